"""What every reporter is: a `BatchReport` in, text out. Adding a format is adding a file.

Reporters read findings and facts and return a string; they never print, and
nothing here imports torch. Which class renders which `--format` is decided in one
place, `memlayout.report.reporter_for`.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator

from memlayout.pipeline.batch import BatchReport
from memlayout.rules import Finding, Severity


class Reporter(abc.ABC):
    """Turns the result of one `memlayout inspect` call into the text of one format."""

    @abc.abstractmethod
    def render(self, batch: BatchReport) -> str:
        """The whole output for `batch`, ending with a newline.

        Args:
            batch: Every path of the call: reports, load errors and the baseline's effect.

        Returns:
            The text to print or write; never printed here.
        """

    def render_pieces(self, batch: BatchReport) -> Iterator[str]:
        """The same text as `render`, in consecutive pieces, for output written as it is made.

        A reporter whose output grows with the tensor count (JSON lists every
        tensor) overrides this, so that the whole text is never held at once.
        """
        yield self.render(batch)


def findings_in_order(findings: Iterable[Finding]) -> list[Finding]:
    """Worst first, then by code and tensors: the order every reporter lists findings in."""
    return sorted(findings, key=lambda f: (-f.severity.rank, f.code, f.tensors))


def count_phrase(counts: dict[str, int]) -> str:
    """`{"error": 0, "warning": 4, "info": 1}` -> "0 error, 4 warning, 1 info", as the table's summary says it."""
    return ", ".join(f"{counts.get(severity.value, 0)} {severity.value}" for severity in Severity)
