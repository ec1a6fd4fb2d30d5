"""The README stays true: its rules table is the registry, and its example commands run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memlayout.cli.app import app
from memlayout.rules import RULES

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_rules_table_matches_the_registry() -> None:
    rows = re.findall(r"^\| (ML\d{3}) \| ([a-z-]+) \| (\w+) \| (.+?) \|$", README, flags=re.MULTILINE)
    documented = {code: (name, severity, summary) for code, name, severity, summary in rows}
    registry = {code: (r.name, r.severity.value, r.summary) for code, r in RULES.items()}
    assert documented == registry


def test_set_up_commands_are_documented() -> None:
    assert "make demo" in README and "make test" in README


def readme_commands() -> list[str]:
    commands = re.findall(r"^\$ memlayout (.+)$", README, flags=re.MULTILINE)
    # Commands on the bundled fixtures can run here; the rest name the reader's files.
    return [c for c in commands if "fixtures/" in c]


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_runs(
    command: str, repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(repo_root)
    args = shlex.split(command)
    # Outputs go to a scratch directory, never into the checkout.
    for index, arg in enumerate(args[:-1]):
        if arg in ("-o", "--output"):
            args[index + 1] = str(tmp_path / Path(args[index + 1]).name)
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, 1), result.stderr
    assert result.stdout


def test_readme_shows_the_current_demo_findings(repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo_root)
    result = CliRunner().invoke(app, ["inspect", "fixtures/demo_checkpoint.pt", "--format", "json"])
    import json

    for finding in json.loads(result.stdout)["findings"]:
        assert f"{finding['code']} " in README
        assert finding["hint"] in README.replace("\n", " ")


def test_readme_python_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)
    runnable = [b for b in blocks if b.startswith("import torch, memlayout")]
    assert runnable, "the README's self-contained examples start with `import torch, memlayout`"
    for block in runnable:
        exec(compile(block, "README.md", "exec"), {})


def test_the_github_actions_workflow_uploads_the_sarif_its_command_writes(
    repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import jsonschema
    import yaml

    (block,) = re.findall(r"```yaml\n(# \.github/workflows/memlayout\.yml\n.*?)```", README, flags=re.DOTALL)
    steps = yaml.safe_load(block)["jobs"]["memlayout"]["steps"]
    sarif_step = next(step for step in steps if "--format sarif" in step.get("run", ""))
    upload = next(step for step in steps if step.get("uses", "").startswith("github/codeql-action/upload-sarif"))
    args = shlex.split(sarif_step["run"])
    assert args[0] == "memlayout" and args[args.index("-o") + 1] == upload["with"]["sarif_file"]
    # The same command on the bundled demo writes a valid SARIF file where the upload looks.
    monkeypatch.chdir(tmp_path)
    args[2] = str(repo_root / "fixtures" / "demo_checkpoint.pt")
    result = CliRunner().invoke(app, args[1:])
    assert result.exit_code == 1, result.stderr
    schema = json.loads((repo_root / "tests" / "report" / "sarif-schema-2.1.0.json").read_text())
    log = json.loads((tmp_path / upload["with"]["sarif_file"]).read_text())
    jsonschema.Draft4Validator(schema).validate(log)
    assert log["runs"][0]["results"]
