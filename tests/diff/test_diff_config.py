"""`memlayout diff` reads `[tool.memlayout]` as `inspect` does: the rules' settings for both sides,
`fail-on` for the changes, `ties` for B; and a flag replaces the file's value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from memlayout.cli.app import app


def diff(*args: str) -> tuple[int, list[str], str]:
    """The exit code, the kinds of change (with each new finding's code) and stderr."""
    result = CliRunner().invoke(app, ["diff", "a.pt", "b.pt", "--format", "json", *args])
    if result.exit_code == 2:
        return 2, [], result.stderr
    kinds = [
        c["kind"] + (f" {c['message'].split()[2]}" if c["kind"] == "finding-new" else "")
        for c in json.loads(result.stdout)["changes"]
    ]
    return result.exit_code, kinds, result.stderr


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder, the working directory, with A and B.

    B stores `w` transposed (ML201, a warning) and `y` as a 1 KiB copy of `x`: a
    duplicate (ML102) only below ML102's default threshold of 4 KiB.
    """
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    w, x = torch.randn(8, 8), torch.randn(16, 16)
    torch.save({"w": w, "x": x, "y": torch.randn(16, 16)}, "a.pt")
    torch.save({"w": w.t().contiguous().t(), "x": x, "y": x.clone()}, "b.pt")
    return tmp_path


def configure(folder: Path, settings: str) -> None:
    (folder / "pyproject.toml").write_text(f"[project]\nname = 'model'\n\n[tool.memlayout]\n{settings}\n")


def test_without_a_config_every_change_counts(project: Path) -> None:
    code, kinds, _ = diff()
    assert code == 1
    assert "finding-new ML201" in kinds and "contiguity" in kinds
    assert "finding-new ML102" not in kinds


def test_select_and_ignore_come_from_the_config(project: Path) -> None:
    configure(project, 'ignore = ["ML2"]')
    _, kinds, _ = diff()
    assert "finding-new ML201" not in kinds and "contiguity" in kinds
    configure(project, 'select = ["ML1"]')
    assert "finding-new ML201" not in diff()[1]
    # A flag replaces the file's value.
    assert "finding-new ML201" in diff("--select", "ML2")[1]


def test_fail_on_comes_from_the_config_and_a_flag_replaces_it(project: Path) -> None:
    configure(project, 'fail-on = "never"')
    assert diff()[0] == 0
    assert diff("--fail-on", "warning")[0] == 1


def test_thresholds_come_from_the_config(project: Path) -> None:
    configure(project, "min-duplicate-bytes = 512")
    assert "finding-new ML102" in diff()[1]
    assert "finding-new ML102" not in diff("--min-duplicate-bytes", "2048")[1]


def test_per_tensor_ignores_drop_findings_on_both_sides(project: Path) -> None:
    configure(project, 'per-tensor-ignores = {"w" = ["ML201"]}')
    _, kinds, _ = diff()
    assert "finding-new ML201" not in kinds and "contiguity" in kinds


def test_ties_in_the_config_are_declared_for_b(project: Path) -> None:
    assert "declared-tie-broken" not in diff()[1]
    configure(project, 'ties = [["y", "x"]]')
    code, kinds, _ = diff()
    assert code == 1 and kinds[0] == "declared-tie-broken"


def test_isolated_and_config_choose_the_file(project: Path) -> None:
    configure(project, 'fail-on = "never"')
    assert diff("--isolated")[0] == 1
    (project / "strict.toml").write_text('fail-on = "info"\nignore = ["ML2"]\n')
    code, kinds, _ = diff("--config", "strict.toml")
    assert code == 1 and "finding-new ML201" not in kinds


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ('select = ["ML999"]', "pyproject.toml: select: unknown rule code 'ML999'"),
        ("colour = true", "pyproject.toml: [tool.memlayout] has no setting 'colour'"),
        ('fail-on = "sometimes"', "pyproject.toml: fail-on must be one of error, warning, info, never"),
    ],
)
def test_a_bad_config_is_one_line_and_exit_2(project: Path, settings: str, message: str) -> None:
    configure(project, settings)
    code, _, err = diff("-o", "never.json")
    assert code == 2 and err.startswith(f"memlayout: error: {message}") and err.count("\n") == 1
    assert not (project / "never.json").exists()
