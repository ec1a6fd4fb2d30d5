"""Tar-format torch.save files: read as torch.load reads them, never executed, ML602."""

from __future__ import annotations

import io
import itertools
import pickle
import struct
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fixtures.make_format_fixtures import legacy_tar_bytes, tar_module, tar_state_dict
from memlayout.errors import CorruptCheckpointError
from memlayout.load import load_path
from memlayout.load.records import LoadedSource, TensorKind, TensorRecord
from memlayout.pipeline.inspection import run_inspection
from memlayout.rules.registry import RuleConfig
from tests.load import malicious
from tests.load.conftest import assert_one_line_error, run_cli

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "formats"
STATE_DICT = FIXTURES / "legacy_tar_state_dict.pt"
MODULE = FIXTURES / "legacy_tar_module.pt"


def _torch_load(path: Path) -> Any:
    # Trusted: the files come from fixtures/make_format_fixtures.py or this module.
    # weights_only=False is the only way torch reads the tar format.
    return torch.load(path, weights_only=False)


def _named_tensors(obj: Any) -> dict[str, tuple[torch.Tensor, TensorKind]]:
    if isinstance(obj, nn.Module):
        named = {n: (p, TensorKind.PARAMETER) for n, p in obj.named_parameters(remove_duplicate=False)}
        named |= {n: (b, TensorKind.BUFFER) for n, b in obj.named_buffers(remove_duplicate=False)}
        return named
    return {name: (value, TensorKind.PARAMETER if isinstance(value, nn.Parameter) else TensorKind.TENSOR)
            for name, value in obj.items()}


def _share_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    # A tensor on a storage view gets a storage of its own that points into the root's memory.
    sa, sb = a.untyped_storage(), b.untyped_storage()
    return sa.data_ptr() < sb.data_ptr() + sb.nbytes() and sb.data_ptr() < sa.data_ptr() + sa.nbytes()


def _rebuilt(source: LoadedSource, record: TensorRecord, dtype: torch.dtype) -> torch.Tensor:
    """The tensor as memlayout locates it: its storage's bytes from the reader, viewed by its metadata."""
    assert source.reader is not None
    storage = source.storages[record.storage_key]
    data = bytearray(source.reader.read(record.storage_key, 0, storage.nbytes))
    return torch.frombuffer(data, dtype=dtype).as_strided(record.shape, record.stride, record.offset)


def assert_reads_like_torch_load(path: Path) -> LoadedSource:
    """memlayout's metadata and bytes for `path` agree with what torch.load builds from it."""
    expected = _named_tensors(_torch_load(path))
    source = load_path(str(path))
    records = {record.name: record for record in source.tensors}
    assert records.keys() == expected.keys()
    for name, (tensor, kind) in expected.items():
        record = records[name]
        assert (record.shape, record.stride) == (tuple(tensor.shape), tensor.stride()), name
        assert record.dtype == str(tensor.dtype).removeprefix("torch."), name
        assert (record.kind, record.requires_grad) == (kind, tensor.requires_grad), name
        assert source.storages[record.storage_key].device == str(tensor.device)
        assert torch.equal(_rebuilt(source, record, tensor.dtype), tensor), name
    for a, b in itertools.combinations(expected, 2):
        (ta, _), (tb, _) = expected[a], expected[b]
        ra, rb = records[a], records[b]
        assert (ta is tb) == (ra.object_id == rb.object_id), (a, b)
        assert _share_memory(ta, tb) == (ra.storage_key == rb.storage_key), (a, b)
        if ra.storage_key == rb.storage_key:
            assert ta.data_ptr() - tb.data_ptr() == (ra.offset - rb.offset) * ta.element_size(), (a, b)
    return source


@pytest.mark.parametrize("path", [STATE_DICT, MODULE], ids=lambda p: p.name)
def test_committed_fixture_reads_as_torch_load_reads_it(path: Path) -> None:
    source = assert_reads_like_torch_load(path)
    assert source.format == "torch-legacy-tar"
    assert source.legacy_format


@pytest.mark.parametrize("make", [tar_state_dict, tar_module], ids=lambda f: f.__name__)
def test_committed_fixtures_are_what_the_writer_writes(make: Callable[[], object]) -> None:
    path = STATE_DICT if make is tar_state_dict else MODULE
    assert path.read_bytes() == legacy_tar_bytes(make())


