"""`activations --weights` against `accelerate estimate-memory`'s own code on the same config.

accelerate's `gather_data` runs as its command runs it (AutoModel under
init_empty_weights, `calculate_maximum_sizes`, `estimate_training_usage`); only its
Hub lookup (`verify_on_hub`, a network call) is answered with the local config. Where
the two agree they agree to the byte; where they differ, each difference is the one
docs/activations-weights.md explains, by the formula it gives.
"""

from __future__ import annotations

import argparse
import json
import types
from pathlib import Path
from typing import Any

import pytest

from memlayout.activations.weights import WeightsReport, weights_report
from tests.activations import models

estimate = pytest.importorskip("accelerate.commands.estimate")
torch = pytest.importorskip("torch")

ACCELERATE_DTYPES = ("float32", "float16", "int8", "int4")
OURS = {"float32": "float32", "float16": "bfloat16", "int8": "int8", "int4": "int4"}
ROOT = Path(__file__).resolve().parents[2]


def accelerate_rows(folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[int, int | None]]:
    """dtype -> (Total Size, Training using Adam or None for N/A), as `accelerate estimate-memory` prints them."""
    config = json.loads((folder / "config.json").read_text())
    monkeypatch.setattr(estimate, "verify_on_hub",
                        lambda repo, token=None: types.SimpleNamespace(config=config, library_name="transformers"))
    args = argparse.Namespace(model_name=str(folder), library_name="transformers", dtypes=list(ACCELERATE_DTYPES),
                              trust_remote_code=False)
    rows = {}
    for dtype, _largest, total, training in estimate.gather_data(args):
        most = max(training.values())  # estimate_command prints the largest of its figures, "N/A" for -1
        rows[dtype] = (int(total), None if most == -1 else int(most))
    return rows


def _row(report: WeightsReport, dtype: str) -> Any:
    return next(row for row in report.rows if row.dtype == dtype)


def _buffer_bytes(report: WeightsReport, floating: bool) -> tuple[int, int]:
    """(float32 bytes, elements) of the buffers of one kind, read off the report's dtype rows."""
    float32, half = _row(report, "float32").buffer_bytes, _row(report, "bfloat16").buffer_bytes
    floating_bytes = 2 * (float32 - half)  # only floating buffers shrink from float32 to 16 bits
    return (floating_bytes, floating_bytes // 4) if floating else (float32 - floating_bytes, 0)


def _tied_copies_bytes(folder: Path) -> int:
    """Bytes of every name but the first of each tied Parameter, in the base model (AutoModel) built for real."""
    import transformers

    model = transformers.AutoModel.from_config(transformers.AutoConfig.from_pretrained(folder))
    names: dict[int, tuple[int, int]] = {}
    for _, parameter in model.named_parameters(remove_duplicate=False):
        count, nbytes = names.get(id(parameter), (0, parameter.nbytes))
        names[id(parameter)] = (count + 1, nbytes)
    return sum((count - 1) * nbytes for count, nbytes in names.values())


@pytest.mark.parametrize("name", ["llama-tiny", "bert", "t5"])
def test_accelerates_figures_and_how_each_differs(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if name == "bert":  # int64 buffers (position_ids, token_type_ids) beside float32 weights
        models.bert().config.save_pretrained(tmp_path)
        folder = tmp_path
    elif name == "t5":  # the input embedding tied to the encoder's and the decoder's
        import transformers

        transformers.T5Config(vocab_size=500, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                              decoder_start_token_id=0).save_pretrained(tmp_path)
        folder = tmp_path
    else:
        folder = ROOT / "benchmarks" / "configs" / name
    theirs = accelerate_rows(folder, monkeypatch)
    ours = weights_report(str(folder))
    base = weights_report(str(folder), model_class="AutoModel")  # the class accelerate builds

    # 1. accelerate builds AutoModel, the model without its head, under its init_empty_weights, where
    # transformers (5.24) leaves ties undone: each name of a tied weight counts (T5's `shared` three times).
    # On the same class and with the ties counted once, float32 agrees to the byte.
    tied = _tied_copies_bytes(folder)
    assert (tied > 0) == (name == "t5")
    assert theirs["float32"][0] == _row(base, "float32").weights_bytes + tied
    head = _row(ours, "float32").weights_bytes - _row(base, "float32").weights_bytes
    assert head > 0 or name == "t5"  # the LM head (untied in the Llama; BERT's MLM head in place of its pooler)

    # 2. accelerate divides every byte, integer buffers too, by 2, 4 and 8; memlayout converts floating tensors.
    integer_buffers, _ = _buffer_bytes(base, floating=False)
    floating_buffers, _ = _buffer_bytes(base, floating=True)
    parameters = _row(base, "float32").parameter_bytes
    assert {"bert": integer_buffers, "llama-tiny": floating_buffers, "t5": tied}[name] > 0  # the case is there
    everything = parameters + floating_buffers + integer_buffers + tied
    assert [theirs[dtype][0] for dtype in ("float16", "int8", "int4")] == [everything // 2, everything // 4,
                                                                              everything // 8]
    assert _row(base, "bfloat16").weights_bytes == parameters // 2 + floating_buffers // 2 + integer_buffers
    assert _row(base, "int8").weights_bytes == parameters // 4 + floating_buffers // 2 + integer_buffers
    assert _row(base, "int4").parameter_bytes >= parameters // 8  # each tensor rounded up to a whole byte
    assert (theirs["int8"][1], theirs["int4"][1]) == (None, None)
    assert (_row(base, "int8").training, _row(base, "int4").training) == (None, None)

    # 3. Training in float32: accelerate's 4x the total counts every buffer four times and no step counters;
    # torch's AdamW keeps a float32 step counter per parameter, and buffers get no gradient and no state.
    training = _row(base, "float32").training
    assert training is not None
    tensors = base.parameter_tensors
    assert theirs["float32"][1] == 4 * everything
    assert training.total_bytes == (theirs["float32"][1] - 4 * tied - 3 * (integer_buffers + floating_buffers)
                                    + 4 * tensors)

    # 4. Training in float16: accelerate prints the largest of its mixed-precision figures, the optimizer's state
    # (2x the float32 weights), where the sum of what it lists (weights, 1.5x gradients, state) is 4.5x; mixed
    # precision as torch.autocast runs it keeps float32 weights, gradients and state: memlayout's float32 row.
    float32_total = theirs["float32"][0]
    assert theirs["float16"][1] == 2 * float32_total
    half = _row(base, "bfloat16").training
    assert half is not None
    assert half.optimizer_bytes == parameters + 4 * tensors  # pure bf16: two 16-bit moments and a step counter
