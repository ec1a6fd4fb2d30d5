"""A value read from what the inputs alone decide is computed, however large the mask it goes through; a value the
weights decide is reported as theirs, with --real as the way on, and --real then measures the real step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import memlayout.activations as act
from memlayout.activations.trace import fake_step
from memlayout.errors import UsageError
from tests.activations.measure import memtracker_step

WINDOW = 512


class WindowedGlobalAttention(nn.Module):
    """Longformer's pattern: the padding mask, padded to the window, widened to [batch, 1, seq, seq] in the
    weights' dtype and cut back, then `.any().item()` of its global tokens picks the branch."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(100, 32)
        self.local = nn.Linear(32, 32)
        self.global_ = nn.Linear(32, 512)
        self.head = nn.Linear(32, 100)

    def forward(self, ids: torch.Tensor, global_tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        mask = torch.ones(ids.shape, device=ids.device) + global_tokens  # 0 padding, 1 local, 2 global
        pad = -ids.shape[1] % WINDOW
        mask = F.pad(mask, (0, pad), value=0)
        hidden = F.pad(hidden, (0, 0, 0, pad))
        batch, length = mask.shape
        wide = mask[:, None, None, :].expand(batch, 1, length, length).to(hidden.dtype)  # 4 MiB at batch 4
        extended = torch.where(wide > 0, torch.zeros((), dtype=hidden.dtype), torch.finfo(hidden.dtype).min)
        extended = extended[:, 0, 0, :].clone()
        extended[mask == 2] = torch.finfo(hidden.dtype).max
        hidden = self.local(hidden) * (extended >= 0)[..., None]
        if (extended > 0).flatten().any().item():  # global tokens: a wider projection
            hidden = hidden + self.global_(hidden).view(batch, length, 16, 32).sum(2)
        return self.head(hidden[:, : ids.shape[1]]).logsumexp(-1).mean()


class ChecksActivations(nn.Module):
    """IBert's pattern: an assert on a value of the activations, which the weights decide."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layer(x)
        assert y.isnan().sum() == 0, "activations are NaN"
        return y.square().mean()


class WritesWeightsIntoAMask(nn.Module):
    """A mask of the inputs, too large to keep real, into which values of the weights are written."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        big = torch.ones(x.shape[0], 1 << 20)  # 4 MiB per row
        big[:, :1] = self.layer(x)
        if (big < 0).any().item():
            return self.layer(x).sum()
        return x.sum() * 0 + self.layer(x).square().sum()


def window_inputs(with_global: bool) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 100, (4, 64), generator=torch.Generator().manual_seed(0))
    global_tokens = torch.zeros(4, 64)
    if with_global:
        global_tokens[:, 0] = 1
    return ids, global_tokens


@pytest.mark.parametrize("with_global", [False, True])
def test_a_wide_mask_of_the_inputs_stays_real_and_the_prediction_is_the_real_step(with_global: bool) -> None:
    inputs = window_inputs(with_global)
    assert 4 * WINDOW * WINDOW * 4 > fake_step.SMALL_BYTES  # the widened mask is larger than a routing index
    report = act.analyze(WindowedGlobalAttention(), list(inputs))
    real = memtracker_step(WindowedGlobalAttention(), inputs, {})
    assert report.summary.peak_bytes == real.peak_bytes


def test_the_branch_taken_follows_the_inputs() -> None:
    """The two branches' peaks differ, so the byte-exact predictions above show that each took the real one."""
    peaks = [act.analyze(WindowedGlobalAttention(), list(window_inputs(g))).summary.peak_bytes for g in (False, True)]
    assert peaks[1] > peaks[0]


def test_a_value_of_the_inputs_through_a_mask_too_large_to_keep_says_so_and_real_measures_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fake_step, "VALUE_BYTES", 1 << 20)  # the 4 MiB widened mask goes fake
    inputs = window_inputs(True)
    with pytest.raises(UsageError) as failed:
        act.analyze(WindowedGlobalAttention(), list(inputs))
    message = str(failed.value)
    assert "follows from the inputs alone" in message and "4.0 MiB" in message
    assert "weights" not in message
    assert "`real=True`" in failed.value.hint  # the setting; the command line says --real
    report = act.analyze(WindowedGlobalAttention(), list(inputs), mode="real")
    assert report.summary.peak_bytes == memtracker_step(WindowedGlobalAttention(), inputs, {}).peak_bytes


def test_a_value_of_the_weights_names_them_and_real_measures_it() -> None:
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(UsageError) as failed:
        act.analyze(ChecksActivations(), [x])
    assert "computed from the weights" in str(failed.value)
    assert "`real=True`" in failed.value.hint  # the setting; the command line says --real
    report = act.analyze(ChecksActivations(), [x], mode="real")
    assert report.summary.peak_bytes == memtracker_step(ChecksActivations(), (x,), {}).peak_bytes
    # Following the hint gives the measurement, and says there is no prediction beside it.
    assert report.predicted_peak_bytes is None
    assert any(note.startswith("no prediction to compare with") and "computed from the weights" in note
               for note in report.notes)


def test_a_mask_of_the_inputs_overwritten_with_values_of_the_weights_is_theirs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake_step, "VALUE_BYTES", 1 << 20)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(UsageError) as failed:
        act.analyze(WritesWeightsIntoAMask(), [x])
    assert "computed from the weights" in str(failed.value)
    assert "inputs alone" not in str(failed.value)
