"""CI with `--fail-on warning`, a baseline and SARIF, before and after the fix memlayout recommends.

One repository's story: a training checkpoint with findings turns CI red; the team
records a baseline and CI goes green; a new problem turns it red again; they run
`memlayout flatten --in-place`, CI stays green with no results at or above warning,
and the baseline's note about fixed findings is followed as it says. Every SARIF
log is checked against the OASIS SARIF 2.1.0 schema the project vendors
(tests/report/sarif-schema-2.1.0.json).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import torch
from torch import nn

SARIF_SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "report" / "sarif-schema-2.1.0.json").read_text())
AT_LEAST_WARNING = {"warning", "error"}
"""SARIF levels at or above memlayout's warning (its info is SARIF's note)."""


class Tagger(nn.Module):
    """An LSTM tagger as a training script leaves it: a transposed head and a calibration slice of a big table."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 32)
        self.lstm = nn.LSTM(32, 32, num_layers=2)
        self.proj = nn.Linear(32, 10)
        # A head kept as the transpose of a (10, 32) matrix's transpose: column-major.
        self.proj.weight = nn.Parameter(self.proj.weight.detach().t().contiguous().t())
        table = torch.randn(4096, 10)
        self.register_buffer("calibration", table[:2])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(tokens))
        return self.proj(hidden) * self.calibration[0]  # type: ignore[no-any-return]


def save_training_checkpoint(path: Path) -> None:
    torch.manual_seed(0)
    model = Tagger()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, 100, (5, 3))).sum().backward()
    optimizer.step()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 1}, path)


def memlayout(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memlayout", *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def ci(cwd: Path, *options: str) -> tuple[int, list[dict[str, Any]]]:
    """The CI step: inspect with --fail-on warning, SARIF to a file; its exit code and valid SARIF results."""
    sarif = cwd / "memlayout.sarif"
    done = memlayout("inspect", "model.pt", "--fail-on", "warning", "--format", "sarif", "-o", str(sarif),
                     "--isolated", *options, cwd=cwd)
    assert done.returncode in (0, 1), done.stderr
    log = json.loads(sarif.read_text())
    jsonschema.Draft4Validator(SARIF_SCHEMA, format_checker=jsonschema.FormatChecker()).validate(log)
    (run,) = log["runs"]
    return done.returncode, run["results"]


def failing(results: list[dict[str, Any]]) -> set[str]:
    """The rules of results at or above warning that no baseline accepted."""
    return {
        r["ruleId"] for r in results
        if r["level"] in AT_LEAST_WARNING and not any(s["status"] == "accepted" for s in r.get("suppressions", []))
    }


def test_ci_before_with_a_baseline_and_after_flatten(tmp_path: Path) -> None:
    save_training_checkpoint(tmp_path / "model.pt")

    # Before: red, and SARIF says why.
    code, results = ci(tmp_path)
    assert code == 1
    assert {"ML201", "ML301"} <= failing(results)

    # A baseline of today's findings: green, every result marked accepted and unchanged.
    recorded = memlayout("inspect", "model.pt", "--isolated", "--write-baseline", "baseline.json", cwd=tmp_path)
    assert recorded.returncode == 0, recorded.stderr
    code, results = ci(tmp_path, "--baseline", "baseline.json")
    assert code == 0
    assert results and failing(results) == set()
    assert {r["baselineState"] for r in results} == {"unchanged"}

    # The fix: flatten in place. Green without the baseline, and nothing at or above warning.
    flattened = memlayout("flatten", "model.pt", "--in-place", cwd=tmp_path)
    assert flattened.returncode == 0, flattened.stderr
    code, results = ci(tmp_path)
    assert code == 0
    assert [r for r in results if r["level"] in AT_LEAST_WARNING] == []

    # With the old baseline: green, and the fixed findings are reported as absent.
    code, results = ci(tmp_path, "--baseline", "baseline.json")
    assert code == 0 and failing(results) == set()
    assert {"ML201", "ML301"} <= {r["ruleId"] for r in results if r["baselineState"] == "absent"}


def test_the_baselines_note_about_fixed_findings_is_followed_as_it_says(tmp_path: Path) -> None:
    save_training_checkpoint(tmp_path / "model.pt")
    assert memlayout("inspect", "model.pt", "--isolated", "--write-baseline", "baseline.json",
                     cwd=tmp_path).returncode == 0
    assert memlayout("flatten", "model.pt", "--in-place", cwd=tmp_path).returncode == 0

    done = memlayout("inspect", "model.pt", "--isolated", "--fail-on", "warning", "--baseline", "baseline.json",
                     cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    note = re.search(r"no longer occur; re-run with (--write-baseline \S+) to drop them", done.stdout + done.stderr)
    assert note, done.stdout + done.stderr
    rerun = memlayout("inspect", "model.pt", "--isolated", *shlex.split(note.group(1)), cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr

    code, results = ci(tmp_path, "--baseline", "baseline.json")
    assert code == 0 and [r for r in results if r.get("baselineState") == "absent"] == []
    again = memlayout("inspect", "model.pt", "--isolated", "--baseline", "baseline.json", cwd=tmp_path)
    assert "no longer occur" not in again.stdout + again.stderr


def test_a_new_warning_after_the_baseline_turns_ci_red(tmp_path: Path) -> None:
    save_training_checkpoint(tmp_path / "model.pt")
    assert memlayout("inspect", "model.pt", "--isolated", "--write-baseline", "baseline.json",
                     cwd=tmp_path).returncode == 0
    checkpoint = torch.load(tmp_path / "model.pt")
    checkpoint["model"]["adapter.weight"] = torch.randn(16, 32).t()  # a new transposed weight: ML201
    torch.save(checkpoint, tmp_path / "model.pt")

    code, results = ci(tmp_path, "--baseline", "baseline.json")
    assert code == 1
    new = [r for r in results if r["ruleId"] == "ML201" and r.get("baselineState") == "new"]
    assert new and failing(new) == {"ML201"}
