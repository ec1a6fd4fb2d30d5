"""Each rule's documentation is complete, its example really triggers the rule, its fix
really clears it, and `explain` prints the registry's texts. The site's rule pages
are checked in tests/test_docs.py, the README's rules table in tests/test_readme.py."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memlayout.cli.app import app
from memlayout.report.rule_docs import SECTIONS, explain_text
from memlayout.rules import RULES

runner = CliRunner()


def reported_codes(command: str) -> list[str]:
    args = shlex.split(command)
    if args[0] == "torchrun":
        return codes_on_real_ranks(args)
    assert args[:2] == ["memlayout", "inspect"]
    result = runner.invoke(app, [*args[1:], "--format", "json"])
    assert result.exit_code in (0, 1), result.stderr
    return [f["code"] for f in json.loads(result.stdout)["findings"]]


def codes_on_real_ranks(args: list[str]) -> list[str]:
    """A `torchrun ... -m memlayout inspect` example, run as written (--standalone picks a free port)."""
    assert args[args.index("-m") + 1 : args.index("-m") + 3] == ["memlayout", "inspect"]
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", *args[1:], "--format", "json"],
                          capture_output=True, text=True, timeout=300, check=False)
    # Rank 0 writes the report; torchrun exits 1 when a rank exits 1 (findings at --fail-on).
    assert done.returncode in (0, 1), done.stderr
    return [f["code"] for f in json.loads(done.stdout)["findings"]]


@pytest.mark.parametrize("code", sorted(RULES))
def test_every_rule_is_documented_in_full(code: str) -> None:
    rule = RULES[code]
    assert rule.summary and rule.detects and rule.explanation and rule.hint and rule.example is not None
    command = rule.example.command
    assert command.startswith("memlayout inspect ") or (
        command.startswith("torchrun ") and " -m memlayout inspect " in command
    )


@pytest.mark.parametrize("code", sorted(RULES))
def test_the_example_triggers_the_rule_and_the_fix_clears_it(
    code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = RULES[code].example
    assert example is not None
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(example.setup, f"{code} example", "exec"), namespace)
    assert code in reported_codes(example.command)
    exec(compile(example.fixed, f"{code} fix", "exec"), namespace)
    assert code not in reported_codes(example.command)


@pytest.mark.parametrize("code", sorted(RULES))
def test_explain_prints_the_four_sections(code: str) -> None:
    result = runner.invoke(app, ["explain", code])
    assert result.exit_code == 0
    assert result.stdout == explain_text(RULES[code])
    positions = [result.stdout.index(f"\n{title}\n") for title in SECTIONS]
    assert positions == sorted(positions)
    assert RULES[code].example.command in result.stdout  # type: ignore[union-attr]


def test_explain_takes_a_name_and_refuses_an_unknown_code() -> None:
    assert runner.invoke(app, ["explain", "duplicate-weights"]).stdout == explain_text(RULES["ML102"])
    result = runner.invoke(app, ["explain", "ML999"])
    assert result.exit_code == 2 and "no rule 'ML999'" in result.stderr
