"""ML102 judges duplicated optimizer state on its own: true, but no lost tie."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from memlayout.pipeline.inspection import run_inspection
from memlayout.rules import Severity


def _trained_lstm_checkpoint() -> dict[str, object]:
    """One Adam step on an LSTM, saved as a training checkpoint."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(8, 256)
    optimizer = torch.optim.Adam(lstm.parameters())
    output, _ = lstm(torch.randn(5, 2, 8))
    output.square().mean().backward()
    optimizer.step()
    return {"model": lstm.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 1}


def test_lstm_bias_moments_are_equal_by_construction_and_judged_as_optimizer_state(tmp_path: Path) -> None:
    checkpoint = _trained_lstm_checkpoint()
    # The premise, from torch: bias_ih and bias_hh get the same gradient, so Adam's
    # moments for them are bitwise equal. Parameters 2 and 3 are the two biases.
    state = checkpoint["optimizer"]["state"]  # type: ignore[index]
    assert torch.equal(state[2]["exp_avg"], state[3]["exp_avg"])
    assert not torch.equal(checkpoint["model"]["bias_ih_l0"], checkpoint["model"]["bias_hh_l0"])  # type: ignore[index]
    path = tmp_path / "ckpt.pt"
    torch.save(checkpoint, path)

    findings = [f for f in run_inspection(str(path)).findings if f.code == "ML102"]
    assert {f.tensors for f in findings} == {
        ("optimizer.state.2.exp_avg", "optimizer.state.3.exp_avg"),
        ("optimizer.state.2.exp_avg_sq", "optimizer.state.3.exp_avg_sq"),
    }
    for finding in findings:
        assert finding.severity is Severity.INFO
        assert "not from a lost tie" in finding.message
        assert "tie them" not in finding.hint and "do not tie" in finding.hint


def test_following_the_optimizer_state_hint_removes_the_finding(tmp_path: Path) -> None:
    checkpoint = _trained_lstm_checkpoint()
    path = tmp_path / "ckpt.pt"
    torch.save(checkpoint, path)
    (finding,) = [f for f in run_inspection(str(path)).findings if f.code == "ML102"][:1]
    # The hint names the checkpoint's model section: run exactly that line.
    line = re.search(r"`(torch\.save\(checkpoint\[\"(\w+)\"\], path\))`", finding.hint)
    assert line is not None and line.group(2) == "model"
    weights_only = tmp_path / "weights.pt"
    exec(line.group(1), {"torch": torch, "checkpoint": torch.load(path, weights_only=True), "path": weights_only})
    assert not [f for f in run_inspection(str(weights_only)).findings if f.code == "ML102"]


def test_duplicated_model_weights_keep_the_tie_judgment(tmp_path: Path) -> None:
    weight = torch.randn(64, 64)
    path = tmp_path / "lost_tie.pt"
    torch.save({"model": {"embed.weight": weight, "head.weight": weight.clone()}}, path)
    (finding,) = [f for f in run_inspection(str(path)).findings if f.code == "ML102"]
    assert finding.severity is Severity.WARNING
    assert "tie them" in finding.hint
