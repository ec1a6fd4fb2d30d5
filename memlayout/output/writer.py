"""The one writer of command output: stdout, or a file replaced atomically.

Every report, page and baseline a command writes goes through `write_output`, so
that a file named with `-o`, `--html` or `--write-baseline` is the old file or
the whole new one, never a part: a formatter that fails halfway, a full disk or
an interrupt leaves it as it was (`memlayout.io.atomic_write`). While the CLI
runs, stdout is a `QuietStdout`: a reader that leaves early is no error.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable
from typing import Any, TextIO


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
        stdout = sys.stdout
        for piece in pieces:
            if isinstance(stdout, QuietStdout) and stdout.reader_left:
                return  # nobody reads the rest: it is not rendered
            stdout.write(piece)
        return
    # Imported here: printing to stdout, the common case, needs none of it.
    from memlayout.io.atomic_write import atomic_file

    with atomic_file(path) as output, output.open() as stream:
        for piece in pieces:
            stream.write(piece.encode("utf-8"))


def write_binary(data: bytes, path: str) -> None:
    """Write `data` atomically to `path` (a picture, a pickle): the old file or the whole new one.

    Raises:
        OutputError: `path` cannot be written; it is left as it was.
    """
    from memlayout.io.atomic_write import atomic_file

    with atomic_file(path) as output, output.open() as stream:
        stream.write(data)


class LineWriter:
    """Lines written as they are made (JSON Lines), to stdout or a file, each whole in one write.

    A report streamed path by path cannot replace its file atomically at the end
    without losing everything when the run is stopped halfway: FILE is truncated
    when the writer opens and grows a whole line at a time (one `write` of the
    line's bytes, which a kill does not split on a local file), so it always
    parses line by line. Every other report replaces its file whole
    (`write_output`). A symlink is followed, a FIFO or device written into.

    Raises:
        OutputError: the file cannot be opened or written.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.fd: int | None = None
        if path is not None:
            try:
                self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666)
            except OSError as exc:
                from memlayout.io.atomic_write.write_errors import write_error

                raise write_error(path, exc) from None

    def write(self, line: str) -> None:
        """One line (ending with a newline), written whole."""
        if self.fd is None:
            self._print(line)
            return
        data = memoryview(line.encode("utf-8"))
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError as exc:
            from memlayout.io.atomic_write.write_errors import write_error

            raise write_error(str(self.path), exc) from None

    def _print(self, line: str) -> None:
        stdout = sys.stdout
        if isinstance(stdout, QuietStdout) and stdout.reader_left:
            return
        try:
            descriptor = stdout.fileno()
        except (AttributeError, OSError, ValueError):  # a captured stdout (tests, notebooks)
            stdout.write(line)
            return
        stdout.flush()
        data = memoryview(line.encode("utf-8"))
        try:
            while data:
                data = data[os.write(descriptor, data):]
        except BrokenPipeError:
            if not isinstance(stdout, QuietStdout):
                raise
            stdout._reader_has_left()  # the reader left: the rest goes nowhere, and nothing fails

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> LineWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class QuietStdout:
    """`sys.stdout` while the CLI runs: a reader that closes the pipe early silences it, and nothing fails.

    A reader that stops early (`memlayout inspect ... | head`, a pager quit) is no
    error of the command: as `grep` and `ruff` do, nothing is said on stderr, and
    the command ends with the exit status its results give, as if everything had
    been read (docs/exit-status.md). On the first EPIPE, stdout's descriptor is
    pointed at /dev/null, as Python's note on SIGPIPE advises, so that neither a
    later write nor the flush at exit fails again; any other write error still
    raises. Everything else is the wrapped stream's.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.reader_left = False
        """The reader closed the pipe; what is written now goes nowhere."""

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._reader_has_left()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._reader_has_left()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def _reader_has_left(self) -> None:
        self.reader_left = True
        with contextlib.suppress(AttributeError, OSError, ValueError):  # no descriptor (a test's capture)
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self.stream.fileno())
            finally:
                os.close(devnull)
