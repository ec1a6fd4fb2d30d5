"""`memlayout inspect` through typer's CliRunner: exit codes, output, options."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from memlayout.cli.app import app
from tests import models

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def demo(repo_root: Path) -> str:
    return str(repo_root / "fixtures" / "demo_checkpoint.pt")


@pytest.fixture
def clean_checkpoint(tmp_path: Path) -> str:
    path = tmp_path / "clean.pt"
    torch.save({"w": torch.randn(8, 8)}, path)
    return str(path)


def test_findings_at_warning_exit_1_by_default(demo: str) -> None:
    code, out, _ = invoke("inspect", demo)
    assert code == 1
    for expected in ("ML102", "ML201", "ML301", "ML401", "ML204", "hint:"):
        assert expected in out


def test_clean_checkpoint_exits_0(clean_checkpoint: str) -> None:
    code, out, _ = invoke("inspect", clean_checkpoint)
    assert code == 0
    assert "no findings" in out


@pytest.mark.parametrize(
    ("fail_on", "expected"), [("error", 0), ("warning", 1), ("info", 1), ("never", 0)]
)
def test_fail_on_sets_the_threshold(demo: str, fail_on: str, expected: int) -> None:
    # The demo's worst finding is a warning.
    assert invoke("inspect", demo, "--fail-on", fail_on)[0] == expected


def test_info_only_findings_fail_only_at_info(tmp_path: Path) -> None:
    path = tmp_path / "fragmented.pt"
    torch.save(models.fragmented_mlp().state_dict(), path)
    assert invoke("inspect", str(path))[0] == 0
    assert invoke("inspect", str(path), "--fail-on", "info")[0] == 1


def test_select_and_ignore_take_prefixes(demo: str) -> None:
    _, out, _ = invoke("inspect", demo, "--format", "json", "--select", "ML2,ML3")
    assert {f["code"] for f in json.loads(out)["findings"]} == {"ML201", "ML204", "ML301"}
    _, out, _ = invoke("inspect", demo, "--format", "json", "--select", "ML2", "--ignore", "ML204")
    assert {f["code"] for f in json.loads(out)["findings"]} == {"ML201"}
    _, out, _ = invoke("inspect", demo, "--format", "json", "--ignore", "ML", "--select", "ML102")
    assert {f["code"] for f in json.loads(out)["findings"]} == {"ML102"}


def test_ignoring_every_warning_makes_the_run_pass(demo: str) -> None:
    assert invoke("inspect", demo, "--ignore", "ML102,ML201,ML301,ML401")[0] == 0


def test_output_file_gets_the_report_and_stdout_stays_empty(demo: str, tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    code, out, _ = invoke("inspect", demo, "--format", "json", "-o", str(target))
    assert code == 1
    assert out == ""
    assert json.loads(target.read_text())["schema"] == 1


def test_tie_option_declares_a_tie(tmp_path: Path) -> None:
    path = tmp_path / "untied.pt"
    torch.save(models.DivergedHeadLM().state_dict(), path)
    _, out, _ = invoke("inspect", str(path), "--format", "json", "--tie", "head.weight=embed.weight")
    (finding,) = [f for f in json.loads(out)["findings"] if f["code"] == "ML103"]
    assert finding["tensors"] == ["head.weight", "embed.weight"]
    code, _, err = invoke("inspect", str(path), "--tie", "head.weight")
    assert code == 2
    assert "TARGET=SOURCE" in err


def test_deep_finds_non_finite_values(tmp_path: Path) -> None:
    path = tmp_path / "nan.pt"
    torch.save(models.nan_state(), path)
    code, out, _ = invoke("inspect", str(path), "--format", "json")
    assert "ML503" not in {f["code"] for f in json.loads(out)["findings"]}
    code, out, _ = invoke("inspect", str(path), "--format", "json", "--deep")
    assert code == 1
    assert {tuple(f["tensors"]) for f in json.loads(out)["findings"] if f["code"] == "ML503"} == {("w",), ("h",)}


def test_import_spec_builds_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_models.py").write_text(
        "import torch\n"
        "def build():\n"
        "    m = torch.nn.Linear(8, 8)\n"
        "    m.weight = torch.nn.Parameter(m.weight.detach().t())\n"
        "    return m\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, _ = invoke("inspect", "my_models:build", "--format", "json")
    report = json.loads(out)
    assert code == 1
    assert report["source"] == {"path": "my_models:build", "format": "live-module", "legacy_format": False, "notes": [],
                                "formats": ["live-module"]}
    assert [f["code"] for f in report["findings"]] == ["ML201"]


def test_import_spec_that_raises_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_models.py").write_text("def build():\n    raise RuntimeError('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = invoke("inspect", "broken_models:build")
    assert code == 2
    assert "RuntimeError: no GPU here" in err
    assert len(err.strip().splitlines()) == 1


def test_unknown_format_is_a_one_line_usage_error(demo: str) -> None:
    code, out, err = invoke("inspect", demo, "--format", "xml")
    assert code == 2 and out == ""
    assert err.startswith("memlayout: error: Invalid value for '--format'") and "'xml' is not one of" in err
    assert "'sarif'" in err and "'junit'" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["--fail-on", "bogus"], ["--no-such-flag"], ["--min-duplicate-bytes", "-1"]])
def test_every_bad_flag_is_one_line_and_exit_2(demo: str, args: list[str]) -> None:
    code, out, err = invoke("inspect", demo, *args)
    assert code == 2 and out == ""
    assert err.startswith("memlayout: error: ") and len(err.strip().splitlines()) == 1


def test_no_arguments_still_shows_the_help() -> None:
    _, out, err = invoke()
    assert "Usage: memlayout" in out + err and "inspect" in out + err


def test_rules_lists_every_code_and_explain_shows_the_fix() -> None:
    code, out, _ = invoke("rules")
    assert code == 0
    assert out.count("\n") >= 15 and "ML101  partial-overlap" in out
    code, out, _ = invoke("explain", "ML301")
    assert code == 0 and "storage-bloat" in out and "\nHow to fix\n" in out
    code, out, _ = invoke("explain", "broken-tie")
    assert code == 0 and out.startswith("ML103")
    code, _, err = invoke("explain", "ML999")
    assert code == 2 and "no rule" in err


def test_python_dash_m_runs_the_same_cli(demo: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "memlayout", "inspect", demo, "--format", "json", "--select", "ML3"],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 1
    assert [f["code"] for f in json.loads(result.stdout)["findings"]] == ["ML301"]