def test_committed_fixtures_have_the_members_torch_save_wrote() -> None:
    with tarfile.open(STATE_DICT) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["sys_info", "pickle", "tensors", "storages"]
    # A fractional mtime gave every member a PAX header, so the file starts with one.
    assert STATE_DICT.read_bytes()[:14] == b"././@PaxHeader"


def test_a_storage_view_is_a_slice_of_its_root() -> None:
    source = load_path(str(STATE_DICT))
    by_name = {t.name: t for t in source.tensors}
    window, embed = by_name["window"], by_name["embed.weight"]
    # The view starts 8 elements into the embedding's storage; the tensor 4 more.
    assert window.storage_key == embed.storage_key
    assert (window.offset, window.shape, window.stride) == (12, (2, 4), (4, 1))
    report = run_inspection(str(STATE_DICT))
    (group,) = [g for g in report.facts.alias_groups if "window" in g.tensors]
    assert {(p.first, p.second, p.relation.value) for p in group.pairs} == {("embed.weight", "window", "contains")}
    assert "ML101" not in {f.code for f in report.findings}


def test_one_tensor_under_two_names_is_one_view() -> None:
    facts = run_inspection(str(STATE_DICT)).facts
    fact = facts.tensor("head.weight")
    assert fact is not None and fact.names == ("embed.weight", "head.weight")
    assert len(facts.tensors) == 5


def test_pickled_module_tree_ties_and_frozen_parameter() -> None:
    report = run_inspection(str(MODULE))
    facts = report.facts
    assert [(m.path, m.class_name) for m in facts.modules] == [
        ("", "torch.nn.modules.container.Sequential"),
        ("0", "torch.nn.modules.sparse.Embedding"),
        ("1", "torch.nn.modules.normalization.LayerNorm"),
        ("2", "torch.nn.modules.linear.Linear"),
    ]
    tied = facts.tensor("2.weight")
    assert tied is not None and tied.names == ("0.weight", "2.weight")
    bias = facts.tensor("1.bias")
    assert bias is not None and bias.kind is TensorKind.PARAMETER
    (unsafe,) = [f for f in report.findings if f.code == "ML601"]
    assert "torch.nn.modules.normalization.LayerNorm" in unsafe.message
    assert "torch.nn.parameter.Parameter" not in unsafe.message


def test_class_source_records_are_read_and_ignored(tmp_path: Path) -> None:
    path = tmp_path / "module.pt"
    path.write_bytes(legacy_tar_bytes(tar_module(), class_sources=True))
    assert b"class LayerNorm(Module)" in path.read_bytes()
    assert_reads_like_torch_load(path)


def test_ml602_names_the_tar_format_and_weights_only() -> None:
    (finding,) = [f for f in run_inspection(str(STATE_DICT)).findings if f.code == "ML602"]
    assert finding.severity.value == "info"
    assert "tar-format" in finding.message and "weights_only=False" in finding.message
    with pytest.raises(RuntimeError, match=r"legacy \.tar format"):
        torch.load(STATE_DICT, weights_only=True)


def test_deep_scan_reads_each_view_at_its_offset(tmp_path: Path) -> None:
    state = tar_state_dict()
    # Root element 2 is in embed.weight only; element 13 also in window (elements 12..19).
    state["embed.weight"].view(-1)[2] = float("nan")
    path = tmp_path / "nan.pt"
    path.write_bytes(legacy_tar_bytes(state))
    report = run_inspection(str(path), RuleConfig(deep=True), select=["ML503"])
    assert {name for f in report.findings for name in f.tensors} == {"embed.weight", "head.weight"}
    state["embed.weight"].view(-1)[2] = 0.0
    state["embed.weight"].view(-1)[13] = float("inf")
    path.write_bytes(legacy_tar_bytes(state))
    report = run_inspection(str(path), RuleConfig(deep=True), select=["ML503"])
    assert {name for f in report.findings for name in f.tensors} == {"embed.weight", "head.weight", "window"}


def test_ustar_without_pax_headers_is_recognized(tmp_path: Path) -> None:
    path = tmp_path / "plain.pt"
    path.write_bytes(_tar(_members(STATE_DICT), mtime=1490000000))
    assert path.read_bytes()[:8] == b"sys_info"
    assert load_path(str(path)).format == "torch-legacy-tar"


