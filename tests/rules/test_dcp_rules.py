"""The rules DCP's metadata can answer run on it: chunks that cover elements twice (ML106), and ties (ML103).

Every directory is written by torch.distributed.checkpoint's own writer (a custom
planner where the default one refuses what the test needs), and each claim a
finding makes is checked against dcp.load.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from memlayout.pipeline.inspection import run_inspection
from memlayout.rules import RuleConfig
from tests.load.dcp_writers import save_overlapping_rows

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def _dcp():  # type: ignore[no-untyped-def]
    import torch.distributed.checkpoint as dcp

    return dcp


def _codes(path: Path, *ties: tuple[str, str]) -> dict[str, str]:
    report = run_inspection(str(path), config=RuleConfig(ties=ties))
    return {f.code: f.message for f in report.findings}


def test_chunks_that_overlap_are_ml106_and_dcp_load_keeps_the_last_ones_values(tmp_path: Path) -> None:
    weight = torch.arange(12.0).reshape(4, 3)
    path = save_overlapping_rows(tmp_path / "ckpt", weight, [(0, 3), (2, 4)], drift=100.0)
    message = _codes(path)["ML106"]
    assert "w: chunk [0:3,0:3] overlaps chunk [2:4,0:3] (3 elements" in message
    assert "get the values of the chunk it reads last" in message
    loaded = {"w": torch.zeros(4, 3)}
    _dcp().load(loaded, checkpoint_id=str(path))
    # Row 2 is in both chunks: the first chunk's values (6, 7, 8) are gone without a word.
    assert loaded["w"][2].tolist() == [106.0, 107.0, 108.0]


def test_chunks_that_tile_the_tensor_are_not_reported(tmp_path: Path) -> None:
    path = save_overlapping_rows(tmp_path / "ckpt", torch.ones(4, 3), [(0, 2), (2, 4)])
    assert "ML106" not in _codes(path)


def test_dcps_own_planner_refuses_overlapping_chunks(tmp_path: Path) -> None:
    # The premise of the rule's hint: DefaultSavePlanner's global-plan check refuses them.
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    with pytest.raises(CheckpointException, match="has overlapping chunks"):
        save_overlapping_rows(tmp_path / "ckpt", torch.ones(4, 3), [(0, 3), (2, 4)], validate=True)


def test_the_hint_of_ml106_is_followed(tmp_path: Path) -> None:
    path = save_overlapping_rows(tmp_path / "ckpt", torch.arange(12.0).reshape(4, 3), [(0, 3), (2, 4)])
    assert "dcp.save(model.state_dict(), checkpoint_id=DIR)" in run_inspection(str(path)).findings[0].hint
    kept = {"w": torch.zeros(4, 3)}
    _dcp().load(kept, checkpoint_id=str(path))
    _dcp().save(kept, checkpoint_id=str(tmp_path / "resaved"))  # one process: DCP's own planner
    assert "ML106" not in _codes(tmp_path / "resaved")


class Tied(nn.Module):
    """An embedding and an output head that share one weight."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight


def _save(state: dict[str, torch.Tensor], path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _dcp().save(state, checkpoint_id=str(path))
    return path


def test_a_tie_stored_as_two_alike_copies_holds(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Tied()
    path = _save(model.state_dict(), tmp_path / "tied")
    report = run_inspection(str(path), config=RuleConfig(ties=(("head.weight", "emb.weight"),)))
    assert "ML103" not in {f.code for f in report.findings}
    assert "ML103" not in {s.code for s in report.skipped}  # it ran
    fresh = Tied()
    _dcp().load(fresh.state_dict(), checkpoint_id=str(path))
    assert fresh.head.weight is fresh.emb.weight and torch.equal(fresh.emb.weight, model.emb.weight)


def test_a_declared_tie_stored_with_another_dtype_is_ml103_and_its_hint_works(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Tied()
    state = {"emb.weight": model.emb.weight.detach().clone(), "head.weight": model.emb.weight.detach().bfloat16()}
    path = _save(state, tmp_path / "cast")
    message = _codes(path, ("head.weight", "emb.weight"))["ML103"]
    assert "stores them as bfloat16 [10, 4] and float32 [10, 4]" in message
    fresh = Tied()
    _dcp().load(fresh.state_dict(), checkpoint_id=str(path))
    # The one tensor holds one copy's values: the float32 ones are lost to the bfloat16 cast.
    assert not torch.equal(fresh.emb.weight, model.emb.weight)
    config = RuleConfig(ties=(("head.weight", "emb.weight"),))
    finding = next(f for f in run_inspection(str(path), config=config).findings
                   if f.code == "ML103")
    assert "dcp.save(model.state_dict(), checkpoint_id=DIR)" in finding.hint
    _save(model.state_dict(), tmp_path / "resaved")  # from the model that ties them, as the hint says
    assert "ML103" not in _codes(tmp_path / "resaved", ("head.weight", "emb.weight"))


def test_names_read_from_the_same_bytes_are_one_tensor(tmp_path: Path) -> None:
    # What a writer that stores a tie once records: both names' chunks point at one copy.
    from torch.distributed.checkpoint import FileSystemReader

    torch.manual_seed(0)
    model = Tied()
    path = _save(model.state_dict(), tmp_path / "once")
    metadata = FileSystemReader(str(path)).read_metadata()
    by_name = {index.fqn: index for index in metadata.storage_data}
    metadata.storage_data[by_name["head.weight"]] = metadata.storage_data[by_name["emb.weight"]]
    (path / ".metadata").write_bytes(pickle.dumps(metadata))
    report = run_inspection(str(path))
    assert [sorted(t.names) for t in report.facts.tensors] == [["emb.weight", "head.weight"]]
    fresh = Tied()
    _dcp().load(fresh.state_dict(), checkpoint_id=str(path))
    assert torch.equal(fresh.head.weight, model.emb.weight)


def test_alignment_is_skipped_as_dcp_load_copies_into_the_callers_tensors(tmp_path: Path) -> None:
    path = _save({"w": torch.randn(64, 3)}, tmp_path / "plain")
    skipped = {s.code: s.reason for s in run_inspection(str(path)).skipped}
    assert "copies it into the caller's own tensors" in skipped["ML203"]
    target = torch.zeros(64, 3)
    before = target.data_ptr()
    _dcp().load({"w": target}, checkpoint_id=str(path))
    assert target.data_ptr() == before and target.abs().sum() > 0  # filled in place: no file byte used as is
