"""The values a step's settings take: each list has its one home here, where the request checks it.

The modules that act on a value (step/run.py on a step kind, step/optimizer.py on an
optimizer, model/quantize.py on a quantization, ranks/parallel.py on FSDP2's dtypes)
import its list from here.
"""

from __future__ import annotations

import enum

from memlayout.errors import SettingError


class Pipeline(enum.Enum):
    """What a request asks for; `StepRequest.pipeline`."""

    WEIGHTS = "weights"
    """The weights in each dtype and the fixed costs of training them: no step (`weights`, or no step setting)."""
    STEP = "step"
    """One step on one device, and a checkpoint plan for `budget`."""
    RANKS = "ranks"
    """Each rank of `world_size` under FSDP2, tensor parallel or DDP, and a plan for `budget`."""
    FIT = "fit"
    """The largest batch or sequence whose step fits `budget`."""


STEPS = ("train", "inference", "generate")
FORWARDS = {"inference": "forward", "generate": "generate"}
"""What a forward-only step runs, as the messages say it."""
OPTIMIZERS = ("adamw", "adam", "sgd", "none")
DEFAULT_OPTIMIZER = "adamw"
CACHES = ("dynamic", "static")
QUANTIZE_METHODS = ("nf4", "fp4", "int8")
FIT_AXES = ("batch", "seq")
FIT_RULE = (
    "batch scales dim 0 of every `input` with a dimension; seq scales dim 1 of every integer `input` with two or "
    "more (token ids, labels, masks), or with seq:N dim N of every `input` that has it"
)
PRECISIONS = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
"""Each precision by its short name (`--dtype bf16`) and torch's (`torch.bfloat16`): either is accepted
wherever a dtype is asked for, and the short one is the request's."""
AUTOCAST = ("bf16", "fp16")
SHARDED_DTYPES = ("float32", "bfloat16", "float16")
"""The dtypes FSDP2 gathers and reduces in (`--param-dtype`, `--reduce-dtype`), as torch names them."""


def precision(value: str | None) -> str | None:
    """The short name of a precision given by either name (bf16 or bfloat16); the value unchanged where it is
    neither, for the caller's check to name."""
    if value is None:
        return None
    short = {long: short for short, long in PRECISIONS.items()}
    text = str(value).removeprefix("torch.")
    return short.get(text, text)


def fit_axis(text: str) -> tuple[str, int | None]:
    """`batch`, `seq` or `seq:N` -> (axis, the named seq dim or None).

    Raises:
        SettingError: none of these.
    """
    axis, _, dim = text.partition(":")
    if axis not in FIT_AXES or (dim and (axis != "seq" or not dim.isdigit() or int(dim) < 1)):
        raise SettingError(f"`fit` {text!r} is not batch, seq or seq:N", FIT_RULE)
    return axis, int(dim) if dim else None
