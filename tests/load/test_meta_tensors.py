"""Tensors torch.save writes without a storage (meta tensors) are read with the storage torch gives them back."""

from __future__ import annotations

from pathlib import Path

import pytest

import memlayout
from tests.invariants import violations

torch = pytest.importorskip("torch")


def test_a_meta_tensor_gets_a_storage_as_large_as_torch_rebuilds_it(tmp_path: Path) -> None:
    path = tmp_path / "meta.pt"
    torch.save({"w": torch.empty(10, device="meta"), "v": torch.empty(3, 4, device="meta")[:, 1]}, path)
    loaded = torch.load(path)
    inspection = memlayout.inspect(str(path))
    storages = {s.id: s for s in inspection.facts.storages}
    for view in inspection.facts.tensors:
        rebuilt = loaded[view.name]
        assert storages[view.storage].nbytes == rebuilt.untyped_storage().nbytes(), view.name
        assert storages[view.storage].device == "meta"
    assert violations(str(path)) == []
