"""Find the aten ops whose real CPU kernel allocates what the fake kernel does not show.

For every aten op a real training step, and a forward under `torch.inference_mode`,
runs (the zoo sweep's architectures, a small ResNet, models ending in mse_loss), each
distinct call (op, shapes, strides, dtype) runs once more on zeros under the allocator's events
(memlayout.activations.trace.kernel_storage.measure_kernel) and once under FakeTensorMode.
An op is listed when its real output storage differs from the fake output's, or
when the allocator's peak inside it exceeds its new outputs (scratch).
memlayout/activations/trace/kernel_storage.py's LEARNED_OPS come from this list. Apart
(`layout_differing`), the ops whose real output lies in memory in another order
than the fake output (layer norm's backward on a transposed input: the real
kernel's gradient is contiguous, the fake one follows the input), which changes
what later ops copy; kernel_storage.py's LAYOUT_OPS come from that list.

Usage:
    python -m benchmarks.accuracy.kernel_storage_probe                    # the default set below
    python -m benchmarks.accuracy.kernel_storage_probe --arch BertForMaskedLM --arch ResNetForImageClassification

Writes benchmarks/results/kernel_storage_probe.json.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "kernel_storage_probe.json"
DEFAULT_ARCHITECTURES = (
    "LlamaForCausalLM", "BertForMaskedLM", "GPT2LMHeadModel", "T5ForConditionalGeneration",
    "ViTForImageClassification", "ResNetForImageClassification", "ConvNextForImageClassification",
    "WhisperForConditionalGeneration", "Wav2Vec2ForCTC", "MixtralForCausalLM", "MambaForCausalLM",
    "UNet2DModel", "AutoencoderKL", "LSTM (2 layers, proj_size)", "SwinForImageClassification",
    "CLIPModel", "DebertaV2ForMaskedLM", "BartForConditionalGeneration", "MobileNetV2ForImageClassification",
    "EfficientNetForImageClassification", "SegformerForImageClassification",
)
SCRATCH_FLOOR = 4096
"""Scratch below this (a few small bookkeeping allocations) is not worth learning."""


def ops_of_step(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[Any, tuple[Any, Any, Any]]:
    """Every distinct aten call of one real training step, then of one forward as `--step inference` runs it (eval
    mode, `torch.inference_mode`, where some ops reach a dispatch mode whole: the CPU's LSTM as aten.lstm.input):
    signature -> (op, args, kwargs)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from memlayout.activations.step.run import run_step

    seen: dict[Any, tuple[Any, Any, Any]] = {}

    def describe(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return ("t", tuple(value.shape), tuple(value.stride()), value.dtype, value.layout)
        return repr(value)

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, a: Any = (), k: Any = None) -> Any:
            k = k or {}
            out = func(*a, **k)
            if func.namespace == "aten" and not func._schema.is_mutable:
                leaves, _ = torch.utils._pytree.tree_flatten((a, k))
                key = (str(func), tuple(describe(v) for v in leaves))
                if key not in seen:
                    meta = torch.utils._pytree.tree_map(
                        lambda v: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
                        if isinstance(v, torch.Tensor) and v.layout == torch.strided else v, (a, k))
                    seen[key] = (func, *meta)
            return out

    torch.manual_seed(0)
    with Recorder():
        run_step(model, args, kwargs)
    model.eval()
    with Recorder(), torch.inference_mode():
        model(*args, **kwargs)
    return seen


def fake_outputs(func: Any, args: Any, kwargs: Any) -> tuple[tuple[int | None, ...], tuple[Any, ...]]:
    """The fake kernel's output storages and layouts (`dimension_order`) for the same call."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake = torch.utils._pytree.tree_map(
            lambda v: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype)
            if isinstance(v, torch.Tensor) else v, (args, kwargs))
        out = func(*fake[0], **fake[1])
    del mode
    from memlayout.core.strides import dimension_order

    flat = [v if isinstance(v, torch.Tensor) and v.layout == torch.strided else None
            for v in (out if isinstance(out, (tuple, list)) else (out,))]
    return (tuple(None if v is None else v.untyped_storage().nbytes() for v in flat),
            tuple(None if v is None else dimension_order(tuple(v.shape), tuple(v.stride())) for v in flat))


def probe(calls: dict[Any, tuple[Any, Any, Any]], found: dict[str, dict[str, Any]], source: str,
          layouts: dict[str, dict[str, Any]]) -> None:
    import torch

    from memlayout.activations.trace.kernel_storage import measure_kernel

    for func, args, kwargs in calls.values():
        real_args = torch.utils._pytree.tree_map(
            lambda v: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype) if isinstance(v, torch.Tensor) else v,
            (args, kwargs))
        try:
            real = measure_kernel(func, *real_args)
            fake, fake_orders = fake_outputs(func, args, kwargs)
        except Exception:
            continue
        if any(r is not None and f is not None and r != f for r, f in zip(real.output_orders, fake_orders,
                                                                          strict=False)):
            layout = layouts.setdefault(str(func), {"calls": 0, "sources": [], "example": ""})
            layout["calls"] += 1
            if source not in layout["sources"]:
                layout["sources"].append(source)
            strided = [(tuple(v.shape), tuple(v.stride())) for v in torch.utils._pytree.tree_flatten(args)[0]
                       if isinstance(v, torch.Tensor)]
            layout["example"] = layout["example"] or (
                f"inputs {strided}: "
                f"real output strides {real.output_strides}, fake orders {fake_orders}, real orders "
                f"{real.output_orders}")
        extra_storage = sum((r or 0) - (f or 0) for r, f in zip(real.output_storage_bytes, fake, strict=False))
        entry = found.setdefault(str(func), {"calls": 0, "max_extra_storage_bytes": 0, "max_scratch_bytes": 0,
                                             "sources": [], "example": ""})
        entry["calls"] += 1
        if source not in entry["sources"]:
            entry["sources"].append(source)
        if extra_storage > entry["max_extra_storage_bytes"] or real.scratch_bytes > entry["max_scratch_bytes"]:
            shapes = [tuple(v.shape) for v in torch.utils._pytree.tree_flatten(args)[0] if isinstance(v, torch.Tensor)]
            entry["example"] = (f"inputs {shapes}: real storage {real.output_storage_bytes}, fake {fake}, "
                                f"scratch {real.scratch_bytes}")
        entry["max_extra_storage_bytes"] = max(entry["max_extra_storage_bytes"], extra_storage)
        entry["max_scratch_bytes"] = max(entry["max_scratch_bytes"], real.scratch_bytes)


def small_resnet() -> tuple[Any, tuple[Any, ...]]:
    """Two residual conv blocks with batch norm, pooled into a classifier: a small ResNet."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
                                      nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                                      nn.BatchNorm2d(channels))

        def forward(self, x: Any) -> Any:
            return torch.relu(x + self.body(x))

    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), Block(32), Block(32), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(32, 10))
    return model, (torch.randn(8, 3, 32, 32),)


