"""The questions page answers each question with one command, and every command on it runs.

The commands run as the page shows them, from a scratch folder that links the
clone's `fixtures/` and `benchmarks/` (so what they write lands there), a
question's commands in one test and in order: the diff reads the file the flatten
before it wrote, whichever worker runs the test.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memlayout.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "questions.md").read_text()


def sections() -> list[tuple[str, str]]:
    """(question, its text) for each `## ` section."""
    parts = re.split(r"^## (.+)$", PAGE, flags=re.MULTILINE)[1:]
    return list(zip(parts[::2], parts[1::2], strict=True))


def commands(text: str) -> list[str]:
    return re.findall(r"^\$ memlayout (.+)$", text, flags=re.MULTILINE)


def test_the_page_asks_a_dozen_questions_each_with_a_command_and_a_link() -> None:
    assert len(sections()) >= 12
    # Every command sits under a question, so the test below runs it.
    assert sum(len(commands(text)) for _, text in sections()) == len(commands(PAGE))
    for question, text in sections():
        assert question.endswith("?"), question
        assert re.search(r"^\$ memlayout ", text, flags=re.MULTILINE), question
        assert re.search(r"\]\([a-z/-]+\.md(#[a-z0-9-]+)?\)", text), question


# `--gpu` runs on every torch build (a fake CUDA device), so a question that names a GPU runs here too.
@pytest.mark.parametrize("question", [pytest.param(q, id=q) for q, _ in sections()])
def test_every_command_on_the_page_runs(question: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("fixtures", "benchmarks"):
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    for command in commands(dict(sections())[question]):
        result = CliRunner().invoke(app, shlex.split(command))
        # 1 is an answer too: findings at or above --fail-on, or a flatten --check that would change the file.
        assert result.exit_code in (0, 1), f"{command}\n{result.stderr}"
        assert result.stdout.strip(), command
