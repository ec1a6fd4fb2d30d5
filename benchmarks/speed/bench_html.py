"""The HTML storage map at 100,000 tensors: time to write it, and time to open it in chromium.

Usage: python benchmarks/speed/bench_html.py [--quick]

Two checkpoints of 100,000 tensors (10,000 with --quick):
- "storages": a safetensors file with one storage per tensor, sizes spread like a
  transformer's (a few large projections, many small norms and biases), the case
  the grouping of small storages is for;
- "flat": a torch.save file whose 100,000 tensors are views of one flat buffer, the
  case the clustering of thin segments is for.

Figures, each against a peer measured in the same run:
- writing the page: `render_html(report)` against `render_json(report)` of the same
  report (both from one inspection, which is left out of both);
- opening it: headless Debian chromium (playwright, the browser tests' launch
  flags), from navigation start to the map drawn (`window.memlayoutReady`, set two
  animation frames after the first rows are in the DOM, so layout and paint are
  in), against plain pages of the same byte size, from navigation start to two
  frames after their load event: the floor, the same bytes as inert data (in a
  `<script type="application/json">`, so the browser only reads and tokenizes
  them) under one line of text; and, for scale, the JSON report shown as text in
  a `<pre>`, which is what reading the JSON report in a browser costs.
Best of N, in round-robin rounds, a fresh page each time.
"""

from __future__ import annotations

import html
import json
import struct
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness import ROOT, Row, ms, print_table, quick_requested, write_results

DATA = ROOT / ".bench-data" / "html"
# Per transformer block: two big projections, two mid, and norms/biases (sizes in floats).
BLOCK = (4096 * 16, 4096 * 16, 1024 * 16, 1024 * 16, 4096, 4096, 1024, 1024, 256, 256)


def storages_checkpoint(count: int) -> Path:
    """A safetensors file of `count` tensors, one storage each; data zeros (a sparse file)."""
    path = DATA / f"storages-{count}.safetensors"
    if path.exists():
        return path
    header: dict[str, Any] = {}
    cursor = 0
    for index in range(count):
        numel = BLOCK[index % len(BLOCK)]
        header[f"model.layers.{index // len(BLOCK)}.part{index % len(BLOCK)}.weight"] = {
            "dtype": "F32", "shape": [numel], "data_offsets": [cursor, cursor + 4 * numel],
        }
        cursor += 4 * numel
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    DATA.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(raw)) + raw)
        out.truncate(8 + len(raw) + cursor)
    return path


def flat_checkpoint(count: int) -> Path:
    """A torch.save file of `count` views of one flat float32 buffer, 64-byte aligned slots."""
    path = DATA / f"flat-{count}.pt"
    if path.exists():
        return path
    import torch

    flat = torch.zeros(count * 16)
    state = {f"model.layers.{i // 10}.p{i % 10}": flat[i * 16 : i * 16 + 12] for i in range(count)}
    DATA.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return path


def plain_page(size: int, text: str, inert: bool) -> str:
    """A peer page of `size` bytes: `text` as inert data, or shown in a `<pre>`."""
    if inert:
        body = "<p>plain page</p><script type='application/json'>" + text.replace("<", "\\u003c") + "</script>"
    else:
        body = "<pre>" + html.escape(text) + "</pre>"
    page = f"<!doctype html><html><head><meta charset='utf-8'><title>plain</title></head><body>{body}</body></html>"
    encoded = page.encode()
    if len(encoded) > size:  # trim the data, keep the closing tags
        cut = len(encoded) - size
        text = text[: max(0, len(text) - cut)]
        return plain_page(size, text, inert)
    return page + " " * (size - len(encoded))


def open_times(pages: dict[str, Path], repeat: int) -> dict[str, float]:
    """Best milliseconds from navigation start to drawn, per page, in round-robin rounds."""
    from tests.report.browser import launch_chromium

    best = dict.fromkeys(pages, float("inf"))
    for browser in launch_chromium_or_exit(launch_chromium):
        for _ in range(repeat):
            for name, path in pages.items():
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                if name.startswith("plain"):
                    page.goto(path.as_uri(), wait_until="load")
                    took = page.evaluate(
                        "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => "
                        "r(performance.now()))))"
                    )
                else:
                    page.goto(path.as_uri())
                    # Set with window.memlayoutReady; a selector, since the page's CSP refuses the
                    # eval that playwright polls a string predicate with (tests/report/browser.py).
                    page.wait_for_selector("body[data-ready='1']", state="attached", timeout=120_000)
                    took = page.evaluate("() => window.memlayoutReady")
                best[name] = min(best[name], float(took))
                page.close()
    return best


def launch_chromium_or_exit(launch: Any) -> Any:
    import pytest

    try:
        yield from launch()
    except pytest.skip.Exception as skipped:
        print(f"bench_html: {skipped}; nothing measured")
        sys.exit(0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    quick = quick_requested(argv)
    count = 10_000 if quick else 100_000
    repeat = 2 if quick else 3
    import memlayout
    from memlayout.report.html import render_html
    from memlayout.report.json_report import render_json

    rows: list[Row] = []
    raw: dict[str, Any] = {"tensors": count}
    pages: dict[str, Path] = {}
    for case, path in (("storages", storages_checkpoint(count)), ("flat", flat_checkpoint(count))):
        # ML102 would compare the zero-filled contents of every equal-shaped tensor;
        # the page's cost does not depend on it, so it is left out.
        report = memlayout.inspect(str(path), ignore=("ML102",))
        timings = {"html": float("inf"), "json": float("inf")}
        for _ in range(repeat):
            for name, render in (("html", render_html), ("json", render_json)):
                start = time.perf_counter()
                text = render(report)
                timings[name] = min(timings[name], time.perf_counter() - start)
                if name == "html":
                    page_text = text
        page = DATA / f"{case}-{count}.html"
        page.write_text(page_text)
        size = page.stat().st_size
        json_text = render_json(report)
        pages[case] = page
        for kind, inert in (("inert", True), ("pre", False)):
            plain = DATA / f"plain-{kind}-{case}-{count}.html"
            plain.write_text(plain_page(size, json_text, inert))
            pages[f"plain-{kind}-{case}"] = plain
        raw[case] = {"page_bytes": size, "render_html_s": timings["html"], "render_json_s": timings["json"],
                     "storages": report.summary.storages, "tensors": report.summary.tensors}
        rows.append(Row(f"write the page ({case}, {count:,} tensors, {size / 2**20:.1f} MiB)", ms(timings["html"]),
                        f"JSON report of the same {ms(timings['json'])}", timings["html"] / timings["json"],
                        "(info)", True))
    opened = open_times(pages, repeat)
    for case in ("storages", "flat"):
        took, inert, pre = opened[case], opened[f"plain-inert-{case}"], opened[f"plain-pre-{case}"]
        raw[case].update({"open_ms": took, "inert_page_open_ms": inert, "pre_page_open_ms": pre})
        rows.append(Row(f"open in chromium ({case}, {count:,} tensors)", f"{took:.0f} ms",
                        f"same-size page, data inert {inert:.0f} ms", took / inert, "<= 3x", took <= 3 * inert))
        rows.append(Row(f"open in chromium ({case}, {count:,} tensors)", f"{took:.0f} ms",
                        f"same-size page, JSON report as text {pre:.0f} ms", took / pre, "(info)", True))
    print_table(f"bench_html: the HTML storage map{' (quick)' if quick else ''}", rows)
    print(f"raw numbers: {write_results('html', rows, raw, quick).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
