"""Reporters: each turns a `BatchReport` into text and never prints.

`OutputFormat` is what `--format` accepts (typer validates it), and `reporter_for`
is the one exhaustive mapping from a format to its reporter.
"""

from __future__ import annotations

import enum
import sys
from typing import TYPE_CHECKING

if sys.version_info >= (3, 11):
    from typing import assert_never
else:  # pragma: no cover - Python 3.10
    from typing_extensions import assert_never

if TYPE_CHECKING:
    from memlayout.pipeline.inspection import Report
    from memlayout.report.interface import Reporter


class OutputFormat(str, enum.Enum):
    """The names `--format` accepts."""

    TABLE = "table"
    """The rich terminal report."""
    JSON = "json"
    """Schema 1 for one path, schema 2 (one schema-1 report per path) for several."""
    SARIF = "sarif"
    """SARIF 2.1.0, for code-scanning dashboards."""
    GITHUB = "github"
    """GitHub Actions workflow commands: one annotation per finding."""
    MARKDOWN = "markdown"
    """A compact report for a pull-request comment."""
    JUNIT = "junit"
    """JUnit XML: a testsuite per checkpoint, a testcase per rule."""


def reporter_for(fmt: OutputFormat, *, width: int = 120, color: bool = False, show_all: bool = False) -> Reporter:
    """The reporter for `fmt`; every format has exactly one.

    Args:
        fmt: The format asked for.
        width: Line width of the terminal table.
        color: ANSI colors in the terminal table.
        show_all: The terminal table lists every storage and every finding (`--all`).

    Returns:
        A `Reporter` whose `render` gives the text.
    """
    # Imported here, so that one format's dependencies cost nothing to the others.
    if fmt is OutputFormat.TABLE:
        from memlayout.report.table import TableReporter

        return TableReporter(width=width, color=color, show_all=show_all)
    if fmt is OutputFormat.JSON:
        from memlayout.report.json_report import JsonReporter

        return JsonReporter()
    if fmt is OutputFormat.SARIF:
        from memlayout.report.sarif import SarifReporter

        return SarifReporter()
    if fmt is OutputFormat.GITHUB:
        from memlayout.report.github import GithubReporter

        return GithubReporter()
    if fmt is OutputFormat.MARKDOWN:
        from memlayout.report.markdown import MarkdownReporter

        return MarkdownReporter()
    if fmt is OutputFormat.JUNIT:
        from memlayout.report.junit import JunitReporter

        return JunitReporter()
    assert_never(fmt)


def render(report: Report, fmt: OutputFormat, width: int = 120, color: bool = False) -> str:
    """Render one `Report` (a library call's result) in `fmt`.

    Args:
        report: What `memlayout.inspect` returned.
        fmt: The format.
        width: Line width of the terminal table.
        color: ANSI colors in the terminal table.

    Returns:
        The text, as `memlayout inspect` would print it for that one path.
    """
    from memlayout.pipeline.batch import BatchReport, PathReport

    path = report.facts.source.path or "(object)"
    return reporter_for(fmt, width=width, color=color).render(BatchReport((PathReport(path, report=report),)))
