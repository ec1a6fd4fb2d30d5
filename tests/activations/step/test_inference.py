"""`--step inference`: forward only, under torch.inference_mode, checked against real forwards on the CPU."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import memlayout.activations as act
from memlayout.activations.step.run import LOSS_NONE
from memlayout.cli.app import app
from tests.activations import models
from tests.activations.measure import allocator_inference_peak

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "memlayout" / "activations" / "schema_v1.json").read_text())
GPT2 = ["activations", "tests.activations.models:gpt2", "--input", "int64[2,32]<500"]

class EagerAttention(nn.Module):
    """Attention written out, its score kept while its dropped-out probabilities are used: in eval mode the
    dropout is the identity, and a copy of the probabilities there would be a third score-sized storage."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.drop = nn.Dropout(0.1)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2)
        probs = self.drop(torch.softmax(scores, dim=-1))
        return self.out((probs @ v).transpose(1, 2).reshape(batch, tokens, width))


CASES: dict[str, tuple[Callable[[], nn.Module], list[str], Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]]] = {
    # transformers models built from their configs; GPT-2's dropout and the CNN's BatchNorm differ between
    # train and eval mode, and Llama's forward fills a key/value cache in eval mode (use_cache)
    "gpt2": (models.gpt2, ["int64[4,64]<500"], lambda: models.token_inputs(4, 64, 500, labels=False)),
    "llama": (models.llama, ["int64[4,64]<500"], lambda: models.token_inputs(4, 64, 500, labels=False)),
    "bert": (models.bert, ["int64[4,64]<500"], lambda: models.token_inputs(4, 64, 500, labels=False)),
    "flat-cnn": (models.flat_cnn, ["float32[8,3,32,32]"], lambda: models.image_inputs(8, 32)),
    "residual-stack": (lambda: models.residual_stack(blocks=4, width=64, hidden=256), ["float32[32,64]"],
                       lambda: ((torch.randn(32, 64),), {})),
    # under inference_mode the CPU's RNNs reach the trace whole (aten.lstm.input, aten.gru.input): oneDNN's
    # LSTM allocates scratch inside (the real peak was 1.21x the layers' outputs alone), the GRU its gates
    "lstm-lm": (models.lstm_lm, ["int64[4,64]<500"], lambda: models.token_inputs(4, 64, 500, labels=False)),
    "bidirectional-gru": (lambda: nn.GRU(32, 64, num_layers=2, batch_first=True, bidirectional=True),
                          ["float32[4,64,32]"], lambda: ((torch.randn(4, 64, 32),), {})),
    # read 1.37x before the eval dropout was taken as its input (IBert, Mpt, RoFormer and others read 1.12-1.44x)
    "eager-attention": (EagerAttention, ["float32[4,128,32]"], lambda: ((torch.randn(4, 128, 32),), {})),
}


@pytest.mark.parametrize("case", list(CASES))
def test_inference_prediction_matches_a_real_forward_under_inference_mode(case: str) -> None:
    build, specs, make_inputs = CASES[case]
    predicted = act.analyze(build(), specs, step="inference")
    args, kwargs = make_inputs()
    measured = allocator_inference_peak(build(), args, kwargs)
    assert abs(predicted.summary.peak_bytes - measured) <= 0.02 * measured, (predicted.summary.peak_bytes, measured)
    real = act.analyze(build(), list(args), kwargs=kwargs, step="inference", mode="real")
    assert abs(real.summary.peak_bytes - measured) <= 0.02 * measured, (real.summary.peak_bytes, measured)


def test_an_eval_dropout_is_its_input_in_aten_and_a_copy_in_the_decomposition_before_torch_2_14() -> None:
    # what memlayout.activations.trace.kernels.returns_its_input says of torch; under inference_mode the op reaches
    # a dispatch mode whole, so whichever of the two runs decides the storage
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.torch_version import TorchVersion

    x = torch.randn(8, 8)
    with torch.inference_mode():
        assert torch.ops.aten.dropout.default(x, 0.1, False).untyped_storage().data_ptr() == x.data_ptr()
        with FakeTensorMode() as mode:
            fake = mode.from_tensor(x)
            decomposed = torch.ops.aten.dropout.default(fake, 0.1, False)
            copies = decomposed.untyped_storage()._cdata != fake.untyped_storage()._cdata
    # torch 2.14's decomposition returns the input, as ATen does; 2.13's returned input.clone()
    assert copies == (TorchVersion(torch.__version__) < "2.14")


