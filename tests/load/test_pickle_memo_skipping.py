"""The memo check that steps over fixed-size opcodes in compiled code decides as the opcode-by-opcode walk does."""

from __future__ import annotations

import pickle
import pickletools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlayout.errors import CorruptCheckpointError
from memlayout.load.pickle_memo import check_memo_indices, largest_memo_index

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
    max_leaves=60,
)


def _exact_refuses(data: bytes, start: int) -> bool:
    largest, end, _ = largest_memo_index(data, start)
    return largest >= max(end - start, 256)


def _fast_refuses(data: bytes, start: int) -> bool:
    try:
        check_memo_indices(data, "x", start)
    except CorruptCheckpointError:
        return True
    return False


@settings(max_examples=300, deadline=None)
@given(
    value=values,
    protocol=st.integers(0, 5),
    index=st.integers(0, 255) | st.integers(256, 1 << 16) | st.integers(0, (1 << 32) - 1),
    where=st.floats(0, 1),
    head=st.binary(max_size=8),
    tail=st.binary(max_size=3000),
)
def test_skipping_refuses_exactly_what_the_full_walk_refuses(
    value: object, protocol: int, index: int, where: float, head: bytes, tail: bytes
) -> None:
    data = pickle.dumps([value, value], protocol=protocol)
    # A LONG_BINPUT of any index at an opcode boundary: the walk reads opcode sizes only.
    boundaries = [position for _, _, position in pickletools.genops(data)]
    at = boundaries[min(int(where * len(boundaries)), len(boundaries) - 1)]
    edited = head + data[:at] + b"r" + struct.pack("<I", index) + data[at:] + tail
    assert _fast_refuses(edited, len(head)) == _exact_refuses(edited, len(head))


@pytest.mark.parametrize("trailing", [0, 10_000, 1 << 20])
def test_an_index_between_the_pickle_and_the_data_length_is_still_refused(trailing: int) -> None:
    # The indices stepped over are bounded by the data's length; a short pickle in
    # long data must still be held to its own length.
    data = b"\x80\x02N" + b"r" + struct.pack("<I", 5000) + b"." + bytes(trailing)
    refused = _fast_refuses(data, 0)
    assert refused == _exact_refuses(data, 0) == True  # noqa: E712


def test_one_match_steps_over_a_bounded_run() -> None:
    # The regex engine keeps state per repetition until a match ends: a DCP
    # .metadata's storage table, millions of fixed-size opcodes in a row, once
    # took 400 MiB in one match. Each match stops after _RUN opcodes; the walk goes on.
    from memlayout.load.pickle_memo import _RUN, _fixed_size_run

    data = b"N" * (3 * _RUN) + b"."
    assert _fixed_size_run(8)(data, 0).end() == _RUN  # type: ignore[union-attr]
    assert largest_memo_index(data) == largest_memo_index(data, skip_below=1 << 20) == (-1, len(data), False)
