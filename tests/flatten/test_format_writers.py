"""flatten for the formats it reaches through torch's own loaders: legacy, tar, TorchScript, torch.export.

Each output is compared with what torch itself loads from IN: the same object
tree (keys, types, non-tensor values), every tensor bitwise, ties kept, and a
working model where the file holds one.
"""

from __future__ import annotations

import collections
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from fixtures.make_format_fixtures import legacy_tar_bytes, tar_module, tar_state_dict
from memlayout.cli.app import main
from memlayout.errors import UnsafeContentError
from memlayout.flatten.apply import as_bits
from memlayout.flatten.writers.legacy import load_legacy_tree
from memlayout.pipeline.inspection import run_inspection
from tests.flatten.models import LstmLM
from tests.flatten.sources import ScriptableLstm, model_state
from tests.load import malicious

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")


def _same_tree(got: Any, want: Any, where: str = "") -> None:
    """Equal object trees: same container types and keys, tensors bitwise and same layout kind."""
    assert type(got) is type(want), where
    if isinstance(want, torch.Tensor):
        assert (got.dtype, got.shape) == (want.dtype, want.shape), where
        assert torch.equal(as_bits(got.contiguous()), as_bits(want.contiguous())), where
        assert isinstance(got, torch.nn.Parameter) == isinstance(want, torch.nn.Parameter), where
    elif isinstance(want, dict):
        assert list(got) == list(want), where
        for key in want:
            _same_tree(got[key], want[key], f"{where}.{key}")
        assert getattr(got, "_metadata", None) == getattr(want, "_metadata", None), where
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for index, (a, b) in enumerate(zip(got, want, strict=True)):
            _same_tree(a, b, f"{where}.{index}")
    else:
        assert got == want, where


def _flatten(source: Path, out: Path, *extra: str) -> int:
    return main(["flatten", str(source), "-o", str(out), "--device", "cpu", *extra])


def _storages(tree: Any) -> int:
    from memlayout.flatten.apply import walk_tensors

    return len({t.untyped_storage().data_ptr() for t in walk_tensors(tree) if t.numel()})


def test_a_legacy_state_dict_becomes_a_current_zip_holding_the_same_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = tmp_path / "old.pt", tmp_path / "new.pt"
    checkpoint = {"model": model_state(), "epoch": 7, "note": "legacy", "sizes": (3, 4)}
    torch.save(checkpoint, source, _use_new_zipfile_serialization=False)
    assert _flatten(source, out) == 0
    summary = capsys.readouterr().out
    assert "becomes a current torch.save zip" in summary and "already flat" not in summary
    import zipfile

    assert zipfile.is_zipfile(out) and not zipfile.is_zipfile(source)
    _same_tree(torch.load(out, weights_only=True, mmap=True), torch.load(source, weights_only=True))
    assert main(["flatten", str(out), "--check"]) == 0
    assert _storages(torch.load(out, weights_only=True)) < _storages(torch.load(source, weights_only=True))
    assert "ML602" not in {f.code for f in run_inspection(str(out)).findings}


def test_a_tar_state_dict_is_flattened_without_trust_as_torch_would_load_it(tmp_path: Path) -> None:
    # torch.load refuses the tar format under weights_only=True; flatten reads it with
    # torch's tar reader and an unpickler that resolves only the weights-only allow-list.
    source, out = tmp_path / "tar.pt", tmp_path / "flat.pt"
    source.write_bytes(legacy_tar_bytes(tar_state_dict()))
    with pytest.raises(RuntimeError, match="tar"):
        torch.load(source, weights_only=True)
    assert _flatten(source, out) == 0
    want = torch.load(source, weights_only=False)
    assert isinstance(want, collections.OrderedDict)
    _same_tree(torch.load(out, weights_only=True), want)


def test_a_tar_or_legacy_module_pickle_needs_trust_and_then_keeps_a_working_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tar_source = tmp_path / "tar_module.pt"
    tar_source.write_bytes(legacy_tar_bytes(tar_module()))
    legacy_source = tmp_path / "legacy_module.pt"
    torch.manual_seed(0)
    torch.save(LstmLM().eval(), legacy_source, _use_new_zipfile_serialization=False)
    for source in (tar_source, legacy_source):
        out = tmp_path / f"flat_{source.name}"
        assert _flatten(source, out) == 2
        assert "--trust" in capsys.readouterr().err
        assert _flatten(source, out, "--trust") == 0
        want = torch.load(source, weights_only=False)
        got = torch.load(out, weights_only=False)
        assert type(got) is type(want)
        _same_tree(dict(got.state_dict(keep_vars=True)), dict(want.state_dict(keep_vars=True)))
    tokens = torch.randint(0, 50, (2, 5))
    model = torch.load(legacy_source, weights_only=False)
    assert torch.equal(torch.load(tmp_path / f"flat_{legacy_source.name}", weights_only=False)(tokens), model(tokens))


