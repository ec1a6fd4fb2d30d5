"""JSON text exactly as `json.dumps(obj, indent=2)` writes it, made by orjson, and in pieces.

For documents without floats, as the report schemas are (orjson writes some floats
differently: 1e-7 for 1e-07, null for NaN).

memlayout's JSON reports were `json.dumps(..., indent=2)`, which `indent` sends
down the pure-Python encoder: two thirds of an inspection of 40,000 tensors went
there. orjson encodes in compiled code, and its two-space indentation, separators,
escapes of control characters and integers are the standard library's; the one
difference is that it writes non-ASCII characters (and DEL) as UTF-8 where
`ensure_ascii` escapes them, so those are escaped here afterwards. What orjson
refuses (an integer beyond 64 bits, a lone surrogate, a non-string key) goes to
the standard library, so the text is byte for byte what it was
(`tests/report/test_json_text.py` compares them).

A report's arrays grow with the tensor count. `LazyArray` marks one that is made
item by item: `json_pieces` encodes it a batch at a time, so a report of 100,000
tensors never exists as one list of dicts nor, when written piece by piece, as one
string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

import orjson

_OPTIONS = orjson.OPT_INDENT_2
BATCH = 512
"""Items of a `LazyArray` encoded per orjson call: few calls, and pieces of a few hundred KiB."""
# Every character from DEL up. Said as "not below DEL": the range compiles in 8 ms
# (at import, on every json and html run), this in 0.1 ms.
_ESCAPED = re.compile("[^\x00-\x7e]")


class LazyArray:
    """A JSON array whose items are produced on demand, once (`json_pieces` streams it)."""

    def __init__(self, items: Iterable[Any]) -> None:
        self._items = items

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items)

    def materialized(self) -> list[Any]:
        """The items as a list, kept: encoding it whole may take two tries (orjson, then json)."""
        if type(self._items) is not list:
            self._items = list(self._items)
        return self._items


def _escape(match: re.Match[str]) -> str:
    # What json's ensure_ascii writes: \uXXXX, and a surrogate pair beyond the BMP.
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 | (code >> 10):04x}\\u{0xDC00 | (code & 0x3FF):04x}"


def _as_list(value: Any) -> Any:
    if isinstance(value, LazyArray):
        return value.materialized()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _ascii_text(raw: bytes) -> str:
    # orjson's UTF-8 as json's ensure_ascii text.
    if raw.isascii() and b"\x7f" not in raw:
        return raw.decode("ascii")
    return _ESCAPED.sub(_escape, raw.decode("utf-8"))


def dumps(value: Any) -> str:
    """`json.dumps(value, indent=2)`, exactly; a nested `LazyArray` is encoded as a list."""
    try:
        raw = orjson.dumps(value, default=_as_list, option=_OPTIONS)
    except orjson.JSONEncodeError:
        return json.dumps(value, indent=2, default=_as_list)
    return _ascii_text(raw)


def compact_dumps(value: Any) -> str:
    """`json.dumps(value, separators=(",", ":"))`, exactly: one line, no spaces."""
    try:
        raw = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"))
    return _ascii_text(raw)


def _indented(text: str, prefix: str) -> str:
    # orjson and json escape a newline inside a string, so every raw newline is layout.
    return text.replace("\n", "\n" + prefix) if prefix else text


def _array_pieces(items: Iterable[Any], level: int, batch_size: int) -> Iterator[str]:
    # The batch is encoded nested in `level` one-item arrays, so that the encoder
    # itself indents its items as the array at `level` needs: "[\n  [\n    item,..."
    # with the openings and closings of the nesting cut off. Re-indenting the text
    # afterwards cost as much as encoding it.
    head = sum(len("[\n" + "  " * depth) for depth in range(1, level + 2))
    tail = sum(len("\n" + "  " * depth + "]") for depth in range(level + 1))
    iterator = iter(items)
    first = True
    while batch := list(islice(iterator, batch_size)):
        nested: list[Any] = batch
        for _ in range(level):
            nested = [nested]
        text = dumps(nested)
        yield ("[\n" if first else ",\n") + "  " * (level + 1) + text[head:-tail]
        first = False
    yield "[]" if first else "\n" + "  " * level + "]"


class StreamedObject(dict[str, Any]):
    """A JSON object that `json_pieces` writes member by member, for a `LazyArray` inside it."""


class StreamedList(list[Any]):
    """A JSON array that `json_pieces` writes item by item, for a `LazyArray` inside it."""


def json_pieces(document: dict[str, Any], batch_size: int = BATCH) -> Iterator[str]:
    """`json.dumps(document, indent=2)` as consecutive pieces; their concatenation is that text.

    `LazyArray`s among the document's values, or inside `StreamedObject` and
    `StreamedList` values at any depth, are encoded `batch_size` items at a time and
    never held whole; everything else is encoded in one call.

    Args:
        document: A JSON object.
        batch_size: Items of a `LazyArray` per piece.

    Yields:
        Pieces of the text, in order.
    """
    return _pieces(StreamedObject(document), 0, batch_size)


def _pieces(value: Any, level: int, batch_size: int) -> Iterator[str]:
    if isinstance(value, LazyArray):
        yield from _array_pieces(value, level, batch_size)
    elif isinstance(value, (StreamedObject, StreamedList)):
        if not value:
            yield "{}" if isinstance(value, dict) else "[]"
            return
        inner = "\n" + "  " * (level + 1)
        separator = ("{" if isinstance(value, dict) else "[") + inner
        members = value.items() if isinstance(value, dict) else ((None, item) for item in value)
        for key, member in members:
            yield separator if key is None else separator + dumps(key) + ": "
            separator = "," + inner
            yield from _pieces(member, level + 1, batch_size)
        yield "\n" + "  " * level + ("}" if isinstance(value, dict) else "]")
    else:
        yield _indented(dumps(value), "  " * level)
