"""`--plot`: a sweep's curve as svg, png and html, whose figures are the sweep's rows, opened in chromium."""

from __future__ import annotations

import struct
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import memlayout.activations as act
from memlayout.activations.fit.sweep import EVALUATED, SweepReport
from memlayout.activations.report.plot import byte_ticks, plot_data, render_plot
from memlayout.format_bytes import human_bytes
from tests.report.browser import launch_chromium

GPT2 = "tests.activations.models:gpt2"
MIB = 2**20


def inputs(batch: int) -> list[str]:
    return [f"int64[{batch},32]<500", f"labels=int64[{batch},32]<500"]


@pytest.fixture(scope="module")
def report() -> SweepReport:
    pytest.importorskip("matplotlib", reason="the plot extra is not installed (make venv installs it)")
    swept = act.predict(act.StepRequest(GPT2, input=tuple(inputs(2)), sweep="batch=1:5", budget="5MiB", fit="batch"))
    assert isinstance(swept, SweepReport)
    return swept


def test_the_curves_are_the_rows_and_the_lines_the_budget_and_fits_answers(report: SweepReport) -> None:
    data = plot_data(report)
    peak, planned = data.series
    assert peak.sizes == tuple(range(1, 6))
    assert peak.values == tuple(row.peak_bytes for row in report.rows)
    assert peak.evaluated == tuple(row.source == EVALUATED for row in report.rows)
    plans = {row.size: row.plan for row in report.rows}
    for size, value in zip(planned.sizes, planned.values, strict=True):
        plan = plans[size]
        assert value == (report.rows[size - 1].compared_bytes if plan is None else plan.result.judged_bytes)  # type: ignore[union-attr]
    assert [level.value for level in data.levels] == [5 * MIB]
    assert report.fit is not None and report.fit.with_plan is not None
    assert [mark.size for mark in data.marks] == [report.fit.without_plan.size, report.fit.with_plan.size]


def test_svg_and_png_are_drawn_by_matplotlib(report: SweepReport) -> None:
    svg = render_plot(report, ".svg")
    root = ElementTree.fromstring(svg)
    assert root.tag.endswith("svg")
    text = svg.decode()
    assert "memlayout activations --sweep batch" in text and human_bytes(5 * MIB) in text
    assert render_plot(report, ".svg") == svg  # no date in it: the same sweep draws the same bytes
    png = render_plot(report, ".png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (1350, 825)  # 9 x 5.5 inches at 150 dpi


def test_ticks_are_round_binary_sizes() -> None:
    assert byte_ticks(7 * MIB + 5) == [n * MIB for n in range(9)]
    assert byte_ticks(80 << 30)[:3] == [0, 10 << 30, 20 << 30]
    assert all(len(byte_ticks(top)) <= 12 for top in (1, 1000, 5 * MIB, 3 << 30, 1 << 40))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launch_chromium()


def test_the_html_plot_opens_in_chromium_offline_with_the_predictions(report: SweepReport, browser: Any,
                                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    pytest.importorskip("plotly", reason="the plot extra is not installed (make venv installs it)")
    path = tmp_path_factory.mktemp("plot") / "sweep.html"
    path.write_bytes(render_plot(report, ".html"))
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(path.as_uri())
    page.wait_for_selector("#memlayout-sweep .main-svg")
    drawn = page.evaluate("() => { const plot = document.getElementById('memlayout-sweep'); return {"
                          "traces: plot.data.map(t => ({name: t.name, x: Array.from(t.x), y: Array.from(t.y)})),"
                          "shapes: plot.layout.shapes.length, points: plot.querySelectorAll('.point').length} }")
    page.close()
    assert errors == [] and [url for url in requests if not url.startswith("file:")] == []  # self-contained
    peak = drawn["traces"][0]
    assert peak["x"] == [row.size for row in report.rows] and peak["y"] == [row.peak_bytes for row in report.rows]
    assert drawn["shapes"] == 3  # the budget, and fit's two answers
    assert drawn["points"] >= 2 * len(report.rows)
    # The picture's figures are one prediction's: an evaluated size's, and the smallest size's.
    evaluated = next(row for row in report.rows if row.source == EVALUATED)
    for row in (report.rows[0], evaluated):
        assert peak["y"][row.size - 1] == act.analyze(GPT2, inputs(row.size)).summary.peak_bytes


def test_a_plot_of_a_format_it_cannot_draw_is_refused_before_tracing() -> None:
    with pytest.raises(act.SettingError, match="pdf"):
        act.StepRequest(GPT2, input=tuple(inputs(2)), sweep="batch=1,2", plot="curve.pdf")
    with pytest.raises(act.SettingError, match="draws the curve of a `sweep`"):
        act.StepRequest(GPT2, input=tuple(inputs(2)), plot="curve.svg")


def test_the_html_needs_no_file_beside_it(report: SweepReport, tmp_path: Path) -> None:
    pytest.importorskip("plotly", reason="the plot extra is not installed (make venv installs it)")
    html = render_plot(report, ".html").decode()
    assert "<script src=" not in html.replace('<script src="data:', "")  # plotly.js is inside the page
    assert html.count("memlayout activations --sweep batch") >= 1


def test_a_plot_whose_library_is_missing_is_refused_before_the_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from typer.testing import CliRunner

    from memlayout.cli.app import app

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "plotly" else found(name, *a))
    result = CliRunner().invoke(app, ["activations", GPT2, *(f"--input={spec}" for spec in inputs(2)),
                                      "--sweep", "batch=1,2", "--plot", "curve.html"])
    assert result.exit_code == 2 and result.stdout == ""
    assert "--plot .html needs plotly, which is not installed (pip install 'memlayout[plot]')" in result.stderr
