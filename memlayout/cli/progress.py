"""Progress on stderr for long commands: a rich display when stderr is a terminal, nothing otherwise.

`memlayout flatten` of a 1 GiB checkpoint takes seconds and of a 70B model
minutes; the library reports `progress(task, done, total)` in bytes for each
stage, and this draws one bar per stage. Piped or redirected stderr (CI logs,
`2> file`) gets nothing: a progress display there is only noise.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID

Progress = Callable[[str, int, int], None]

# The library's stage names, as the bars label them.
FLATTEN_STAGES = {"copy": "bytes copied", "write": "bytes written", "verify": "verification"}


@contextmanager
def stage_progress(
    labels: dict[str, str], stream: TextIO | None = None, transient: bool = False
) -> Iterator[Progress | None]:
    """A `progress(task, done, total)` callable drawing one byte bar per task, or None off a terminal.

    Args:
        labels: Task name -> the bar's label; other task names label themselves.
        stream: Where to draw; stderr by default.
        transient: Clear the bars when done (a scan before a report), rather than leave them (flatten's stages).

    Yields:
        The callable while the display is live, or None when `stream` is not a terminal.
    """
    stream = stream if stream is not None else sys.stderr
    if not stream.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )
    from rich.progress import Progress as RichProgress

    display = RichProgress(
        TextColumn("{task.description:<14}"), BarColumn(), DownloadColumn(binary_units=True),
        TransferSpeedColumn(), TimeRemainingColumn(),
        console=Console(file=stream), transient=transient, redirect_stdout=False, redirect_stderr=False,
    )
    tasks: dict[str, TaskID] = {}

    def update(task: str, done: int, total: int) -> None:
        if task not in tasks:
            tasks[task] = display.add_task(labels.get(task, task), total=total)
        display.update(tasks[task], completed=done, total=total)

    with display:
        yield update


@contextmanager
def progress_callback(enabled: bool) -> Iterator[Progress | None]:
    """`--deep`'s content scans as bars on stderr (`stage_progress`, cleared when done); None when not enabled."""
    if not enabled:
        yield None
        return
    with stage_progress({}, transient=True) as progress:
        yield progress


class PathsProgress:
    """One bar for a many-path inspect: paths done of all, failures counted; error lines printed above it."""

    def __init__(self, stream: TextIO, display: RichProgress | None = None, task: TaskID | None = None) -> None:
        self.stream = stream
        self.display = display
        self.task = task
        self.failed = 0

    def advance(self, done: int, failed: int) -> None:
        """`done` more paths finished, `failed` of them unread."""
        self.failed += failed
        if self.display is not None and self.task is not None:
            self.display.update(self.task, advance=done, failed=self.failed)

    def say(self, line: str) -> None:
        """A line on stderr (a path's error), above the bar when one is drawn."""
        if self.display is not None:
            self.display.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=self.stream, flush=True)


@contextmanager
def paths_progress(total: int, stream: TextIO | None = None) -> Iterator[PathsProgress]:
    """A bar of paths done for an inspect of more than one path, drawn only when `stream` (stderr) is a terminal."""
    stream = stream if stream is not None else sys.stderr
    if total < 2 or not stream.isatty():
        yield PathsProgress(stream)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as RichProgress

    display = RichProgress(
        TextColumn("paths"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[failed]} failed"),
        TimeElapsedColumn(), TimeRemainingColumn(),
        console=Console(file=stream, markup=False, emoji=False), transient=True, redirect_stdout=False,
        redirect_stderr=False,
    )
    task = display.add_task("paths", total=total, failed=0)
    with display:
        yield PathsProgress(stream, display, task)
