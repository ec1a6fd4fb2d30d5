"""The HTML storage map in a real browser: segments, links, tooltips, findings, diff view.

Every DOM assertion runs in headless Debian chromium (see tests/report/browser.py).
A screenshot of each page is kept under .test-artifacts/ for people to look at.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import memlayout
import memlayout.report
from memlayout.cli.app import app
from memlayout.report.json_report import report_dict
from tests.report.browser import ARTIFACTS, launch_chromium, open_page


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launch_chromium()


def layout_cases() -> dict[str, torch.Tensor]:
    """One of each thing the map draws: a transposed tie, a flat buffer with slots and
    padding, a partial overlap, bloat, and a plain tensor."""
    torch.manual_seed(0)
    encoder = torch.randn(64, 32)
    flat = torch.zeros(300)
    overlapping = torch.zeros(100)
    return {
        "encoder.weight": encoder,
        "decoder.weight": encoder.t(),
        "flat.a": flat[:100],
        "flat.b": flat[112:212],   # 64-byte aligned slots: 48 bytes of padding between them
        "flat.c": flat[224:290],
        "window.left": overlapping[:60],
        "window.right": overlapping[40:],
        "calibration": torch.randn(5000)[:100],
        "scale": torch.ones(8),
    }


def write_map(tmp_path: Path, target: object, name: str = "map.html") -> Path:
    path = tmp_path / name
    code = CliRunner().invoke(app, ["inspect", str(target), "--html", str(path), "--fail-on", "never"]).exit_code
    assert code == 0
    return path


@pytest.fixture
def case_file(tmp_path: Path) -> Path:
    path = tmp_path / "cases.pt"
    torch.save(layout_cases(), path)
    return path


def open_groups(page: Any) -> None:
    """Small storages start in collapsed groups; opening each draws its bars."""
    heads = page.locator(".group-head")
    for index in range(heads.count()):
        heads.nth(index).click()


def segment_tensors(page: Any) -> list[int]:
    """Tensor indices drawn, one per segment or per member of a cluster of small segments."""
    return page.evaluate(
        """() => [...document.querySelectorAll('.seg')].flatMap(
               s => s.dataset.ts ? s.dataset.ts.split(',').map(Number) : [Number(s.dataset.t)])"""
    )


def test_every_tensor_is_one_segment_and_every_storage_one_bar(browser: Any, case_file: Path, tmp_path: Path) -> None:
    page, requests, errors = open_page(browser, write_map(tmp_path, case_file))
    report = report_dict(memlayout.inspect(str(case_file)))
    assert page.locator(".group").count() >= 1  # the 32-byte storage is too small to share the scale
    open_groups(page)
    drawn = segment_tensors(page)
    assert sorted(drawn) == list(range(len(report["tensors"])))  # each view exactly once
    assert page.locator(".storage").count() == len(report["storages"])
    per_bar = page.evaluate("() => [...document.querySelectorAll('.storage')].map(s => [s.dataset.storage, "
                            "Number(s.dataset.segments)])")
    expected = {s["id"]: len(s["ranges"]) for s in report["storages"]}
    assert dict(per_bar) == expected
    # Bloat, padding and the partial overlap are each drawn, in their own way.
    assert page.locator(".gap.unused").count() >= 1
    assert page.locator(".gap.padding").count() == 3  # after each aligned slot, up to the next 64 bytes
    assert page.locator(".overlap").count() == 1
    assert errors == [] and requests == [(tmp_path / "map.html").as_uri()]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "storage_map.png"), full_page=True)


def test_bars_are_scaled_to_bytes(browser: Any, case_file: Path, tmp_path: Path) -> None:
    page, _, _ = open_page(browser, write_map(tmp_path, case_file))
    widths = page.evaluate(
        "() => Object.fromEntries([...document.querySelectorAll('.storage')].map("
        "s => [s.dataset.storage, s.querySelector('.bar').getBoundingClientRect().width]))"
    )
    sizes = {s.id: s.nbytes for s in memlayout.inspect(str(case_file)).facts.storages}
    largest = max(sizes, key=lambda k: sizes[k])
    for storage, width in widths.items():
        assert width == pytest.approx(widths[largest] * sizes[storage] / sizes[largest], abs=2.5)


def test_hovering_a_tied_segment_lights_its_tie_and_shows_a_tooltip(browser: Any, case_file: Path,
                                                                    tmp_path: Path) -> None:
    page, _, _ = open_page(browser, write_map(tmp_path, case_file))
    names = page.evaluate("() => JSON.parse(document.getElementById('memlayout-data').textContent)"
                          ".sides[0].tensors.map(t => t[0][0])")
    encoder, decoder, scale = (names.index(n) for n in ("encoder.weight", "decoder.weight", "scale"))
    open_groups(page)
    assert page.locator(".seg.linked").count() == 0
    page.hover(f'.seg[data-t="{decoder}"]')
    linked = page.evaluate("() => [...document.querySelectorAll('.seg.linked')].map(s => Number(s.dataset.t))")
    assert linked == [encoder]
    tip = page.inner_text("#tip")
    for expected in ("decoder.weight", "float32[32, 64]", "stride [1, 32]", "offset 0 elements", "bytes 0..8192",
                     "equal: encoder.weight"):
        assert expected in tip
    page.hover(f'.seg[data-t="{scale}"]')
    assert page.locator(".seg.linked").count() == 0  # nothing shares its memory
    assert "scale" in page.inner_text("#tip")


def test_clicking_a_finding_highlights_its_tensors(browser: Any, case_file: Path, tmp_path: Path) -> None:
    page, _, _ = open_page(browser, write_map(tmp_path, case_file))
    data = page.evaluate("() => JSON.parse(document.getElementById('memlayout-data').textContent).sides[0]")
    names = [t[0][0] for t in data["tensors"]]
    overlap = next(i for i, f in enumerate(data["findings"]) if f[0] == "ML101")
    page.click(f'.finding[data-finding="{overlap}"]')
    highlighted = page.evaluate("() => [...document.querySelectorAll('.seg.hl')].map(s => Number(s.dataset.t))")
    assert sorted(names[i] for i in highlighted) == ["window.left", "window.right"]
    assert page.evaluate("() => document.body.dataset.highlighted") == "2"
    page.click(f'.finding[data-finding="{overlap}"]')  # a second click clears it
    assert page.locator(".seg.hl").count() == 0


def test_smshow_all_are_grouped_and_drawn_when_a_finding_needs_them(browser: Any, tmp_path: Path) -> None:
    # One big storage and 3,000 small ones, one of them bloated: the small ones sit in
    # collapsed groups until something needs them.
    state = {"big": torch.zeros(1 << 20)}
    state.update({f"small.{i}": torch.full((16,), float(i)) for i in range(3000)})
    state["small.bloated"] = torch.randn(4096)[:16]
    path = tmp_path / "many.pt"
    torch.save(state, path)
    page, _, errors = open_page(browser, write_map(tmp_path, path))
    assert page.locator(".storage").count() == 1 and page.locator(".group").count() >= 1
    assert len(segment_tensors(page)) == 1
    data = page.evaluate("() => JSON.parse(document.getElementById('memlayout-data').textContent).sides[0]")
    bloat = next(i for i, f in enumerate(data["findings"]) if f[0] == "ML301")
    page.click(f'.finding[data-finding="{bloat}"]')
    (highlighted,) = page.evaluate("() => [...document.querySelectorAll('.seg.hl')].map(s => Number(s.dataset.t))")
    assert data["tensors"][highlighted][0] == ["small.bloated"]
    assert page.locator(".group.open").count() == 1 and errors == []


def test_a_tensor_name_cannot_break_out_of_the_page(browser: Any, tmp_path: Path) -> None:
    hostile = '</script><script>document.title="pwned"</script><b id="x">'
    state = {hostile: torch.zeros(4), "plain": torch.zeros(2)}
    path = tmp_path / "hostile.pt"
    torch.save(state, path)
    html = write_map(tmp_path, path)
    assert hostile not in html.read_text()
    page, _, errors = open_page(browser, html)
    assert page.title() != "pwned" and page.locator("#x").count() == 0 and errors == []
    names = page.evaluate("() => JSON.parse(document.getElementById('memlayout-data').textContent)"
                          ".sides[0].tensors.map(t => t[0][0])")
    assert hostile in names


def test_the_page_is_self_contained(case_file: Path, tmp_path: Path) -> None:
    text = write_map(tmp_path, case_file).read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text)
    assert "<link" not in text and "@import" not in text and "url(" not in text
    assert "default-src 'none'" in text  # the CSP forbids any load the page might attempt


def test_diff_view_shows_both_sides_coloured_and_linked(browser: Any, tmp_path: Path) -> None:
    torch.manual_seed(0)
    embed = torch.randn(64, 32)
    a = {"embed.weight": embed, "head.weight": embed, "norm.weight": torch.ones(32), "old.bias": torch.zeros(8)}
    b = {"embed.weight": embed.clone(), "head.weight": embed.clone(), "norm.weight": torch.ones(32).half(),
         "new.bias": torch.zeros(8)}
    torch.save(a, tmp_path / "a.pt")
    torch.save(b, tmp_path / "b.pt")
    html = tmp_path / "diff.html"
    result = CliRunner().invoke(app, ["diff", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--html", str(html)])
    assert result.exit_code == 1
    page, requests, errors = open_page(browser, html)
    assert page.locator("section.side").count() == 2 and errors == [] and len(requests) == 1
    open_groups(page)
    marks = page.evaluate(
        """() => [...document.querySelectorAll('.map')].map(m =>
               Object.fromEntries([...m.querySelectorAll('.seg')].map(s => [
                 JSON.parse(document.getElementById('memlayout-data').textContent)
                   .sides[Number(m.dataset.side)].tensors[Number(s.dataset.t)][0].join('='),
                 [...s.classList].filter(c => c.startsWith('mark-')).join(' ')])))"""
    )
    assert marks[0] == {"embed.weight=head.weight": "mark-broken", "norm.weight": "mark-changed",
                        "old.bias": "mark-removed"}
    assert marks[1] == {"embed.weight": "mark-broken", "head.weight": "mark-broken", "norm.weight": "mark-changed",
                        "new.bias": "mark-added"}
    # Hovering the tie in A lights both of its copies in B.
    page.hover('.map[data-side="0"] .seg.mark-broken')
    assert page.locator('.map[data-side="1"] .seg.linked').count() == 2
    # Clicking the lost tie highlights its tensors on both sides.
    page.click('.change:has-text("tie-lost")')
    assert page.locator('.map[data-side="0"] .seg.hl').count() == 1
    assert page.locator('.map[data-side="1"] .seg.hl').count() == 2
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "storage_map_diff.png"), full_page=True)


@pytest.mark.parametrize("command", ["inspect", "diff"])
def test_an_unwritable_html_path_is_one_error_line_and_nothing_printed(
    command: str, case_file: Path, tmp_path: Path
) -> None:
    args = [str(case_file)] * (2 if command == "diff" else 1)
    result = CliRunner().invoke(app, [command, *args, "--html", str(tmp_path / "missing" / "map.html")])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("memlayout: error: cannot write") and result.stderr.count("\n") == 1


def test_the_wait_for_a_drawn_map_works_when_drawing_comes_late(browser: Any, tmp_path: Path) -> None:
    # The map's own Content-Security-Policy refuses eval. A page that marks itself
    # drawn only after the first look must still be waited for, as a slow machine
    # makes the real map do (a string predicate was polled through eval and failed).
    template = (Path(memlayout.report.__file__).parent / "templates" / "storage_map.html.j2").read_text()
    (policy,) = re.findall(r'<meta http-equiv="Content-Security-Policy"[^>]*>', template)
    assert "unsafe-eval" not in policy
    page_path = tmp_path / "late.html"
    page_path.write_text(
        f"<!doctype html><html><head>{policy}</head><body><script>"
        "setTimeout(function () { document.body.dataset.ready = '1'; }, 300);</script></body></html>"
    )
    page, _, errors = open_page(browser, page_path)
    assert page.get_attribute("body", "data-ready") == "1"
    assert errors == []


def test_the_map_prints_bytes_exactly_as_the_table_does(browser: Any, tmp_path: Path) -> None:
    """The map's script repeats memlayout.format_bytes in JavaScript; both agree on every count,
    including the ties where float rounding differs between the languages (552,192 B)."""
    from memlayout.format_bytes import human_bytes

    script = (Path(memlayout.report.__file__).parent / "templates" / "storage_map.js").read_text()
    formatter = re.search(r"const bytes = \(n\) => \{.*?\n  \};", script, re.S)
    assert formatter is not None
    counts = [0, 1, 1023, 1024, 1535, 1536, 552_192, -552_192, 1024**2 - 1, 1024**2, 1024**2 + 52_429,
              13 * 1024**3 // 4, 10**12] + [int(1.37**k) for k in range(20, 90)]
    page = browser.new_page()
    shown = page.evaluate(f"(counts) => {{ {formatter.group(0)} return counts.map(bytes); }}", counts)
    assert shown == [human_bytes(c) for c in counts]
    # And on a drawn map: a 552,192-byte storage reads as the table's text.
    path = tmp_path / "tie.pt"
    torch.save({"w": torch.zeros(552_192 // 4)}, path)
    drawn, _, errors = open_page(browser, write_map(tmp_path, path))
    label = drawn.locator(".storage .label").first.inner_text()
    assert not errors
    assert f"\u00b7 {human_bytes(552_192)} \u00b7" in label
    table = CliRunner().invoke(app, ["inspect", str(path), "--fail-on", "never"]).output
    assert human_bytes(552_192) in table


def test_a_tie_saved_as_one_tensor_shows_every_name_in_the_tie_colour(browser: Any, tmp_path: Path) -> None:
    # Issue 26, defect 7: the tied storage showed one name, in the plain colour.
    embed = torch.randn(256, 64)
    path = tmp_path / "tied.pt"
    torch.save({"embed.weight": embed, "head.weight": embed, "plain": torch.randn(256, 64)}, path)
    page, _, errors = open_page(browser, write_map(tmp_path, path))
    open_groups(page)
    names = page.evaluate("() => JSON.parse(document.getElementById('memlayout-data').textContent)"
                          ".sides[0].tensors.map(t => t[0])")
    tied = names.index(["embed.weight", "head.weight"])
    plain = names.index(["plain"])
    segment, other = page.locator(f'.seg[data-t="{tied}"]'), page.locator(f'.seg[data-t="{plain}"]')
    assert segment.inner_text() == "embed.weight = head.weight"
    colour = "(el) => getComputedStyle(el).backgroundColor"
    assert segment.evaluate(colour) != other.evaluate(colour)
    legend = page.locator(".legend .sw-tied")
    assert legend.evaluate(colour) == segment.evaluate(colour)
    assert errors == []
