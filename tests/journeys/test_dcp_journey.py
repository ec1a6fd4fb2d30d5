"""DCP checkpoints get the rules their metadata can answer (issue 40, defect 8).

The user saved torch.distributed.checkpoint directories and inspected them:
every content and layout rule was skipped, though `.metadata` holds each
chunk's offsets, sizes, dtype and where its bytes lie. Here, as the user did:
a tied model saved by dcp.save in one process, and a replicated weight whose two
gloo ranks had drifted apart, saved by DCP's writer once with its own planner
and once with a planner that keeps every rank's replica. Each is inspected with
the real command, and what the report says is checked against dcp.load.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.load.dcp_writers import save_replicas
from tests.rules.test_dcp_rules import Tied

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def _inspect(path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "memlayout", "inspect", str(path), "--format", "json", *args],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def _loaded(path: Path) -> torch.Tensor:
    import torch.distributed.checkpoint as dcp

    state = {"w": torch.zeros(4, 3)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=str(path))
    return state["w"]


def test_replicas_written_twice_are_reported_and_the_lost_copy_is_the_one_dcp_load_drops(tmp_path: Path) -> None:
    own_planner, every_replica = save_replicas(tmp_path / "replicas")  # rank r's replica holds r + 1

    code, report = _inspect(every_replica)
    (finding,) = [f for f in report["findings"] if f["code"] == "ML106"]
    assert finding["severity"] == "error" and code == 1
    assert ("w: chunk [0:4,0:3] is listed twice (12 elements, both read from __1_0.distcp at byte 0)"
            in finding["message"])
    assert ".metadata locates one copy for both" in finding["message"]
    assert "__0_0.distcp: not named by .metadata, so dcp.load never reads it" in report["source"]["notes"]
    assert torch.equal(_loaded(every_replica), torch.full((4, 3), 2.0))  # rank 1's; rank 0's replica is gone

    code, report = _inspect(own_planner)
    assert report["findings"] == [] and code == 0  # DCP's planner kept one replica
    assert torch.equal(_loaded(own_planner), torch.full((4, 3), 1.0))


def test_a_tied_models_checkpoint_runs_the_tie_rule_and_says_why_the_layout_rules_cannot(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = Tied()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(model.state_dict(), checkpoint_id=str(tmp_path / "tied"))
    code, report = _inspect(tmp_path / "tied", "--tie", "head.weight=emb.weight")
    assert code == 0 and report["findings"] == []
    skipped = {entry["code"]: entry["reason"] for entry in report["skipped_rules"]}
    ran = {"ML103", "ML106", "ML402", "ML502", "ML601"}
    assert not ran & set(skipped)
    assert {"ML101", "ML201", "ML203", "ML204", "ML301", "ML401", "ML501"} <= set(skipped)
    assert all("dcp.load reads each chunk with torch.load into fresh memory and copies it" in reason
               for reason in skipped.values())
    fresh = Tied()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(fresh.state_dict(), checkpoint_id=str(tmp_path / "tied"))
    assert fresh.head.weight is fresh.emb.weight and torch.equal(fresh.head.weight, model.emb.weight)
