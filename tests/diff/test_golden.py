"""Golden diffs of real conversions: clone() of every tensor, a save_pretrained round trip, a bf16 cast.

The goldens are the JSON reports with the temporary paths blanked; rewrite them
deliberately with `pytest --overwrite`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from typer.testing import CliRunner

import memlayout
from memlayout.cli.app import app

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
SCHEMA = json.loads((Path(memlayout.__file__).parent / "diff" / "schema_v1.json").read_text())


def diff_json(*args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(app, ["diff", *args, "--format", "json"])
    assert result.exit_code in (0, 1), result.stderr
    data = json.loads(result.stdout)
    jsonschema.validate(data, SCHEMA)
    return result.exit_code, data


def check_golden(name: str, data: dict[str, Any], overwrite: bool) -> None:
    for side in ("a", "b"):
        data[side]["path"] = f"<{side}>"
    data["tool"]["version"] = "<version>"
    path = GOLDEN / f"diff_{name}.json"
    if overwrite:
        path.write_text(json.dumps(data, indent=2) + "\n")
    assert data == json.loads(path.read_text()), "rerun with --overwrite if the change is intended"


def kinds(data: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["severity"], c["kind"]) for c in data["changes"]]


def test_gpt2_against_a_clone_of_every_tensor_loses_the_tie(gpt2_files: dict[str, Path],
                                                            overwrite_golden: bool) -> None:
    code, data = diff_json(str(gpt2_files["state"]), str(gpt2_files["clone"]), "--deep")
    check_golden("gpt2_clone", data, overwrite_golden)
    assert code == 1
    (lost,) = [c for c in data["changes"] if c["kind"] == "tie-lost"]
    assert lost["severity"] == "error"
    assert set(lost["tensors"]) == {"transformer.wte.weight", "lm_head.weight"}
    # Every value is the same: --deep finds no changed values, only the lost sharing.
    assert not [c for c in data["changes"] if c["kind"] == "values"]
    assert data["b"]["summary"]["storage_bytes"] - data["a"]["summary"]["storage_bytes"] == 128 * 64 * 4


def test_save_pretrained_round_trip_changes_nothing(gpt2_files: dict[str, Path], overwrite_golden: bool) -> None:
    code, data = diff_json(str(gpt2_files["saved"]), str(gpt2_files["resaved"]), "--deep")
    check_golden("gpt2_save_pretrained_round_trip", data, overwrite_golden)
    assert code == 0 and data["changes"] == []
    assert data["matched"] == 28


def test_state_dict_against_save_pretrained_is_a_restored_tie(gpt2_files: dict[str, Path],
                                                              overwrite_golden: bool) -> None:
    code, data = diff_json(str(gpt2_files["state"]), str(gpt2_files["saved"]), "--fail-on", "warning")
    check_golden("gpt2_state_vs_save_pretrained", data, overwrite_golden)
    assert code == 0
    (restored,) = [c for c in data["changes"] if c["kind"] == "tie-restored"]
    assert restored["severity"] == "info" and "config.json tie_word_embeddings" in restored["message"]
    assert "removed" not in {kind for _, kind in kinds(data)}


def test_bf16_against_fp32_is_a_faithful_cast(gpt2_files: dict[str, Path], overwrite_golden: bool) -> None:
    code, data = diff_json(str(gpt2_files["state"]), str(gpt2_files["bf16"]), "--deep")
    check_golden("gpt2_bf16", data, overwrite_golden)
    assert code == 1  # dtype changes are warnings
    dtype_changes = [c for c in data["changes"] if c["kind"] == "dtype"]
    # 28 views; the tied one is one change citing both names.
    assert len(dtype_changes) == 28
    assert all(c["before"] == "float32" and c["after"] == "bfloat16" for c in dtype_changes)
    assert all("values are A's as bfloat16" in c["message"] for c in dtype_changes)
    assert "tie-lost" not in {kind for _, kind in kinds(data)}
    code, _ = diff_json(str(gpt2_files["state"]), str(gpt2_files["bf16"]), "--fail-on", "error")
    assert code == 0


@pytest.mark.parametrize(
    ("name", "expected"),
    [("save_model", ("info", "tie-restored")), ("dropped", ("error", "tie-lost"))],
)
def test_a_dropped_tie_is_lost_unless_the_file_restores_it(
    gpt2_files: dict[str, Path], name: str, expected: tuple[str, str]
) -> None:
    code, data = diff_json(str(gpt2_files["state"]), str(gpt2_files[name]))
    assert expected in kinds(data)
    assert code == (1 if expected[0] == "error" else 0)


def test_deep_compares_values_across_formats(gpt2_files: dict[str, Path]) -> None:
    # torch.save zip against the safetensors directory save_pretrained wrote: every
    # value read from both files is the same, including the restored head.
    code, data = diff_json(str(gpt2_files["state"]), str(gpt2_files["saved"]), "--deep", "--fail-on", "warning")
    assert code == 0
    assert not [c for c in data["changes"] if c["kind"] in ("values", "dtype", "tie-lost")]
