"""The values a step's settings take: each list has its one home here, where the request checks it.

The modules that act on a value (step/run.py on a step kind, step/optimizer.py on an
optimizer, model/quantize.py on a quantization, ranks/parallel.py on FSDP2's dtypes)
import its list from here.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

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
    SWEEP = "sweep"
    """One step at each size of a batch or a sequence (`sweep`), and with `fit` its answers too."""


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


MAX_SWEEP_SIZES = 64
"""A sweep predicts at most this many sizes: a range written by mistake (1:100000) is refused, not traced."""
SWEEP_RULE = ("AXIS=SIZES: AXIS is batch, seq or seq:N (as for `fit`), SIZES a list (1,2,4,8) or START:STOP[:STEP], "
              "STOP included (512:4096:512)")
PLOT_SUFFIXES = (".svg", ".png", ".html")
"""What `plot` writes, by the file's suffix."""


class SweepSpec(NamedTuple):
    """What `sweep` asks for: the axis (as `fit` names it) and the sizes, ascending, each once."""

    axis: str
    seq_dim: int | None
    sizes: tuple[int, ...]

    @property
    def fit_text(self) -> str:
        """The axis as `fit` writes it: batch, seq or seq:N."""
        return self.axis if self.seq_dim is None else f"{self.axis}:{self.seq_dim}"


def sweep_spec(text: str) -> SweepSpec:
    """`batch=1,2,4,8`, `seq=512:4096:512` or `seq:2=64,128` -> the axis and its sizes.

    Raises:
        SettingError: not AXIS=SIZES, a size below 1, or more than MAX_SWEEP_SIZES sizes.
    """
    axis_text, equals, sizes_text = str(text).partition("=")
    if not equals or not sizes_text.strip():
        raise SettingError(f"`sweep` {text!r} is not AXIS=SIZES", SWEEP_RULE)
    try:
        axis, seq_dim = fit_axis(axis_text.strip())
    except SettingError:
        raise SettingError(f"`sweep` {text!r}: {axis_text.strip()!r} is not batch, seq or seq:N", SWEEP_RULE) from None
    sizes: set[int] = set()
    for part in sizes_text.split(","):
        sizes.update(_sizes(part.strip(), text))
        if len(sizes) > MAX_SWEEP_SIZES:
            raise SettingError(f"`sweep` {text!r} asks for more than {MAX_SWEEP_SIZES} sizes",
                               "give fewer, or a larger STEP")
    return SweepSpec(axis, seq_dim, tuple(sorted(sizes)))


def _sizes(part: str, text: str) -> range | tuple[int, ...]:
    pieces = part.split(":")
    if not part or len(pieces) > 3 or not all(piece.strip().isdigit() for piece in pieces):
        raise SettingError(f"`sweep` {text!r}: {part!r} is not a size or START:STOP[:STEP]", SWEEP_RULE)
    numbers = [int(piece) for piece in pieces]
    if min(numbers) < 1:
        raise SettingError(f"`sweep` {text!r}: sizes and steps start at 1", SWEEP_RULE)
    if len(numbers) == 1:
        return (numbers[0],)
    start, stop = numbers[0], numbers[1]
    step = numbers[2] if len(numbers) == 3 else 1
    if stop < start:
        raise SettingError(f"`sweep` {text!r}: {part!r} stops before it starts", SWEEP_RULE)
    if (stop - start) // step + 1 > MAX_SWEEP_SIZES:
        raise SettingError(f"`sweep` {text!r} asks for more than {MAX_SWEEP_SIZES} sizes",
                           "give fewer, or a larger STEP")
    return range(start, stop + 1, step)
# The training recipe: the loop's optimizer implementation and clipping, op-level checkpointing, resharding.
OPTIMIZER_IMPLS = ("for-loop", "foreach", "fused")
"""torch.optim's implementations (`--optimizer-impl`): one tensor at a time, the foreach kernels, the fused ones."""
CLIP_IMPLS = ("for-loop", "foreach")
"""`clip_grad_norm_`'s implementations (`--clip-grad-impl`)."""
SAC_SAVES = ("matmuls", "every-other-matmul", "attention", "collectives", "max")
"""What a built-in op-level checkpoint policy (`--selective-ac`) saves: every matmul's output, every other one's
(torchtitan's), attention's outputs (each device's attention kernels), collectives' outputs, and max reductions."""
SAC_PRESETS = {"torchtitan": ("every-other-matmul", "attention", "collectives", "max")}
"""Named policies: torchtitan's `_save_list` with its every-other-`mm` rule (models/llama3/infra/parallelize.py)."""
RESHARD_PRESETS = {
    "torchtitan": "every wrapped block but the last (torchtitan's apply_fsdp: FSDP2 would gather it again at once)",
    "lightning": "every wrapped module (Lightning's FSDPStrategy default, FULL_SHARD; FSDP2's own default)",
}
"""`--reshard-after-forward` presets, and what each reshards after forward."""
