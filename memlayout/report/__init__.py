"""Reporters: each turns a `Report` into text and never prints."""

from __future__ import annotations

import enum

from memlayout.inspection import Report


class OutputFormat(str, enum.Enum):
    """The names `--format` accepts."""

    TABLE = "table"
    JSON = "json"


def render(report: Report, fmt: OutputFormat, width: int = 120, color: bool = False) -> str:
    """Render `report` in `fmt`; one exhaustive mapping from format to formatter."""
    if fmt is OutputFormat.TABLE:
        from memlayout.report.table import render_table

        return render_table(report, width=width, color=color)
    if fmt is OutputFormat.JSON:
        from memlayout.report.json_report import render_json

        return render_json(report)
    raise AssertionError(f"unhandled output format {fmt}")
