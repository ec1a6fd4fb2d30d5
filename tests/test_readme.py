"""The README stays short and true: a page of at most about 1,500 words, its commands run,
and its CI workflow uploads what it writes. The headline figures it used to carry are on
the performance page, rendered from the benchmark results."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.headlines import headlines_markdown
from memlayout.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
README_PATH = ROOT / "README.md"
README = README_PATH.read_text()
MAX_WORDS = 1_500


def test_the_readme_is_short() -> None:
    # The README introduces; the documentation site under docs/ holds the rest.
    assert len(README.split()) <= MAX_WORDS


def test_set_up_commands_are_documented() -> None:
    assert "make demo" in README and "make test" in README


# Blocks rendered from the code, between `<!-- NAME:start -->` and `<!-- NAME:end -->`: (page, name) -> its text.
GENERATED: dict[tuple[str, str], Callable[[], str]] = {("docs/performance.md", "figures"): headlines_markdown}


@pytest.mark.parametrize(("page", "name"), sorted(GENERATED))
def test_generated_blocks_are_current(page: str, name: str, overwrite_golden: bool) -> None:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    path = ROOT / page
    text = path.read_text()
    current = re.search(re.escape(start) + ".*?" + re.escape(end), text, flags=re.S)
    assert current is not None, f"{page} needs the {start} ... {end} block"
    expected = f"{start}\n{GENERATED[page, name]()}{end}"
    if overwrite_golden:
        path.write_text(text.replace(current.group(0), expected))
        return
    assert current.group(0) == expected, f"{page}'s {name} block drifted: rerun pytest with --overwrite"


def runnable_commands(text: str) -> list[str]:
    """`$ memlayout ...` lines that need no file of the reader's: the bundled fixtures, rules, explain."""
    commands = re.findall(r"^\$ memlayout (.+)$", text, flags=re.MULTILINE)
    return [c for c in commands if "fixtures/" in c or c.split()[0] in ("rules", "explain")]


def run_command(command: str, repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run one documented command from the repository root, its outputs in a scratch folder."""
    monkeypatch.chdir(repo_root)
    args = shlex.split(command, comments=True)
    for index, arg in enumerate(args[:-1]):
        if arg in ("-o", "--output"):
            args[index + 1] = str(tmp_path / Path(args[index + 1]).name)
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, 1), result.stderr
    assert result.stdout
    return result.stdout


@pytest.mark.parametrize("command", runnable_commands(README))
def test_readme_command_runs(command: str, repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_command(command, repo_root, tmp_path, monkeypatch)


def test_the_quick_start_shows_three_commands() -> None:
    section = README[README.index("## Quick start") : README.index("\n## ", README.index("## Quick start"))]
    assert len(re.findall(r"^\$ memlayout ", section, flags=re.MULTILINE)) == 3


@pytest.mark.parametrize("page", ["README.md", "docs/usage.md"])
def test_the_demo_output_shows_the_current_findings(page: str, repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo_root)
    result = CliRunner().invoke(app, ["inspect", "fixtures/demo_checkpoint.pt", "--format", "json"])
    text = (repo_root / page).read_text().replace("\n", " ")
    for finding in json.loads(result.stdout)["findings"]:
        assert f"{finding['code']} {finding['severity']}" in text
        assert finding["hint"] in text


def test_readme_links_point_at_files() -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), target


def test_the_github_actions_workflow_uploads_the_sarif_its_command_writes(
    repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
