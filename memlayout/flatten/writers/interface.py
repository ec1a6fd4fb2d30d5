"""What a flatten writer is: one per source format it can rewrite flat, or convert.

`memlayout.flatten.files` loads the source, builds its facts and plan, picks the
writer registered for the loader's format (`memlayout.flatten.writers`), and
hands it a `FlattenJob`. The writer moves the bytes into the planned layout,
writes OUT atomically, verifies it, and says what it did in a `Written`.

A writer is a `FlattenWriter` instance named `WRITER` in a module of the
`memlayout.flatten.writers` package, or one a distribution exposes through the
`memlayout.flatten_writers` entry-point group. It must say which inputs it
handles (`formats`, and `target` for a conversion) and `write`; every other
method has a default that suits a writer keeping IN's format.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from memlayout.core.facts import Facts
from memlayout.errors import FlattenError
from memlayout.flatten.options import FlattenOptions, Progress
from memlayout.flatten.plan import FlatPlan, describe_changes
from memlayout.flatten.verification import BUFFERS_WRITTEN, LAYOUT
from memlayout.load.main_module import classes_from_main, objects_from_main
from memlayout.load.records import LoadedSource


@dataclass(frozen=True)
class FlattenJob:
    """One rewrite: the loaded source, its facts and plan, and where it goes."""

    path: str
    """IN as the user gave it."""
    out: str
    """Where OUT goes (IN itself for --in-place)."""
    source: LoadedSource
    """IN's loaded records; still open (its reader locates the storage bytes)."""
    facts: Facts
    plan: FlatPlan
    """The layout, already on the target device."""
    options: FlattenOptions
    progress: Progress | None = None
    """Told the bytes copied and verified so far, for a progress display."""

    def objects_from_main(self) -> dict[int, str]:
        """What IN's pickle names `__main__.Name`, as `--main-module` defines it, by identity; empty without it."""
        if self.options.main_module is None:
            return {}
        return objects_from_main(self.options.main_module, classes_from_main(self.source.pickle_globals))


@dataclass(frozen=True)
class LayoutAfter:
    """What OUT holds, for the summary: the same numbers `inspect OUT` reports."""

    storages: int
    nbytes: int
    """Bytes of every storage OUT holds."""
    padding_bytes: int
    """Of those, alignment padding between slots."""


@dataclass(frozen=True)
class Written:
    """What a writer did."""

    bytes_copied: int
    """Bytes moved into the flat layout."""
    verified: bool
    """OUT was read back and checked before it replaced anything."""
    verification: tuple[str, ...] = (BUFFERS_WRITTEN, LAYOUT)
    """What the check proved, one clause per kind of change (`memlayout.flatten.verification`), for the
    summary; the default is what `memlayout.flatten.save.verify_torch_file` proves."""
    stages: dict[str, float] = field(default_factory=dict)
    """Seconds per stage of the write ("copy", "verify", "fsync", ...), for benchmarks."""


class FlattenWriter(abc.ABC):
    """Rewrites sources of some loader formats flat, in their own format or (a converter) in `target`'s."""

    formats: tuple[str, ...] = ()
    """The `LoadedSource.format` names this writer rewrites."""
    target: str | None = None
    """The format a converter writes (`flatten --to`); None for a writer that keeps IN's format."""

    def label(self, source: LoadedSource) -> str:
        """How the summary names what is read and written, e.g. "torch.save state dict".

        Args:
            source: The loaded IN.

        Returns:
            A short human name.
        """
        return source.format

    def changes(self, plan: FlatPlan, facts: Facts, source: LoadedSource) -> list[str]:
        """What rewriting would change, one line each; empty when IN is already flat.

        Args:
            plan: The plan made from `facts`.
            facts: IN's facts.
            source: IN's loaded records.

        Returns:
            Lines for `--check` and the summary.
        """
        return describe_changes(plan, facts)

    def movable(self, source: LoadedSource) -> LoadedSource:
        """The part of IN's records this writer can move; all of them by default.

        Flatten plans, checks and summarizes only these, so that `--check` and
        the summary never promise to move a tensor the writer must leave alone.

        Args:
            source: The loaded IN.

        Returns:
            `source` itself, or a copy holding fewer tensor records.
        """
        return source

    def layout_after(self, plan: FlatPlan, facts: Facts) -> LayoutAfter:
        """The storages OUT holds: the plan's buffers, and the storages it leaves alone.

        Args:
            plan: The plan made from `facts`.
            facts: IN's facts.

        Returns:
            Storage count, bytes and padding of OUT.
        """
        untouched = {key[0] for key in plan.untouched}
        kept = [s for s in facts.storages if s.key in untouched]
        return LayoutAfter(len(plan.buffers) + len(kept), plan.nbytes + sum(s.nbytes for s in kept), plan.padding_bytes)

    def admit(self, source: LoadedSource, facts: Facts, options: FlattenOptions) -> tuple[str, ...]:
        """Raise when OUT cannot hold what IN holds; else notes on what it leaves out. Before any work,
        the same with and without --check.

        Args:
            source: The loaded IN.
            facts: IN's facts.
            options: What was asked.

        Returns:
            Notes for the summary; none by default.
        """
        return ()

    def refuse(self, source: LoadedSource, options: FlattenOptions, device: str | None) -> None:
        """Raise when this rewrite must not start (no trust, wrong device); before any work.

        Args:
            source: The loaded IN.
            options: What was asked.
            device: The device every tensor moves to; None when each keeps its own.
        """
        return None

    def declines(self, source_format: str, path: str) -> FlattenError:
        """The refusal for a source this converter does not convert, with what to do instead.

        Args:
            source_format: IN's `LoadedSource.format`, which is not among `formats`.
            path: IN.

        Returns:
            The error to raise.
        """
        return FlattenError(f"{path}: --to {self.target} does not convert {source_format} sources")

    @abc.abstractmethod
    def write(self, job: FlattenJob) -> Written:
        """Write IN's flat copy to `job.out`, atomically and (when asked) verified.

        Args:
            job: The source, plan, destination and options.

        Returns:
            What was done.

        Raises:
            FlattenError: the copy or its verification failed; OUT is untouched.
        """
