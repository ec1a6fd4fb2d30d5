"""What `memlayout diff` reports, case by case, on objects and files written by torch and safetensors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from memlayout.diff import DiffOptions, NameMap, run_diff
from memlayout.diff.changes import ChangeKind, DiffReport
from memlayout.errors import UsageError
from memlayout.rules import RuleConfig, Severity
from tests import models


def kinds(diff: DiffReport) -> dict[ChangeKind, list[tuple[str, ...]]]:
    found: dict[ChangeKind, list[tuple[str, ...]]] = {}
    for change in diff.changes:
        found.setdefault(change.kind, []).append(change.tensors)
    return found


def test_identical_checkpoints_have_no_changes(tmp_path: Path) -> None:
    state = {"w": torch.randn(8, 8), "b": torch.randn(8)}
    torch.save(state, tmp_path / "a.pt")
    save_file(state, str(tmp_path / "b.safetensors"))
    diff = run_diff(str(tmp_path / "a.pt"), str(tmp_path / "b.safetensors"))
    assert diff.changes == () and diff.matched == 2 and not diff.fails("info")


def test_added_and_removed_tensors() -> None:
    diff = run_diff({"w": torch.zeros(4), "old": torch.zeros(2)}, {"w": torch.zeros(4), "new": torch.zeros(3)})
    found = kinds(diff)
    assert found[ChangeKind.REMOVED] == [("old",)] and found[ChangeKind.ADDED] == [("new",)]
    severities = {c.kind: c.severity for c in diff.changes}
    assert severities[ChangeKind.REMOVED] is Severity.WARNING and severities[ChangeKind.ADDED] is Severity.INFO


def test_dtype_shape_stride_and_contiguity_changes() -> None:
    w = torch.randn(4, 6)
    image = torch.randn(2, 3, 4, 4)
    a = {"cast": torch.randn(3), "grown": torch.zeros(5), "t": w.t().contiguous().t(), "packed": w.clone(),
         "cl": image.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2)}  # non-contiguous, not channels_last
    b = {"cast": a["cast"].half(), "grown": torch.zeros(7), "t": a["t"].contiguous(), "packed": w.t().contiguous().t(),
         "cl": image.contiguous(memory_format=torch.channels_last)}
    diff = run_diff(a, b)
    by_kind = {c.kind: c for c in diff.changes if c.tensors}
    assert (by_kind[ChangeKind.DTYPE].before, by_kind[ChangeKind.DTYPE].after) == ("float32", "float16")
    assert (by_kind[ChangeKind.SHAPE].before, by_kind[ChangeKind.SHAPE].after) == ("[5]", "[7]")
    contiguity = {c.tensors: c for c in diff.changes if c.kind is ChangeKind.CONTIGUITY}
    assert contiguity[("t",)].severity is Severity.INFO and "became contiguous" in contiguity[("t",)].message
    assert (contiguity[("packed",)].severity is Severity.WARNING
            and "no longer contiguous" in contiguity[("packed",)].message)
    (stride,) = [c for c in diff.changes if c.kind is ChangeKind.STRIDE]
    assert stride.tensors == ("cl",) and "channels_last" in stride.message


def test_a_tensor_moved_to_meta_lost_its_data() -> None:
    diff = run_diff({"w": torch.zeros(4)}, {"w": torch.zeros(4, device="meta")})
    (change,) = [c for c in diff.changes if c.kind is ChangeKind.DATA_LOST]
    assert change.severity is Severity.ERROR and change.after == "meta"


def test_tie_lost_by_cloning_is_an_error_and_a_tie_gained_is_info() -> None:
    tied, untied = models.TiedEmbeddingLM(), models.LostTieLM()
    lost = run_diff(tied, untied)
    (change,) = [c for c in lost.changes if c.kind is ChangeKind.TIE_LOST]
    assert change.severity is Severity.ERROR and set(change.tensors) == {"embed.weight", "head.weight"}
    assert lost.fails("error")
    gained = run_diff(untied, tied)
    assert ChangeKind.TIE_LOST not in kinds(gained)
    assert [c.severity for c in gained.changes if c.kind is ChangeKind.SHARING_GAINED] == [Severity.INFO]


def test_a_transposed_tie_counts_as_a_tie() -> None:
    kept = models.TransposedTieAutoencoder()
    copied = {"encoder.weight": kept.encoder.weight.detach(), "decoder_weight": kept.decoder_weight.clone()}
    diff = run_diff(kept, copied)
    assert kinds(diff)[ChangeKind.TIE_LOST] == [("decoder_weight", "encoder.weight")]


def test_sharing_lost_when_a_flat_buffer_is_split() -> None:
    flat = torch.randn(10)
    diff = run_diff({"flat": flat, "w": flat[:4]}, {"flat": flat.clone(), "w": flat[:4].clone()})
    (lost,) = [c for c in diff.changes if c.kind is ChangeKind.SHARING_LOST]
    assert lost.severity is Severity.INFO and set(lost.tensors) == {"flat", "w"}


def test_a_declared_tie_b_does_not_keep_is_an_error(tmp_path: Path) -> None:
    # B is a model directory whose config ties the head to the embedding, but stores two copies.
    embed = torch.randn(64, 32)
    directory = tmp_path / "b"
    directory.mkdir()
    save_file({"model.embed_tokens.weight": embed, "lm_head.weight": embed.clone()},
              str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    diff = run_diff({"model.embed_tokens.weight": embed, "lm_head.weight": embed.clone()}, str(directory))
    (broken,) = [c for c in diff.changes if c.kind is ChangeKind.DECLARED_TIE_BROKEN]
    assert broken.severity is Severity.ERROR
    assert "B's config.json tie_word_embeddings" in broken.message and "A did not keep it either" in broken.message


def test_a_tie_declared_with_tie_option_is_checked_in_b() -> None:
    a = {"x": torch.randn(64), "y": torch.randn(64)}
    diff = run_diff(a, dict(a), DiffOptions(rules=RuleConfig(ties=(("y", "x"),))))
    assert kinds(diff)[ChangeKind.DECLARED_TIE_BROKEN] == [("y", "x")]


def test_strip_prefix_and_map_match_renamed_sections() -> None:
    a = {"module._orig_mod.fc.weight": torch.zeros(2), "module._orig_mod.head.bias": torch.zeros(3)}
    b = {"fc.weight": torch.zeros(2), "out.bias": torch.zeros(3)}
    plain = run_diff(a, b)
    assert len(kinds(plain)[ChangeKind.REMOVED]) == 2
    mapped = run_diff(a, b, DiffOptions(names=NameMap(("module._orig_mod.",), (("head.", "out."),))))
    assert mapped.changes == () and mapped.matched == 2


def test_names_that_collide_after_stripping_are_a_usage_error() -> None:
    with pytest.raises(UsageError, match="both become 'w'"):
        run_diff({"model.w": torch.zeros(1), "w": torch.zeros(1)}, {"w": torch.zeros(1)},
                 DiffOptions(names=NameMap(("model.",))))


def test_deep_finds_changed_values_and_their_largest_difference(tmp_path: Path) -> None:
    w = torch.randn(16, 16)
    changed = w.clone()
    changed[3, 4] += 0.5
    torch.save({"w": w, "same": w.clone()}, tmp_path / "a.pt")
    torch.save({"w": changed, "same": w.clone()}, tmp_path / "b.pt")
    shallow = run_diff(str(tmp_path / "a.pt"), str(tmp_path / "b.pt"))
    assert ChangeKind.VALUES not in kinds(shallow)
    deep = run_diff(str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), DiffOptions(deep=True))
    (values,) = [c for c in deep.changes if c.kind is ChangeKind.VALUES]
    assert values.tensors == ("w",) and "1 of 256 values changed" in values.message
    assert f"{0.5:.6g}"[:3] in values.message


def test_deep_compares_strided_views_in_logical_order(tmp_path: Path) -> None:
    w = torch.randn(8, 5)
    torch.save({"w": w}, tmp_path / "a.pt")
    torch.save({"w": w.t().contiguous().t()}, tmp_path / "b.pt")  # same values, column-major
    deep = run_diff(str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), DiffOptions(deep=True))
    assert ChangeKind.VALUES not in kinds(deep) and ChangeKind.CONTIGUITY in kinds(deep)


@pytest.mark.parametrize("target", [torch.bfloat16, torch.float16])
def test_deep_knows_a_faithful_cast_from_a_lossy_one(tmp_path: Path, target: torch.dtype) -> None:
    # Values chosen to exercise rounding: ties to even, subnormals, NaN, Inf, large.
    w = torch.cat([torch.randn(1000), torch.tensor([1.00390625, 1.01171875, float("nan"), float("inf"), 1e-40,
                                                    60000.0])])
    torch.save({"w": w}, tmp_path / "a.pt")
    torch.save({"w": w.to(target)}, tmp_path / "cast.pt")
    lossy = w.to(target)
    lossy[0] = lossy[0] + 1
    torch.save({"w": lossy}, tmp_path / "lossy.pt")
    name = str(target).removeprefix("torch.")
    faithful = run_diff(str(tmp_path / "a.pt"), str(tmp_path / "cast.pt"), DiffOptions(deep=True))
    (dtype,) = [c for c in faithful.changes if c.kind is ChangeKind.DTYPE]
    assert dtype.message.endswith(f"values are A's as {name}")
    broken = run_diff(str(tmp_path / "a.pt"), str(tmp_path / "lossy.pt"), DiffOptions(deep=True))
    (dtype,) = [c for c in broken.changes if c.kind is ChangeKind.DTYPE]
    assert f"1 of 1006 values differ from A's as {name}" in dtype.message
    # And back: widening is exact.
    widened = run_diff(str(tmp_path / "cast.pt"), str(tmp_path / "a.pt"), DiffOptions(deep=True))
    (dtype,) = [c for c in widened.changes if c.kind is ChangeKind.DTYPE]
    assert "values differ" in dtype.message  # A's bf16 values are not the fp32 originals...
    reload = {"w": w.to(target).float()}
    torch.save(reload, tmp_path / "widened.pt")
    exact = run_diff(str(tmp_path / "cast.pt"), str(tmp_path / "widened.pt"), DiffOptions(deep=True))
    (dtype,) = [c for c in exact.changes if c.kind is ChangeKind.DTYPE]
    assert dtype.message.endswith("values are A's as float32")


def test_new_and_resolved_findings() -> None:
    bloated = {"w": torch.randn(4096)[:10]}
    clean = {"w": bloated["w"].clone()}
    forward = run_diff(clean, bloated)
    (new,) = [c for c in forward.changes if c.kind is ChangeKind.FINDING_NEW]
    assert "ML301" in new.message and new.severity is Severity.WARNING
    assert ChangeKind.WASTED_BYTES in kinds(forward)
    backward = run_diff(bloated, clean)
    assert [c.severity for c in backward.changes if c.kind is ChangeKind.FINDING_RESOLVED] == [Severity.INFO]
