"""`memlayout activations --weights` (or without inputs): the table and the JSON, never printed here.

The JSON is its own report, `"report": "activations-weights"`, published as
`memlayout/activations/weights_schema_v1.json`; within a version keys are only added.
"""

from __future__ import annotations

import io
import shlex
import textwrap
from typing import Any

from memlayout.activations.report.json_parts import SCHEMA_VERSION, model_text
from memlayout.activations.weights import WeightsReport
from memlayout.format_bytes import human_bytes
from memlayout.version import __version__

REPORT = "activations-weights"
NOT_TRAINED = "-"
"""What a quantized row shows under training: quantized weights do not train."""


def activations_hint(report: WeightsReport) -> tuple[str, str]:
    """What the report says of activations (not counted), and the command that traces them."""
    target = shlex.quote(report.target) if report.target else "TARGET"
    if report.suggested_inputs:
        flags = " ".join(f"--input {shlex.quote(spec)}" for spec in report.suggested_inputs)
        source = f"with the inputs read off {report.model_class}'s config"
    else:
        flags, source = ("--input DTYPE[SHAPE] ...",
                         "giving each input (e.g. --input 'int64[4,128]<50257' for token ids)")
    return (f"activations are not counted: they depend on the batch; trace a step for them, {source}",
            f"memlayout activations {target} {flags}")


def render_weights_table(report: WeightsReport, *, width: int = 120, color: bool = False) -> str:
    """The terminal report: what was counted, one row per dtype, and what activations need."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    from memlayout.output.terminal import text_console

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    if report.model_class is not None:
        grid.add_row("model", model_text(report.model_class, report.class_chosen_by))
    grid.add_row("counted from", report.counted_from + (f" ({report.format})" if report.format else ""))
    trainable = ("all trainable" if report.trainable_parameters == report.parameters
                 else f"{report.trainable_parameters:,} trainable")
    grid.add_row("parameters", f"{report.parameters:,} in {report.parameter_tensors:,} tensors, {trainable}; "
                               "a tied weight counted once")
    grid.add_row("buffers", f"{report.buffers:,} elements in {report.buffer_tensors:,} tensors")
    grid.add_row("as built" if report.model_class is not None else "as stored",
                 f"{human_bytes(report.as_built_bytes)}: " + ", ".join(
                     f"{dtype} ({count:,} elements)" for dtype, count, _ in report.as_built))
    title = f"memlayout activations --weights: {report.target or report.model_class}"
    parts: list[Any] = [Panel(grid, title=title, title_align="left", expand=False)]
    table = Table(title=f"by dtype: the weights, and training's fixed costs with {report.optimizer}",
                  title_justify="left")
    for name in ("dtype", "weights", "gradients", "optimizer state", "training total"):
        table.add_column(name, justify="left" if name == "dtype" else "right")
    for row in report.rows:
        t = row.training
        table.add_row(row.label, human_bytes(row.weights_bytes),
                      *((human_bytes(t.gradient_bytes), human_bytes(t.optimizer_bytes), human_bytes(t.total_bytes))
                        if t is not None else (NOT_TRAINED,) * 3))
    parts.append(table)
    why, command = activations_hint(report)
    for note in (*report.notes, _rows_note(report), f"{why}:"):
        parts.append(Text(textwrap.fill(note, width=width, initial_indent="note: ", subsequent_indent="      ",
                                        break_on_hyphens=False, break_long_words=False)))
    buffer = io.StringIO()
    console = text_console(buffer, width, color, color_system="standard")
    console.print(Group(*parts))
    console.print(f"  {command}", soft_wrap=True, markup=False, highlight=False)  # one line, to copy whole
    return buffer.getvalue()


def _rows_note(report: WeightsReport) -> str:
    return ("the 16-bit row trains in that dtype (--dtype bf16: torch keeps the optimizer's state in the parameters' "
            "dtype); mixed precision (--autocast) keeps float32 weights, gradients and state, the float32 row. int8 "
            "and int4 hold the weights' data alone, floating buffers in 16 bits: a quantization library adds its "
            "scales and keeps some layers in 16 bits, and quantized weights do not train")


def weights_report_dict(report: WeightsReport) -> dict[str, Any]:
    """The report as plain JSON-ready data (`weights_schema_v1.json`)."""
    return {
        "schema": SCHEMA_VERSION,
        "report": REPORT,
        "tool": {"name": "memlayout", "version": __version__},
        "target": {"spec": report.target, "kind": report.target_kind, "format": report.format,
                   "class": report.model_class, "class_chosen_by": report.class_chosen_by},
        "counted_from": report.counted_from,
        "optimizer": report.optimizer,
        "parameters": {"count": report.parameters, "trainable": report.trainable_parameters,
                       "tensors": report.parameter_tensors},
        "buffers": {"count": report.buffers, "tensors": report.buffer_tensors},
        "as_built": [{"dtype": dtype, "count": count, "bytes": nbytes} for dtype, count, nbytes in report.as_built],
        "dtypes": [
            {
                "dtype": row.dtype,
                "parameter_bytes": row.parameter_bytes,
                "buffer_bytes": row.buffer_bytes,
                "weights_bytes": row.weights_bytes,
                "training": None if row.training is None else {
                    "weights_bytes": row.training.weights_bytes,
                    "gradient_bytes": row.training.gradient_bytes,
                    "optimizer_bytes": row.training.optimizer_bytes,
                    "total_bytes": row.training.total_bytes,
                },
            }
            for row in report.rows
        ],
        "suggested_inputs": list(report.suggested_inputs),
        "notes": [*report.notes, _rows_note(report), "{}: {}".format(*activations_hint(report))],
        "next_command": activations_hint(report)[1],
    }
