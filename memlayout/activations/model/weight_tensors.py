"""The distinct tensors a model holds, without their values: from the model built on the meta device, or from a
checkpoint's headers.

`--weights` counts them (activations/weights.py). Which source a TARGET is read from:

- a model memlayout builds (a config.json, its directory, a remote config or Hub
  repository, `pkg.module:build`): built on the meta device, so parameters and
  buffers are told apart, a tied weight is one Parameter counted once, and the
  non-persistent buffers a checkpoint never holds (rotary tables) are counted as
  the model holds them;
- anything else memlayout reads (a safetensors file, a `.bin` or other torch.save
  file, a sharded or unsharded weights directory, local or behind a URL): the
  headers, read by memlayout/load without the tensors' bytes (over HTTP, a few
  ranges). A pickled module is read by the restricted unpickler, which runs nothing
  and keeps its parameters and buffers apart; a state dict does not say which of its
  tensors are buffers, so every floating tensor but torch's BatchNorm running
  statistics is taken for a trainable parameter. Tensors that share a storage at the
  same offset and shape (a tie saved once by torch.save) count once; optimizer state
  saved beside the weights is left out, and so is the second name of a tie the
  config beside the weights declares (`tie_word_embeddings`), which `from_pretrained`
  makes one tensor however the files hold it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, NamedTuple

from memlayout import _torch
from memlayout.activations.model.build import build_model
from memlayout.activations.model.target import CONFIG, classify
from memlayout.activations.request.step_request import StepRequest
from memlayout.dtypes import DTYPES
from memlayout.errors import SettingError, UsageError
from memlayout.load import load_path
from memlayout.load.hf_ties import is_config_tie
from memlayout.load.records import TensorKind
from memlayout.load.remote_location import RemoteOptions, remote_location

BATCH_NORM_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")
"""The names torch's BatchNorm and InstanceNorm give their buffers: the one kind of floating buffer a state dict's
names tell for sure."""

BUILT = "the model built on the meta device"
HEADERS = "the checkpoint's headers"


class WeightTensor(NamedTuple):
    """One distinct tensor of the model: a parameter or a buffer, its dtype and shape."""

    name: str
    dtype: str
    """torch's short name, e.g. "bfloat16"."""
    shape: tuple[int, ...]
    buffer: bool
    trainable: bool
    """A parameter that gets a gradient (requires_grad); never a buffer."""

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    @property
    def floating(self) -> bool:
        return DTYPES[self.dtype].is_floating if self.dtype in DTYPES else False


@dataclass(frozen=True)
class WeightSource:
    """The tensors counted, and what they were read from."""

    tensors: tuple[WeightTensor, ...]
    kind: str
    """import-spec, hf-config, module or checkpoint."""
    counted_from: str
    """BUILT or HEADERS."""
    format: str | None
    """The checkpoint's format (safetensors, hf-dir, torch-zip, ...); None for a built model."""
    model: Any = None
    """The model built on the meta device (its config suggests inputs); None from headers."""
    model_class: str | None = None
    class_chosen_by: str = ""
    notes: tuple[str, ...] = ()


def reads_headers(target: str) -> bool:
    """Whether `--weights` reads TARGET's headers (a checkpoint) rather than building its model (see the module)."""
    if os.path.isdir(target):
        return not os.path.isfile(os.path.join(target, CONFIG))
    if os.path.isfile(target):
        return not target.endswith(".json")
    location = remote_location(target)
    if location is None:
        return False  # an import spec, or nothing: classify says which
    path = location.path_in_repo if location.protocol == "hf" else location.url
    if location.protocol == "hf" and not path:
        return False  # a Hub repository: its config.json, as activations reads it
    return not (path.endswith("/") or (path.endswith(".json") and not path.endswith(".index.json")))


