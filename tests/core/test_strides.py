"""Strided geometry checked against brute force: explicit byte sets and torch itself."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import memlayout
from memlayout.core.strides import (
    MemoryFormat,
    Relation,
    byte_set,
    has_internal_overlap,
    is_contiguous,
    memory_format,
)

STORAGE_ELEMENTS = 96


@st.composite
def views(draw: st.DrawFn, max_dims: int = 4) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """A (shape, stride, offset) that stays inside a STORAGE_ELEMENTS-element storage."""
    ndim = draw(st.integers(0, max_dims))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim)))
    stride = tuple(draw(st.lists(st.integers(0, 12), min_size=ndim, max_size=ndim)))
    reach = sum((s - 1) * t for s, t in zip(shape, stride, strict=True) if s > 0)
    offset = draw(st.integers(0, max(0, STORAGE_ELEMENTS - 1 - reach)))
    if reach + offset >= STORAGE_ELEMENTS:
        shape = tuple(0 for _ in shape)
    return shape, stride, offset


def element_offsets(shape: tuple[int, ...], stride: tuple[int, ...], offset: int) -> list[int]:
    return [
        offset + sum(i * s for i, s in zip(index, stride, strict=True))
        for index in itertools.product(*(range(n) for n in shape))
    ]


def brute_bytes(shape: tuple[int, ...], stride: tuple[int, ...], offset: int, itemsize: int) -> set[int]:
    return {e * itemsize + b for e in element_offsets(shape, stride, offset) for b in range(itemsize)}


def brute_relation(a: set[int], b: set[int]) -> Relation:
    if not a & b:
        return Relation.DISJOINT
    if a == b:
        return Relation.EQUAL
    if b <= a:
        return Relation.CONTAINS
    if a <= b:
        return Relation.CONTAINED
    return Relation.PARTIAL


@settings(max_examples=300, deadline=None)
@given(views(), st.sampled_from([1, 2, 4, 8]))
def test_byte_set_is_exactly_the_bytes_the_view_touches(view: tuple, itemsize: int) -> None:
    shape, stride, offset = view
    intervals = byte_set(shape, stride, offset, itemsize).intervals
    covered = {b for start, end in intervals for b in range(start, end)}
    assert covered == brute_bytes(shape, stride, offset, itemsize)
    # Intervals are sorted, disjoint and not touching (fully merged).
    assert all(a_end < b_start for (_, a_end), (b_start, _) in itertools.pairwise(intervals))
    # The span is the lowest and one past the highest byte touched; (0, 0) for none.
    touched = byte_set(shape, stride, offset, itemsize)
    assert touched.span == ((min(covered), max(covered) + 1) if covered else (0, 0))
    assert touched.span == (touched.start, touched.end)


@settings(max_examples=300, deadline=None)
@given(views(), views(), st.sampled_from([1, 4]))
def test_relation_matches_brute_force(first: tuple, second: tuple, itemsize: int) -> None:
    a = byte_set(*first, itemsize)
    b = byte_set(*second, itemsize)
    expected = brute_relation(brute_bytes(*first, itemsize), brute_bytes(*second, itemsize))
    assert memlayout.core.strides.relation(a, b) is expected


@settings(max_examples=400, deadline=None)
@given(views())
def test_internal_overlap_matches_brute_force(view: tuple) -> None:
    shape, stride, offset = view
    offsets = element_offsets(shape, stride, offset)
    assert has_internal_overlap(shape, stride) == (len(set(offsets)) < len(offsets))


@settings(max_examples=300, deadline=None)
@given(views())
def test_contiguity_and_memory_format_agree_with_torch(view: tuple) -> None:
    shape, stride, offset = view
    tensor = torch.empty(STORAGE_ELEMENTS).as_strided(shape, stride, offset)
    assert is_contiguous(shape, stride) == tensor.is_contiguous()
    fmt = memory_format(shape, stride)
    if fmt is MemoryFormat.CHANNELS_LAST:
        assert tensor.is_contiguous(memory_format=torch.channels_last)
    if len(shape) == 4 and tensor.is_contiguous(memory_format=torch.channels_last):
        assert fmt in (MemoryFormat.CONTIGUOUS, MemoryFormat.CHANNELS_LAST)


@settings(max_examples=150, deadline=None)
@given(st.lists(views(max_dims=3), min_size=2, max_size=5))
def test_alias_pairs_of_a_checkpoint_match_brute_force(view_list: list[tuple]) -> None:
    base = torch.arange(STORAGE_ELEMENTS, dtype=torch.float32)
    state = {f"t{i}": base.as_strided(*v) for i, v in enumerate(view_list)}
    report = memlayout.inspect(state)
    facts = report.facts
    found = {
        frozenset((p.first, p.second)): p.relation for g in facts.alias_groups for p in g.pairs
    }
    names = list(state)
    for i, j in itertools.combinations(range(len(names)), 2):
        a, b = facts.tensor(names[i]), facts.tensor(names[j])
        assert a is not None and b is not None
        if a is b:
            continue  # identical views merge into one fact with two names
        expected = brute_relation(brute_bytes(*view_list[i], 4), brute_bytes(*view_list[j], 4))
        got = found.get(frozenset((a.name, b.name)), Relation.DISJOINT)
        if got is not Relation.DISJOINT or expected is not Relation.DISJOINT:
            # Orientation of CONTAINS/CONTAINED depends on pair order; compare unordered.
            flip = {Relation.CONTAINS: Relation.CONTAINED, Relation.CONTAINED: Relation.CONTAINS}
            assert got in (expected, flip.get(expected, expected))
    partial = {frozenset(f.tensors) for f in report.findings if f.code == "ML101"}
    expected_partial = {
        frozenset((facts.tensor(names[i]).name, facts.tensor(names[j]).name))  # type: ignore[union-attr]
        for i, j in itertools.combinations(range(len(names)), 2)
        if brute_relation(brute_bytes(*view_list[i], 4), brute_bytes(*view_list[j], 4)) is Relation.PARTIAL
    }
    assert partial == expected_partial


def test_used_bytes_of_a_storage_are_the_union_of_its_views() -> None:
    base = torch.arange(100, dtype=torch.float32)
    report = memlayout.inspect({"a": base[:10], "b": base[5:20], "c": base[50:60]})
    (storage,) = report.facts.storages
    assert storage.used == ((0, 80), (200, 240))
    assert storage.used_bytes == 120
    assert storage.unused_bytes == 400 - 120


def test_gaps_that_only_align_the_next_slot_are_padding_not_bloat() -> None:
    base = torch.zeros(64, dtype=torch.float32)  # 256 bytes
    # Slots at bytes 0..20 and 64..100 show 64-byte alignment: the 44-byte gap is
    # padding, the 156-byte tail is longer than any 64-byte alignment needs.
    report = memlayout.inspect({"a": base[:5], "b": base[16:25]})
    (storage,) = report.facts.storages
    assert storage.padding_bytes == 64 - 20
    assert storage.unused_bytes == 256 - 100
    # A tail shorter than the slot alignment is padding.
    report = memlayout.inspect({"a": base[:5], "b": base[16:60]})
    assert report.facts.storages[0].padding_bytes == 44 + 16
    assert report.facts.storages[0].unused_bytes == 0


def test_a_lone_slice_shows_no_alignment_so_its_tail_is_bloat() -> None:
    base = torch.zeros(64, dtype=torch.float32)
    (storage,) = memlayout.inspect({"a": base[:5]}).facts.storages
    assert (storage.padding_bytes, storage.unused_bytes) == (0, 256 - 20)


def test_the_tail_flatten_rounds_a_one_slot_buffer_up_to_is_padding() -> None:
    # Issue 26: a group of one tensor becomes a buffer of one slot, its end rounded
    # up to 64 bytes; no slot start shows the alignment, yet the tail is padding.
    state = {"w": torch.randn(10), "steps": torch.tensor([3, 1], dtype=torch.int64)}
    memlayout.flatten(state)
    storages = memlayout.inspect(state).facts.storages
    assert sorted((s.nbytes, s.used_bytes, s.padding_bytes, s.unused_bytes) for s in storages) == [
        (64, 16, 48, 0), (64, 40, 24, 0),
    ]


@pytest.mark.parametrize(
    ("elements", "used", "waste"),
    [
        (1024, 10, 4096 - 40),  # ML301's own example, on a storage a multiple of 64 bytes
        (32, 10, 128 - 40),  # a tail of 64 bytes or more is more than the rounding
        (17, 15, 8),  # a storage that does not end on a 64-byte boundary was not rounded
    ],
)
def test_a_users_slice_that_is_not_flattens_tail_rounding_stays_bloat(elements: int, used: int, waste: int) -> None:
    (storage,) = memlayout.inspect({"a": torch.zeros(elements)[:used]}).facts.storages
    assert (storage.padding_bytes, storage.unused_bytes) == (0, waste)
