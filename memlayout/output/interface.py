"""What every formatter is: a result in, text out. Adding a format is adding a file.

A formatter reads a command's result (inspect's `BatchReport`, diff's
`DiffReport`, activations' `ActivationReport`) and returns a string; it never
prints and never writes. Which formatter renders which `--format` for which
command is decided in one place, `memlayout.cli.formats.to_format`; where the text
goes is decided by the one writer, `memlayout.output.writer.write_output`.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Generic, TypeVar

Result = TypeVar("Result", contravariant=True)


class Formatter(abc.ABC, Generic[Result]):
    """Turns one command's result into the text of one format."""

    @abc.abstractmethod
    def render(self, result: Result) -> str:
        """The whole output for `result`; a text format's ends with a newline (a page with `</html>`).

        Args:
            result: What the command computed.

        Returns:
            The text to print or write; never printed here.
        """

    def render_pieces(self, result: Result) -> Iterator[str]:
        """The same text as `render`, in consecutive pieces, for output written as it is made.

        A formatter whose output grows with the tensor count (JSON lists every
        tensor) overrides this, so that the whole text is never held at once.
        """
        yield self.render(result)