def test_inference_has_no_backward_no_gradients_and_no_optimizer() -> None:
    inference = act.analyze(models.gpt2(), ["int64[4,64]<500"], step="inference")
    training = act.analyze(models.gpt2(), ["int64[4,64]<500"], optimizer="none")
    s = inference.summary
    assert (inference.optimizer, inference.loss, inference.step) == ("none", LOSS_NONE, "inference")
    assert s.gradient_bytes == 0 and s.activation_bytes == 0 and s.optimizer_bytes == 0
    assert s.peak_at.phase == "forward"
    # --optimizer none still runs backward: its peak holds gradients and saved activations
    assert training.summary.gradient_bytes == training.summary.parameter_bytes
    assert training.summary.peak_bytes > s.peak_bytes


class _RecordsItsMode(nn.Module):
    """Records whether autograd and inference mode were on, and whether it was in training mode, in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.seen: list[tuple[bool, bool, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled(), self.training))
        return torch.relu(self.linear(x))


@pytest.mark.parametrize("mode", ["fake", "meta", "real"])
def test_the_forward_runs_under_inference_mode_in_eval_mode(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[bool, bool, bool]] = []
    original = _RecordsItsMode.forward

    def forward(self: _RecordsItsMode, x: torch.Tensor) -> torch.Tensor:
        out = original(self, x)
        seen.extend(self.seen[-1:])
        return out

    monkeypatch.setattr(_RecordsItsMode, "forward", forward)
    act.analyze(_RecordsItsMode(), ["float32[4,8]"], step="inference", mode=mode,
                device="meta" if mode == "meta" else "cpu")
    assert seen and all(s == (True, False, False) for s in seen), seen


def test_cli_reports_an_inference_step_in_json() -> None:
    result = CliRunner().invoke(app, [*GPT2, "--step", "inference", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    jsonschema.validate(report, SCHEMA)
    assert report["step"] == "inference" and report["optimizer"] == "none" and report["plan"] is None
    assert report["summary"]["gradient_bytes"] == 0


def test_cli_table_says_the_step_is_forward_only() -> None:
    result = CliRunner().invoke(app, [*GPT2, "--step", "inference"])
    assert result.exit_code == 0, result.stderr
    assert "step: inference" in result.stdout and "forward only" in result.stdout


@pytest.mark.parametrize(("extra", "message"), [
    (["--budget", "8MiB"], "--budget plans checkpoints for backward"),
    (["--optimizer", "adamw"], "--optimizer adamw does not apply to --step inference"),
    (["--world-size", "2", "--fsdp"], "--step inference with --world-size is traced as tensor-parallel serving, and "
                                      "--fsdp shards a training step"),
    (["--world-size", "2"], "--step inference with --world-size 2 needs --tp 2: the ranks are one tensor-parallel"),
    (["--world-size", "2", "--tp", "2", "--fit", "batch", "--budget", "2MB"],
     "--fit with --step inference is not searched across ranks yet"),
    (["--step", "eval"], "unknown --step 'eval'"),
])
def test_cli_refuses_what_a_forward_only_step_does_not_have(extra: list[str], message: str) -> None:
    args = [*GPT2, "--step", "inference", *extra] if extra[0] != "--step" else [*GPT2, *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_docs_give_the_inference_sweeps_figures() -> None:
    root = Path(__file__).resolve().parents[3]
    sweep = json.loads((root / "benchmarks" / "results" / "inference_sweep.json").read_text())
    docs = " ".join((root / "docs" / "activations-reference.md").read_text().split())
    assert f"{sweep['within_2pct']} of {sweep['runnable']} within 2%" in docs, "rerun the sweep or mend the docs"
    assert sweep["command"] in docs
