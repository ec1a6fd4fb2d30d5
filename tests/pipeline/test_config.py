"""`[tool.memlayout]`: found from a subdirectory, overridden by flags, every key and code checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from memlayout.cli.app import app
from memlayout.errors import UsageError
from memlayout.pipeline.config import KEYS, Settings, find_config, resolve_settings
from memlayout.rules import RuleConfig
from tests import models

runner = CliRunner()


def codes(*args: str) -> tuple[int, list[str], str]:
    result = runner.invoke(app, ["inspect", *args, "--format", "json"])
    findings = json.loads(result.stdout)["findings"] if result.stdout else []
    return result.exit_code, sorted(f["code"] for f in findings), result.stderr


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project whose checkpoint has ML101 (error), ML201 (warning) and ML203 (info), run from a subdirectory."""
    torch.save(models.one_finding_of_each_severity_state(), tmp_path / "model.pt")
    (tmp_path / "src" / "deep").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "src" / "deep")
    return tmp_path


def write_pyproject(folder: Path, body: str) -> Path:
    path = folder / "pyproject.toml"
    path.write_text('[project]\nname = "demo"\n\n[tool.memlayout]\n' + body)
    return path


def test_no_config_means_defaults(project: Path) -> None:
    assert codes(str(project / "model.pt"))[:2] == (1, ["ML101", "ML201", "ML203"])


def test_config_is_found_from_a_subdirectory(project: Path) -> None:
    write_pyproject(project, 'ignore = ["ML101"]\nfail-on = "error"\n')
    assert find_config() == project / "pyproject.toml"
    # ML101 ignored, and with fail-on error the warning left does not fail the run.
    assert codes(str(project / "model.pt"))[:2] == (0, ["ML201", "ML203"])


def test_a_pyproject_without_the_table_is_passed_over(project: Path) -> None:
    write_pyproject(project, 'select = ["ML2"]\n')
    (project / "src" / "pyproject.toml").write_text('[project]\nname = "inner"\n[tool.ruff]\nline-length = 99\n')
    assert find_config() == project / "pyproject.toml"


def test_the_nearest_table_wins(project: Path) -> None:
    write_pyproject(project, 'select = ["ML1"]\n')
    write_pyproject(project / "src", 'select = ["ML2"]\n')
    assert codes(str(project / "model.pt"))[1] == ["ML201", "ML203"]


def test_flags_override_the_file(project: Path) -> None:
    write_pyproject(project, 'select = ["ML1"]\nfail-on = "never"\n')
    model = str(project / "model.pt")
    assert codes(model)[:2] == (0, ["ML101"])  # the file: only ML1, never fails
    assert codes(model, "--select", "ML2")[:2] == (0, ["ML201", "ML203"])  # the flag replaces select
    assert codes(model, "--fail-on", "info")[:2] == (1, ["ML101"])  # ... and fail-on
    assert codes(model, "--isolated")[:2] == (1, ["ML101", "ML201", "ML203"])  # --isolated: no file


def test_config_names_a_file_explicitly(project: Path) -> None:
    write_pyproject(project, 'select = ["ML1"]\n')
    other = project / "ci-memlayout.toml"
    other.write_text('select = ["ML203"]\n')  # a settings file: the keys at top level
    model = str(project / "model.pt")
    assert codes(model, "--config", str(other))[1] == ["ML203"]
    named = project / "elsewhere"
    named.mkdir()
    assert codes(model, "--config", str(write_pyproject(named, 'ignore = ["ML2"]\n')))[1] == ["ML101"]


