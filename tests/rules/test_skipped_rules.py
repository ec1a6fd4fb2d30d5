"""Rules that read what a source does not record are skipped, and the report says which and why."""

from __future__ import annotations

import dataclasses
import json
import pickle
import warnings
from pathlib import Path

import jsonschema
import pytest
import torch

import memlayout
from memlayout.cli.formats import OutputFormat
from memlayout.pipeline.inspection import run_inspection
from memlayout.rules import RULES, Requirement
from tests.report.rendering import render

SCHEMA = json.loads((Path(memlayout.__file__).parent / "report" / "schema_v1.json").read_text())


def _lstm_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.LSTM(8, 8, num_layers=2).state_dict()


@pytest.fixture(scope="module")
def dcp_lstm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch.distributed.checkpoint as dcp

    directory = tmp_path_factory.mktemp("dcp_lstm")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(_lstm_state(), checkpoint_id=str(directory))
    return directory


def test_dcp_metadata_records_no_storage_stride_offset_or_device(dcp_lstm: Path) -> None:
    # The premise, asked of torch: what DCP keeps per tensor is properties, size and chunks.
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorProperties, TensorStorageMetadata

    metadata = FileSystemReader(str(dcp_lstm)).read_metadata()
    entry = metadata.state_dict_metadata["weight_ih_l0"]
    assert isinstance(entry, TensorStorageMetadata)
    recorded = {f.name for f in dataclasses.fields(entry)} | {f.name for f in dataclasses.fields(TensorProperties)}
    assert not recorded & {"stride", "storage_offset", "device", "storage"}


def test_layout_rules_do_not_run_on_dcp_metadata_and_are_listed(dcp_lstm: Path) -> None:
    report = run_inspection(str(dcp_lstm))
    assert "ML401" not in {f.code for f in report.findings}
    skipped = {s.code: s.reason for s in report.skipped}
    layout_rules = {code for code, r in RULES.items() if Requirement.LAYOUT in r.needs}
    assert set(skipped) == layout_rules | {code for code, r in RULES.items() if Requirement.CONTENT in r.needs
                                           and not r.deep_only}
    assert "records no strides, storage offsets, devices or addresses" in skipped["ML401"]
    # Rules that read only names, dtypes and shapes still run, and those that read which names
    # share bytes and how tensors are chunked (tests/rules/test_dcp_rules.py).
    assert not {"ML103", "ML106", "ML402", "ML502", "ML601", "ML602"} & set(skipped)


def test_the_same_weights_saved_by_torch_save_get_ml401_and_skip_nothing(tmp_path: Path) -> None:
    path = tmp_path / "lstm.pt"
    torch.save(_lstm_state(), path)
    report = run_inspection(str(path))
    assert "ML401" in {f.code for f in report.findings}
    assert report.skipped == ()


def test_only_selected_rules_are_listed_as_skipped(dcp_lstm: Path) -> None:
    report = run_inspection(str(dcp_lstm), select=["ML401", "ML502"])
    assert [s.code for s in report.skipped] == ["ML401"]


def test_json_and_table_show_the_skipped_rules(dcp_lstm: Path) -> None:
    report = run_inspection(str(dcp_lstm))
    data = json.loads(render(report, OutputFormat.JSON))
    jsonschema.validate(data, SCHEMA)
    assert [entry["code"] for entry in data["skipped_rules"]] == [s.code for s in report.skipped]
    assert all(entry["reason"] for entry in data["skipped_rules"])
    table = render(report, OutputFormat.TABLE)
    assert "skipped ML101, ML102" in table and "ML401" in table
    assert "storages: not recorded" in table


def test_a_bare_pickle_skips_the_content_rules_with_its_own_reason(tmp_path: Path) -> None:
    path = tmp_path / "plain.pkl"
    with open(path, "wb") as out:
        pickle.dump({"a": torch.randn(2048), "b": torch.randn(2048)}, out)
    report = run_inspection(str(path))
    skipped = {s.code: s.reason for s in report.skipped}
    assert set(skipped) == {"ML102"}
    assert "bare pickle" in skipped["ML102"]
