"""The formats `memlayout diff --format` writes, and the one mapping to their renderers."""

from __future__ import annotations

import enum

from memlayout.diff.changes import DiffReport


class DiffFormat(str, enum.Enum):
    """The names `diff --format` accepts."""

    TABLE = "table"
    JSON = "json"
    MARKDOWN = "markdown"


def render_diff(diff: DiffReport, fmt: DiffFormat, width: int = 120, color: bool = False) -> str:
    """Render `diff` in `fmt`; one exhaustive mapping from format to renderer."""
    if fmt is DiffFormat.TABLE:
        from memlayout.diff.table import render_diff_table

        return render_diff_table(diff, width=width, color=color)
    if fmt is DiffFormat.JSON:
        from memlayout.diff.json_report import render_diff_json

        return render_diff_json(diff)
    if fmt is DiffFormat.MARKDOWN:
        from memlayout.diff.markdown import render_diff_markdown

        return render_diff_markdown(diff)
    raise AssertionError(f"unhandled diff format {fmt}")
