"""The diff as GitHub-flavoured markdown, for a pull-request comment or a release note."""

from __future__ import annotations

from memlayout.diff.changes import DiffReport
from memlayout.diff.grouping import change_lines
from memlayout.diff.table import SUMMARY_ROWS, delta
from memlayout.format_bytes import human_bytes
from memlayout.output.interface import Formatter
from memlayout.rules import Severity

_ICON = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "info"}


def _cell(text: str) -> str:
    # A pipe ends a cell and a newline ends the row; backticks would start code spans.
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("`", "\\`")


def render_diff_markdown(diff: DiffReport) -> str:
    """Summary table (A, B, change) and the changes, most severe first."""
    a, b = diff.a.facts.source, diff.b.facts.source
    counts = diff.counts()
    out = [
        "## memlayout diff",
        "",
        f"- **A**: `{_cell(a.path or '(object)')}` ({a.format})",
        f"- **B**: `{_cell(b.path or '(object)')}` ({b.format})",
        f"- {diff.matched} names matched; "
        + ", ".join(f"{counts[s.value]} {s.value}" for s in Severity),
        "",
        "| | A | B | change |",
        "|---|---:|---:|---:|",
    ]
    for label, field, as_bytes in SUMMARY_ROWS:
        before, after = getattr(diff.a.summary, field), getattr(diff.b.summary, field)
        show = human_bytes if as_bytes else str
        out.append(f"| {label} | {show(before)} | {show(after)} | {delta(before, after, as_bytes)} |")
    out.append("")
    if not diff.changes:
        out += ["No changes.", ""]
        return "\n".join(out)
    out += ["| severity | change | details |", "|---|---|---|"]
    for line in change_lines(diff.changes):
        out.append(f"| {_ICON[line.severity]} | {line.kind.value} | {_cell(line.text)} |")
    out.append("")
    return "\n".join(out)


class DiffMarkdown(Formatter[DiffReport]):
    """The diff for a pull-request comment."""

    def render(self, diff: DiffReport) -> str:
        return render_diff_markdown(diff)