def test_other_tar_archives_are_not_checkpoints(tmp_path: Path) -> None:
    path = tmp_path / "docs.tar"
    path.write_bytes(_tar({"README": b"hello"}))
    assert_one_line_error(run_cli("inspect", str(path)), "tar archive of text: no pickle or checkpoint inside")


# Hand-built members: the smallest file each damage needs, from a valid baseline.


class _Ref:
    """Stands for a tensor or storage in a hand-built `pickle` member."""

    def __init__(self, key: int) -> None:
        self.key = key


class _RefPickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        return str(obj.key) if isinstance(obj, _Ref) else None


def _dump(*objects: Any) -> bytes:
    return b"".join(pickle.dumps(obj, protocol=2) for obj in objects)


def _main(obj: Any) -> bytes:
    buffer = io.BytesIO()
    _RefPickler(buffer, protocol=2).dump(obj)
    return buffer.getvalue()


def _storages(records: list[tuple[Any, ...]], views: list[Any] | None = None, count: int | None = None) -> bytes:
    """records: (key, location, storage class, element count, data)."""
    out = _dump(len(records) if count is None else count)
    for key, location, storage_class, numel, data in records:
        out += _dump((key, location, storage_class)) + struct.pack("<q", numel) + data
    return out + _dump(views or [])


def _tensors(records: list[tuple[Any, ...]], count: int | None = None) -> bytes:
    """records: (key, storage key, shape, stride, offset), or (key, storage key, raw metadata bytes)."""
    out = _dump(len(records) if count is None else count)
    for key, storage, *rest in records:
        out += _dump((key, storage, torch.FloatTensor))
        if len(rest) == 1:
            out += rest[0]
        else:
            shape, stride, offset = rest
            out += struct.pack(f"<i4x{len(shape)}q{len(stride)}qq", len(shape), *shape, *stride, offset)
    return out


def _tar(members: dict[str, bytes], mtime: float = 0) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), mtime
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


_FLOATS = struct.pack("<6f", 0, 1, 2, 3, 4, 5)


def _baseline(**replace: bytes) -> dict[str, bytes]:
    """A storage of 6 floats, a view of its last 4, a 2x2 tensor on the view, and {"w": that tensor}."""
    members = {
        "storages": _storages([(1, "cpu", torch.FloatStorage, 6, _FLOATS)], [(2, 1, 2, 4)]),
        "tensors": _tensors([(3, 2, (2, 2), (2, 1), 0)]),
        "pickle": _main({"w": _Ref(3)}),
    }
    return {**members, **replace}


def test_hand_built_baseline_reads_like_torch_load(tmp_path: Path) -> None:
    path = tmp_path / "base.pt"
    path.write_bytes(_tar(_baseline()))
    source = assert_reads_like_torch_load(path)
    (record,) = source.tensors
    assert (record.storage_key, record.offset) == ("1", 2)


def test_pre_variable_parameter_state_holds_the_data(tmp_path: Path) -> None:
    # NEWOBJ Parameter() then BUILD (data, grad, hooks, requires_grad, volatile): the
    # oldest Variable pickling, which torch's Tensor.__setstate__ still reads.
    m = malicious
    state = m.MARK + m.text("3") + b"Q" + m.NONE + m.global_("collections", "OrderedDict") + m.EMPTY_TUPLE + m.REDUCE
    parameter = m.global_("torch.nn.parameter", "Parameter") + m.EMPTY_TUPLE + m.NEWOBJ + state + b"\x89\x89t" + m.BUILD
    main = m.PROTO2 + m.EMPTY_DICT + m.text("w") + parameter + m.SETITEM + m.STOP
    path = tmp_path / "param.pt"
    path.write_bytes(_tar(_baseline(pickle=main)))
    source = assert_reads_like_torch_load(path)
    (record,) = source.tensors
    assert (record.kind, record.requires_grad, record.offset) == (TensorKind.PARAMETER, False, 2)


