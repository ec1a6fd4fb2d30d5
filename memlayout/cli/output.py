"""Where command output goes: stdout or a file, and progress on stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from memlayout.io.atomic_write import atomic_file


def write_output(text: str | Iterable[str], path: str | None) -> None:
    """Print `text`, or write it atomically to `path` (never a half-written report).

    `text` may come in pieces (a reporter's `render_pieces`): each is written as it
    comes, so a large report is never held whole.
    """
    pieces = (text,) if isinstance(text, str) else text
    if path is None:
        for piece in pieces:
            sys.stdout.write(piece)
        return
    with atomic_file(path) as output, output.open() as stream:
        for piece in pieces:
            stream.write(piece.encode("utf-8"))


@contextmanager
def progress_callback(enabled: bool) -> Iterator[Callable[[str, int, int], None] | None]:
    """A rich progress bar on stderr when it is a terminal; None otherwise."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TaskID,
        TextColumn,
        TransferSpeedColumn,
    )

    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        console=Console(stderr=True), transient=True,
    )
    tasks: dict[str, TaskID] = {}

    def update(description: str, done: int, total: int) -> None:
        if description not in tasks:
            tasks[description] = progress.add_task(description, total=total)
        progress.update(tasks[description], completed=done, total=total)

    with progress:
        yield update
