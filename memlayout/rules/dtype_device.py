"""ML5xx: devices, dtypes and values."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from memlayout.core.facts import TensorFact
from memlayout.dtypes import dtype_info
from memlayout.rules.registry import Finding, Requirement, RuleContext, RuleExample, rule
from memlayout.severity import Severity


def _minority(groups: dict[str, list[TensorFact]]) -> list[str]:
    majority = max(groups, key=lambda k: len(groups[k]))
    return [t.name for key, tensors in groups.items() if key != majority for t in tensors]


@rule(
    "ML501",
    "mixed-device",
    Severity.WARNING,
    "one model's tensors span several devices",
    "move the whole model with `.to(device)`; for checkpoints, load with `map_location`",
    """
Tensors of one model live on different devices (cpu and cuda:0, or meta and cpu
after a partial materialization). Every op that mixes them fails or copies, and a
checkpoint saved that way needs `map_location` to load anywhere else. A meta
tensor is different: it holds no values at all, and `torch.load` leaves it on
meta whatever `map_location` says, so the file lacks those weights until a model
with real ones is saved again. Scalars (0-d tensors such as an optimizer's step
count, which torch keeps on the CPU) are not counted.
""",
    needs=(Requirement.LAYOUT,),
    detects=(
        "Tensors of one model or checkpoint on more than one device (cpu and cuda:0, or meta and "
        "cpu); 0-d scalars are not counted."
    ),
    example=RuleExample(
        setup="""
import torch

torch.save({"weight": torch.zeros(8, 8), "bias": torch.zeros(8, device="meta")}, "model.pt")
""",
        command="memlayout inspect model.pt",
        fixed="""
torch.save({"weight": torch.zeros(8, 8), "bias": torch.zeros(8)}, "model.pt")
""",
    ),
)
def mixed_device(ctx: RuleContext) -> Iterator[Finding]:
    by_device: dict[str, list[TensorFact]] = defaultdict(list)
    for tensor in ctx.facts.tensors:
        if tensor.shape:
            by_device[tensor.device].append(tensor)
    if len(by_device) < 2:
        return
    counts = ", ".join(f"{len(ts)} on {device}" for device, ts in sorted(by_device.items()))
    yield mixed_device.finding(
        _minority(by_device), f"tensors span {len(by_device)} devices ({counts})", hint=_mixed_device_hint(by_device)
    )


def _mixed_device_hint(by_device: dict[str, list[TensorFact]]) -> str | None:
    # torch.load(map_location=...) maps a storage's recorded location, but a meta
    # storage has no bytes to move: it loads as meta whatever the map says (checked
    # in tests/journeys/test_hints_followed.py), so the default hint would leave the
    # finding in place.
    meta = by_device.get("meta")
    if not meta:
        return None
    shown = ", ".join(t.name for t in meta[:3]) + (f" and {len(meta) - 3} more" if len(meta) > 3 else "")
    return (
        f"{shown} {'is' if len(meta) == 1 else 'are'} on the meta device and hold{'s' if len(meta) == 1 else ''} "
        "no values, which no `map_location` gives them: materialize the model (`model.to_empty(device=...)`, "
        "then load or initialize those weights) and save it again"
    )


@rule(
    "ML502",
    "mixed-dtype",
    Severity.INFO,
    "floating parameters mix dtypes",
    "cast the odd ones (`module.to(dtype)`), unless the mix is deliberate (fp32 norms in a bf16 model)",
    """
Floating-point parameters of one model use more than one dtype, as when a float32
layer is left in a bfloat16 model. Mixed dtypes cost casts at every boundary,
split flat buffers and fused optimizers into several groups, and are often an
accident of loading. Optimizer state is not counted.
""",
    detects=(
        "Floating-point parameters and buffers of one model in more than one dtype; optimizer state "
        "is not counted."
    ),
    example=RuleExample(
        setup="""
import torch
from torch import nn

model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))
model[0].half()
torch.save(model.state_dict(), "model.pt")
""",
        command="memlayout inspect model.pt --select ML502",
        fixed="""
model.half()
torch.save(model.state_dict(), "model.pt")
""",
    ),
)
def mixed_dtype(ctx: RuleContext) -> Iterator[Finding]:
    # Grouped first, then each dtype asked once whether it is floating: a model has
    # a few dtypes and may have 100,000 tensors.
    every_dtype: dict[str, list[TensorFact]] = defaultdict(list)
    for tensor in ctx.facts.model_tensors():
        every_dtype[tensor.dtype].append(tensor)
    by_dtype = {dtype: tensors for dtype, tensors in every_dtype.items() if dtype_info(dtype).is_floating}
    if len(by_dtype) < 2:
        return
    counts = ", ".join(f"{len(ts)} {dtype}" for dtype, ts in sorted(by_dtype.items()))
    yield mixed_dtype.finding(_minority(by_dtype), f"floating tensors mix dtypes ({counts})")


@rule(
    "ML503",
    "non-finite",
    Severity.ERROR,
    "NaN or Inf values (content check, --deep only)",
    "find the step that diverged and restore an earlier checkpoint; do not ship this one",
    """
Some elements are NaN or Inf. A checkpoint that diverged, or a buffer filled with
a sentinel, poisons every output it touches. Checked from the bit patterns, so
bfloat16 and float8 work without conversion. Reads every value, so it runs with
--deep only, streaming each tensor in bounded chunks.
""",
    deep_only=True,
    needs=(Requirement.CONTENT,),
    detects=(
        "NaN or Inf elements in a floating tensor, found from the bit patterns of every value "
        "(bfloat16 and float8 included). Runs with `--deep` only."
    ),
    example=RuleExample(
        setup="""
import torch

weight = torch.randn(64, 64)
weight[3, 5] = float("nan")
torch.save({"weight": weight}, "model.pt")
""",
        command="memlayout inspect model.pt --deep",
        fixed="""
torch.save({"weight": torch.randn(64, 64)}, "model.pt")  # an earlier checkpoint, before the divergence
""",
    ),
)
def non_finite(ctx: RuleContext) -> Iterator[Finding]:
    if ctx.content is None:
        return
    tensors = [t for t in ctx.facts.tensors if t.is_floating and t.has_data and t.numel > 0]
    total = sum(t.nbytes for t in tensors)
    done = 0
    for tensor, bad in ctx.content.non_finite_counts(tensors):
        done += tensor.nbytes
        if ctx.progress is not None:
            ctx.progress("scanning values", done, total)
        if bad:
            yield non_finite.finding(
                tensor.names,
                f"{tensor.name} has {bad} NaN/Inf value{'s' if bad != 1 else ''} of {tensor.numel}",
                storage=tensor.storage,
            )
