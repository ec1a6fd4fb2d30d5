"""A 20-kill slice of the SIGKILL harness; `make reliability` runs 200 on 64 MiB."""

from __future__ import annotations

import json
from pathlib import Path

from tests.reliability.sigkill import run_campaign


def test_twenty_sigkills_lose_nothing_and_leave_nothing(tmp_path: Path) -> None:
    campaign = run_campaign(tmp_path / "sigkill", kills=20, mib=8, seed=20261122)
    figures = json.dumps(campaign.as_dict(), indent=1)
    assert campaign.kills == 20
    assert campaign.input_changed == 0, figures
    assert campaign.out_bad == 0, figures
    assert campaign.leftovers_after_next_run == 0, figures
    assert not campaign.failures, figures
    # Kills landed in every phase: before OUT existed, and after it was complete.
    states = " ".join(campaign.states)
    assert "absent" in states or "old" in states, figures