def weight_source(request: StepRequest) -> WeightSource:
    """The distinct tensors of the request's TARGET (an nn.Module, or a TARGET string), read as the module says;
    a remote checkpoint as `timeout` and `download` say.

    Raises:
        UsageError, SourceNotFoundError, UnsafeContentError, RemoteReadError, ...: one line for the CLI.
    """
    import torch

    target = request.target
    if isinstance(target, torch.nn.Module):
        return WeightSource(module_tensors(target), "module", BUILT, None, target, type(target).__name__,
                            "the module given")
    target = str(target)
    if reads_headers(target):
        if request.model_class is not None:
            raise SettingError(f"`model_class` chooses the class a config builds, and {target} is a checkpoint",
                               "drop `model_class`, or give the model's config.json")
        return header_tensors(target, RemoteOptions(timeout_s=request.timeout, download=request.download))
    classify(target)  # refuses what builds no model, in one line
    built = build_model(request.model_target, context=lambda: torch.device("meta"), world="meta", device="meta",
                        adopt=lambda model: model)
    return WeightSource(module_tensors(built.model), built.kind.kind, BUILT, None, built.model,
                        type(built.model).__name__, built.class_chosen_by, built.notes)


def module_tensors(model: Any) -> tuple[WeightTensor, ...]:
    """A module's parameters and buffers, each storage view once: named_parameters() already drops a Parameter
    reached twice (a tie); views of one storage at one offset and shape are dropped here too."""
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

    seen: set[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = set()
    found = []
    for buffer, named in ((False, model.named_parameters()), (True, model.named_buffers())):
        for name, tensor in named:
            if isinstance(tensor, (UninitializedParameter, UninitializedBuffer)):
                raise UsageError(f"{name} is a lazy module's parameter, whose shape its first forward decides",
                                 "give `input`, so that the step runs the forward")
            key = (_torch.storage_id(tensor.untyped_storage()), tensor.storage_offset(), tuple(tensor.shape),
                   tuple(tensor.stride()))
            if key in seen:
                continue
            seen.add(key)
            found.append(WeightTensor(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), buffer,
                                      not buffer and bool(tensor.requires_grad)))
    return tuple(found)


def header_tensors(target: str, remote: RemoteOptions) -> WeightSource:
    """The tensors a checkpoint's headers describe, read by memlayout/load without their bytes."""
    with load_path(target, remote=remote) as source:
        records, fmt, notes = list(source.tensors), source.format, [n for n in source.notes if "read remotely" in n]
        root = next((m.class_name for m in source.modules if m.path == ""), None)
        present = {record.name for record in records}
        # A tie the config declares is one tensor once from_pretrained loads it, whatever the files hold.
        tied_away = {tie.target for tie in source.declared_ties if is_config_tie(tie.declared_by)
                     and tie.source in present and tie.target != tie.source}
    seen: set[tuple[str, int, tuple[int, ...], tuple[int, ...]]] = set()
    found = []
    state = 0
    for record in records:
        if record.optimizer_state:
            state += 1
            continue
        if record.name in tied_away:
            continue
        key = (record.storage_key, record.offset, tuple(record.shape), tuple(record.stride))
        if key in seen:
            continue
        seen.add(key)
        floating = record.dtype in DTYPES and DTYPES[record.dtype].is_floating
        if record.kind == TensorKind.TENSOR:
            buffer = not floating or record.name.rsplit(".", 1)[-1] in BATCH_NORM_STATISTICS
            trainable = not buffer
        else:
            buffer = record.kind == TensorKind.BUFFER
            trainable = not buffer and floating and record.requires_grad
        found.append(WeightTensor(record.name, record.dtype, tuple(record.shape), buffer, trainable))
    if not found:
        raise UsageError(f"{target} holds no tensors to count", "give a checkpoint, a config.json or pkg.module:build")
    if state:
        notes.append(f"{state} optimizer-state tensors saved beside the weights are not counted")
    if any(r.kind == TensorKind.TENSOR for r in records):
        notes.append("a state dict does not say which tensors are buffers: every floating tensor but BatchNorm's "
                     "running statistics is counted as a trainable parameter; the config or pkg.module:build tells "
                     "them apart")
    # A pickled module names its class; the restricted unpickler read it without importing it.
    model_class = root.rsplit(".", 1)[-1] if root else None
    return WeightSource(tuple(found), "checkpoint", HEADERS, fmt, model_class=model_class,
                        class_chosen_by=f"pickled in {target}" if root else "", notes=tuple(notes))
