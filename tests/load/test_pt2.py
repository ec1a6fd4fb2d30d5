"""torch.export .pt2 archives: weights from the JSON configs, or from the older
layout's nested torch.save archives through the restricted unpickler."""

from __future__ import annotations

import contextlib
import io
import os
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import memlayout
from memlayout.errors import CorruptCheckpointError, MemlayoutError
from memlayout.load import load_path
from memlayout.load.records import TensorKind
from memlayout.pipeline.inspection import run_inspection
from memlayout.rules import RuleConfig
from tests.load import malicious
from tests.load.conftest import assert_one_line_error, run_cli
from tests.load.test_damaged_files import byte_edits


class TiedWithView(nn.Module):
    """A head tied to the embedding, and a buffer that views another buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.head = nn.Linear(4, 5, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("table", torch.arange(6, dtype=torch.float32))
        self.register_buffer("tail", self.table[2:])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids)) + self.table.sum() + self.tail.sum()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TiedWithView written by torch.export.save."""
    path = tmp_path_factory.mktemp("pt2") / "model.pt2"
    program = torch.export.export(TiedWithView(), (torch.tensor([1, 2]),))
    torch.export.save(program, str(path))
    return path


def test_weights_config_gives_kinds_views_and_ties(exported: Path) -> None:
    source = load_path(str(exported))
    by_name = {t.name: t for t in source.tensors}
    assert source.format == "torch-export"
    assert by_name["embed.weight"].kind is TensorKind.PARAMETER
    assert by_name["table"].kind is TensorKind.BUFFER
    assert by_name["embed.weight"].storage_key == by_name["head.weight"].storage_key
    assert by_name["tail"].storage_key == by_name["table"].storage_key
    assert (by_name["tail"].offset, by_name["tail"].shape) == (2, (4,))


def test_reader_serves_the_raw_records(exported: Path) -> None:
    source = load_path(str(exported))
    table = next(t for t in source.tensors if t.name == "table")
    assert source.reader is not None
    data = bytes(source.reader.read(table.storage_key, 0, 24))
    assert data == torch.arange(6, dtype=torch.float32).numpy().tobytes()


