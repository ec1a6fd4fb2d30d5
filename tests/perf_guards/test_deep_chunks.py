"""Chunked content reads give exactly what reading the whole tensor gives."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import memlayout
from memlayout.core.content import ContentReader
from memlayout.core.fact_builder import build_facts
from memlayout.core.facts import Facts
from memlayout.load import load_path
from memlayout.load.records import LoadedSource
from memlayout.rules import RuleConfig


def _bits(tensor: torch.Tensor) -> np.ndarray:
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.contiguous().view(width).numpy().reshape(-1).view(f"u{tensor.element_size()}")


def _load(path: Path) -> tuple[LoadedSource, Facts, ContentReader]:
    source = load_path(str(path))
    facts = build_facts(source)
    assert source.reader is not None
    # A tiny chunk size forces many chunks and every split path.
    reader = ContentReader(source.reader, {s.id: s.key for s in facts.storages}, chunk_bytes=256)
    return source, facts, reader


@pytest.fixture
def state() -> dict[str, torch.Tensor]:
    base = torch.randn(40, 30)
    cube = torch.randn(6, 7, 8)
    return {
        "plain": base,
        "transposed": torch.randn(30, 40).t(),
        "sliced": torch.randn(50, 50)[5:45, 10:40],
        "permuted": cube.permute(2, 0, 1),
        "stepped": torch.randn(4000)[::7],
        "half": torch.randn(33, 17).half().t(),
        "bf16": torch.randn(129).bfloat16(),
    }


def test_chunks_concatenate_to_the_logical_order(tmp_path: Path, state: dict[str, torch.Tensor]) -> None:
    path = tmp_path / "views.pt"
    torch.save(state, path)
    source, facts, reader = _load(path)
    try:
        for name, tensor in state.items():
            fact = facts.tensor(name)
            assert fact is not None
            chunks = list(reader.chunks(fact))
            assert len(chunks) > 1 or tensor.numel() * tensor.element_size() <= 256
            assert np.array_equal(np.concatenate(chunks), _bits(tensor)), name
    finally:
        source.close()


def test_non_finite_counts_across_chunk_boundaries(tmp_path: Path) -> None:
    values = torch.randn(1000)
    bad = [0, 63, 64, 65, 511, 999]
    values[bad[:3]] = float("nan")
    values[bad[3:]] = float("inf")
    transposed = torch.randn(40, 25)
    transposed[3, 7] = float("-inf")
    path = tmp_path / "nan.pt"
    torch.save({"v": values, "t": transposed.t(), "h": values.half(), "b": values.bfloat16()}, path)
    source, facts, reader = _load(path)
    try:
        counts = {name: reader.non_finite(facts.tensor(name)) for name in ("v", "t", "h", "b")}  # type: ignore[arg-type]
    finally:
        source.close()
    assert counts == {"v": len(bad), "t": 1, "h": len(bad), "b": len(bad)}


def test_equal_and_fingerprint_ignore_strides(tmp_path: Path) -> None:
    base = torch.randn(48, 36)
    other = base.clone()
    other[47, 35] += 1
    path = tmp_path / "pairs.pt"
    torch.save({"a": base, "b": base.t().contiguous().t(), "c": other}, path)
    source, facts, reader = _load(path)
    try:
        a, b, c = (facts.tensor(n) for n in "abc")
        assert a is not None and b is not None and c is not None
        assert not b.contiguous
        assert reader.equal(a, b) and not reader.equal(a, c)
        assert reader.fingerprint(a) == reader.fingerprint(b)
    finally:
        source.close()


def test_duplicates_are_found_with_and_without_deep(tmp_path: Path) -> None:
    base = torch.randn(64, 64)
    state = {"a": base, "b": base.clone(), "c": base.t().contiguous().t(), "d": torch.randn(64, 64)}
    state["e"] = base.clone()
    state["e"][63, 63] += 1  # agrees with the others on every sample but the last
    path = tmp_path / "dups.pt"
    torch.save(state, path)
    for deep in (False, True):
        findings = memlayout.inspect(str(path), config=RuleConfig(deep=deep)).findings
        groups = [set(f.tensors) for f in findings if f.code == "ML102"]
        assert groups == [{"a", "b", "c"}], (deep, groups)


def test_zip64_directories_are_read(tmp_path: Path) -> None:
    # Checkpoints over 4 GiB keep offsets in zip64 extra fields and a zip64 end record;
    # lowering zipfile's limits makes it write both for a tiny file.
    plain = tmp_path / "plain.pt"
    torch.save({"w": torch.randn(16, 16), "b": torch.randn(16)}, plain)
    rewritten = tmp_path / "zip64.pt"
    with zipfile.ZipFile(plain) as source:
        entries = [(info, source.read(info)) for info in source.infolist()]
    limits = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
    zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = 8, 1
    try:
        with zipfile.ZipFile(rewritten, "w") as target:
            for info, data in entries:
                target.writestr(info, data)
    finally:
        zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = limits
    assert b"PK\x06\x06" in rewritten.read_bytes()
    expected = memlayout.inspect(str(plain), config=RuleConfig(deep=True))
    actual = memlayout.inspect(str(rewritten), config=RuleConfig(deep=True))
    # zipfile does not align records as torch does, so alignment findings may differ;
    # the tensors, storages and values read must not.
    layout = [(t.name, t.shape, t.stride, t.dtype, t.nbytes) for t in expected.facts.tensors]
    assert [(t.name, t.shape, t.stride, t.dtype, t.nbytes) for t in actual.facts.tensors] == layout
    assert actual.summary.storage_bytes == expected.summary.storage_bytes
    source, facts, reader = _load(rewritten)
    try:
        weight = facts.tensor("w")
        assert weight is not None
        assert np.array_equal(np.concatenate(list(reader.chunks(weight))), _bits(torch.load(plain)["w"]))
    finally:
        source.close()


def test_fast_finite_test_never_misses_a_special_value() -> None:
    # The scan proves chunks finite with two max reductions; check that shortcut
    # against the exact mask test on every bit pattern of the 1- and 2-byte floats,
    # one value per chunk so no neighbour can hide a miss.
    from memlayout.core.content import _NonFiniteCounter
    from memlayout.dtypes import DTYPES

    for info in DTYPES.values():
        if not info.is_floating or info.itemsize > 2:
            continue
        assert info.special_mask is not None and info.special_pattern is not None
        counter = _NonFiniteCounter(info.special_mask, info.special_pattern)
        width = np.uint8 if info.itemsize == 1 else np.uint16
        patterns = np.arange(1 << (8 * info.itemsize), dtype=np.uint32).astype(width)
        expected = (patterns & info.special_mask) == info.special_pattern
        found = np.array([counter.count(patterns[i : i + 1]) for i in range(patterns.size)])
        assert np.array_equal(found, expected.astype(int)), info.name


def test_float32_and_float64_specials_are_counted() -> None:
    from memlayout.core.content import non_finite_count

    for dtype, width in (("float32", np.uint32), ("float64", np.uint64)):
        values = np.array([0.0, -0.0, 1.5, -2.0, np.inf, -np.inf, np.nan, -np.nan, np.finfo(dtype).max], dtype=dtype)
        assert non_finite_count(values.view(width), dtype) == 4
        assert non_finite_count(values[[0, 1, 2, 3, 8]].view(width), dtype) == 0
