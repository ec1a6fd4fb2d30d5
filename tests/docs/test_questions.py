"""The questions page answers each question with one command, and every command on it runs.

The commands run as the page shows them, from a folder that holds the clone's
`fixtures/` and `benchmarks/` (so what they write lands in a scratch folder), in
the order of the page: the diff reads the file the flatten before it wrote.
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


def commands() -> list[str]:
    return re.findall(r"^\$ memlayout (.+)$", PAGE, flags=re.MULTILINE)


def test_the_page_asks_a_dozen_questions_each_with_a_command_and_a_link() -> None:
    assert len(sections()) >= 12
    for question, text in sections():
        assert question.endswith("?"), question
        assert re.search(r"^\$ memlayout ", text, flags=re.MULTILINE), question
        assert re.search(r"\]\([a-z/-]+\.md(#[a-z0-9-]+)?\)", text), question


def _marks(command: str) -> list[pytest.MarkDecorator]:
    # Fake CUDA tensors need torch's CUDA build (no GPU): CI's torch 2.14.1 job runs these.
    return [pytest.mark.cuda_build] if "--gpu" in command else []


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("questions")
    for name in ("fixtures", "benchmarks"):
        (folder / name).symlink_to(ROOT / name, target_is_directory=True)
    return folder


@pytest.mark.parametrize(
    "command", [pytest.param(c, marks=_marks(c), id=c[:60]) for c in commands()]
)
def test_every_command_on_the_page_runs(command: str, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    result = CliRunner().invoke(app, shlex.split(command))
    # 1 is an answer too: findings at or above --fail-on, or a flatten --check that would change the file.
    assert result.exit_code in (0, 1), result.stderr
    assert result.stdout.strip()