def test_the_allow_list_unpickler_runs_nothing_from_a_malicious_tar(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    source = tmp_path / "evil.pt"
    source.write_bytes(malicious.legacy_tar(malicious.PAYLOADS[0].build(str(marker))))
    # Refused up front (the pickle names os.system), and refused again by the unpickler itself.
    assert _flatten(source, tmp_path / "out.pt") == 2
    with pytest.raises(UnsafeContentError, match="outside torch's weights-only allow-list"):
        load_legacy_tree(str(source), tar=True, trust=False)
    assert not marker.exists() and os.environ.get(malicious.ENV_VAR) is None


def test_torchscript_needs_trust_and_round_trips_a_working_flat_module(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = tmp_path / "scripted.pt", tmp_path / "flat.pt"
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(ScriptableLstm()), str(source))
    assert _flatten(source, out) == 2
    assert "torch.jit.load" in capsys.readouterr().err
    assert _flatten(source, out, "--trust") == 0
    want, got = torch.jit.load(str(source)), torch.jit.load(str(out))
    _same_tree(dict(got.named_parameters()) | dict(got.named_buffers()),
               dict(want.named_parameters()) | dict(want.named_buffers()))
    tokens = torch.randint(0, 20, (4, 2))
    assert torch.equal(got(tokens), want(tokens))
    # torch.jit.load gives the parameters back as views of the flat buffers.
    assert len({p.untyped_storage().data_ptr() for p in got.parameters()}) < len(list(want.parameters()))
    assert main(["flatten", str(out), "--check", "--trust"]) == 0


def test_torch_export_needs_trust_and_round_trips_a_working_flat_program(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = tmp_path / "model.pt2", tmp_path / "flat.pt2"
    torch.manual_seed(0)
    tokens = torch.randint(0, 20, (3, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.export.save(torch.export.export(ScriptableLstm().eval(), (tokens,)), source)
    assert _flatten(source, out) == 2
    assert "torch.export.load" in capsys.readouterr().err
    assert _flatten(source, out, "--trust") == 0
    want, got = torch.export.load(source), torch.export.load(out)
    # torch.export.save orders weights by record; the names and values are what count.
    _same_tree(dict(sorted(got.state_dict.items())), dict(sorted(want.state_dict.items())))
    assert torch.equal(got.module()(tokens), want.module()(tokens))
    assert len({t.untyped_storage().data_ptr() for t in got.state_dict.values()}) <= 3
    assert "ML401" not in {f.code for f in run_inspection(str(out)).findings}


def test_torch_export_in_the_older_layout_is_rewritten_in_the_current_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import zipfile

    from torch._export.serde.schema import SCHEMA_VERSION
    from torch._export.serde.serialize import serialize

    from tests.load.test_pt2 import TiedWithConstants

    # The members torch.export.save wrote up to torch 2.7 (see tests/load/test_pt2.py).
    inputs = (torch.tensor([1, 2]),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        artifact = serialize(torch.export.export(TiedWithConstants(), inputs))
    source, out = tmp_path / "older.pt2", tmp_path / "flat.pt2"
    with zipfile.ZipFile(source, "w") as archive:
        archive.writestr("serialized_exported_program.json", artifact.exported_program)
        archive.writestr("serialized_state_dict.pt", artifact.state_dict)
        archive.writestr("serialized_constants.pt", artifact.constants)
        archive.writestr("serialized_example_inputs.pt", artifact.example_inputs)
        archive.writestr("version", ".".join(map(str, SCHEMA_VERSION)))
    # Its findings are info: the check passes and says what flatten would still rewrite.
    assert main(["flatten", str(source), "--check", "--trust"]) == 0
    assert "passes" in (text := capsys.readouterr().out) and "older layout" in text
    assert main(["flatten", str(source), "--check", "--trust", "--fail-on", "info"]) == 1
    assert "would change" in (text := capsys.readouterr().out) and "older layout" in text
    assert _flatten(source, out, "--trust") == 0
    assert "becomes the current pt2 archive" in capsys.readouterr().out
    want, got = torch.export.load(source), torch.export.load(out)
    _same_tree(dict(sorted(got.state_dict.items())), dict(sorted(want.state_dict.items())))
    _same_tree(dict(sorted(got.constants.items())), dict(sorted(want.constants.items())))
    # Bit patterns: this test model's outputs include NaN, which torch.equal never calls equal.
    assert torch.equal(as_bits(got.module()(*inputs).detach()), as_bits(want.module()(*inputs).detach()))
    assert main(["flatten", str(out), "--check", "--trust"]) == 0
