"""`--plot FILE`: a sweep's curve, as a picture. Never written here: the bytes go to the one writer.

What is drawn is `plot_data`, the same rows the table and the JSON show: the peak of live
tensors and, for a GPU, the caching allocator's reserved peak and the figure compared
with the card (the reserved peak plus the CUDA runtime), against the swept size; the
plan's figure at each size with `--budget`; the card's memory and the budget as lines;
`--fit`'s answers marked, without and with a plan. A traced size is a filled marker, one
evaluated from the traces a hollow one.

Two libraries, each for what it does best, both imported only here and only when a plot
is asked for (the `plot` extra installs them):
- matplotlib for `.svg` and `.png`: the Python standard for static figures, drawn with
  its Agg and SVG canvases on a `Figure` of its own (no pyplot, so no global state);
- plotly for `.html`: one self-contained page (plotly.js inside it, no network) whose
  points show their exact bytes, and whether traced or evaluated, under the pointer.
"""

from __future__ import annotations

import io
from typing import Any, NamedTuple

from memlayout.activations.fit.sweep import EVALUATED, FAILED, SweepReport
from memlayout.errors import UsageError
from memlayout.format_bytes import human_bytes


class Series(NamedTuple):
    """One curve: a figure of each size, in bytes."""

    name: str
    sizes: tuple[int, ...]
    values: tuple[int, ...]
    evaluated: tuple[bool, ...]
    """Per point: evaluated from the traces at other sizes, not traced."""


class Level(NamedTuple):
    """A horizontal line: the card's memory, or the budget."""

    name: str
    value: int


class Mark(NamedTuple):
    """A vertical line: one of `--fit`'s answers."""

    name: str
    size: int


CAPTION = "filled: traced at that size; hollow: evaluated from the traces around it"


class PlotData(NamedTuple):
    """Everything the picture shows, in bytes and sizes."""

    title: str
    axis: str
    series: tuple[Series, ...]
    levels: tuple[Level, ...]
    marks: tuple[Mark, ...]


def plot_data(report: SweepReport) -> PlotData:
    """The curves, lines and marks of a sweep, from its rows (what the table and the JSON say)."""
    rows = [row for row in report.rows if row.source != FAILED and row.peak_bytes is not None]
    sizes = tuple(row.size for row in rows)
    evaluated = tuple(row.source == EVALUATED for row in rows)
    series = [Series("peak of live tensors", sizes, tuple(row.peak_bytes or 0 for row in rows), evaluated)]
    if any(row.reserved_peak_bytes is not None for row in rows):
        series.append(Series("reserved peak (caching allocator)", sizes,
                             tuple(row.reserved_peak_bytes or 0 for row in rows), evaluated))
        series.append(Series("reserved peak + CUDA runtime (compared)", sizes,
                             tuple(row.compared_bytes or 0 for row in rows), evaluated))
    if report.planned:
        # Where the plain step fits, no plan is needed: the plain figure, traced or evaluated. A plan's figure is
        # always its own trace's.
        planned = [(row.size, row.compared_bytes or 0, row.source == EVALUATED) if row.plan is None or
                   row.plan.result is None else (row.size, row.plan.result.judged_bytes, False)
                   for row in rows if row.plan is None or (row.plan.found and row.plan.result is not None)]
        series.append(Series("with the budget search's plan", tuple(p[0] for p in planned),
                             tuple(p[1] for p in planned), tuple(p[2] for p in planned)))
    levels = []
    if report.card_bytes is not None:
        levels.append(Level(f"{report.card}: {human_bytes(report.card_bytes)}", report.card_bytes))
    if report.budget_bytes is not None and report.budget_bytes != report.card_bytes:
        levels.append(Level(f"budget: {human_bytes(report.budget_bytes)}", report.budget_bytes))
    marks = []
    if report.fit is not None:
        marks.append(Mark(f"--fit, no plan: {report.axis} {report.fit.without_plan.size}", report.fit.without_plan.size))
        if report.fit.with_plan is not None:
            marks.append(Mark(f"--fit, with a plan: {report.axis} {report.fit.with_plan.size}",
                              report.fit.with_plan.size))
    step = report.report
    title = f"memlayout activations --sweep {report.axis}: {step.target or step.model_class}"
    return PlotData(title, report.axis, tuple(series), tuple(levels), tuple(marks))


LIBRARIES = {".svg": "matplotlib", ".png": "matplotlib", ".html": "plotly"}
"""The library each format of `plot` is drawn with."""


def require_library(path: str) -> None:
    """Refuse, before anything is traced, a plot whose library is not installed.

    Raises:
        UsageError: the library `path`'s format needs cannot be imported.
    """
    import importlib.util
    import os

    suffix = os.path.splitext(path)[1].lower()
    package = LIBRARIES.get(suffix)
    if package is not None and importlib.util.find_spec(package) is None:
        raise _missing(package, suffix.removeprefix("."))


