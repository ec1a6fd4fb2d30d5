"""picklescan's and modelscan's samples, remade from our recipes, through one watched `memlayout inspect`.

Every malicious sample must come out flagged (ML601: runs-code or constructs-object),
every benign one cleared (or, for the one that is no checkpoint at all, refused with
one line), and nothing may execute: the run's audit hook records any command,
connection or real unpickling (tests/corpus/sweep.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.corpus.scanner_samples import RECIPES, available
from tests.corpus.sweep import FLAGGED, Sweep, sweep

SAMPLES = [recipe for recipe in RECIPES if available(recipe)]


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    folder = tmp_path_factory.mktemp("scanner-samples")
    for recipe in SAMPLES:
        (folder / recipe.name).write_bytes(recipe.build())
    return sweep(sorted(folder.iterdir()), folder)


def test_nothing_from_any_sample_executed(swept: Sweep) -> None:
    assert swept.executions == []


@pytest.mark.parametrize("recipe", [r for r in SAMPLES if r.malicious], ids=lambda r: r.name)
def test_every_malicious_sample_is_flagged(recipe: object, swept: Sweep) -> None:
    outcome = swept.outcomes[recipe.name]  # type: ignore[attr-defined]
    assert outcome.outcome in FLAGGED, (recipe, outcome)


@pytest.mark.parametrize("recipe", [r for r in SAMPLES if not r.malicious], ids=lambda r: r.name)
def test_every_benign_sample_is_cleared(recipe: object, swept: Sweep) -> None:
    outcome = swept.outcomes[recipe.name]  # type: ignore[attr-defined]
    assert outcome.outcome == recipe.expected, (recipe, outcome)  # type: ignore[attr-defined]


def test_the_samples_said_to_run_code_are_errors_and_the_run_fails(swept: Sweep) -> None:
    # The modelscan and picklescan basics: eval, os.system, subprocess, sockets, nested pickles.
    for name in ("malicious1_v0.pkl", "malicious2_v4.pkl", "malicious8.pkl", "malicious7.pkl", "malicious12.pkl",
                 "model.pt.gz", "payload-zlib.joblib", "nested.zip", "dns_exfiltration.npy"):
        assert swept.outcomes[name].outcome == "runs-code", (name, swept.outcomes[name])
    assert swept.exit_code == 2  # bad_pytorch.pt is no checkpoint: not everything could be read


def test_the_recipes_name_distinct_files(tmp_path: Path) -> None:
    assert len({r.name for r in RECIPES}) == len(RECIPES)
