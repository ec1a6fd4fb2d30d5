"""The diff for a terminal (rich): both sides' totals side by side, then the changes."""

from __future__ import annotations

import io

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from memlayout.diff.changes import DiffReport
from memlayout.diff.grouping import change_lines
from memlayout.format_bytes import human_bytes
from memlayout.output.interface import Formatter
from memlayout.output.terminal import text_console
from memlayout.pipeline.inspection import Summary
from memlayout.rules import Severity

SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}

# (label, Summary field, whether it counts bytes)
SUMMARY_ROWS = (
    ("tensors", "tensors", False),
    ("names", "names", False),
    ("storages", "storages", False),
    ("tensor bytes", "tensor_bytes", True),
    ("storage bytes", "storage_bytes", True),
    ("unique bytes", "unique_bytes", True),
    ("wasted bytes", "wasted_bytes", True),
    ("padding bytes", "padding_bytes", True),
)


def delta(before: int, after: int, as_bytes: bool) -> str:
    """"+1.5 KiB", "-3", or "" when equal."""
    if before == after:
        return ""
    change = after - before
    sign = "+" if change > 0 else "-"
    return sign + (human_bytes(abs(change)) if as_bytes else str(abs(change)))


def _totals(a: Summary, b: Summary) -> Table:
    table = Table(box=None, padding=(0, 2), show_edge=False)
    for column, justify in (("", "left"), ("A", "right"), ("B", "right"), ("change", "right")):
        table.add_column(column, justify=justify, style="bold" if not column else None)  # type: ignore[arg-type]
    for label, field, as_bytes in SUMMARY_ROWS:
        before, after = getattr(a, field), getattr(b, field)
        show = human_bytes if as_bytes else str
        table.add_row(label, show(before), show(after), delta(before, after, as_bytes))
    findings = [f"{s.findings.get(sev.value, 0)}" for s in (a, b) for sev in Severity]
    table.add_row("findings (e/w/i)", "/".join(findings[:3]), "/".join(findings[3:]), "")
    return table


def _changes(diff: DiffReport) -> Group | Text:
    if not diff.changes:
        return Text("no changes", "green")
    lines: list[Text] = []
    for line in change_lines(diff.changes):
        text = Text()
        text.append(f"{line.severity.value:<7} ", SEVERITY_STYLE[line.severity])
        text.append(f"{line.kind.value}: ", "bold")
        text.append(line.text)
        lines.append(text)
    return Group(*lines)


def render_diff_table(diff: DiffReport, width: int = 120, color: bool = False) -> str:
    """The rich diff as text; ANSI colors only when `color` is set."""
    buffer = io.StringIO()
    console = text_console(buffer, width, color)
    header = Table.grid(padding=(0, 1))
    header.add_column(style="bold")
    header.add_column()
    for label, report in (("A", diff.a), ("B", diff.b)):
        source = report.facts.source
        header.add_row(label, Text(f"{source.path or '(object)'} [{source.format}]"))
    counts = diff.counts()
    verdict = Text(f"{diff.matched} names matched; ")
    for index, severity in enumerate(Severity):
        verdict.append(f"{counts[severity.value]} {severity.value}", SEVERITY_STYLE[severity])
        verdict.append(", " if index < len(Severity) - 1 else "")
    body = Group(header, Text(""), _totals(diff.a.summary, diff.b.summary), Text(""), verdict)
    console.print(Panel(body, title="memlayout diff", title_align="left", expand=False))
    console.print(Text("changes", "bold"))
    console.print(_changes(diff))
    return buffer.getvalue()


class DiffTable(Formatter[DiffReport]):
    """The diff for a terminal: both sides' totals, then the changes."""

    def __init__(self, width: int = 120, color: bool = False) -> None:
        self.width = width
        self.color = color

    def render(self, diff: DiffReport) -> str:
        return render_diff_table(diff, width=self.width, color=self.color)
