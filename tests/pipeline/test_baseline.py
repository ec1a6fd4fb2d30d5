"""Baselines: record the findings, hide them on the next run, report the ones fixed since."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from memlayout.cli.app import app
from tests import models

runner = CliRunner()


def inspect(*args: str) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    result = runner.invoke(app, ["inspect", *args, "--format", "json"])
    return result.exit_code, json.loads(result.stdout) if result.stdout else {}, result.stderr


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    torch.save(models.one_finding_of_each_severity_state(), "model.pt")
    torch.save(models.sliced_bloat_state(), "bloat.pt")
    return tmp_path


def test_baseline_round_trip(project: Path) -> None:
    # 1. Record: the run passes, every finding is known.
    code, data, _ = inspect("model.pt", "--write-baseline", "baseline.json")
    assert code == 0 and data["findings"] == []
    assert data["baseline"] == {"file": "baseline.json", "written": True, "suppressed": 3, "fixed": [], "rekeyed": []}
    recorded = json.loads(Path("baseline.json").read_text())
    assert sorted(f["code"] for f in recorded["findings"]) == ["ML101", "ML201", "ML203"]
    assert {f["path"] for f in recorded["findings"]} == {"model.pt"}

    # 2. Nothing changed: nothing new, nothing fixed.
    code, data, _ = inspect("model.pt", "--baseline", "baseline.json")
    assert code == 0 and data["findings"] == [] and data["baseline"]["suppressed"] == 3

    # 3. A new finding appears and one is fixed: only the new one is reported.
    state = models.one_finding_of_each_severity_state()
    state["proj.weight"] = state["proj.weight"].contiguous()  # fixes ML201
    state["norm.shifted"] = torch.arange(4096, dtype=torch.float32)[1:65]  # still ML203, and new: ML301
    torch.save(state, "model.pt")
    code, data, _ = inspect("model.pt", "--baseline", "baseline.json")
    assert code == 1 and [f["code"] for f in data["findings"]] == ["ML301"]
    assert [(f["code"], f["tensors"]) for f in data["baseline"]["fixed"]] == [("ML201", ["proj.weight"])]

    # 4. Following the printed advice shrinks the baseline.
    table = runner.invoke(app, ["inspect", "model.pt", "--baseline", "baseline.json"]).stdout
    assert "re-run with --write-baseline baseline.json to drop them" in table
    inspect("model.pt", "--baseline", "baseline.json", "--write-baseline", "baseline.json")
    recorded = json.loads(Path("baseline.json").read_text())
    assert sorted(f["code"] for f in recorded["findings"]) == ["ML101", "ML203", "ML301"]
    code, data, _ = inspect("model.pt", "--baseline", "baseline.json")
    assert code == 0 and data["baseline"]["fixed"] == [] and data["baseline"]["suppressed"] == 3


def test_a_baseline_works_from_another_directory(project: Path) -> None:
    Path("ci").mkdir()
    inspect("model.pt", "--write-baseline", "ci/baseline.json")
    assert json.loads(Path("ci/baseline.json").read_text())["findings"][0]["path"] == "../model.pt"
    os.chdir(project / "ci")
    code, data, _ = inspect("../model.pt", "--baseline", "baseline.json")
    assert code == 0 and data["baseline"]["suppressed"] == 3
    os.chdir(project)
    code, data, _ = inspect(str(project / "model.pt"), "--baseline", "ci/baseline.json")
    assert code == 0 and data["baseline"]["suppressed"] == 3


def test_fingerprints_follow_tensors_not_messages(project: Path) -> None:
    inspect("bloat.pt", "--write-baseline", "baseline.json")
    # The bloat changes size (the message changes); the finding is the same one.
    torch.save({"head": torch.arange(100_000, dtype=torch.float32)[:20]}, "bloat.pt")
    state = models.sliced_bloat_state()
    torch.save({name: t[:20] for name, t in state.items()}, "bloat.pt")
    code, data, _ = inspect("bloat.pt", "--baseline", "baseline.json")
    assert code == 0 and data["baseline"]["suppressed"] == 1


def test_writing_a_baseline_for_some_paths_keeps_the_others(project: Path) -> None:
    inspect("model.pt", "bloat.pt", "--write-baseline", "baseline.json")
    inspect("model.pt", "--write-baseline", "baseline.json")
    recorded = json.loads(Path("baseline.json").read_text())
    assert {f["path"] for f in recorded["findings"]} == {"model.pt", "bloat.pt"}
    # Recorded findings of a path not inspected in this run are not "fixed".
    code, data, _ = inspect("model.pt", "--baseline", "baseline.json")
    assert code == 0 and data["baseline"]["fixed"] == []


def test_the_baseline_applies_per_path(project: Path) -> None:
    inspect("model.pt", "--write-baseline", "baseline.json")
    Path("copy.pt").write_bytes(Path("model.pt").read_bytes())
    code, data, _ = inspect("model.pt", "copy.pt", "--baseline", "baseline.json")
    reports = {r["path"]: r for r in data["reports"]}
    assert reports["model.pt"]["suppressed"] == 3 and reports["model.pt"]["report"]["findings"] == []
    assert len(reports["copy.pt"]["report"]["findings"]) == 3 and code == 1


def test_every_format_reports_what_the_baseline_did(project: Path) -> None:
    inspect("model.pt", "--write-baseline", "baseline.json")
    torch.save(models.cloned_slice_state(), "model.pt")  # every recorded finding is fixed
    sarif = json.loads(runner.invoke(app, ["inspect", "model.pt", "--baseline", "baseline.json", "-f", "sarif"]).stdout)
    states = sorted(r["baselineState"] for r in sarif["runs"][0]["results"])
    assert states == ["absent", "absent", "absent"]
    markdown = runner.invoke(app, ["inspect", "model.pt", "--baseline", "baseline.json", "-f", "markdown"]).stdout
    assert "#### Fixed since the baseline (3)" in markdown
    github = runner.invoke(app, ["inspect", "model.pt", "--baseline", "baseline.json", "-f", "github"]).stdout
    assert github.count("::notice file=model.pt,title=ML") == 3


def test_sarif_marks_known_findings_suppressed(project: Path) -> None:
    from tests.report.test_formats import validate_sarif

    inspect("model.pt", "--write-baseline", "baseline.json")
    result = runner.invoke(app, ["inspect", "model.pt", "--baseline", "baseline.json", "-f", "sarif"])
    log = validate_sarif(result.stdout)
    results = log["runs"][0]["results"]  # type: ignore[index]
    assert len(results) == 3
    assert all(r["baselineState"] == "unchanged" and r["suppressions"][0]["kind"] == "external" for r in results)


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (None, ["--baseline", "none.json"], "--baseline none.json: no such file (create it with --write-baseline"),
        ("not json", ["--baseline", "b.json"], "b.json is not a memlayout baseline"),
        ('{"findings": []}', ["--baseline", "b.json"], "b.json is not a memlayout baseline"),
        ("precious notes", ["--write-baseline", "b.json"], "not a memlayout baseline; not overwriting it"),
        (None, ["--baseline", "a.json", "--write-baseline", "b.json"], "name different files"),
    ],
)
def test_baseline_errors_are_one_line(project: Path, setup: str | None, args: list[str], message: str) -> None:
    if setup is not None:
        Path("b.json").write_text(setup)
    code, _, err = inspect("model.pt", *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    if setup is not None:
        assert Path("b.json").read_text() == setup  # never overwritten


def test_a_pickle_that_gains_a_global_is_a_new_finding_and_the_old_one_is_fixed(project: Path) -> None:
    import os

    import numpy as np

    class Hook:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return os.system, ("true",)

    torch.save({"w": torch.zeros(2), "best": np.float64(1.0)}, "ckpt.pt")
    code, data, _ = inspect("ckpt.pt", "--write-baseline", "pickles.json")
    assert code == 0 and data["baseline"]["suppressed"] == 1
    recorded = json.loads(Path("pickles.json").read_text())
    assert recorded["memlayout-baseline"] == 2 and {f["scheme"] for f in recorded["findings"]} == {2}
    torch.save({"w": torch.zeros(2), "best": np.float64(1.0), "hook": Hook()}, "ckpt.pt")
    code, data, _ = inspect("ckpt.pt", "--baseline", "pickles.json")
    assert code == 1 and [f["code"] for f in data["findings"]] == ["ML601"]
    assert [f["code"] for f in data["baseline"]["fixed"]] == ["ML601"]  # the entry of the scalar alone


def test_a_scheme_1_baseline_still_hides_what_its_key_still_tells(project: Path) -> None:
    # Version 1 keyed every finding on its rule and tensors; for rules whose fingerprint did not
    # change (here ML101, ML201, ML203), its entries still hide their findings.
    inspect("model.pt", "--write-baseline", "baseline.json")
    recorded = json.loads(Path("baseline.json").read_text())
    recorded["memlayout-baseline"] = 1
    for entry in recorded["findings"]:
        del entry["scheme"]
    Path("baseline.json").write_text(json.dumps(recorded))
    code, data, _ = inspect("model.pt", "--baseline", "baseline.json")
    assert code == 0 and data["findings"] == [] and data["baseline"]["suppressed"] == 3
    assert data["baseline"]["rekeyed"] == [] and data["baseline"]["fixed"] == []
