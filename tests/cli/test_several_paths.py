"""`memlayout inspect a.pt b.safetensors models/`: one combined report, the worst exit
code, and a path that fails to load reported while the others are still inspected
(and the run exits 2: an audit that could not read everything has not passed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from memlayout.cli.app import app
from tests import models
from tests.report.test_formats import validate_multi_path_json, validate_sarif

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """clean.pt (no finding), bloated.pt (ML301, a warning), weights.safetensors (clean), broken.pt (random bytes)."""
    monkeypatch.chdir(tmp_path)
    torch.save({"w": torch.randn(8, 8)}, "clean.pt")
    torch.save(models.sliced_bloat_state(), "bloated.pt")
    save_file({"w": torch.randn(4, 4)}, "weights.safetensors")
    Path("broken.pt").write_bytes(b"\x13" + bytes(range(200)))
    return tmp_path


def test_a_path_that_fails_to_load_does_not_stop_the_others(folder: Path) -> None:
    code, out, err = invoke("inspect", "clean.pt", "broken.pt", "bloated.pt", "--format", "json")
    data = json.loads(out)
    validate_multi_path_json(data)
    assert [(r["path"], r["report"] is None) for r in data["reports"]] == [
        ("clean.pt", False), ("broken.pt", True), ("bloated.pt", False),
    ]
    assert "broken.pt is not a checkpoint format" in data["reports"][1]["error"]
    assert [f["code"] for f in data["reports"][2]["report"]["findings"]] == ["ML301"]
    assert data["summary"] == {
        "paths": 3, "inspected": 2, "failed": 1, "data": 0, "findings": {"error": 0, "warning": 1, "info": 0},
    }
    # The failure is also one line on stderr, whatever the format.
    assert err.splitlines() == [f"memlayout: error: {data['reports'][1]['error']}"]
    assert code == 2 and data["exit_code"] == 2


@pytest.mark.parametrize(
    ("paths", "fail_on", "expected"),
    [
        (["clean.pt", "weights.safetensors"], "warning", 0),
        (["clean.pt", "bloated.pt"], "warning", 1),
        (["clean.pt", "bloated.pt"], "error", 0),
        (["clean.pt", "broken.pt"], "warning", 2),  # a load error is exit 2 ...
        (["clean.pt", "broken.pt"], "error", 2),
        (["clean.pt", "broken.pt"], "never", 2),  # ... whatever --fail-on says of findings
        (["broken.pt", "missing.pt"], "never", 2),  # nothing could be inspected
    ],
)
def test_the_exit_code_is_the_worst_over_the_paths(folder: Path, paths: list[str], fail_on: str, expected: int) -> None:
    assert invoke("inspect", *paths, "--fail-on", fail_on)[0] == expected


def test_when_every_path_fails_nothing_is_written_and_each_error_is_one_line(folder: Path) -> None:
    code, out, err = invoke("inspect", "broken.pt", "missing.pt", "-f", "sarif", "-o", "report.sarif")
    assert code == 2 and out == ""
    assert not Path("report.sarif").exists()
    lines = err.splitlines()
    assert len(lines) == 2 and all(line.startswith("memlayout: error: ") for line in lines)
    assert "broken.pt" in lines[0] and "missing.pt" in lines[1]


def test_a_single_path_keeps_the_schema_1_document(folder: Path) -> None:
    _, out, _ = invoke("inspect", "bloated.pt", "--format", "json")
    assert json.loads(out)["schema"] == 1


def test_a_folder_of_checkpoints_is_each_file(folder: Path) -> None:
    Path("sub").mkdir()
    torch.save({"w": torch.randn(4, 4)}, "sub/inner.pth")
    Path("notes.txt").write_text("not a model")  # read, and said to be text
    Path(".hidden").mkdir()
    Path(".hidden/x.pt").write_bytes(b"junk")  # hidden files load as well as any other: read
    code, out, _ = invoke("inspect", ".", "-f", "json")
    data = json.loads(out)
    outcome = {r["path"]: "report" if r["report"] else "data" if r["data"] else "error" for r in data["reports"]}
    assert outcome == {
        "./.hidden/x.pt": "error", "./bloated.pt": "report", "./broken.pt": "error", "./clean.pt": "report",
        "./notes.txt": "data", "./sub/inner.pth": "report", "./weights.safetensors": "report",
    }
    assert data["summary"]["data"] == 1 and data["summary"]["failed"] == 2
    assert code == 2  # broken.pt and .hidden/x.pt could not be read


def test_a_folder_with_no_checkpoint_is_still_an_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    code, _, err = invoke("inspect", str(tmp_path / "empty"))
    assert code == 2 and "directory with no model" in err


def test_a_symlink_loop_is_walked_once(folder: Path) -> None:
    Path("loop").mkdir()
    torch.save({"w": torch.randn(4, 4)}, "loop/a.pt")
    Path("loop/again").symlink_to(Path("loop").resolve())
    code, out, _ = invoke("inspect", "loop", "-f", "json")
    assert [r["path"] for r in json.loads(out)["reports"]] == ["loop/a.pt"]
    assert code == 0


def test_sarif_has_one_run_with_results_in_several_artifacts(folder: Path) -> None:
    torch.save(models.partial_overlap_state(), "overlap.pt")
    _, out, _ = invoke("inspect", "bloated.pt", "overlap.pt", "broken.pt", "-f", "sarif")
    log = validate_sarif(out)
    (run,) = log["runs"]  # type: ignore[index]
    assert {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]} == {
        "bloated.pt", "overlap.pt",
    }
    assert run["invocations"][0]["executionSuccessful"] is False
    (note,) = run["invocations"][0]["toolExecutionNotifications"]
    assert note["level"] == "error" and "broken.pt" in note["message"]["text"]


def test_table_ends_with_the_totals(folder: Path) -> None:
    _, out, _ = invoke("inspect", "clean.pt", "bloated.pt", "broken.pt")
    assert "memlayout: clean.pt" in out and "memlayout: bloated.pt" in out
    assert "error: broken.pt is not a checkpoint format" in out
    assert out.splitlines()[-1] == "3 paths: 2 inspected, 1 failed to load; findings: 0 error, 1 warning, 0 info"


def test_debug_shows_the_first_load_error_as_a_traceback(folder: Path) -> None:
    result = runner.invoke(app, ["inspect", "clean.pt", "broken.pt", "--debug"])
    assert result.exception is not None and "not a checkpoint format" in str(result.exception)


def test_flatten_check_takes_several_paths(folder: Path) -> None:
    flat = torch.zeros(64)
    torch.save({"a": flat[:32], "b": flat[32:]}, "flat.pt")
    assert invoke("flatten", "--check", "flat.pt")[0] == 0
    code, out, err = invoke("flatten", "--check", "flat.pt", "bloated.pt", "broken.pt")
    assert code == 1
    assert "flat.pt: already flat" in out and "bloated.pt: would change" in out
    assert err.splitlines() == [line for line in err.splitlines() if line.startswith("memlayout: error: broken.pt")]
    assert len(err.splitlines()) == 1
    assert invoke("flatten", "--check", "broken.pt", "missing.pt")[0] == 2


def test_flatten_without_check_takes_one_path(folder: Path) -> None:
    code, _, err = invoke("flatten", "clean.pt", "bloated.pt", "-o", "out.pt")
    assert code == 2 and "flatten writes one IN at a time" in err
    assert not Path("out.pt").exists()
