"""`memlayout activations --sweep`'s report: the table and the JSON of a `SweepReport`. Never printed here.

The JSON is the activations report (schema 1) of the plain step at the sweep's smallest
size, with `sweep` (one object per size) and `sweep_of` (what each size was compared
with, and how it was predicted) added, and `fit` with `--fit`.
"""

from __future__ import annotations

import io
import textwrap
from typing import Any

from memlayout.activations.fit.sweep import EVALUATED, FAILED, SweepPlan, SweepReport, SweepRow
from memlayout.activations.report.fit import fit_dict, seconds_text
from memlayout.activations.report.json_parts import model_text, plan_dict
from memlayout.format_bytes import human_bytes


def sweep_rows(report: SweepReport) -> list[dict[str, Any]]:
    """`sweep`: one object per size, ascending."""
    return [_row_dict(row) for row in report.rows]


def _row_dict(row: SweepRow) -> dict[str, Any]:
    return {
        "size": row.size,
        "source": row.source,
        "peak_bytes": row.peak_bytes,
        "allocator_peak_bytes": row.allocator_peak_bytes,
        "reserved_peak_bytes": row.reserved_peak_bytes,
        "compared_bytes": row.compared_bytes,
        "fits": row.fits,
        "failure": row.failure,
        "plan": None if row.plan is None else _plan(row.plan),
    }


def _plan(plan: SweepPlan) -> dict[str, Any]:
    result = plan.result
    return {
        "found": plan.found,
        "peak_bytes": None if result is None else result.peak_bytes,
        "compared_bytes": None if result is None else result.judged_bytes,
        "failure": plan.failure,
        "plan": None if result is None else plan_dict(result),
    }


def sweep_of_dict(report: SweepReport) -> dict[str, Any]:
    """`sweep_of`: the axis and dimensions scaled, what each size is compared with, and how each was predicted."""
    return {
        "axis": report.axis,
        "dims": [{"input": d.input, "dim": d.dim} for d in report.dims],
        "budget_bytes": report.budget_bytes,
        "budget_from": report.budget_from,
        "compared": report.compared,
        "card_bytes": report.card_bytes,
        "card": report.card,
        "planned": report.planned,
        "traced_sizes": list(report.traced_sizes),
        "evaluated_sizes": list(report.evaluated_sizes),
        "how": report.how,
    }


def sweep_json_parts(report: SweepReport) -> dict[str, Any]:
    """The keys a sweep adds to the step's report: `sweep`, `sweep_of`, and `fit` with `--fit`."""
    parts: dict[str, Any] = {"sweep": sweep_rows(report), "sweep_of": sweep_of_dict(report)}
    if report.fit is not None:
        parts["fit"] = fit_dict(report.fit)
    return parts


def render_sweep_table(report: SweepReport, *, width: int = 120, color: bool = False) -> str:
    """The terminal report: what was scaled and compared, one row per size, how each was predicted, and the fit."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from memlayout.output.terminal import text_console

    step = report.report
    lines = [
        f"memlayout activations --sweep {report.axis}: {step.target or step.model_class}",
        f"  model       {model_text(step.model_class, step.class_chosen_by)}",
        f"  scaled      {'; '.join(f'{d.input} dim {d.dim}' for d in report.dims)}",
    ]
    if report.budget_bytes is not None:
        lines.append(f"  budget      {human_bytes(report.budget_bytes)} ({report.budget_from})")
    if report.card_bytes is not None:
        lines.append(f"  card        {report.card}: {human_bytes(report.card_bytes)} (torch's total_memory)")
    lines.append(f"  compared    {report.compared}")
    table = Table(box=None, pad_edge=False, show_edge=False)
    cuda = any(row.reserved_peak_bytes is not None for row in report.rows)
    columns = [report.axis, "peak", *(("allocated", "reserved") if cuda else ()), "compared", "fits"]
    if report.planned:
        columns.extend(("with a plan", "checkpointed"))
    columns.append("how")
    for name in columns:
        table.add_column(name, justify="left" if name in ("how", "fits", "checkpointed") else "right")
    for row in report.rows:
        table.add_row(*_cells(row, cuda, report.planned))
    parts: list[Any] = [Text("\n".join(lines)), table]
    tail = [("how", report.how)]
    if report.fit is not None:
        tail.extend(_fit_fields(report))
    tail.extend(("note", note) for note in step.notes)
    parts.append(Text("\n".join(textwrap.fill(text, width=width, initial_indent=f"  {name:<12}",
                                              subsequent_indent=" " * 14) for name, text in tail)))
    buffer = io.StringIO()
    console = text_console(buffer, width, color, color_system="standard")
    console.print(Group(*parts))
    return buffer.getvalue()


def _cells(row: SweepRow, cuda: bool, planned: bool) -> list[str]:
    if row.source == FAILED:
        cells = [str(row.size), "-", *(("-", "-") if cuda else ()), "-", "failed"]
        if planned:
            cells.extend(("-", ""))
        return [*cells, row.failure or ""]
    fits = "" if row.fits is None else "yes" if row.fits else "no"
    cells = [str(row.size), _size(row.peak_bytes)]
    if cuda:
        cells.extend((_size(row.allocator_peak_bytes), _size(row.reserved_peak_bytes)))
    cells.extend((_size(row.compared_bytes), fits))
    if planned:
        cells.extend(_plan_cells(row))
    cells.append("evaluated" if row.source == EVALUATED else "traced")
    return cells


def _plan_cells(row: SweepRow) -> tuple[str, str]:
    if row.plan is None:
        return ("not needed", "") if row.fits else ("-", "")
    result = row.plan.result
    if result is None:
        return "failed", row.plan.failure or ""
    figure = _size(result.judged_bytes)
    if not row.plan.found:
        return f"none; lowest {figure}", ""
    checkpointed = len(result.plan.checkpoint)
    return figure, f"{checkpointed} module{'s' if checkpointed != 1 else ''}, {seconds_text(result.recompute_seconds)}"


def _fit_fields(report: SweepReport) -> list[tuple[str, str]]:
    fit = report.fit
    assert fit is not None
    fields = [("fit", f"{fit.axis} {fit.without_plan.size} without a plan")]
    if fit.with_plan is not None:
        fields.append(("fit", f"{fit.axis} {fit.with_plan.size} with the budget search's plan"))
    return fields


def _size(count: int | None) -> str:
    return "-" if count is None else human_bytes(count)
