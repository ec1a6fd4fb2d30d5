"""Flattening files: streamed torch.save rewrites, verified atomic saves, safetensors, load_flat."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings

import memlayout
from memlayout.core.fact_builder import build_facts
from memlayout.errors import FlattenError, UnsafeContentError, UsageError
from memlayout.flatten.files import FlattenOptions, flatten_path
from memlayout.flatten.live import live_facts
from memlayout.load.torch_zip import load_torch_zip
from tests.flatten.conftest import assert_flat_invariants, sharing, snapshot
from tests.flatten.models import LstmLM, TransposedTie
from tests.flatten.strategies import build_checkpoint, layout_steps

ROUND_TRIP = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                             HealthCheck.function_scoped_fixture])


def _flatten(src: Path, out: Path, **options: Any) -> Any:
    return flatten_path(str(src), FlattenOptions(out=str(out), device="cpu", **options))


@ROUND_TRIP
@given(layout_steps())
def test_generated_checkpoints_survive_flatten_to_file_and_back(tmp_path: Path, steps: list[tuple[str, int]]) -> None:
    checkpoint = build_checkpoint(steps)
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(checkpoint, src)
    original = torch.load(src, weights_only=True)
    before, values = live_facts(original), snapshot(original)
    result = _flatten(src, out)
    loaded = torch.load(out, weights_only=True)
    assert_flat_invariants(before, values, loaded)
    assert result.storages_after <= result.storages_before or result.storages_before == 0
    check = flatten_path(str(out), FlattenOptions(out=None, check=True))
    assert check.already_flat, check.changes


def test_state_dict_file_loses_its_bloat_and_keeps_ties(tmp_path: Path) -> None:
    model = LstmLM()
    state = model.state_dict()
    state["slice"] = torch.randn(100_000)[5:15]
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(state, src)
    result = _flatten(src, out)
    assert os.path.getsize(out) < os.path.getsize(src) / 4
    assert result.bytes_after < result.bytes_before
    loaded = torch.load(out, weights_only=True)
    assert loaded["head.weight"].data_ptr() == loaded["embed.weight"].data_ptr()
    for name, value in state.items():
        assert torch.equal(loaded[name], value), name
    codes = {f.code for f in memlayout.inspect(str(out)).findings}
    assert not codes & {"ML201", "ML203", "ML204", "ML301", "ML401"}


def test_in_is_never_modified(tmp_path: Path) -> None:
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(TransposedTie().state_dict(), src)
    before = src.read_bytes()
    _flatten(src, out)
    assert src.read_bytes() == before


def test_in_place_rewrites_in(tmp_path: Path) -> None:
    src = tmp_path / "in.pt"
    state = LstmLM().state_dict()
    torch.save(state, src)
    flatten_path(str(src), FlattenOptions(out=None, in_place=True, device="cpu"))
    assert flatten_path(str(src), FlattenOptions(out=None, check=True)).already_flat
    assert [p.name for p in tmp_path.iterdir()] == ["in.pt"]


def test_output_equal_to_input_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "in.pt"
    torch.save(LstmLM().state_dict(), src)
    with pytest.raises(UsageError, match="is IN itself"):
        _flatten(src, src)


def test_module_pickle_needs_trust(tmp_path: Path) -> None:
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(LstmLM(), src)
    with pytest.raises(UnsafeContentError, match=r"flatten needs --trust: its pickle names "
                                                 r"tests\.flatten\.models\.LstmLM"):
        _flatten(src, out)
    assert not out.exists()


def test_module_pickle_with_trust_round_trips_a_working_model(tmp_path: Path) -> None:
    model = LstmLM().eval()
    tokens = torch.randint(0, 50, (2, 5))
    expected = model(tokens)
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(model, src)
    _flatten(src, out, trust=True)
    loaded = torch.load(out, weights_only=False)
    assert loaded.head.weight is loaded.embed.weight
    assert torch.equal(loaded(tokens), expected)
    codes = {f.code for f in memlayout.inspect(loaded).findings}
    assert not codes & {"ML201", "ML203", "ML204", "ML301", "ML401"}


def test_failed_verification_leaves_no_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An import spec's model is saved by torch.save and compared with its buffers.
    out = tmp_path / "out.pt"
    out.write_bytes(b"old")

    def broken_compare(*_: Any) -> bool:
        return False

    # By module object: the dotted path is shadowed by the `memlayout.flatten` function.
    from memlayout.flatten import save

    monkeypatch.setattr(save, "compare_bytes", broken_compare)
    with pytest.raises(FlattenError, match="differ on disk"):
        flatten_path("tests.flatten.models:LstmLM", FlattenOptions(out=str(out), device="cpu"))
    assert out.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.pt"]


def test_written_file_matches_plan_layout(tmp_path: Path) -> None:
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save({"model": TransposedTie().state_dict(), "step": torch.tensor(3)}, src)
    _flatten(src, out, align=256)
    source = load_torch_zip(str(out))
    facts = build_facts(source)
    source.close()
    for tensor in facts.tensors:
        if tensor.name in ("model.encoder.bias", "step"):
            assert (tensor.offset * tensor.itemsize) % 256 == 0


def test_import_spec_is_saved_as_a_flat_state_dict(tmp_path: Path) -> None:
    out = tmp_path / "out.pt"
    result = flatten_path("tests.flatten.models:LstmLM", FlattenOptions(out=str(out), device="cpu"))
    assert "state dict" in result.format
    loaded = torch.load(out, weights_only=True)
    assert loaded["head.weight"].data_ptr() == loaded["embed.weight"].data_ptr()


def test_load_flat_keeps_layout_where_load_state_dict_loses_it(tmp_path: Path) -> None:
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    trained = LstmLM()
    torch.save(trained.state_dict(), src)
    _flatten(src, out)
    plain = LstmLM()
    plain.load_state_dict(torch.load(out, weights_only=True))
    assert len(live_facts(plain).storages) > 4
    fresh = LstmLM()
    handle = memlayout.load_flat(fresh, str(out))
    assert not handle.changed
    assert len(live_facts(fresh).storages) == len(handle.groups)
    assert fresh.head.weight is fresh.embed.weight
    tokens = torch.randint(0, 50, (1, 6))
    assert torch.equal(fresh(tokens), trained(tokens))


def test_safetensors_rewrite_and_load_flat_map_one_buffer(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = {k: v.clone() for k, v in TransposedTie().state_dict().items()}
    state["decoder.weight"] = state["decoder.weight"].contiguous()
    src, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file(state, str(src), metadata={"format": "pt"})
    _flatten(src, out)
    again = load_file(str(out))
    assert all(torch.equal(again[k], v) for k, v in state.items())
    assert flatten_path(str(out), FlattenOptions(out=None, check=True)).already_flat
    from memlayout.flatten.load_flat import load_flat_safetensors

    mapped = load_flat_safetensors(str(out))
    assert len({t.untyped_storage().data_ptr() for t in mapped.values()}) == 1


def test_safetensors_writer_records_ties_as_aliases(tmp_path: Path) -> None:
    from safetensors import safe_open

    from memlayout.flatten.live import flatten_object
    from memlayout.flatten.load_flat import load_flat_safetensors
    from memlayout.flatten.writers.safetensors import write_flat_safetensors

    model = TransposedTie()
    model.tied = model.encoder  # the same Linear under a second name
    handle = flatten_object(model)
    path = tmp_path / "flat.safetensors"
    buffers = [torch.empty(0, dtype=torch.uint8).set_(g.data.untyped_storage()) for g in handle.groups]
    write_flat_safetensors(str(path), handle.plan, buffers, {"format": "pt"})
    with safe_open(str(path), "pt") as stored:
        keys = set(stored.keys())
    assert "tied.weight" not in keys and "decoder.weight" not in keys
    loaded = load_flat_safetensors(str(path))
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded[name], tensor), name
    assert loaded["decoder.weight"].stride() == (1, 6)
    assert sharing(live_facts(loaded)) == sharing(live_facts(model.state_dict()))
