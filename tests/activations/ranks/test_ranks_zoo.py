"""--tp on architectures memlayout was not built against: transformers' own models, from tiny configs.

Each either gets a tensor-parallel plan and a prediction, or one clear reason why
not: no projections to split by name, a fused q/k/v, transformers' Conv1D, or a
step that cannot run on a share of the heads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from memlayout.activations.ranks import analyze_ranks
from memlayout.activations.ranks.parallel import ShardingOptions
from memlayout.errors import RankStepError, UsageError

transformers = pytest.importorskip("transformers")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
SMALL: dict[str, Any] = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "vocab_size": 512}


def config(name: str) -> Any:
    t = transformers
    return {
        "llama": lambda: t.LlamaConfig(**SMALL, num_key_value_heads=2),
        "opt": lambda: t.OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                                   vocab_size=512, word_embed_proj_dim=64),
        "phi": lambda: t.PhiConfig(**SMALL),
        "gpt_neox": lambda: t.GPTNeoXConfig(**SMALL),
        "gpt2": lambda: t.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=512),
        "bert": lambda: t.BertConfig(**SMALL),
        "t5": lambda: t.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=512, d_kv=16),
    }[name]()


def predict(name: str, tmp_path: Path) -> Any:
    config(name).save_pretrained(tmp_path)
    inputs = ["input_ids=int64[2,32]<512", "labels=int64[2,32]<512"]
    if name == "t5":
        inputs.append("decoder_input_ids=int64[2,32]<512")
    return analyze_ranks(str(tmp_path), inputs, sharding=ShardingOptions(world_size=2, tp=2))


@pytest.mark.parametrize(("name", "split"), [("llama", 14), ("opt", 12), ("phi", 12)])
def test_attention_and_mlp_projections_are_split(name: str, split: int, tmp_path: Path) -> None:
    report = predict(name, tmp_path)
    assert len(report.sharding.tp_plan) == split  # 2 layers x (q, k, v, o and the MLP's two or three)
    assert report.ranks[0].peak_bytes > 0 and not any("tensor parallel leaves" in note for note in report.notes)


def test_a_fused_qkv_is_left_whole_and_said_so(tmp_path: Path) -> None:
    report = predict("gpt_neox", tmp_path)
    assert {s.module.rsplit(".", 1)[1] for s in report.sharding.tp_plan} == {"dense_h_to_4h", "dense_4h_to_h"}
    assert any("query_key_value computes q, k and v in one projection" in note for note in report.notes)


@pytest.mark.parametrize(("name", "why"), [
    ("gpt2", "c_fc is a Conv1D"),
    ("bert", "key, query, value have no row-wise projection beside it"),
])
def test_a_model_with_nothing_to_split_gets_the_reason(name: str, why: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="`tp` found no attention or MLP projections") as raised:
        predict(name, tmp_path)
    assert why in raised.value.one_line()


def test_a_step_that_cannot_run_on_a_share_of_the_heads_is_one_line(tmp_path: Path) -> None:
    # T5's relative position bias has every head, the split attention half of them.
    with pytest.raises(RankStepError) as raised:
        predict("t5", tmp_path)
    line = raised.value.one_line()
    assert "\n" not in line and line.startswith("the step failed on rank 0 of 2 with the sharding applied")