def render_plot(report: SweepReport, suffix: str) -> bytes:
    """The picture in the format `suffix` names: `.svg`, `.png` (matplotlib) or `.html` (plotly).

    Raises:
        UsageError: the library the format needs is not installed.
    """
    data = plot_data(report)
    suffix = suffix.lower()
    if suffix == ".html":
        return _plotly_html(data).encode("utf-8")
    return _matplotlib(data, suffix.removeprefix("."))


def byte_ticks(top: int) -> list[int]:
    """Five to ten tick values from 0 to `top`, each a round number of a binary unit (1, 2, 5, 10, 20, 50... MiB)."""
    unit = 1
    for scale in (1024, 1024**2, 1024**3):
        if top >= 2 * scale:
            unit = scale
    step = unit
    for factor in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000):
        step = factor * unit
        if top / step <= 10:
            break
    return list(range(0, top + step, step))


def _top(data: PlotData) -> int:
    values = [v for s in data.series for v in s.values] + [level.value for level in data.levels]
    return max(values, default=1)


def _matplotlib(data: PlotData, kind: str) -> bytes:
    try:
        from matplotlib import rc_context
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise _missing("matplotlib", kind) from None

    figure = Figure(figsize=(9, 5.5), layout="constrained")
    axes = figure.add_subplot()
    for index, series in enumerate(data.series):
        color = f"C{index}"
        axes.plot(series.sizes, series.values, color=color, label=series.name, linewidth=1.5)
        traced = [(x, y) for x, y, e in zip(series.sizes, series.values, series.evaluated, strict=True) if not e]
        evaluated = [(x, y) for x, y, e in zip(series.sizes, series.values, series.evaluated, strict=True) if e]
        if traced:
            axes.scatter([x for x, _ in traced], [y for _, y in traced], color=color, zorder=3, s=22)
        if evaluated:
            axes.scatter([x for x, _ in evaluated], [y for _, y in evaluated], facecolors="white", edgecolors=color,
                         zorder=3, s=22)
    for level, style in zip(data.levels, ("-", "--"), strict=False):
        axes.axhline(level.value, color="black", linestyle=style, linewidth=1, label=level.name)
    for mark, style in zip(data.marks, (":", "-."), strict=False):
        axes.axvline(mark.size, color="gray", linestyle=style, linewidth=1.2, label=mark.name)
    ticks = byte_ticks(_top(data))
    axes.set_yticks(ticks, [human_bytes(tick) for tick in ticks])
    axes.set_ylim(0, ticks[-1])
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel(f"{data.axis}    ({CAPTION})")
    axes.set_ylabel("memory")
    axes.set_title(data.title, fontsize=10)
    axes.grid(True, linewidth=0.3)
    axes.legend(fontsize=8, loc="upper left")
    buffer = io.BytesIO()
    # An SVG's text as text (searchable, in the viewer's font), not paths of glyphs; its ids salted alike each run.
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "memlayout"}):
        figure.savefig(buffer, format=kind, dpi=150 if kind == "png" else None, metadata=_metadata(kind))
    return buffer.getvalue()


def _metadata(kind: str) -> dict[str, Any]:
    # No creation date: the same sweep draws the same bytes.
    return {"Date": None} if kind == "svg" else {}


def _plotly_html(data: PlotData) -> str:
    try:
        import plotly.graph_objects as go
    except ImportError:
        raise _missing("plotly", "html") from None

    figure = go.Figure()
    for series in data.series:
        figure.add_trace(go.Scatter(
            x=list(series.sizes), y=list(series.values), name=series.name, mode="lines+markers",
            marker={"symbol": ["circle-open" if e else "circle" for e in series.evaluated], "size": 8},
            customdata=[[human_bytes(v), "evaluated" if e else "traced"]
                        for v, e in zip(series.values, series.evaluated, strict=True)],
            hovertemplate=f"{data.axis} %{{x}}: %{{customdata[0]}} (%{{y:,d}} bytes, %{{customdata[1]}})"
                          f"<extra>{series.name}</extra>",
        ))
    for level, dash in zip(data.levels, ("solid", "dash"), strict=False):
        figure.add_hline(y=level.value, line={"color": "black", "width": 1, "dash": dash},
                         annotation_text=level.name, annotation_position="top left")
    for mark, dash in zip(data.marks, ("dot", "dashdot"), strict=False):
        figure.add_vline(x=mark.size, line={"color": "gray", "width": 1.5, "dash": dash},
                         annotation_text=mark.name, annotation_position="top right")
    ticks = byte_ticks(_top(data))
    figure.update_layout(
        title={"text": data.title, "font": {"size": 14}}, xaxis_title=f"{data.axis}    ({CAPTION})",
        yaxis_title="memory", xaxis={"tickformat": "d"},
        yaxis={"tickvals": ticks, "ticktext": [human_bytes(t) for t in ticks], "range": [0, ticks[-1]]},
        template="plotly_white", legend={"orientation": "h", "y": -0.2},
    )
    html: str = figure.to_html(include_plotlyjs=True, full_html=True, div_id="memlayout-sweep",
                               config={"responsive": True, "displaylogo": False})
    return html


def _missing(package: str, kind: str) -> Exception:
    return UsageError(f"`plot` .{kind} needs {package}, which is not installed",
                      "pip install 'memlayout[plot]'")
