"""The JSON report: schema 1, validated, and a golden file for the bundled demo."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from typer.testing import CliRunner

import memlayout
from memlayout.cli.app import app
from memlayout.report.json_report import report_dict
from tests import models

SCHEMA = json.loads((Path(memlayout.__file__).parent / "report" / "schema_v1.json").read_text())
GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "demo_checkpoint.json"


def test_demo_report_matches_the_golden_file(
    repo_root: Path, monkeypatch: pytest.MonkeyPatch, overwrite_golden: bool
) -> None:
    monkeypatch.chdir(repo_root)
    result = CliRunner().invoke(app, ["inspect", "fixtures/demo_checkpoint.pt", "--format", "json"])
    assert result.exit_code == 1
    if overwrite_golden:
        GOLDEN.write_text(result.stdout)
    assert json.loads(result.stdout) == json.loads(GOLDEN.read_text()), "rerun with --overwrite if intended"


@pytest.mark.parametrize(
    "case",
    [models.LostTieLM, models.partial_overlap_state, models.WeightDropLSTM, models.nan_state,
     models.assign_loaded_tied_lm],
)
def test_reports_validate_against_the_schema(case: object) -> None:
    data = report_dict(memlayout.inspect(case()))  # type: ignore[operator]
    jsonschema.validate(data, SCHEMA)


def test_the_contract_keys_exist() -> None:
    data = report_dict(memlayout.inspect(models.LostTieLM()))
    assert data["schema"] == 1
    assert {"path", "format"} <= data["source"].keys()
    assert {"tensors", "storages", "tensor_bytes", "storage_bytes", "wasted_bytes"} <= data["summary"].keys()
    tensor = data["tensors"][0]
    assert {"name", "names", "dtype", "device", "shape", "stride", "storage", "offset", "contiguous"} <= tensor.keys()
    assert tensor["dtype"] == "float32"
    assert {"id", "device", "nbytes", "tensors"} <= data["storages"][0].keys()
    assert {"code", "name", "severity", "tensors", "message", "hint"} <= data["findings"][0].keys()


def test_a_tied_parameter_is_one_tensor_with_every_name() -> None:
    data = report_dict(memlayout.inspect(models.TiedEmbeddingLM()))
    (tied,) = [t for t in data["tensors"] if len(t["names"]) > 1]
    assert tied["names"] == ["embed.weight", "head.weight"]
    assert data["summary"]["tensors"] == 1 and data["summary"]["names"] == 2


def test_schema_rejects_a_report_missing_a_contract_key() -> None:
    data = report_dict(memlayout.inspect(models.LostTieLM()))
    del data["findings"][0]["hint"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, SCHEMA)


def test_storages_list_the_byte_range_of_each_tensor() -> None:
    base = models.torch.arange(100, dtype=models.torch.float32)
    data = report_dict(memlayout.inspect({"a": base[:10], "b": base[50:60]}))
    (storage,) = data["storages"]
    assert storage["ranges"] == [{"tensor": "a", "start": 0, "end": 40}, {"tensor": "b", "start": 200, "end": 240}]


def test_a_tie_saved_as_one_tensor_is_an_alias_group(tmp_path: Path) -> None:
    # Issue 26, defect 7: `alias_groups` was empty for the commonest sharing there is.
    embed = torch.randn(4, 3)
    path = tmp_path / "tied.pt"
    torch.save({"embed.weight": embed, "head.weight": embed, "bias": torch.zeros(3)}, path)
    data = report_dict(memlayout.inspect(str(path)))
    jsonschema.validate(data, SCHEMA)
    storage = next(t["storage"] for t in data["tensors"] if t["name"] == "embed.weight")
    assert data["alias_groups"] == [{
        "storage": storage,
        "tensors": ["embed.weight", "head.weight"],
        "pairs": [{"first": "embed.weight", "second": "head.weight", "relation": "equal"}],
    }]


def test_a_tie_of_one_view_joins_its_storages_other_alias_pairs(tmp_path: Path) -> None:
    flat = torch.zeros(100)
    path = tmp_path / "flat.pt"
    torch.save({"buffer": flat, "a": flat[:50], "a_again": flat[:50], "b": flat[50:]}, path)
    data = report_dict(memlayout.inspect(str(path)))
    jsonschema.validate(data, SCHEMA)
    (group,) = data["alias_groups"]
    assert set(group["tensors"]) == {"buffer", "a", "a_again", "b"}
    pairs = {(p["first"], p["second"], p["relation"]) for p in group["pairs"]}
    assert ("a", "a_again", "equal") in pairs
    assert {("buffer", "a", "contains"), ("buffer", "b", "contains")} <= pairs
