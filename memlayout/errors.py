"""One exception hierarchy. Every error carries a hint that says how to fix it.

The CLI turns any `MemlayoutError` into one line on stderr and exit code 2.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

from memlayout.format_bytes import human_bytes


class MemlayoutError(Exception):
    """Base of every error memlayout raises on purpose."""

    default_hint = ""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint

    def one_line(self) -> str:
        """The message and the hint, as the single line the CLI prints."""
        return f"{self.message} ({self.hint})" if self.hint else self.message

    def respell(self, spell: Callable[[str], str | None]) -> None:
        """Write the settings the message and the hint name as `spell` writes them (a command line: as its flags;
        see `respelled`)."""
        self.message, self.hint = respelled(self.message, spell), respelled(self.hint, spell)
        self.args = (self.message, *self.args[1:])


class UsageError(MemlayoutError):
    """The command line or API call asks for something inconsistent."""


SETTING = r"`([a-z][a-z0-9_]*)(?:=([^`]*))?`"
"""A setting named in an error's message or hint, as a Python caller writes it: `world_size`, `world_size=8`
(compiled where it is used, by `re`'s own cache: every command imports this module, few read a setting)."""


class SettingError(UsageError):
    """A setting of a request that is wrong alone, or settings that do not go together.

    The message and the hint name each setting in backquotes, alone (`world_size`) or
    with a value (`world_size=8`), as the library and its Python callers name it; a
    command line shows each as its flag (`respelled`), so one rule reads right in both.
    """

    @property
    def settings(self) -> tuple[str, ...]:
        """The settings the message names, in order."""
        return tuple(dict.fromkeys(match.group(1) for match in re.finditer(SETTING, self.message)))


def respelled(text: str, spell: Callable[[str], str | None]) -> str:
    """`text` with each setting named in backquotes written as `spell` writes its name (None: left as it is):
    `spell("world_size")` "--world-size" turns "`world_size=8`" into "--world-size 8", and "`fsdp=True`" into
    "--fsdp"."""

    def one(match: re.Match[str]) -> str:
        name, value = match.group(1), match.group(2)
        written = spell(name)
        if written is None:
            return match.group(0)
        return written if value is None or value == "True" else f"{written} {value}"

    return re.sub(SETTING, one, text)


class SourceNotFoundError(MemlayoutError):
    """The path does not exist, or an import spec does not resolve."""

    default_hint = "check the path or the `package.module:callable` spec"


class UnrecognizedFormatError(MemlayoutError):
    """The file exists but is no checkpoint format memlayout knows."""

    default_hint = (
        "memlayout reads torch.save files in zip, legacy non-zip or tar form, safetensors, Hugging Face "
        "directories, TorchScript, torch.export .pt2 and torch.distributed.checkpoint directories"
    )


class CorruptCheckpointError(MemlayoutError):
    """The file claims a known format but its contents are inconsistent."""

    default_hint = "the file is truncated or damaged; re-export it from its source"


class DamagedPickleError(CorruptCheckpointError):
    """A pickle breaks off after naming globals outside the allow-list: what unpickling would have
    imported, and may have called, before it failed. The error says which, for the audit to judge."""

    def __init__(self, message: str, hint: str | None = None, named: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message, hint)
        self.named = named
        """(module, name) of each global outside the allow-list named before the damage."""


class UnpackLimitError(CorruptCheckpointError):
    """Unpacking a file (decompressing it, opening its archives) went past one of memlayout's caps:
    a decompression bomb, archives nested too deep, or too many members to audit."""

    default_hint = "it is refused unread; unpack it yourself where its size is expected, and inspect what it holds"


class UnsafeContentError(MemlayoutError):
    """The operation needs real objects from a pickle that memlayout will not execute."""

    default_hint = "pass --trust only if you trust whoever wrote the file"


class FlattenError(MemlayoutError):
    """Flattening was refused or could not be verified; nothing was written."""


class OutputError(MemlayoutError):
    """An output could not be written; the previous file or folder is unchanged."""

    default_hint = "check the path, its permissions and the free space"


class TorchNotInstalledError(MemlayoutError):
    """What was asked runs torch, and torch is not installed (reading files needs none)."""

    default_hint = "install it with: pip install 'memlayout[torch]'"


class RemoteReadError(MemlayoutError):
    """A file behind a URL could not be read as asked: the server, the network or the reply is at fault."""

    default_hint = "check the URL; memlayout reads remote files by HTTP Range requests and never runs them"


class RangeNotSupportedError(RemoteReadError):
    """The server answered a Range request with the whole file."""

    def __init__(self, url: str, size: int | None) -> None:
        amount = f"all {size:,} bytes" if size is not None else "the whole file"
        super().__init__(
            f"{url}: the server ignores HTTP Range requests, so reading it means downloading {amount}",
            "pass --download to download it whole, or use a server that supports Range (the Hub and S3 do)",
        )
        self.url = url
        self.size = size


class RankFailedError(MemlayoutError):
    """Another rank could not inspect the path this rank could."""


# What `memlayout activations` raises.
class ActivationsError(MemlayoutError):
    """memlayout could not finish an analysis for a reason of its own, not the model's."""

    default_hint = "rerun with --debug for the traceback, and report it: it is memlayout's failure, not your model's"


class Alternative(NamedTuple):
    """A setting the step did not use, named by a nothing-fits error's hint, and the figure it would give."""

    setting: str
    """The setting as a Python caller writes it, in backquotes (`dtype=bf16`; "`lora=16` with `quantize=nf4`"); a
    command line's error writes it as flags (`respelled`)."""
    bytes: int | None
    """The figure compared with the budget of the step with this setting alone, at the smallest size; None where it
    was not predicted (`why`)."""
    why: str | None = None
    """Why there is no figure: its step failed, or predicting it costs more than a hint may."""
    name: str = ""
    """What the setting is, in words: "bf16", "LoRA", "more ranks"."""


class NothingFits(MemlayoutError):
    """No plan, or no size, fits the budget: the hint names what the step did not try, each with its figure."""

    alternatives: tuple[Alternative, ...] = ()
    """What the hint names, the lowest-cost first, each with the figure it would give."""

    def respell(self, spell: Callable[[str], str | None]) -> None:
        super().respell(spell)
        self.alternatives = tuple(option._replace(setting=respelled(option.setting, spell))
                                  for option in self.alternatives)


class BudgetUnreachableError(NothingFits):
    """No plan brings the step under the budget."""

    def __init__(self, budget: int, lowest: Any) -> None:
        self.budget_bytes = budget
        self.lowest = lowest
        """The lowest plan found: an `activations.search.PlanResult` (typed Any: this base layer imports no layer)."""
        # Why, in the line itself: a search at a reachable budget meets the failing plans only if it traces them,
        # and one whose estimate fits at its first trace meets none.
        first, why = lowest.excluded[0] if lowest.excluded else ("", "")
        left_out = (
            f"; {len(lowest.excluded)} modules cannot be checkpointed ({', '.join(p for p, _ in lowest.excluded[:3])}"
            f"{', ...' if len(lowest.excluded) > 3 else ''}; {first or 'the model'}: "
            f"{why.split(': ', 1)[0].split(' (', 1)[0]})"
            if lowest.excluded else ""
        )
        figure = ("peak" if lowest.compared == "peak"
                  else "reserved peak plus the CUDA context, cuBLAS and its workspaces")
        # Only what was traced is known: "the lowest of the plans traced", never "the lowest reachable".
        traced = (f"the lowest {figure} of {lowest.checks} {'plan' if lowest.checks == 1 else 'plans'} traced, over "
                  f"{lowest.searched}," if lowest.checks
                  else f"the planner found no plan that lowers the {figure}, which")
        tried = f" ({lowest.cut_short})" if lowest.cut_short else ""
        super().__init__(
            f"no checkpoint plan found fits a budget of {human_bytes(budget)} ({budget} bytes): {traced} is "
            f"{human_bytes(lowest.judged_bytes)} ({lowest.judged_bytes} bytes){tried}{left_out}",
            "raise --budget to at least that figure, or shrink the batch",
        )


class RanksBudgetUnreachableError(MemlayoutError):
    """No plan brings the largest rank under the budget."""

    def __init__(self, budget: int, lowest: Any, tried: str) -> None:
        self.budget_bytes = budget
        self.lowest = lowest
        """The lowest plan found: an `activations.ranks.plan.RanksPlan` (typed Any: this base layer imports no
        layer)."""
        ddp = lowest.sharding.ddp
        if ddp is not None:  # every DDP rank holds the whole model: more ranks and offload lower nothing
            hint = "raise --budget, shrink each rank's batch, " + (
                "" if ddp.gradient_as_bucket_view else "keep the gradients in DDP's buckets "
                                                       "(--gradient-as-bucket-view), "
            ) + "or shard the model instead (--fsdp)"
        else:
            hint = "raise --budget, add ranks (--world-size), shrink each rank's batch" + (
                "" if lowest.offload or lowest.sharding.offload else ", or allow CPU offload (--allow-offload)")
        # On CUDA the figure compared is the reserved peak with the runtime beside it (activations/ranks/card.py).
        judged = getattr(lowest, "judged_bytes", lowest.peak_bytes)
        what = "peak" if judged == lowest.peak_bytes else "reserved peak with the CUDA runtime"
        super().__init__(
            f"no plan fits the largest rank in {human_bytes(budget)} ({budget} bytes): the lowest {what} reached is "
            f"{human_bytes(judged)} ({judged} bytes), with {tried}", hint,
        )


class RankStepError(MemlayoutError):
    """The step failed on the sharded model."""


class AllocatorOutOfMemoryError(MemlayoutError):
    """The CUDA allocator model's capacity cannot hold a new segment, even after releasing the cached ones."""


class SegmentBroken(MemlayoutError, RuntimeError):
    """A run of children planned as one checkpointed segment did not run as the plan's trace saw it run
    (activations/plans/apply_segments.py): the step stops rather than train on a rerun that replays something else."""

    default_hint = "apply the plan to the model it was made for, or make the plan again from this model's step"


class NothingFitsError(NothingFits):
    """Not even a size of 1 fits the budget, with or without a plan."""

    def __init__(self, axis: str, budget: int, lowest: int | None, hint: str = "",
                 alternatives: tuple[Alternative, ...] = ()) -> None:
        self.budget_bytes = budget
        self.lowest_peak_bytes = lowest
        self.alternatives = alternatives
        reached = f": at {axis} 1 the lowest peak is {human_bytes(lowest)} ({lowest} bytes)" if lowest else ""
        super().__init__(f"not even a {axis} of 1 fits a budget of {human_bytes(budget)} ({budget} bytes){reached}",
                         hint or "raise `budget`")
