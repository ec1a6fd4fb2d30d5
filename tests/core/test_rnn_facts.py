"""RNNs recognized from a state dict's names and shapes, checked against the torch modules that made them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from memlayout.core.fact_builder import build_facts  # noqa: E402
from memlayout.core.rnn_facts import infer_rnn_modules  # noqa: E402
from memlayout.load.live import load_live  # noqa: E402

RNNS = {
    "lstm": lambda: torch.nn.LSTM(6, 8, num_layers=2),
    "lstm-bidirectional": lambda: torch.nn.LSTM(6, 8, num_layers=2, bidirectional=True),
    "lstm-proj": lambda: torch.nn.LSTM(6, 8, num_layers=2, proj_size=3),
    "lstm-proj-bidirectional": lambda: torch.nn.LSTM(6, 8, num_layers=2, proj_size=3, bidirectional=True),
    "lstm-no-bias": lambda: torch.nn.LSTM(6, 8, bias=False),
    "gru": lambda: torch.nn.GRU(6, 8, num_layers=3),
    "gru-bidirectional": lambda: torch.nn.GRU(6, 8, num_layers=2, bidirectional=True),
    "elman": lambda: torch.nn.RNN(6, 8, num_layers=2, nonlinearity="relu"),
}


@pytest.mark.parametrize("case", sorted(RNNS))
def test_an_rnns_state_dict_is_recognized_in_torchs_flat_weight_order(case: str) -> None:
    rnn = RNNS[case]()
    state = {f"encoder.rnn.{name}": tensor for name, tensor in rnn.state_dict().items()}
    state["encoder.norm.weight"] = torch.ones(8)
    facts = build_facts(load_live(state))
    (module,) = facts.modules
    assert module.path == "encoder.rnn"
    assert module.rnn is not None
    # An Elman RNN's tanh or relu cannot be told from its weights.
    assert module.rnn.mode == ("RNN" if rnn.mode.startswith("RNN_") else rnn.mode)
    assert module.rnn.flat_weight_names == tuple(f"encoder.rnn.{name}" for name in rnn._flat_weights_names)
    assert module.rnn.unregistered == ()


def test_names_whose_shapes_form_no_rnn_are_not_taken_for_one() -> None:
    lstm = torch.nn.LSTM(6, 8)
    state = dict(lstm.state_dict())
    state["weight_hh_l0"] = torch.zeros(4 * 8, 5)  # hidden size 8 by weight_ih, 5 here
    facts = build_facts(load_live(state))
    assert facts.modules == ()
    assert infer_rnn_modules({name: facts.tensor(name) for name in state}) == []


def test_a_weight_dropout_raw_copy_stands_for_the_missing_weight() -> None:
    """fastai's WeightDropout: the wrapper holds `weight_hh_l0_raw`; the module's own weight is not registered."""
    lstm = torch.nn.LSTM(6, 8)
    state = {f"rnn.module.{name}": tensor for name, tensor in lstm.state_dict().items() if name != "weight_hh_l0"}
    state["rnn.weight_hh_l0_raw"] = lstm.weight_hh_l0.detach().clone()
    facts = build_facts(load_live(state))
    (module,) = facts.modules
    assert module.rnn is not None
    assert module.rnn.flat_weight_names == tuple(f"rnn.module.{name}" for name in lstm._flat_weights_names)
    assert module.rnn.unregistered == ("rnn.module.weight_hh_l0",)