def test_archive_with_neither_layout_is_refused_with_a_reason(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model/archive_format", "pt2")
        archive.writestr("model/serialized_state_dict.pt", b"PK")
    path = tmp_path / "odd.pt2"
    path.write_bytes(buffer.getvalue())
    assert_one_line_error(run_cli("inspect", str(path)), "no description of its weights")


def test_damaged_weights_config_is_a_one_line_error(exported: Path, tmp_path: Path) -> None:
    source = zipfile.ZipFile(exported)
    path = tmp_path / "damaged.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        for info in source.infolist():
            data = source.read(info.filename)
            if info.filename.endswith("model_weights_config.json"):
                data = data[: len(data) // 2]
            archive.writestr(info, data)
    assert_one_line_error(run_cli("inspect", str(path)), "torch.export")


class TiedWithConstants(TiedWithView):
    """TiedWithView plus a non-persistent buffer holding a NaN and a tensor constant export lifts."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor([1.0, float("nan")]), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids) + torch.tensor([0.5, 1.5, 2.5, 3.5, 4.5]) + self.scale.sum()


STATE_DICT_MEMBER = "serialized_state_dict.pt"
NESTED_MEMBERS = [STATE_DICT_MEMBER, "serialized_constants.pt", "serialized_example_inputs.pt"]


@pytest.fixture(scope="module")
def older_members() -> dict[str, bytes]:
    """TiedWithConstants exported, as the members torch.export.save wrote up to torch 2.7.

    That writer called `torch._export.serde.serialize.serialize(ep)` and wrote the
    artifact's fields, then `version`; torch 2.8 replaced it with the pt2 archive
    (pytorch/pytorch#152495). The serializer is still torch's own.
    """
    from torch._export.serde.schema import SCHEMA_VERSION
    from torch._export.serde.serialize import serialize

    artifact = serialize(torch.export.export(TiedWithConstants(), (torch.tensor([1, 2]),)))
    return {
        "serialized_exported_program.json": artifact.exported_program,
        STATE_DICT_MEMBER: artifact.state_dict,
        "serialized_constants.pt": artifact.constants,
        "serialized_example_inputs.pt": artifact.example_inputs,
        "version": ".".join(map(str, SCHEMA_VERSION)).encode(),
    }


def write_older_layout(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> Path:
    """A zip of `members` at its root, as the old writer's `zipfile.ZipFile(f, "w")` made it (stored)."""
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


@pytest.fixture(scope="module")
def older(older_members: dict[str, bytes], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The older-layout archive of TiedWithConstants."""
    return write_older_layout(tmp_path_factory.mktemp("pt2-older") / "model.pt2", older_members)


def test_older_layout_reads_what_torch_export_load_reads(older: Path) -> None:
    program = torch.export.load(str(older))  # the real reader, which unpickles
    expected = {**program.state_dict, **program.constants}
    source = load_path(str(older))
    by_name = {t.name: t for t in source.tensors}
    assert source.format == "torch-export"
    assert any("older layout" in note for note in source.notes)
    assert set(by_name) == set(expected)
    assert source.reader is not None
    for name, tensor in expected.items():
        record = by_name[name]
        assert (record.dtype, record.shape, record.stride, record.offset) == (
            str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), tensor.stride(), tensor.storage_offset()
        ), name
        nbytes = tensor.numel() * tensor.element_size()
        data = source.reader.read(record.storage_key, tensor.storage_offset() * tensor.element_size(), nbytes)
        assert bytes(data) == tensor.detach().numpy().tobytes(), name


def test_older_layout_kinds_follow_the_graph_signature(older: Path) -> None:
    signature = torch.export.load(str(older)).graph_signature
    source = load_path(str(older))
    kinds = {kind: {t.name for t in source.tensors if t.kind is kind} for kind in TensorKind}
    assert kinds[TensorKind.PARAMETER] == set(signature.parameters) == {"embed.weight", "head.weight"}
    # "scale" is a non-persistent buffer, pickled among the constants as a plain tensor.
    assert kinds[TensorKind.BUFFER] == set(signature.buffers) == {"table", "tail", "scale"}
    assert kinds[TensorKind.TENSOR] == set(signature.lifted_tensor_constants) == {"lifted_tensor_0"}


def test_older_layout_keeps_ties_and_views_as_shared_storages(older: Path) -> None:
    source = load_path(str(older))
    by_name = {t.name: t for t in source.tensors}
    assert by_name["embed.weight"].storage_key == by_name["head.weight"].storage_key
    assert by_name["tail"].storage_key == by_name["table"].storage_key
    # Both nested archives number storages from 0; their keys must still differ.
    assert len({by_name[n].storage_key for n in ("embed.weight", "table", "scale", "lifted_tensor_0")}) == 4


def test_older_layout_storages_are_byte_ranges_of_the_file(older: Path) -> None:
    source = load_path(str(older))
    data = older.read_bytes()
    table = next(t for t in source.tensors if t.name == "table")
    span = source.reader.spans[table.storage_key]  # type: ignore[union-attr]
    assert data[span.start : span.start + span.size] == torch.arange(6, dtype=torch.float32).numpy().tobytes()


def test_file_offsets_of_nested_storages_are_no_alignment_finding(older: Path) -> None:
    # The nested archives start wherever the outer zip put them, but torch.export.load
    # copies every storage out of the file into fresh memory. Only "tail", 8 bytes
    # into its storage, is misaligned wherever that storage lives.
    source = load_path(str(older))
    assert any(span.start % 16 for span in source.reader.spans.values())  # type: ignore[union-attr]
    assert [f.tensors for f in run_inspection(str(older), select=["ML203"]).findings] == [("tail",)]


def test_deep_scan_reads_the_nested_constants_in_place(older: Path) -> None:
    report = run_inspection(str(older), RuleConfig(deep=True), select=["ML503"])
    assert [f.tensors for f in report.findings] == [("scale",)]


def test_cli_inspects_the_older_layout(older: Path) -> None:
    result = run_cli("inspect", str(older), "--deep", "--format", "json")
    assert result.exit_code == 1, result.stderr  # ML503 on "scale"
    assert '"format": "torch-export"' in result.stdout
    assert "ML503" in result.stdout


@pytest.mark.filterwarnings("ignore:This version of file is deprecated")
def test_torch_2_1_member_names_read_the_same(older_members: dict[str, bytes], older: Path, tmp_path: Path) -> None:
    # torch 2.1 named the nested torch.save archives `.json`; torch.export.load still reads them.
    renamed = {name.replace("state_dict.pt", "state_dict.json").replace("constants.pt", "constants.json"): data
               for name, data in older_members.items()}
    path = write_older_layout(tmp_path / "named.pt2", renamed)
    assert set(torch.export.load(str(path)).state_dict) == {"embed.weight", "head.weight", "table", "tail"}
    listed = [(t.name, t.kind, t.shape) for t in load_path(str(path)).tensors]
    assert listed == [(t.name, t.kind, t.shape) for t in load_path(str(older)).tensors]


def test_recompressed_nested_archives_are_listed_without_contents(
    older_members: dict[str, bytes], older: Path, tmp_path: Path
) -> None:
    path = write_older_layout(tmp_path / "deflated.pt2", older_members, zipfile.ZIP_DEFLATED)
    source = load_path(str(path))
    assert [(t.name, t.kind, t.shape, t.offset) for t in source.tensors] == [
        (t.name, t.kind, t.shape, t.offset) for t in load_path(str(older)).tensors
    ]
    assert not any(storage.has_data for storage in source.storages.values())
    assert any(f"{STATE_DICT_MEMBER} is compressed" in note for note in source.notes)


def test_missing_state_dict_is_a_one_line_error(older_members: dict[str, bytes], tmp_path: Path) -> None:
    members = {name: data for name, data in older_members.items() if name != STATE_DICT_MEMBER}
    path = write_older_layout(tmp_path / "partial.pt2", members)
    assert_one_line_error(run_cli("inspect", str(path)), "older layout", STATE_DICT_MEMBER)


def test_truncated_older_layout_is_a_one_line_error(older: Path, tmp_path: Path) -> None:
    path = tmp_path / "cut.pt2"
    path.write_bytes(older.read_bytes()[: older.stat().st_size // 2])
    with pytest.raises(CorruptCheckpointError):
        load_path(str(path))
    assert_one_line_error(run_cli("inspect", str(path)))


@pytest.mark.parametrize("damage", ["cut", "pickle"])
def test_damaged_nested_archive_is_a_one_line_error_naming_it(
    older_members: dict[str, bytes], tmp_path: Path, damage: str
) -> None:
    nested = older_members[STATE_DICT_MEMBER]
    if damage == "cut":
        nested = nested[: len(nested) // 2]
    else:
        # One flipped byte in data.pkl, which its zip CRC catches.
        at = nested.index(b"\x80\x02", nested.index(b"data.pkl"))
        nested = nested[: at + 2] + bytes([nested[at + 2] ^ 0xFF]) + nested[at + 3 :]
    path = write_older_layout(tmp_path / "damaged.pt2", {**older_members, STATE_DICT_MEMBER: nested})
    assert_one_line_error(run_cli("inspect", str(path)), f"{path}: {STATE_DICT_MEMBER}")


def _central_entry(archive: bytes, name: str) -> int:
    """Offset of `name`'s central directory entry in a zip held in memory."""
    end = archive.rindex(b"PK\x05\x06")
    (at,) = struct.unpack_from("<I", archive, end + 16)
    while archive[at : at + 4] == b"PK\x01\x02":
        name_length, extra_length, comment_length = struct.unpack_from("<HHH", archive, at + 28)
        if archive[at + 46 : at + 46 + name_length] == name.encode():
            return int(at)
        at += 46 + name_length + extra_length + comment_length
    raise AssertionError(f"{name} is not in the zip")


def test_nested_archive_cannot_point_outside_its_member(older_members: dict[str, bytes], tmp_path: Path) -> None:
    # A storage record's header offset aimed at the next member's local header, a
    # real one in the outer file, must not be taken for a record of the archive.
    path = write_older_layout(tmp_path / "escape.pt2", older_members)
    with zipfile.ZipFile(path) as outer:
        infos = outer.infolist()
    order = [info.filename for info in infos]
    following = infos[order.index(STATE_DICT_MEMBER) + 1].header_offset
    start = infos[order.index(STATE_DICT_MEMBER)].header_offset + 30 + len(STATE_DICT_MEMBER)
    nested = bytearray(older_members[STATE_DICT_MEMBER])
    entry = _central_entry(bytes(nested), "archive/data/0")
    struct.pack_into("<I", nested, entry + 42, following - start)
    write_older_layout(path, {**older_members, STATE_DICT_MEMBER: bytes(nested)})
    with pytest.raises(CorruptCheckpointError, match="archive/data/0"):
        load_path(str(path))


def test_archive_with_neither_pickle_nor_config_names_is_not_taken_for_the_older_layout(tmp_path: Path) -> None:
    path = write_older_layout(tmp_path / "other.zip", {"version": b"8.20", "readme.txt": b"hi"})
    assert_one_line_error(run_cli("inspect", str(path)), "no pickle or checkpoint inside")


@pytest.fixture
def no_execution_traces(marker: Path) -> Iterator[None]:
    """The test ends with neither trace a payload would leave."""
    os.environ.pop(malicious.ENV_VAR, None)
    yield
    assert not marker.exists(), "a payload ran: the marker file exists"
    assert malicious.ENV_VAR not in os.environ, "a payload ran: the environment variable is set"


@pytest.mark.usefixtures("no_execution_traces")
@pytest.mark.parametrize("member", NESTED_MEMBERS)
@pytest.mark.parametrize("payload", malicious.PAYLOADS, ids=lambda p: p.name)
def test_payload_in_a_nested_pickle_is_not_executed_and_named_by_ml601(
    older_members: dict[str, bytes], tmp_path: Path, marker: Path, payload: malicious.Payload, member: str
) -> None:
    # torch.export.load falls back to weights_only=False for each of these pickles.
    nested = malicious.torch_zip(payload.build(str(marker)))
    path = write_older_layout(tmp_path / "evil.pt2", {**older_members, member: nested})
    report = run_inspection(str(path))
    (finding,) = [f for f in report.findings if f.code == "ML601"]
    for dotted in payload.globals:
        assert dotted in finding.message


@pytest.mark.usefixtures("no_execution_traces")
def test_refused_payload_in_a_nested_pickle_is_a_one_line_error(
    older_members: dict[str, bytes], tmp_path: Path, marker: Path
) -> None:
    (payload,) = malicious.REFUSED
    nested = malicious.torch_zip(payload.build(str(marker)))
    path = write_older_layout(tmp_path / "evil.pt2", {**older_members, STATE_DICT_MEMBER: nested})
    assert_one_line_error(run_cli("inspect", str(path)), f"{STATE_DICT_MEMBER}: the pickle archive/data.pkl")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_raw_byte_damage_is_a_memlayout_error(older: Path, tmp_path: Path, data: st.DataObject) -> None:
    path = tmp_path / "fuzzed.pt2"
    path.write_bytes(data.draw(byte_edits(older.read_bytes())))
    for deep in (False, True):
        with contextlib.suppress(MemlayoutError):
            memlayout.inspect(str(path), config=RuleConfig(deep=deep))
