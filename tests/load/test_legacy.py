"""Legacy (non-zip) torch.save files: ML602, storage bytes located after the pickles."""

from __future__ import annotations

import collections
import pickle
import types
from pathlib import Path

import pytest
import torch

from memlayout.load import load_path
from memlayout.pipeline.inspection import run_inspection
from tests.load.conftest import assert_one_line_error, run_cli
from tests.load.models import TinyLSTM

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "formats"


def _save_legacy(obj: object, path: Path) -> Path:
    torch.save(obj, path, _use_new_zipfile_serialization=False)
    return path


def test_state_dict_views_and_bytes(tmp_path: Path) -> None:
    base = torch.arange(10, dtype=torch.float32)
    path = _save_legacy({"base": base, "view": base[2:5], "half": torch.ones(3, dtype=torch.float16)},
                        tmp_path / "old.pt")
    source = load_path(str(path))
    by_name = {t.name: t for t in source.tensors}
    assert source.format == "torch-legacy" and source.legacy_format
    assert by_name["view"].storage_key == by_name["base"].storage_key
    assert (by_name["view"].offset, by_name["view"].shape) == (2, (3,))
    assert by_name["half"].dtype == "float16"
    assert source.reader is not None
    assert bytes(source.reader.read(by_name["base"].storage_key, 0, 40)) == base.numpy().tobytes()
    half = by_name["half"]
    assert bytes(source.reader.read(half.storage_key, 0, 6)) == torch.ones(3, dtype=torch.float16).numpy().tobytes()


def test_legacy_file_is_ml602_info(tmp_path: Path) -> None:
    path = _save_legacy({"w": torch.zeros(4)}, tmp_path / "old.pt")
    (finding,) = [f for f in run_inspection(str(path)).findings if f.code == "ML602"]
    assert finding.severity.value == "info"


def test_pickled_module_in_legacy_format(tmp_path: Path) -> None:
    path = _save_legacy(TinyLSTM(), tmp_path / "module.pt")
    report = run_inspection(str(path))
    assert any(m.rnn is not None for m in report.facts.modules)
    assert {"ML401", "ML601", "ML602"} <= {f.code for f in report.findings}


def test_committed_legacy_fixture_reads_as_written(tmp_path: Path) -> None:
    path = FIXTURES / "legacy_state_dict.pt"
    if not path.exists():
        pytest.skip("run fixtures/make_format_fixtures.py")
    source = load_path(str(path))
    assert source.legacy_format
    assert sorted(t.name for t in source.tensors) == ["bias", "view", "weight"]


def test_truncated_storage_section_is_a_one_line_cli_error(tmp_path: Path) -> None:
    path = _save_legacy({"w": torch.zeros(1000)}, tmp_path / "old.pt")
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    assert_one_line_error(run_cli("inspect", str(path)), "runs past the end")


class _OldParameterPickler(pickle.Pickler):
    """Pickles a Parameter as torch < 0.4 did: REDUCE Parameter(data) plus its Variable state."""

    def reducer_override(self, obj: object) -> object:
        if isinstance(obj, torch.nn.Parameter):
            return type(obj), (obj.data,), (obj.requires_grad, False, collections.OrderedDict())
        return NotImplemented


def test_pre_0_4_parameters_in_a_non_zip_file(tmp_path: Path) -> None:
    # The non-zip writer of torch 0.2/0.3 was today's, but for how Parameters pickled;
    # torch.save takes the pickle module, so only that part is swapped in.
    old_pickle = types.SimpleNamespace(Pickler=_OldParameterPickler, dump=pickle.dump, __name__="pickle")
    model = torch.nn.Linear(3, 2)
    model.bias.requires_grad_(False)
    path = tmp_path / "old.pt"
    torch.save(model, path, pickle_module=old_pickle, _use_new_zipfile_serialization=False)

    loaded = torch.load(path, weights_only=False)  # the real reader, on a file this test wrote
    assert isinstance(loaded.weight, torch.nn.Parameter) and not loaded.bias.requires_grad
    tensors = {t.name: t for t in load_path(str(path)).tensors}
    assert set(tensors) == {"weight", "bias"}
    for name, record in tensors.items():
        real = getattr(loaded, name)
        assert record.kind.value == "parameter", name
        assert record.requires_grad == real.requires_grad, name
        assert (record.shape, record.stride, record.offset) == (tuple(real.shape), real.stride(), real.storage_offset())