def mse_patches() -> tuple[Any, tuple[Any, ...]]:
    """A patch embedding and projection back, ending in mse_loss against the patches."""
    import torch
    from torch import nn

    class Patches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encode = nn.Linear(192, 96)
            self.decode = nn.Linear(96, 192)

        def forward(self, patches: Any) -> Any:
            return nn.functional.mse_loss(self.decode(torch.relu(self.encode(patches))), patches)

    return Patches(), (torch.randn(16, 48, 192),)


def lstm_lm() -> tuple[Any, tuple[Any, ...]]:
    """tests/activations/models.py's LSTM language model: oneDNN's LSTM forward and backward."""
    from tests.activations import models

    args, _ = models.token_inputs(4, 32, 500, labels=False)
    return models.lstm_lm(), tuple(args)


def main(argv: list[str]) -> int:
    import torch

    parser = argparse.ArgumentParser(prog="python -m benchmarks.accuracy.kernel_storage_probe",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", default=[], help="a zoo architecture (repeatable)")
    parser.add_argument("--add", action="store_true", help="add to the results file rather than replace it")
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    from benchmarks.accuracy.zoo.catalog import by_name

    entries = by_name()
    started = time.perf_counter()
    found: dict[str, dict[str, Any]] = {}
    layouts: dict[str, dict[str, Any]] = {}
    probed: list[str] = []
    local = {"small ResNet": small_resnet, "mse_loss on patches": mse_patches, "LSTM language model": lstm_lm}
    for name in options.arch or [*local, *DEFAULT_ARCHITECTURES]:
        try:
            if name in local:
                model, args = local[name]()
                calls = ops_of_step(model, args, {})
            else:
                built = entries[name].build()
                calls = ops_of_step(built.model, built.args, built.kwargs)
        except Exception as exc:
            print(f"{name}: not probed ({type(exc).__name__}: {str(exc)[:100]})", file=sys.stderr)
            continue
        probe(calls, found, name, layouts)
        probed.append(name)
        print(f"{name}: {len(calls)} distinct calls", file=sys.stderr)
    differing = {op: entry for op, entry in sorted(found.items())
                 if entry["max_extra_storage_bytes"] > 0 or entry["max_scratch_bytes"] > SCRATCH_FLOOR}
    command = shlex.join(["python", "-m", "benchmarks.accuracy.kernel_storage_probe", *argv])
    if options.add and RESULTS.exists():
        # --add: these models' findings join the earlier runs' (each op keeps the largest bytes seen)
        earlier = json.loads(RESULTS.read_text())
        for op, entry in earlier["differing"].items():
            if op not in differing or entry["max_scratch_bytes"] > differing[op]["max_scratch_bytes"]:
                differing[op] = entry
        differing = dict(sorted(differing.items()))
        for op, entry in earlier.get("layout_differing", {}).items():
            layouts.setdefault(op, entry)
        probed = [*earlier["probed"], *(name for name in probed if name not in earlier["probed"])]
        command = f"{earlier['command']}; then {command}"
    result = {"command": command, "torch": torch.__version__,
              "probed": probed, "ops_seen": len(found), "seconds": round(time.perf_counter() - started, 1),
              "scratch_floor_bytes": SCRATCH_FLOOR, "differing": differing,
              "layout_differing": dict(sorted(layouts.items()))}
    from memlayout.io.atomic_write import write_text

    write_text(str(RESULTS), json.dumps(result, indent=1) + "\n")
    for op, entry in differing.items():
        print(f"{op}: extra storage up to {entry['max_extra_storage_bytes']}, scratch up to "
              f"{entry['max_scratch_bytes']} ({entry['example']})")
    for op, entry in sorted(layouts.items()):
        print(f"{op}: the real output's layout differs from the fake's ({entry['example']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
