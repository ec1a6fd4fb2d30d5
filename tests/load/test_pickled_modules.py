"""Pickled nn.Modules inspect without --trust, and their classes are never imported."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from memlayout.load import load_path
from memlayout.load.records import TensorKind
from memlayout.pipeline.inspection import run_inspection
from tests.load.models import AssignedTwins, TiedScriptable, TinyLSTM

PHANTOM = "memlayout_phantom_pkg.models"


@pytest.fixture
def phantom_checkpoint(tmp_path: Path) -> Iterator[Path]:
    """A module whose class lives in a package that exists only while saving."""
    package = types.ModuleType(PHANTOM)

    class PhantomNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(4, 4)
            self.rnn = nn.GRU(4, 4)

    PhantomNet.__module__ = PHANTOM
    PhantomNet.__qualname__ = "PhantomNet"
    package.PhantomNet = PhantomNet  # type: ignore[attr-defined]
    root = PHANTOM.split(".")[0]
    sys.modules[root] = types.ModuleType(root)
    sys.modules[PHANTOM] = package
    try:
        path = tmp_path / "phantom.pt"
        torch.save(PhantomNet(), path)
    finally:
        del sys.modules[PHANTOM], sys.modules[root]
    yield path
    assert root not in sys.modules


def test_user_class_is_named_not_imported(phantom_checkpoint: Path) -> None:
    report = run_inspection(str(phantom_checkpoint))
    assert PHANTOM.split(".")[0] not in sys.modules
    modules = {m.path: m.class_name for m in report.facts.modules}
    assert modules[""] == f"{PHANTOM}.PhantomNet"
    assert modules["rnn"] == "torch.nn.modules.rnn.GRU"
    (finding,) = [f for f in report.findings if f.code == "ML601"]
    assert f"{PHANTOM}.PhantomNet" in finding.message
    assert "ML401" in {f.code for f in report.findings}


def test_tied_weights_survive_through_memo_identity(tmp_path: Path) -> None:
    path = tmp_path / "tied.pt"
    torch.save(TiedScriptable(), path)
    report = run_inspection(str(path))
    tied = report.facts.tensor("head.weight")
    assert tied is not None and set(tied.names) == {"embed.weight", "head.weight"}
    assert tied.kind is TensorKind.PARAMETER
    codes = {f.code for f in report.findings}
    assert "ML104" not in codes and "ML103" not in codes


def test_assign_style_twin_parameters_are_ml104(tmp_path: Path) -> None:
    path = tmp_path / "twins.pt"
    torch.save(AssignedTwins(), path)
    (finding,) = [f for f in run_inspection(str(path)).findings if f.code == "ML104"]
    assert set(finding.tensors) == {"embed.weight", "head.weight"}


def test_pickled_lstm_gives_its_flat_weight_order(tmp_path: Path) -> None:
    path = tmp_path / "lstm.pt"
    torch.save(TinyLSTM(), path)
    (rnn_module,) = [m for m in load_path(str(path)).modules if m.rnn is not None]
    assert rnn_module.rnn is not None
    assert rnn_module.rnn.flat_weight_names[:4] == (
        "rnn.weight_ih_l0", "rnn.weight_hh_l0", "rnn.bias_ih_l0", "rnn.bias_hh_l0"
    )


@pytest.fixture(scope="module")
def gpt2_config() -> object:
    transformers = pytest.importorskip("transformers")
    return transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=32, n_positions=16, bos_token_id=0,
                                   eos_token_id=0)


def test_pickled_transformers_model_keeps_its_tie(tmp_path: Path, gpt2_config: object) -> None:
    import transformers

    model = transformers.GPT2LMHeadModel(gpt2_config)
    path = tmp_path / "gpt2.pt"
    torch.save(model, path)
    source = load_path(str(path))
    assert ("lm_head.weight", "transformer.wte.weight") in {(t.target, t.source) for t in source.declared_ties}
    assert "ML103" not in {f.code for f in run_inspection(str(path)).findings}


def test_pickled_transformers_model_with_a_lost_tie_is_ml103(tmp_path: Path, gpt2_config: object) -> None:
    import transformers

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(gpt2_config)
    model.lm_head.weight = nn.Parameter(torch.randn_like(model.lm_head.weight))
    path = tmp_path / "gpt2_untied.pt"
    torch.save(model, path)
    (finding,) = [f for f in run_inspection(str(path)).findings if f.code == "ML103"]
    assert set(finding.tensors) == {"lm_head.weight", "transformer.wte.weight"}
    assert "pickled" in finding.message
