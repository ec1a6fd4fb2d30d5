"""The one registry of output formats: every `--format` name, and what renders it for each command.

`OutputFormat` is every name a `--format` accepts, and `to_format` the one
exhaustive mapping from a name to its formatters (as pip-audit's
`OutputFormatChoice.to_format`): one per command that writes that format, None
for a command that does not. Each command's `--format` accepts exactly the names
this registry gives it (`memlayout.cli.options.format_option`), and `--html FILE`
is the `html` format written beside the report.

Adding a format: its formatter, one file beside the results it renders (a
`memlayout.output.interface.Formatter`), a member of `OutputFormat`, and its
branch in `to_format`, which mypy checks is there (`assert_never`).

Formatters are imported only when a command asks for one, so that a command loads
nothing of another's (the factories below), and nothing here prints or writes:
the text goes to `memlayout.output.writer.write_output`.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from memlayout.errors import UsageError

if sys.version_info >= (3, 11):
    from typing import assert_never
else:  # pragma: no cover - Python 3.10
    from typing_extensions import assert_never

if TYPE_CHECKING:
    from memlayout.activations.analysis import ActivationReport
    from memlayout.activations.fit.size_search import FitReport
    from memlayout.activations.fit.sweep import SweepReport
    from memlayout.activations.ranks.facts import RanksReport
    from memlayout.activations.weights import WeightsReport
    from memlayout.diff.changes import DiffReport
    from memlayout.output.interface import Formatter
    from memlayout.pipeline.batch import BatchReport

R = TypeVar("R")


class OutputFormat(str, enum.Enum):
    """Every name a `--format` accepts; each command takes those `to_format` gives it a formatter for."""

    TABLE = "table"
    """The rich terminal report."""
    JSON = "json"
    """A versioned JSON document (the schemas beside each command's formatters)."""
    SARIF = "sarif"
    """SARIF 2.1.0, for code-scanning dashboards."""
    GITHUB = "github"
    """GitHub Actions workflow commands: one annotation per finding."""
    MARKDOWN = "markdown"
    """A compact report for a pull-request comment."""
    JUNIT = "junit"
    """JUnit XML: a testsuite per checkpoint, a testcase per rule."""
    HTML = "html"
    """The self-contained storage map page (what `--html FILE` writes)."""
    JSONL = "jsonl"
    """JSON Lines: one line per path, written as each path finishes (memlayout.report.json_lines)."""


class Command(str, enum.Enum):
    """The commands that write a report, each rendering its own kind of result."""

    INSPECT = "inspect"
    DIFF = "diff"
    ACTIVATIONS = "activations"


class RenderOptions(NamedTuple):
    """How the terminal formats lay out their text; the other formats ignore them."""

    width: int = 120
    """Line width of a table."""
    color: bool = False
    """ANSI colors in a table (`terminal_color`)."""
    show_all: bool = False
    """inspect's table lists every storage and every finding (`--all`)."""
    depth: int = 3
    """activations' table shows modules down to this depth (`--depth`)."""


class Format(NamedTuple):
    """One `--format` name: the formatter each command renders it with; None where a command has none."""

    inspect: Callable[[RenderOptions], Formatter[BatchReport]] | None = None
    diff: Callable[[RenderOptions], Formatter[DiffReport]] | None = None
    activations: Callable[[RenderOptions], Formatter[ActivationReport | RanksReport | FitReport | SweepReport | WeightsReport]] | None = None

    def of(self, command: Command) -> Callable[[RenderOptions], Formatter[Any]] | None:
        """The formatter factory `command` renders this format with; None where it has none."""
        make: Callable[[RenderOptions], Formatter[Any]] | None = getattr(self, command.value)
        return make

    def commands(self) -> tuple[Command, ...]:
        """The commands that write this format."""
        given = ((Command.INSPECT, self.inspect), (Command.DIFF, self.diff), (Command.ACTIVATIONS, self.activations))
        return tuple(command for command, make in given if make is not None)


def to_format(fmt: OutputFormat) -> Format:
    """The formatters of `fmt`, for each command that writes it: the one mapping, every name a branch.

    Args:
        fmt: The format asked for.

    Returns:
        A `Format`: for each command, a function that builds its formatter from
        `RenderOptions`, or None when the command does not write `fmt`.
    """
    if fmt is OutputFormat.TABLE:
        return Format(inspect=_inspect_table, diff=_diff_table, activations=_activations_table)
    if fmt is OutputFormat.JSON:
        return Format(inspect=_inspect_json, diff=_diff_json, activations=_activations_json)
    if fmt is OutputFormat.SARIF:
        return Format(inspect=_inspect_sarif)
    if fmt is OutputFormat.GITHUB:
        return Format(inspect=_inspect_github)
    if fmt is OutputFormat.MARKDOWN:
        return Format(inspect=_inspect_markdown, diff=_diff_markdown)
    if fmt is OutputFormat.JUNIT:
        return Format(inspect=_inspect_junit)
    if fmt is OutputFormat.HTML:
        return Format(inspect=_inspect_html, diff=_diff_html)
    if fmt is OutputFormat.JSONL:
        return Format(inspect=_inspect_json_lines)
    assert_never(fmt)


def formats_for(command: Command) -> tuple[OutputFormat, ...]:
    """The names `command`'s `--format` accepts, in `OutputFormat`'s order."""
    return tuple(fmt for fmt in OutputFormat if command in to_format(fmt).commands())


def supported(make: Callable[[RenderOptions], Formatter[R]] | None, fmt: OutputFormat, command: Command) -> (
    Callable[[RenderOptions], Formatter[R]]
):
    """`make`, the formatter factory `to_format(fmt)` gave `command`; a usage error when it gave none.

    Raises:
        UsageError: `command` does not write `fmt`, naming the formats it does.
    """
    if make is None:
        names = ", ".join(f.value for f in formats_for(command))
        raise UsageError(f"{command.value} does not write --format {fmt.value}", f"it writes {names}")
    return make


def write_reports(
    command: Command, result: Any, render: RenderOptions, fmt: OutputFormat, output: str | None, html: str | None,
) -> None:
    """Write `--html`'s page, then the `--format` report, each rendered as it is written.

    The page first: a --html path that cannot be written ends the command with its
    one error line before any report is printed.

    Raises:
        UsageError: `command` does not write `fmt`.
        OutputError: a file cannot be written.
    """
    from memlayout.output.writer import write_output

    if html is not None:
        page = supported(to_format(OutputFormat.HTML).of(command), OutputFormat.HTML, command)
        write_output(page(render).render_pieces(result), html)
    formatter = supported(to_format(fmt).of(command), fmt, command)(render)
    write_output(formatter.render_pieces(result), output)


def terminal_color(fmt: OutputFormat, output: str | None) -> bool:
    """ANSI colors only for a table printed to a terminal; never in a file or a pipe."""
    return output is None and fmt is OutputFormat.TABLE and sys.stdout.isatty()


# The factories: each imports its formatter only when called.


def _inspect_table(options: RenderOptions) -> Formatter[BatchReport]:
    from memlayout.report.table import TableReporter

    return TableReporter(width=options.width, color=options.color, show_all=options.show_all)


def _inspect_json(options: RenderOptions) -> Formatter[BatchReport]:
    from memlayout.report.json_report import JsonReporter

    return JsonReporter()


def _inspect_json_lines(options: RenderOptions) -> Formatter[BatchReport]:
    from memlayout.report.json_lines import JsonLinesReporter

    return JsonLinesReporter()


def _inspect_sarif(options: RenderOptions) -> Formatter[BatchReport]:
    from memlayout.report.sarif import SarifReporter

    return SarifReporter()


def _inspect_github(options: RenderOptions) -> Formatter[BatchReport]:
    from memlayout.report.github import GithubReporter

    return GithubReporter()


def _inspect_markdown(options: RenderOptions) -> Formatter[BatchReport]:
    from memlayout.report.markdown import MarkdownReporter

    return MarkdownReporter()


def _inspect_junit(options: RenderOptions) -> Formatter[BatchReport]:
    from memlayout.report.junit import JunitReporter

    return JunitReporter()


def _inspect_html(options: RenderOptions) -> Formatter[BatchReport]:
    from memlayout.report.html import HtmlReporter

    return HtmlReporter()


def _diff_table(options: RenderOptions) -> Formatter[DiffReport]:
    from memlayout.diff.table import DiffTable

    return DiffTable(width=options.width, color=options.color)


def _diff_json(options: RenderOptions) -> Formatter[DiffReport]:
    from memlayout.diff.json_report import DiffJson

    return DiffJson()


def _diff_markdown(options: RenderOptions) -> Formatter[DiffReport]:
    from memlayout.diff.markdown import DiffMarkdown

    return DiffMarkdown()


def _diff_html(options: RenderOptions) -> Formatter[DiffReport]:
    from memlayout.diff.html import DiffHtml

    return DiffHtml()


def _activations_table(options: RenderOptions) -> Formatter[ActivationReport | RanksReport | FitReport | SweepReport | WeightsReport]:
    from memlayout.activations.report.table import ActivationsTable

    return ActivationsTable(depth=options.depth, width=options.width, color=options.color)


def _activations_json(options: RenderOptions) -> Formatter[ActivationReport | RanksReport | FitReport | SweepReport | WeightsReport]:
    from memlayout.activations.report.json_report import ActivationsJson

    return ActivationsJson()
