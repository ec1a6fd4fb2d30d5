"""The memo-index walk: agrees with pickletools, refuses indices no pickle can hold, never hangs."""

from __future__ import annotations

import io
import pickle
import pickletools
import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlayout.errors import CorruptCheckpointError
from memlayout.load.pickle_memo import (
    check_memo_indices,
    check_stream_memo_indices,
    largest_memo_index,
)
from memlayout.load.restricted_pickle import unpickle

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner) | st.tuples(inner, inner),
    max_leaves=40,
)


@settings(max_examples=200, deadline=None)
@given(value=values, protocol=st.integers(0, 5))
def test_the_walk_finds_what_pickletools_finds(value: object, protocol: int) -> None:
    shared = [value, value]  # shared references make the pickler memoize
    data = pickle.dumps(shared, protocol=protocol)
    # BINPUT's one-byte index is harmless and not tracked; PUT and LONG_BINPUT are.
    puts = [arg for opcode, arg, _ in pickletools.genops(data) if opcode.name in ("PUT", "LONG_BINPUT")]
    largest, end, ran_out = largest_memo_index(data + b"trailing bytes after STOP")
    assert largest == max(puts, default=-1)
    assert (end, ran_out) == (len(data), False)
    check_memo_indices(data, "a genuine pickle")


@settings(max_examples=150, deadline=None)
@given(
    names=st.lists(st.text(max_size=300) | st.just("r\xff\xff\xff\x7f"), max_size=30),
    far=st.integers(1 << 20, (1 << 32) - 1),
)
def test_the_skipping_walk_steps_over_strings_as_the_full_walk_does(names: list[str], far: int) -> None:
    # A far LONG_BINPUT after strings of every length, some that look like one:
    # stepping over a string by the wrong length would lose it or find a false one.
    data = pickle.dumps(names, protocol=2)
    data = data[:-1] + b"r" + struct.pack("<I", far) + b"."
    full = largest_memo_index(data)
    skipping = largest_memo_index(data, skip_below=1 << 20)
    assert full[0] == far
    assert skipping == full


@pytest.mark.parametrize(
    "body",
    [
        b"N" + b"r" + struct.pack("<I", 959_917_433),  # LONG_BINPUT, as fuzzing found it
        b"N" + b"p1000000000\n",  # PUT, protocol 0's text form
    ],
    ids=["LONG_BINPUT", "PUT"],
)
def test_an_index_beyond_the_pickle_is_refused_before_any_allocation(body: bytes) -> None:
    data = b"\x80\x02" + body + b"."
    started = time.perf_counter()
    with pytest.raises(CorruptCheckpointError, match="memo slot"):
        unpickle(data, what="x")
    assert time.perf_counter() - started < 1.0


def test_small_indices_stay_allowed_whatever_the_length() -> None:
    # BINPUT's one-byte index can always be written, even in a tiny pickle.
    check_memo_indices(b"\x80\x02Nq\xff0N.", "x")


@pytest.mark.parametrize("data", [b"cos\n", b"c", b"\x8c", b"X\x10\x00\x00\x00ab", b"\x95" + b"\xff" * 8])
def test_truncated_arguments_end_the_walk(data: bytes) -> None:
    # A GLOBAL with one newline once made the walk step backwards, forever.
    started = time.perf_counter()
    largest, _, ran_out = largest_memo_index(data)
    assert (largest, ran_out) == (-1, True)
    assert time.perf_counter() - started < 0.1


def test_a_stream_is_read_only_up_to_stop_and_left_where_it_was() -> None:
    class Counting(io.BytesIO):
        read_bytes = 0

        def read(self, size: int | None = -1) -> bytes:
            chunk = super().read(size)
            Counting.read_bytes += len(chunk)
            return chunk

    pickled = pickle.dumps(list(range(300)), protocol=2)
    stream = Counting(b"junk" + pickled + bytes(50 << 20))  # a legacy file: storages after the pickle
    buffered = io.BufferedReader(stream)  # type: ignore[arg-type]
    buffered.seek(4)
    check_stream_memo_indices(buffered, "x")
    assert buffered.tell() == 4
    assert Counting.read_bytes < 8 << 20
