"""Legacy (non-zip) torch.save files in every pickle protocol torch.save accepts (issue 21, item 1).

torch.save(..., _use_new_zipfile_serialization=False, pickle_protocol=N) writes
every pickle of the file with protocol N. torch.load reads protocols 1 to 5 back,
so memlayout must too; protocol 0 writes persistent ids as text, which torch.load
refuses, and so does memlayout. Each claim is checked by calling torch.load.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from memlayout.flatten.apply import as_bits
from memlayout.load import load_path
from memlayout.load.weights_only_allowlist import WEIGHTS_ONLY_PROTOCOLS
from tests.load.conftest import assert_one_line_error, run_cli
from tests.load.models import TinyLSTM

READABLE = [1, 2, 3, 4, 5]


def _checkpoint() -> dict[str, Any]:
    """Views, sharing, a transposed view, several dtypes, a parameter and a nested dict."""
    base = torch.arange(24, dtype=torch.float32)
    grid = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    weight = torch.nn.Parameter(torch.randn(4, 3))
    return {
        "base": base,
        "view": base[5:11],
        "strided": base[::3],
        "grid_t": grid.t(),
        "grid": grid,
        "half": torch.ones(5, dtype=torch.float16),
        "steps": torch.tensor([1, 2, 3], dtype=torch.int64),
        "flags": torch.tensor([True, False]),
        "model": {"weight": weight, "tied": weight},
    }


def _save(obj: Any, path: Path, protocol: int) -> Path:
    torch.save(obj, path, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    return path


def _torch_load(path: Path, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Detected pickle protocol N", for N above 2
        return torch.load(path, map_location="cpu", **kwargs)


def _tensors(tree: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a loaded tree of dicts, by dotted name."""
    found: dict[str, torch.Tensor] = {}
    for key, value in tree.items():
        if isinstance(value, torch.Tensor):
            found[f"{prefix}{key}"] = value
        else:
            found.update(_tensors(value, f"{prefix}{key}."))
    return found


def _torch_layouts(tree: Any) -> dict[str, tuple[str, tuple[int, ...], tuple[int, ...], int, int]]:
    """name -> (dtype, shape, stride, storage offset, storage identity), as torch loaded it."""
    return {
        name: (str(t.dtype).removeprefix("torch."), tuple(t.shape), t.stride(), t.storage_offset(),
               t.untyped_storage().data_ptr())
        for name, t in _tensors(tree).items()
    }


def _sharing(identities: dict[str, Any]) -> set[frozenset[str]]:
    groups: dict[Any, set[str]] = {}
    for name, identity in identities.items():
        groups.setdefault(identity, set()).add(name)
    return {frozenset(group) for group in groups.values()}


@pytest.mark.parametrize("protocol", READABLE)
def test_every_protocol_torch_reads_is_read_with_torchs_metadata(tmp_path: Path, protocol: int) -> None:
    path = _save(_checkpoint(), tmp_path / f"protocol{protocol}.pt", protocol)
    theirs = _torch_layouts(_torch_load(path, weights_only=False))
    source = load_path(str(path))
    assert source.format == "torch-legacy" and source.legacy_format
    records = {t.name: t for t in source.tensors}
    assert set(records) == set(theirs)
    for name, (dtype, shape, stride, offset, _) in theirs.items():
        mine = records[name]
        assert (mine.dtype, mine.shape, mine.stride, mine.offset) == (dtype, shape, stride, offset), name
    assert _sharing({n: t.storage_key for n, t in records.items()}) == _sharing({n: v[4] for n, v in theirs.items()})
    # The bytes memlayout locates are the bytes torch reads.
    loaded = _torch_load(path, weights_only=False)
    assert source.reader is not None
    base = records["base"]
    assert bytes(source.reader.read(base.storage_key, 0, 24 * 4)) == loaded["base"].numpy().tobytes()


@pytest.mark.parametrize("protocol", READABLE)
def test_every_readable_protocol_is_ml602_and_nothing_unsafe(tmp_path: Path, protocol: int) -> None:
    path = _save(_checkpoint(), tmp_path / "old.pt", protocol)
    result = run_cli("inspect", str(path), "--format", "json", "--fail-on", "never")
    assert result.exit_code == 0, result.stderr
    assert '"ML602"' in result.stdout and '"ML601"' not in result.stdout


@pytest.mark.parametrize("protocol", READABLE)
def test_flatten_writes_a_zip_that_is_bitwise_the_legacy_file(tmp_path: Path, protocol: int) -> None:
    path = _save(_checkpoint(), tmp_path / "old.pt", protocol)
    out = tmp_path / "flat.pt"
    result = run_cli("flatten", str(path), "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert out.read_bytes()[:4] == b"PK\x03\x04"
    before, after = _torch_load(path, weights_only=False), _torch_load(out, weights_only=True)
    layouts_before, layouts_after = _torch_layouts(before), _torch_layouts(after)
    assert {n: v[:4] for n, v in layouts_before.items()} == {n: v[:4] for n, v in layouts_after.items()}
    assert (_sharing({n: v[4] for n, v in layouts_before.items()})
            == _sharing({n: v[4] for n, v in layouts_after.items()}))
    flat = _tensors(after)
    for name, tensor in _tensors(before).items():
        assert torch.equal(as_bits(flat[name]), as_bits(tensor)), name


def test_a_pickled_module_in_protocol_1_is_read_with_its_modules(tmp_path: Path) -> None:
    path = _save(TinyLSTM(), tmp_path / "module.pt", 1)
    loaded = _torch_load(path, weights_only=False)
    names = {t.name for t in load_path(str(path)).tensors}
    assert names == {name for name, _ in loaded.named_parameters()}
    result = run_cli("inspect", str(path), "--format", "json")
    assert '"ML601"' in result.stdout and "torch.nn.modules.rnn.LSTM" in result.stdout


def test_protocol_0_is_refused_as_torch_load_refuses_it(tmp_path: Path) -> None:
    path = _save(_checkpoint(), tmp_path / "protocol0.pt", 0)
    with pytest.raises(AssertionError, match="saved_id must be a tuple"):
        _torch_load(path, weights_only=False)
    with pytest.raises(pickle.UnpicklingError):
        _torch_load(path, weights_only=True)
    assert_one_line_error(run_cli("inspect", str(path)), "pickle protocol 0", "torch.load cannot read this file either")
    assert_one_line_error(run_cli("flatten", str(path), "-o", str(tmp_path / "out.pt")), "pickle protocol 0")
    assert not (tmp_path / "out.pt").exists()


def test_protocol_0_without_tensors_is_read_as_torch_reads_it(tmp_path: Path) -> None:
    # No persistent id, nothing for torch.load to refuse: it reads the file, and so does memlayout.
    path = _save({"epoch": 3, "name": "run"}, tmp_path / "protocol0.pt", 0)
    assert _torch_load(path, weights_only=False) == {"epoch": 3, "name": "run"}
    source = load_path(str(path))
    assert source.format == "torch-legacy" and source.tensors == []


@pytest.mark.parametrize("protocol", [0, *READABLE])
def test_weights_only_protocols_are_the_ones_torchs_weights_only_loader_reads(tmp_path: Path, protocol: int) -> None:
    # flatten picks its loader by this table; a torch upgrade that changes it fails here.
    path = _save({"w": torch.ones(2)}, tmp_path / "old.pt", protocol)
    try:
        _torch_load(path, weights_only=True)
    except pickle.UnpicklingError:
        reads = False
    else:
        reads = True
    assert reads == (protocol in WEIGHTS_ONLY_PROTOCOLS)
