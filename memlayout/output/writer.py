"""The one writer of command output: stdout, or a file replaced atomically.

Every report, page and baseline a command writes goes through `write_output`, so
that a file named with `-o`, `--html` or `--write-baseline` is the old file or
the whole new one, never a part: a formatter that fails halfway, a full disk or
an interrupt leaves it as it was (`memlayout.io.atomic_write`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable


def write_output(text: str | Iterable[str], path: str | None) -> None:
    """Print `text`, or write it atomically to `path`.

    Args:
        text: The whole text, or its pieces (a formatter's `render_pieces`): each
            is written as it comes, so a large report is never held whole.
        path: The file to write; None for stdout.

    Raises:
        OutputError: `path` cannot be written; it is left as it was.
    """
    pieces = (text,) if isinstance(text, str) else text
    if path is None:
        for piece in pieces:
            sys.stdout.write(piece)
        return
    # Imported here: printing to stdout, the common case, needs none of it.
    from memlayout.io.atomic_write import atomic_file

    with atomic_file(path) as output, output.open() as stream:
        for piece in pieces:
            stream.write(piece.encode("utf-8"))
