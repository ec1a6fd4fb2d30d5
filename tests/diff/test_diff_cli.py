"""`memlayout diff` on the command line: formats, exit codes, options and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

import memlayout
from memlayout.cli.app import app

SCHEMA = json.loads((Path(memlayout.__file__).parent / "diff" / "schema_v1.json").read_text())


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["diff", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def pair(tmp_path: Path) -> tuple[str, str]:
    """A torch.save state dict and its safetensors conversion with one tensor cast to half."""
    state = {"model.w": torch.randn(8, 8), "model.b": torch.randn(8)}
    torch.save(state, tmp_path / "a.pt")
    save_file({"w": state["model.w"].half(), "b": state["model.b"]}, str(tmp_path / "b.safetensors"))
    return str(tmp_path / "a.pt"), str(tmp_path / "b.safetensors")


def test_table_names_both_sides_and_the_changes(pair: tuple[str, str]) -> None:
    code, out, _ = invoke(*pair, "--strip-prefix", "model.")
    assert code == 1
    assert "[torch-zip]" in out and "[safetensors]" in out
    assert "dtype: w: dtype float32 -> float16" in out
    assert "storage bytes" in out and "\x1b[" not in out


def test_exit_code_follows_fail_on(pair: tuple[str, str]) -> None:
    assert invoke(*pair, "--strip-prefix", "model.")[0] == 1
    assert invoke(*pair, "--strip-prefix", "model.", "--fail-on", "error")[0] == 0
    assert invoke(*pair, "--strip-prefix", "model.", "--fail-on", "never")[0] == 0
    assert invoke(pair[0], pair[0])[0] == 0


def test_map_renames_a_section(pair: tuple[str, str]) -> None:
    code, out, _ = invoke(*pair, "--map", "model.=", "--format", "json")
    assert code == 1
    data = json.loads(out)
    jsonschema.validate(data, SCHEMA)
    assert data["matched"] == 2 and data["options"]["maps"] == [{"old": "model.", "new": ""}]
    changed = [c["kind"] for c in data["changes"]]
    assert changed[0] == "dtype" and "storage-bytes" in changed and "removed" not in changed


def test_json_and_markdown_reports(pair: tuple[str, str], tmp_path: Path) -> None:
    out_file = tmp_path / "diff.md"
    code, out, _ = invoke(*pair, "--strip-prefix", "model.", "--format", "markdown", "-o", str(out_file))
    assert code == 1 and out == ""
    text = out_file.read_text()
    assert text.startswith("## memlayout diff")
    assert "| warning | dtype | w: dtype float32 -> float16 |" in text
    assert "| storage bytes | 288 B | 160 B | -128 B |" in text


def test_many_alike_changes_fold_into_one_line(tmp_path: Path) -> None:
    state = {f"layer{i}.weight": torch.randn(4) for i in range(40)}
    torch.save(state, tmp_path / "a.pt")
    torch.save({k: v.bfloat16() for k, v in state.items()}, tmp_path / "b.pt")
    _, out, _ = invoke(str(tmp_path / "a.pt"), str(tmp_path / "b.pt"))
    assert "40 tensors: dtype float32 -> bfloat16 (layer0.weight, layer1.weight, layer10.weight +37 more)" in out
    _, out, _ = invoke(str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--format", "json")
    assert len([c for c in json.loads(out)["changes"] if c["kind"] == "dtype"]) == 40


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.pt", "{a}"], "missing.pt: no such file or directory"),
        (["{a}", "{a}", "--format", "xml"], "'xml' is not one of 'table', 'json', 'markdown', 'html'."),
        (["{a}", "{a}", "--format", "junit"],
         "'junit' is not one of 'table', 'json', 'markdown', 'html' (junit is for"),
        (["{a}", "{a}", "--select", "ML999"], "--select: unknown rule code 'ML999'"),
        (["{a}", "{a}", "--ignore", "XY1"], "--ignore: unknown rule code 'XY1'"),
        (["{a}", "{a}", "--map", "nothing"], "--map 'nothing' is not of the form OLD=NEW"),
        (["{a}", "{a}", "--strip-prefix", ""], "--strip-prefix needs a non-empty PREFIX"),
        (["{a}", "{a}", "--tie", "x"], "--tie 'x' is not of the form TARGET=SOURCE"),
        (["{a}", "{empty}"], "is empty"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(pair: tuple[str, str], tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "empty.pt").write_bytes(b"")
    filled = [arg.format(a=pair[0], empty=tmp_path / "empty.pt") for arg in args]
    out_file = tmp_path / "never.json"
    code, out, err = invoke(*filled, "-o", str(out_file))
    assert code == 2 and out == ""
    assert err.startswith("memlayout: error: ") and message in err and err.count("\n") == 1
    assert not out_file.exists()


def test_names_colliding_after_strip_prefix_exit_2(tmp_path: Path) -> None:
    torch.save({"model.w": torch.zeros(2), "w": torch.zeros(2)}, tmp_path / "a.pt")
    code, _, err = invoke(str(tmp_path / "a.pt"), str(tmp_path / "a.pt"), "--strip-prefix", "model.")
    assert code == 2 and "A: model.w and w both become 'w'" in err
