"""The orjson-made JSON text is byte for byte what `json.dumps(..., indent=2)` wrote before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import memlayout
from memlayout.pipeline.batch import BatchReport, PathReport
from memlayout.report.json_report import JsonReporter, render_json, report_dict
from memlayout.report.json_text import (
    LazyArray,
    StreamedList,
    StreamedObject,
    compact_dumps,
    dumps,
    json_pieces,
)
from tests import models

GOLDEN = Path(__file__).resolve().parent.parent / "golden"

# Every character, lone surrogates and astral ones included: names come from files.
_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, blacklist_categories=()), max_size=12)
# Integers beyond 64 bits are ones orjson refuses; they must still come out right.
_scalars = st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70) | _text
_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4), max_leaves=20
)


@given(_values)
def test_dumps_is_the_standard_librarys_text(value: Any) -> None:
    assert dumps(value) == json.dumps(value, indent=2)


@given(_values)
def test_compact_dumps_is_the_standard_librarys_compact_text(value: Any) -> None:
    assert compact_dumps(value) == json.dumps(value, separators=(",", ":"))


@settings(max_examples=60)
@given(st.dictionaries(_text, st.tuples(st.booleans(), st.lists(_values, max_size=7)), max_size=5), st.integers(1, 4))
def test_pieces_with_lazy_arrays_join_to_the_standard_librarys_text(
    document: dict[str, tuple[bool, list[Any]]], batch_size: int
) -> None:
    plain = {key: items for key, (_, items) in document.items()}
    lazy = {key: LazyArray(iter(items)) if is_lazy else items for key, (is_lazy, items) in document.items()}
    assert "".join(json_pieces(lazy, batch_size)) == json.dumps(plain, indent=2)


def test_a_lazy_array_below_the_top_level_is_written_whole() -> None:
    document = {"reports": [{"tensors": LazyArray(iter([1, {"a": "é"}]))}]}
    assert "".join(json_pieces(document)) == json.dumps({"reports": [{"tensors": [1, {"a": "é"}]}]}, indent=2)


def test_golden_reports_are_the_standard_librarys_text(repo_root: Path) -> None:
    # The golden files were written by json.dumps(indent=2); the new encoder must
    # reproduce them exactly, and agree with json.dumps on the same data.
    report = memlayout.inspect(str(repo_root / "fixtures" / "demo_checkpoint.pt"))
    text = render_json(report)
    assert text == json.dumps(report_dict(report), indent=2) + "\n"
    golden = json.loads((GOLDEN / "demo_checkpoint.json").read_text())
    assert json.loads(text) | {"source": golden["source"]} == golden
    batch = BatchReport((PathReport("fixtures/demo_checkpoint.pt", report=report),))
    assert JsonReporter().render(batch) == json.dumps(report_dict(report), indent=2) + "\n"


def test_a_hostile_name_is_escaped_as_the_standard_library_escapes_it() -> None:
    name = "w\x00\x7f\u00e9\u2028\U0001f600\ud800\"\\\n"
    report = memlayout.inspect({name: models.torch.zeros(3)})
    assert render_json(report) == json.dumps(report_dict(report), indent=2) + "\n"


@st.composite
def _streamed(draw: st.DrawFn, depth: int = 0) -> tuple[Any, Any]:
    """(plain value, the same value with streamed containers and lazy arrays at any depth)."""
    if depth >= 3 or draw(st.booleans()):
        value = draw(_values)
        return value, value
    kind = draw(st.sampled_from(["object", "list", "lazy"]))
    children = draw(st.lists(_streamed(depth + 1), max_size=4))
    plain_items = [plain for plain, _ in children]
    wrapped_items = [wrapped for _, wrapped in children]
    if kind == "lazy":
        return plain_items, LazyArray(iter(wrapped_items))
    if kind == "list":
        return plain_items, StreamedList(wrapped_items)
    keys = draw(st.lists(_text, min_size=len(children), max_size=len(children), unique=True))
    return dict(zip(keys, plain_items, strict=True)), StreamedObject(zip(keys, wrapped_items, strict=True))


@settings(max_examples=100)
@given(st.lists(st.tuples(_text, _streamed()), max_size=4, unique_by=lambda pair: pair[0]), st.integers(1, 3))
def test_streamed_containers_at_any_depth_join_to_the_standard_librarys_text(
    members: list[tuple[str, tuple[Any, Any]]], batch_size: int
) -> None:
    plain = {key: value[0] for key, value in members}
    streamed = {key: value[1] for key, value in members}
    assert "".join(json_pieces(streamed, batch_size)) == json.dumps(plain, indent=2)


def test_sarif_written_in_pieces_is_the_standard_librarys_text(tmp_path: Path) -> None:
    from memlayout.report.sarif import SarifReporter, sarif_log

    path = tmp_path / "transposed.pt"
    models.torch.save({f"w{i}": models.torch.randn(3, 2).t() for i in range(700)}, path)  # 700 results
    batch = BatchReport((PathReport(str(path), report=memlayout.inspect(str(path))),))
    assert SarifReporter().render(batch) == json.dumps(sarif_log(batch), indent=2) + "\n"