def test_thresholds_and_ties_reach_the_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    torch.save(models.sliced_bloat_state(), "bloat.pt")
    torch.save(models.DivergedHeadLM().state_dict(), "lm.pt")
    torch.save(models.LostTieLM().state_dict(), "dup.pt")
    assert codes("bloat.pt", "--select", "ML301")[1] == ["ML301"]
    write_pyproject(tmp_path, "min-bloat-bytes = 100000000\nmin-duplicate-bytes = 100000000\n"
                    'ties = [["head.weight", "embed.weight"]]\nfragmented-min-storages = 2\n')
    assert codes("bloat.pt", "--select", "ML301")[1] == []
    assert codes("bloat.pt", "--select", "ML301", "--min-bloat-bytes", "0")[1] == ["ML301"]
    assert codes("dup.pt", "--select", "ML102")[1] == []
    assert codes("dup.pt", "--select", "ML102", "--min-duplicate-bytes", "0")[1] == ["ML102"]
    assert codes("lm.pt", "--select", "ML103")[1] == ["ML103"]
    assert codes("lm.pt", "--select", "ML103", "--tie", "head.weight=head.weight")[1] == []  # the flag replaces ties
    # 2 storages that flatten would make 1: reported from 2 storages, not from the default 4.
    assert codes("lm.pt", "--select", "ML204")[1] == ["ML204"]
    assert codes("lm.pt", "--select", "ML204", "--fragmented-min-storages", "4")[1] == []
    assert resolve_settings().rules.fragmented_min_storages == 2


def test_per_tensor_ignores_drop_findings_whose_tensors_all_match(project: Path) -> None:
    write_pyproject(project, 'per-tensor-ignores = {"*.shifted" = ["ML203"], "proj.*" = ["ML2"], '
                    '"encoder.left" = ["ML101"]}\n')
    # ML203 on norm.shifted and ML201 on proj.weight go; ML101 names encoder.left and
    # encoder.right, and only one of them matches, so it stays.
    assert codes(str(project / "model.pt"))[1] == ["ML101"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('selct = ["ML1"]\n', "[tool.memlayout] has no setting 'selct'"),
        ('select = ["ML999"]\n', "select: unknown rule code 'ML999'"),
        ('ignore = ["XY1"]\n', "ignore: unknown rule code 'XY1'"),
        ('per-tensor-ignores = {"*.bias" = ["ML7"]}\n', "unknown rule code 'ML7'"),
        ('fail-on = "sometimes"\n', "fail-on must be one of error, warning, info, never"),
        ("min-bloat-bytes = -1\n", "min-bloat-bytes must be a whole number"),
        ("min-duplicate-bytes = true\n", "min-duplicate-bytes must be a whole number"),
        ('ties = [["a"]]\n', "ties must be a list of [target, source] name pairs"),
        ('select = "ML1"\n', "select must be a list of strings"),
        ("select = [\n", "is not valid TOML"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(project: Path, body: str, message: str) -> None:
    write_pyproject(project, body)
    code, findings, err = codes(str(project / "model.pt"))
    assert code == 2 and findings == []
    assert err.startswith("memlayout: error: ") and message in err and len(err.strip().splitlines()) == 1
    assert "pyproject.toml" in err


def test_an_unknown_code_on_the_command_line_is_an_error_too(project: Path) -> None:
    code, _, err = codes(str(project / "model.pt"), "--ignore", "ML1,ML77")
    assert code == 2 and "--ignore: unknown rule code 'ML77'" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", "missing.toml"], "--config missing.toml: no such file"),
        (["--config", "x.toml", "--isolated"], "--config and --isolated contradict each other"),
    ],
)
def test_config_flag_errors(project: Path, args: list[str], message: str) -> None:
    code, _, err = codes(str(project / "model.pt"), *args)
    assert code == 2 and message in err


def test_a_broken_unrelated_pyproject_up_the_tree_is_not_read(project: Path) -> None:
    (project / "pyproject.toml").write_text("[project\nthis is not toml")
    assert codes(str(project / "model.pt"))[0] == 1


def test_every_documented_key_is_a_setting_and_the_ci_page_lists_them(repo_root: Path) -> None:
    page = (repo_root / "docs" / "ci.md").read_text()
    fields = set(Settings.__dataclass_fields__) | set(RuleConfig.__dataclass_fields__) - {"deep"}
    for key, (name, _) in KEYS.items():
        assert name in fields
        assert f"`{key}`" in page


def test_resolve_settings_rejects_a_pyproject_without_the_table(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    with pytest.raises(UsageError, match=r"has no \[tool\.memlayout\] table"):
        resolve_settings(str(tmp_path / "pyproject.toml"))
