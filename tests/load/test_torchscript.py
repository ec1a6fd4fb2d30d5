"""TorchScript archives: module tree, parameters, buffers and ties without torch.jit.load."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
import torch

from memlayout.load import load_path
from memlayout.load.records import TensorKind
from memlayout.pipeline.inspection import run_inspection
from tests.load import malicious
from tests.load.conftest import assert_one_line_error, run_cli
from tests.load.models import TiedScriptable

# torch.jit is deprecated in favour of torch.export, but users still hold its archives.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TiedScriptable written by torch.jit.save."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ts") / "scripted.pt"
    torch.jit.save(torch.jit.script(TiedScriptable()), str(path))
    return path


@pytest.fixture
def no_jit_load(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.jit.load must not be called without --trust")

    monkeypatch.setattr(torch.jit, "load", refuse)
    monkeypatch.setattr(torch, "load", refuse)


def test_parameters_buffers_and_attributes_are_told_apart(scripted: Path, no_jit_load: None) -> None:
    source = load_path(str(scripted))
    kinds = {t.name: t.kind for t in source.tensors}
    assert source.format == "torchscript"
    assert kinds["proj.weight"] is TensorKind.PARAMETER
    assert kinds["lstm.weight_hh_l0"] is TensorKind.PARAMETER
    assert kinds["running"] is TensorKind.BUFFER
    assert kinds["scale"] is TensorKind.BUFFER


def test_module_tree_names_the_scripted_classes(scripted: Path, no_jit_load: None) -> None:
    modules = {m.path: m for m in load_path(str(scripted)).modules}
    assert modules["proj"].class_name == "torch.nn.modules.linear.Linear"
    # torch.jit mangles the second Linear class; the report shows the Python class.
    assert modules["head"].class_name == "torch.nn.modules.linear.Linear"
    rnn = modules["lstm"].rnn
    assert rnn is not None and rnn.mode == "LSTM"
    assert rnn.flat_weight_names == ("lstm.weight_ih_l0", "lstm.weight_hh_l0", "lstm.bias_ih_l0", "lstm.bias_hh_l0")


def test_tie_survives_as_one_view(scripted: Path, no_jit_load: None) -> None:
    report = run_inspection(str(scripted))
    tied = report.facts.tensor("head.weight")
    assert tied is not None and set(tied.names) == {"embed.weight", "head.weight"}
    codes = {f.code for f in report.findings}
    assert "ML401" in codes
    assert "ML601" not in codes


def test_storage_bytes_match_the_module(scripted: Path) -> None:
    expected = torch.jit.load(str(scripted)).proj.bias.detach().numpy().tobytes()
    source = load_path(str(scripted))
    record = next(t for t in source.tensors if t.name == "proj.bias")
    assert source.reader is not None
    assert bytes(source.reader.read(record.storage_key, 0, len(expected))) == expected


def test_truncated_archive_is_a_one_line_cli_error(scripted: Path, tmp_path: Path) -> None:
    data = scripted.read_bytes()
    path = tmp_path / "truncated.pt"
    path.write_bytes(data[: len(data) // 2])
    assert_one_line_error(run_cli("inspect", str(path)))


def test_malicious_data_pkl_in_a_torchscript_shape_is_named(tmp_path: Path, marker: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", malicious.PAYLOADS[0].build(str(marker)))
        archive.writestr("archive/constants.pkl", b"\x80\x02).")
        archive.writestr("archive/code/__torch__.py", "class M(Module):\n  __parameters__ = []\n")
    path = tmp_path / "evil_script.pt"
    path.write_bytes(buffer.getvalue())
    report = run_inspection(str(path))
    assert report.facts.source.format == "torchscript"
    (finding,) = [f for f in report.findings if f.code == "ML601"]
    assert "os.system" in finding.message
    assert not marker.exists()
