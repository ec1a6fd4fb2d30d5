"""The activations pages' examples are real: each command runs and prints what its page shows."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memlayout.cli.app import app

DOCS = Path(__file__).resolve().parents[2] / "docs"
# The pages split from the one activations page that show a command with its output.
PAGE = "\n".join((DOCS / page).read_text()
                 for page in ("activations.md", "activations-weights.md", "activations-budget.md"))
EXAMPLES = re.findall(r"```console\n\$ memlayout (activations .+?)\n(.*?)```", PAGE, flags=re.DOTALL)
MEASURED_HERE = re.compile(r"(recompute .*?, )\S+ \S+ \(\d+% of the forward's time\)")
"""A plan's recompute time on the CPU: the roofline of rates measured on the machine that runs it."""


def _machine_free(text: str) -> str:
    """The page's text less what depends on the machine: a CPU plan's recompute time."""
    if "the roofline of this machine's CPU" not in text:
        return text
    return MEASURED_HERE.sub(r"\1(time on this machine)", text)


def test_the_page_has_examples() -> None:
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("command, shown", EXAMPLES, ids=[c[:60] for c, _ in EXAMPLES])
def test_example_output_is_what_the_command_prints(
    command: str, shown: str, repo_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(repo_root)
    result = CliRunner().invoke(app, shlex.split(command))
    assert result.exit_code in (0, 1), result.stderr
    if result.exit_code == 0:
        assert _machine_free(result.stdout.rstrip("\n")) == _machine_free(shown.rstrip("\n"))
    else:  # the budget's one line (transformers may log its own lines to stderr too)
        ours = [line for line in result.stderr.splitlines() if line.startswith("memlayout: ")]
        assert ours == shown.rstrip("\n").splitlines()
