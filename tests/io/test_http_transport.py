"""The HTTP transport's own pieces: spans merged into one Range header, multipart replies cut back into spans."""

from __future__ import annotations

import pytest

pytest.importorskip("aiohttp")

from memlayout.errors import RemoteReadError
from memlayout.io.http_transport import MERGE_GAP, _merged, _parts, _range_value
from memlayout.load.remote_hub import _next_page


def test_spans_that_touch_or_lie_close_are_asked_as_one_and_suffixes_stay_apart() -> None:
    spans = [(200, 230), (0, 64), (230 + MERGE_GAP, 500), (5000, 5030), (-98, None), (210, 220)]
    assert _merged(spans) == [(0, 64), (200, 500), (5000, 5030), (-98, None)]
    assert _range_value(_merged(spans)) == "bytes=0-63,200-499,5000-5029,-98"


def multipart(boundary: str, parts: list[tuple[int, bytes]], size: int) -> bytes:
    body = b""
    for start, data in parts:
        body += (f"--{boundary}\r\nContent-Type: application/octet-stream\r\n"
                 f"Content-Range: bytes {start}-{start + len(data) - 1}/{size}\r\n\r\n").encode() + data + b"\r\n"
    return body + f"--{boundary}--\r\n".encode()


def test_a_multipart_reply_is_cut_by_each_parts_range_even_where_the_data_holds_the_boundary() -> None:
    tricky = b"--b0undary\r\n\r\n" * 3  # the boundary's text inside a part's bytes
    body = multipart("b0undary", [(0, b"head"), (100, tricky)], 1000)
    parts = _parts('multipart/byteranges; boundary="b0undary"', {}, body, "u")
    assert parts == [(0, b"head", 1000), (100, tricky, 1000)]


def test_a_single_part_reply_is_its_content_range() -> None:
    assert _parts("application/octet-stream", {"Content-Range": "bytes 10-13/99"}, b"abcd", "u") == [(10, b"abcd", 99)]


def test_a_part_without_its_range_is_a_damaged_reply() -> None:
    body = b"--x\r\nContent-Type: text/plain\r\n\r\nabc\r\n--x--\r\n"
    with pytest.raises(RemoteReadError, match="a part without its byte range"):
        _parts("multipart/byteranges; boundary=x", {}, body, "http://h/f")


def test_the_hubs_next_page_is_read_from_its_link_header() -> None:
    link = '<https://hub/api/models/a/b/tree/main?cursor=xyz>; rel="next", <https://hub/first>; rel="first"'
    assert _next_page(link) == "https://hub/api/models/a/b/tree/main?cursor=xyz"
    assert _next_page("") is None
