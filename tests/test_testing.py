"""`memlayout.testing.assert_layout` in a user's own test suite."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import memlayout.testing
from memlayout.errors import UsageError
from tests import models


def test_a_clean_model_passes_and_returns_the_report() -> None:
    report = memlayout.testing.assert_layout(models.TiedEmbeddingLM())
    assert report.summary.parameters == 1


def test_the_message_is_the_reports_findings() -> None:
    state = models.one_finding_of_each_severity_state()
    hints = {f.code: f.hint for f in memlayout.inspect(state).findings}
    with pytest.raises(AssertionError) as failure:
        memlayout.testing.assert_layout(state)
    # The info finding (ML203) is under the default threshold, so it is not listed.
    assert str(failure.value).splitlines() == [
        "memlayout found 2 layout problems at or above warning in dict:",
        "ML101 error partial-overlap: encoder.left and encoder.right overlap partially in storage s0",
        f"    hint: {hints['ML101']}",
        "ML201 warning non-contiguous: proj.weight (shape [8, 8], stride [1, 8]) is not contiguous",
        f"    hint: {hints['ML201']}",
    ]


def test_fail_on_select_and_ignore() -> None:
    state = models.one_finding_of_each_severity_state()
    memlayout.testing.assert_layout(state, fail_on="never")
    memlayout.testing.assert_layout(state, ignore=["ML1", "ML201"], fail_on="warning")
    memlayout.testing.assert_layout(state, select="ML2", fail_on="error")
    with pytest.raises(AssertionError, match="ML203 info misaligned"):
        memlayout.testing.assert_layout(state, select="ML203", fail_on="info")
    with pytest.raises(ValueError, match="fail_on must be one of"):
        memlayout.testing.assert_layout(state, fail_on="warnings")
    with pytest.raises(UsageError, match="unknown rule code 'ML9'"):
        memlayout.testing.assert_layout(state, select=["ML9"])


def test_following_the_hint_makes_it_pass() -> None:
    linear = torch.nn.Linear(4, 4)
    linear.weight = torch.nn.Parameter(linear.weight.t())
    with pytest.raises(AssertionError, match=re.escape("p.data = p.data.contiguous()")):
        memlayout.testing.assert_layout(linear)
    linear.weight.data = linear.weight.data.contiguous()
    memlayout.testing.assert_layout(linear)


def test_it_works_on_a_checkpoint_path(tmp_path: Path) -> None:
    torch.save(models.sliced_bloat_state(), tmp_path / "bloat.pt")
    with pytest.raises(AssertionError, match=r"ML301 warning storage-bloat"):
        memlayout.testing.assert_layout(str(tmp_path / "bloat.pt"))


def test_in_a_users_pytest_run_the_failure_shows_the_findings(tmp_path: Path) -> None:
    (tmp_path / "test_user_model.py").write_text(
        "import torch\nimport memlayout.testing\n\n"
        "def test_model_layout():\n"
        "    model = torch.nn.Linear(4, 4)\n"
        "    model.weight = torch.nn.Parameter(model.weight.t())\n"
        "    memlayout.testing.assert_layout(model)\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 1, result.stdout
    assert "AssertionError: memlayout found 1 layout problem at or above warning in Linear:" in result.stdout
    assert "ML201 warning non-contiguous: weight (shape [4, 4], stride [1, 4]) is not contiguous" in result.stdout
    assert "1 failed" in result.stdout
