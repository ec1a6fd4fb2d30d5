"""torch.distributed.checkpoint directories: metadata only, never plain pickle.load."""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch

from memlayout.errors import CorruptCheckpointError
from memlayout.load import load_path
from memlayout.pipeline.inspection import run_inspection
from tests.load import malicious
from tests.load.conftest import assert_one_line_error, run_cli


@pytest.fixture(scope="module")
def dcp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A nested training state written by dcp.save in one process, no process group."""
    import torch.distributed.checkpoint as dcp

    directory = tmp_path_factory.mktemp("dcp")
    state = {"model": {"w": torch.randn(4, 3), "b": torch.zeros(4, dtype=torch.bfloat16)}, "step": 3}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(directory))
    return directory


def _copy(source: Path, target: Path) -> Path:
    target.mkdir()
    for item in source.iterdir():
        (target / item.name).write_bytes(item.read_bytes())
    return target


def test_names_global_shapes_and_dtypes_come_from_metadata(dcp_dir: Path) -> None:
    source = load_path(str(dcp_dir))
    by_name = {t.name: t for t in source.tensors}
    assert source.format == "dcp"
    assert set(by_name) == {"model.w", "model.b"}  # "step" is a bytes entry, not a tensor
    assert (by_name["model.w"].shape, by_name["model.w"].dtype) == ((4, 3), "float32")
    assert by_name["model.b"].dtype == "bfloat16"
    assert not any(s.has_data for s in source.storages.values())
    assert source.storages["model.w"].nbytes == 48


def test_genuine_metadata_is_not_flagged_unsafe(dcp_dir: Path) -> None:
    assert "ML601" not in {f.code for f in run_inspection(str(dcp_dir)).findings}


def test_metadata_is_never_read_with_plain_pickle(dcp_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("plain pickle.load must not read .metadata")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    assert len(load_path(str(dcp_dir)).tensors) == 2


def test_sharded_tensor_chunks_are_reported(tmp_path: Path) -> None:
    from torch.distributed.checkpoint import metadata as meta

    chunks = [
        meta.ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([2, 3])),
        meta.ChunkStorageMetadata(offsets=torch.Size([2, 0]), sizes=torch.Size([2, 3])),
    ]
    properties = meta.TensorProperties(dtype=torch.float16)
    metadata = meta.Metadata(state_dict_metadata={"w": meta.TensorStorageMetadata(properties, torch.Size([4, 3]),
                                                                                  chunks)})
    (tmp_path / ".metadata").write_bytes(pickle.dumps(metadata))
    source = load_path(str(tmp_path))
    (tensor,) = source.tensors
    assert (tensor.shape, tensor.dtype) == ((4, 3), "float16")
    assert any("sharded in 2 chunks: [0:2,0:3] [2:4,0:3]" in note for note in source.notes)


def test_directory_without_metadata_is_a_one_line_cli_error(dcp_dir: Path, tmp_path: Path) -> None:
    broken = _copy(dcp_dir, tmp_path / "broken")
    os.remove(broken / ".metadata")
    assert_one_line_error(run_cli("inspect", str(broken)), "no .metadata")


def test_metadata_naming_a_missing_data_file_is_a_one_line_cli_error(dcp_dir: Path, tmp_path: Path) -> None:
    broken = _copy(dcp_dir, tmp_path / "broken")
    for item in broken.glob("*.distcp"):
        item.unlink()
    # Keep the directory recognizable as DCP by its .metadata alone.
    assert_one_line_error(run_cli("inspect", str(broken)), "missing")


def test_malicious_metadata_executes_nothing_and_is_named(tmp_path: Path, marker: Path) -> None:
    m = malicious
    body = (
        m.PROTO2
        + m.global_("torch.distributed.checkpoint.metadata", "Metadata") + m.EMPTY_TUPLE + m.NEWOBJ
        + m.EMPTY_DICT
        + m.text("state_dict_metadata") + m.EMPTY_DICT + m.SETITEM
        + m.text("planner_data") + m.call("os", "system", m.text(m.shell_payload(str(marker)))) + m.SETITEM
        + m.BUILD + m.STOP
    )
    (tmp_path / ".metadata").write_bytes(body)
    (finding,) = [f for f in run_inspection(str(tmp_path)).findings if f.code == "ML601"]
    assert "os.system" in finding.message
    assert "Metadata" not in finding.message
    assert not marker.exists()


@pytest.mark.parametrize("payload", malicious.PAYLOADS[:3], ids=lambda p: p.name)
def test_bare_payload_as_metadata_is_refused_without_running(tmp_path: Path, marker: Path,
                                                             payload: malicious.Payload) -> None:
    (tmp_path / ".metadata").write_bytes(payload.build(str(marker)))
    with pytest.raises(CorruptCheckpointError):
        load_path(str(tmp_path))
    assert not marker.exists()
