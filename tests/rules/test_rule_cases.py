"""Every rule fires on its case and stays quiet on its clean twin."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import memlayout
from memlayout.cli.app import main
from memlayout.rules import RULES, RuleConfig
from tests import models
from tests.pipeline import sharded_builders as sharded

Case = Callable[[], Any]


def codes(target: Any, config: RuleConfig | None = None) -> list[str]:
    return [f.code for f in memlayout.inspect(target, config=config).findings]


def overlapping_dcp_chunks() -> str:
    """A torch.distributed.checkpoint whose "w" is stored as rows 0:3 and 2:4 (ML106)."""
    from tests.load.dcp_writers import save_overlapping_rows

    return str(save_overlapping_rows(Path(tempfile.mkdtemp(prefix="ml106-")) / "ckpt", torch.ones(4, 3),
                                     [(0, 3), (2, 4)]))


def tiled_dcp_chunks() -> str:
    """The same tensor stored as rows 0:2 and 2:4, which tile it."""
    from tests.load.dcp_writers import save_overlapping_rows

    return str(save_overlapping_rows(Path(tempfile.mkdtemp(prefix="ml106-")) / "ckpt", torch.ones(4, 3),
                                     [(0, 2), (2, 4)]))


TIE_HEAD = RuleConfig(ties=(("head.weight", "embed.weight"),))
DEEP = RuleConfig(deep=True)

# (code, case that must trigger it, case that must not, config)
CASES: list[tuple[str, Case, Case, RuleConfig | None]] = [
    ("ML101", models.partial_overlap_state, models.flat_buffer_with_views_state, None),
    ("ML101", models.partial_overlap_state, models.aligned_slices_state, None),
    ("ML102", models.LostTieLM, models.TiedEmbeddingLM, None),
    ("ML102", models.LostTieLM, models.constant_tensors_state, None),
    ("ML102", models.LostTieLM, models.DivergedHeadLM, None),
    ("ML103", models.LostTieLM, models.TiedEmbeddingLM, TIE_HEAD),
    ("ML103", models.DivergedHeadLM, models.TiedEmbeddingLM, TIE_HEAD),
    ("ML104", models.assign_loaded_tied_lm, models.TiedEmbeddingLM, None),
    ("ML105", models.ExpandedBufferModule, models.ContiguousBufferModule, None),
    ("ML106", overlapping_dcp_chunks, tiled_dcp_chunks, None),
    ("ML201", models.TransposedWeightLinear, models.channels_last_convnet, None),
    ("ML201", models.TransposedWeightLinear, models.TransposedTieAutoencoder, None),
    ("ML202", models.mixed_format_convnet, models.channels_last_convnet, None),
    ("ML202", models.mixed_format_convnet, models.pointwise_mixed_convnet, None),
    ("ML203", models.misaligned_state, models.aligned_slices_state, None),
    ("ML204", models.fragmented_mlp, models.hand_flattened_mlp, None),
    ("ML301", models.sliced_bloat_state, models.cloned_slice_state, None),
    ("ML301", models.sliced_bloat_state, models.flat_buffer_with_views_state, None),
    ("ML302", sharded.root_left_out_on_rank_0, sharded.root_wrapped_on_rank_0, None),
    ("ML303", sharded.root_wrapped_on_rank_0, sharded.even_table_on_rank_0, None),
    ("ML401", models.cpu_lstm, models.cudnn_flat_lstm, None),
    ("ML402", models.WeightDropLSTM, models.cpu_lstm, None),
    ("ML501", models.meta_and_cpu_state, models.cpu_state_with_scalar_step, None),
    ("ML502", models.mixed_dtype_mlp, models.bf16_model_with_fp32_optimizer_state, None),
    ("ML503", models.nan_state, models.constant_tensors_state, DEEP),
]


@pytest.mark.parametrize(
    ("code", "triggering", "clean", "config"),
    CASES,
    ids=[f"{code}-{trig.__name__}-vs-{clean.__name__}" for code, trig, clean, _ in CASES],
)
def test_rule_fires_on_its_case_and_not_on_the_clean_twin(
    code: str, triggering: Case, clean: Case, config: RuleConfig | None, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # what a case writes goes with the test's folder
    assert code in codes(triggering(), config)
    assert code not in codes(clean(), config)


def test_every_rule_of_this_issue_has_a_case() -> None:
    covered = {code for code, *_ in CASES}
    implemented_here = {code for code in RULES if code not in ("ML601", "ML602", "ML603", "ML604")}
    assert implemented_here <= covered


def test_non_finite_runs_only_with_deep() -> None:
    assert "ML503" not in codes(models.nan_state())
    findings = memlayout.inspect(models.nan_state(), config=DEEP).findings
    flagged = {name for f in findings if f.code == "ML503" for name in f.tensors}
    assert flagged == {"w", "h"}


def test_non_finite_counts_each_bad_element() -> None:
    state = models.nan_state()
    state["w"][10] = float("-inf")
    (finding,) = [f for f in memlayout.inspect(state, config=DEEP).findings if "w" in f.tensors]
    assert "has 2 NaN/Inf values of 64" in finding.message


def test_duplicate_finding_names_both_tensors_and_the_wasted_bytes() -> None:
    (finding,) = [f for f in memlayout.inspect(models.LostTieLM()).findings if f.code == "ML102"]
    assert set(finding.tensors) == {"embed.weight", "head.weight"}
    assert finding.wasted_bytes == models.VOCAB * models.WIDTH * 4


def test_duplicates_below_the_size_threshold_are_ignored() -> None:
    model = models.LostTieLM()
    size = model.embed.weight.numel() * 4
    assert "ML102" in codes(model, RuleConfig(min_duplicate_bytes=size))
    assert "ML102" not in codes(model, RuleConfig(min_duplicate_bytes=size + 1))


def test_duplicates_found_across_checkpoint_sections() -> None:
    weights = models.torch.randn(64, 64)
    checkpoint = {"model": {"w": weights}, "ema": {"w": weights.clone()}}
    (finding,) = [f for f in memlayout.inspect(checkpoint).findings if f.code == "ML102"]
    assert set(finding.tensors) == {"model.w", "ema.w"}


def test_broken_tie_says_whether_contents_differ() -> None:
    lost = [f for f in memlayout.inspect(models.LostTieLM(), config=TIE_HEAD).findings if f.code == "ML103"]
    diverged = [f for f in memlayout.inspect(models.DivergedHeadLM(), config=TIE_HEAD).findings if f.code == "ML103"]
    assert "contents match" in lost[0].message
    assert "contents differ" in diverged[0].message


def test_partial_overlap_names_the_pair_and_storage() -> None:
    (finding,) = [f for f in memlayout.inspect(models.partial_overlap_state()).findings if f.code == "ML101"]
    assert set(finding.tensors) == {"first", "second"}
    assert finding.storage == "s0"


def test_bloat_reports_the_unused_bytes() -> None:
    (finding,) = [f for f in memlayout.inspect(models.sliced_bloat_state()).findings if f.code == "ML301"]
    assert finding.wasted_bytes == (10_000 - 10) * 4


def test_fragmented_reports_before_and_after_counts() -> None:
    (finding,) = [f for f in memlayout.inspect(models.fragmented_mlp()).findings if f.code == "ML204"]
    assert "over 6 storages; flatten would use 1" in finding.message


def test_rnn_state_dict_is_recognized_without_the_module() -> None:
    state = models.cpu_lstm().state_dict()
    assert "ML401" in codes(state)
    assert "ML401" not in codes(models.cudnn_flat_lstm().state_dict())


def test_rnn_mid_buffer_is_not_flat_for_cudnn() -> None:
    # cuDNN takes the whole storage of the first weight from offset 0, so a
    # whole-model buffer that puts the LSTM after another tensor still fails.
    lstm = models.cpu_lstm()
    models.pack_like_cudnn(lstm, start=16)
    (finding,) = [f for f in memlayout.inspect(lstm).findings if f.code == "ML401"]
    assert "weight weight_ih_l0 is at element 16; cuDNN expects it at element 0" in finding.message


def test_rnn_packed_in_parameter_name_order_is_not_where_cudnn_expects_it() -> None:
    # One chunk from element 0, but per layer w_ih, w_hh, b_ih, b_hh: cuDNN wants
    # every matrix before any bias, so the first bias is where layer 1's w_ih goes.
    (finding,) = [f for f in memlayout.inspect(models.names_order_lstm()).findings if f.code == "ML401"]
    assert "weight bias_ih_l0 is at element 512; cuDNN expects it at element 1024" in finding.message
    assert "(3 more weights out of place)" in finding.message  # b_hh_l0, w_ih_l1, w_hh_l1


def test_weight_drop_state_dict_shows_the_raw_pattern() -> None:
    state = models.WeightDropLSTM().state_dict()
    assert "ML402" in codes(state)


def test_non_contiguous_offers_flatten_only_where_flatten_makes_the_tensor_dense(tmp_path: Path) -> None:
    # Issue 26: a strided view sharing bytes with another stays strided in flatten's
    # output (its region is copied as it is), so a hint that offers flatten there
    # would be offered again on flatten's own output.
    base = torch.arange(64, dtype=torch.float32)
    source, out = tmp_path / "views.pt", tmp_path / "flat.pt"
    torch.save({"lone": torch.randn(4, 8).t(), "b": base[8:40].view(4, 8).t(), "c": base}, source)
    hints = {f.tensors[0]: f.hint for f in memlayout.inspect(str(source)).findings if f.code == "ML201"}
    assert "memlayout flatten" in hints["lone"] and "memlayout flatten" not in hints["b"]
    assert main(["flatten", str(source), "-o", str(out)]) == 0
    (after,) = [f for f in memlayout.inspect(str(out)).findings if f.code == "ML201"]
    assert after.tensors == ("b",) and after.hint == hints["b"]


def test_a_transposed_view_keeps_a_declared_tie() -> None:
    tie = RuleConfig(ties=(("decoder_weight", "encoder.weight"),))
    assert "ML103" not in codes(models.TransposedTieAutoencoder(), tie)
    untied = models.TransposedTieAutoencoder()
    untied.decoder_weight = untied.decoder_weight.clone()
    assert "ML103" in codes(untied, tie)


def test_rnn_first_in_a_longer_buffer_is_what_cudnn_accepts() -> None:
    # try_get_weight_buf cuts a longer storage to cuDNN's length: a whole-model buffer
    # that starts with the RNN in cuDNN's layout needs no copy.
    lstm = models.cpu_lstm()
    models.pack_like_cudnn(lstm)
    first = lstm.weight_ih_l0
    longer = torch.zeros(first.untyped_storage().nbytes() // 4 + 100)
    longer[: longer.numel() - 100].copy_(torch.empty(0).set_(first.untyped_storage()))
    for name in lstm._flat_weights_names:
        weight = getattr(lstm, name)
        weight.data = longer[weight.storage_offset() : weight.storage_offset() + weight.numel()].view_as(weight)
    assert "ML401" not in codes(lstm)


def test_rnn_without_bias_needs_cudnns_bias_space() -> None:
    # cuDNN's weight space keeps two bias vectors per layer even for bias=False;
    # one chunk of just the matrices is too short, and cuDNN copies.
    lstm = torch.nn.LSTM(8, 8, bias=False)
    models.pack_into_one_buffer([lstm.weight_ih_l0, lstm.weight_hh_l0])
    (finding,) = [f for f in memlayout.inspect(lstm).findings if f.code == "ML401"]
    assert "holds 512 elements, but cuDNN's buffer for this LSTM is 576 (bias space included)" in finding.message
    models.pack_like_cudnn(lstm)
    assert "ML401" not in codes(lstm)
