"""Every loader's shared ending: a `LoadedSource` closes its files, and a failed load leaves none open."""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from memlayout.errors import CorruptCheckpointError
from memlayout.load import load_path

FIXTURES = Path(__file__).resolve().parent.parent.parent / "fixtures" / "formats"


def _open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _mapped_paths() -> list[str]:
    with open("/proc/self/maps") as maps:
        return [line.split(maxsplit=5)[-1].strip() for line in maps if "/" in line]


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"embed.weight": torch.randn(8, 4), "head.weight": torch.randn(8, 4), "norm.bias": torch.zeros(4)}


def _hf_dir(folder: Path, pickled: bool) -> None:
    state = _state()
    names = sorted(state)
    shards = {f"model-0000{i + 1}-of-00002.{'bin' if pickled else 'safetensors'}": names[i::2] for i in range(2)}
    for shard, keys in shards.items():
        part = {key: state[key] for key in keys}
        if pickled:
            torch.save(part, folder / shard)
        else:
            save_file(part, folder / shard)
    index = "pytorch_model.bin.index.json" if pickled else "model.safetensors.index.json"
    weight_map = {key: shard for shard, keys in shards.items() for key in keys}
    (folder / index).write_text(json.dumps({"weight_map": weight_map}))
    (folder / "config.json").write_text("{}")


WRITERS: dict[str, Callable[[Path], Path]] = {
    "torch-zip": lambda p: (torch.save(_state(), p / "m.pt"), p / "m.pt")[1],
    "torch-legacy": lambda p: (torch.save(_state(), p / "m.pt", _use_new_zipfile_serialization=False), p / "m.pt")[1],
    "torch-legacy-tar": lambda p: FIXTURES / "legacy_tar_state_dict.pt",
    "safetensors": lambda p: (save_file(_state(), p / "m.safetensors"), p / "m.safetensors")[1],
    "torchscript": lambda p: (torch.jit.save(torch.jit.script(torch.nn.Linear(3, 3)), p / "s.pt"), p / "s.pt")[1],
    "hf-safetensors": lambda p: (_hf_dir(p, pickled=False), p)[1],
    "hf-pytorch": lambda p: (_hf_dir(p, pickled=True), p)[1],
}


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_leaving_the_with_block_closes_every_file_the_loader_opened(tmp_path: Path, fmt: str) -> None:
    path = WRITERS[fmt](tmp_path)
    before = _open_descriptors()
    with load_path(str(path)) as source:
        assert source.format == fmt
        assert source.reader is not None
        assert _open_descriptors() > before, "the reader holds its files open while in use"
        assert any(str(path) in mapped for mapped in _mapped_paths())
    assert _open_descriptors() == before
    assert not any(str(path) in mapped for mapped in _mapped_paths())
    source.close()  # closing again is harmless


def test_a_load_that_fails_after_the_spans_are_known_leaves_no_file_open(tmp_path: Path) -> None:
    path = tmp_path / "missing_storage.pt"
    buffer = io.BytesIO()
    torch.save({"w": torch.zeros(4)}, buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as original, zipfile.ZipFile(path, "w") as damaged:
        for info in original.infolist():
            if not info.filename.endswith("/data/0"):
                damaged.writestr(info, original.read(info))
    before = _open_descriptors()
    with pytest.raises(CorruptCheckpointError, match="names storage 0, which the file lacks"):
        load_path(str(path))
    assert _open_descriptors() == before
    assert not any(str(path) in mapped for mapped in _mapped_paths())


def test_a_damaged_shard_leaves_the_shards_before_it_closed(tmp_path: Path) -> None:
    _hf_dir(tmp_path, pickled=True)
    (tmp_path / "model-00002-of-00002.bin").write_bytes(b"PK\x03\x04 not a zip")
    before = _open_descriptors()
    with pytest.raises(CorruptCheckpointError):
        load_path(str(tmp_path))
    assert _open_descriptors() == before