BAD_MEMBERS: dict[str, tuple[dict[str, bytes], str]] = {
    "missing-tensors": ({"tensors": b""}, "lacks the member(s) tensors"),
    "damaged-pickle": ({"pickle": b"\x80\x02}q\x00(X\x01\x00\x00\x00w"},
                       "the object in the tar member pickle could not be read"),
    "storage-count-past-end": ({"storages": _storages([(1, "cpu", torch.FloatStorage, 6, _FLOATS)], count=5)},
                               "a storage record is []"),
    "element-count-past-end": ({"storages": _storages([(1, "cpu", torch.FloatStorage, 1 << 40, _FLOATS)])},
                               "runs past the end of the tar member storages"),
    "negative-element-count": ({"storages": _storages([(1, "cpu", torch.FloatStorage, -6, _FLOATS)])}, "claims -6"),
    "storage-type-not-a-storage": ({"storages": _storages([(1, "cpu", "FloatStorage", 6, _FLOATS)])},
                                   "not a torch storage"),
    "view-past-root": ({"storages": _storages([(1, "cpu", torch.FloatStorage, 6, _FLOATS)], [(2, 1, 4, 4)])},
                       "runs past the 6 elements of storage 1"),
    "view-of-missing-root": ({"storages": _storages([(1, "cpu", torch.FloatStorage, 6, _FLOATS)], [(2, 9, 0, 4)])},
                             "slices storage 9, which the file lacks"),
    "tensor-count-past-end": ({"tensors": _tensors([(3, 2, (2, 2), (2, 1), 0)], count=2)}, "tensors could not be read"),
    "ndim-past-end": ({"tensors": _tensors([(3, 2, struct.pack("<i4x", 1 << 30))])},
                      "runs past the end of the tar member tensors"),
    "negative-ndim": ({"tensors": _tensors([(3, 2, struct.pack("<i4x", -1))])}, "claims -1 dimensions"),
    "tensor-past-view": ({"tensors": _tensors([(3, 2, (2, 2), (2, 1), 1)])}, "reaches past the 4 elements"),
    "negative-stride": ({"tensors": _tensors([(3, 2, (2, 2), (-2, 1), 0)])}, "stride (-2, 1)"),
    "tensor-without-storage": ({"tensors": _tensors([(3, None, (2, 2), (2, 1), 0)])}, "names storage None"),
    "unknown-persistent-id": ({"pickle": _main({"w": _Ref(7)})}, "names no tensor or storage"),
    "big-endian": ({"sys_info": _dump({"protocol_version": 1000, "little_endian": False})}, "big-endian"),
}


@pytest.mark.parametrize("case", sorted(BAD_MEMBERS))
def test_damaged_members_are_one_line_errors(tmp_path: Path, case: str) -> None:
    replace, fragment = BAD_MEMBERS[case]
    members = {name: data for name, data in _baseline(**replace).items() if data}
    if "sys_info" in members:
        members = {"sys_info": members.pop("sys_info"), **members}
    path = tmp_path / f"{case}.pt"
    path.write_bytes(_tar(members))
    assert_one_line_error(run_cli("inspect", str(path)), fragment)


def _member_start(path: Path, name: str) -> int:
    with tarfile.open(path) as tar:
        return tar.getmember(name).offset_data


@pytest.mark.parametrize("member", ["sys_info", "pickle", "tensors", "storages"])
def test_file_cut_inside_a_member_is_a_one_line_error(tmp_path: Path, member: str) -> None:
    path = tmp_path / "cut.pt"
    path.write_bytes(STATE_DICT.read_bytes()[: _member_start(STATE_DICT, member) + 40])
    assert_one_line_error(run_cli("inspect", str(path)), "the tar archive is damaged or cut short")


def test_file_cut_after_a_member_lacks_the_rest(tmp_path: Path) -> None:
    with tarfile.open(STATE_DICT) as tar:
        end = tar.getmember("pickle").offset_data + 512 * (-(-tar.getmember("pickle").size // 512))
    path = tmp_path / "cut.pt"
    path.write_bytes(STATE_DICT.read_bytes()[:end])
    assert_one_line_error(run_cli("inspect", str(path)), "lacks the member(s) storages, tensors")


def test_truncated_file_raises_the_corrupt_checkpoint_error(tmp_path: Path) -> None:
    path = tmp_path / "cut.pt"
    path.write_bytes(STATE_DICT.read_bytes()[: _member_start(STATE_DICT, "storages") + 40])
    with pytest.raises(CorruptCheckpointError):
        load_path(str(path))
