"""Damaged files of every format fail as a `MemlayoutError`, never as a bug.

Audits read files that someone else wrote, so any damage (a flipped bit, a cut
transfer, a hostile edit) must end in the CLI's one line and exit 2. Two kinds of
damage are generated: raw byte edits of whole files, which mostly trip the formats'
own checks (zip CRCs, header lengths), and edits behind those checks (a re-zipped
pickle with a valid CRC, a re-serialised safetensors header), which reach the
parsers. The regressions below are cases such runs found.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import json
import pickle
import shutil
import struct
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

import memlayout
from memlayout.errors import CorruptCheckpointError, MemlayoutError
from memlayout.load.restricted_pickle import run_unpickler
from memlayout.rules import RuleConfig
from tests.invariants import violations
from tests.load.conftest import assert_one_line_error, run_cli

FUZZ_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10), torch.nn.LSTM(4, 4))
    model[1].weight = model[0].weight
    return model


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """One small file per single-file format, written by the real writer."""
    folder = tmp_path_factory.mktemp("originals")
    model = _model()
    state = model.state_dict()
    writers: dict[str, Callable[[Path], None]] = {
        "state_dict.pt": lambda p: torch.save(state, p),
        "module.pt": lambda p: torch.save(model, p),
        "views.pt": lambda p: torch.save({"a": torch.zeros(16)[:4], "b": torch.zeros(16)[4:12].view(2, 4).t()}, p),
        "legacy.pt": lambda p: torch.save(state, p, _use_new_zipfile_serialization=False),
        "model.safetensors": lambda p: save_file({k: v.clone() for k, v in state.items()}, p),
        "script.pt": lambda p: torch.jit.save(torch.jit.script(torch.nn.Linear(3, 3)), p),
    }
    files = {}
    for name, write in writers.items():
        write(folder / name)
        files[name] = (folder / name).read_bytes()
    return files


def _inspect_bytes(name: str, data: bytes) -> None:
    """Inspect `data` written as `name`, metadata and --deep: success or a MemlayoutError only,
    and what a success returns is possible (`tests.invariants`)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        _inspect_path(path)


def _inspect_path(path: Path) -> None:
    read = False
    for deep in (False, True):
        with contextlib.suppress(MemlayoutError):
            memlayout.inspect(str(path), config=RuleConfig(deep=deep))
            read = True
    if read:
        assert violations(str(path)) == []


@st.composite
def byte_edits(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` after one to four edits: bit flips, overwrites, insertions, deletions or a cut."""
    edited = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if not edited:
            break
        at = draw(st.integers(0, len(edited) - 1))
        kind = draw(st.sampled_from(["flip", "overwrite", "insert", "delete", "cut"]))
        if kind == "flip":
            edited[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "overwrite":
            chunk = draw(st.binary(min_size=1, max_size=8))
            edited[at : at + len(chunk)] = chunk
        elif kind == "insert":
            edited[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del edited[at : at + draw(st.integers(1, 8))]
        else:
            del edited[at:]
    return bytes(edited)


def _rezipped(archive_bytes: bytes, edit: Callable[[bytes], bytes], member_suffix: str) -> bytes:
    """The zip with every member ending in `member_suffix` edited, CRCs recomputed."""
    output = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive_bytes)) as source, zipfile.ZipFile(output, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            target.writestr(info, edit(data) if info.filename.endswith(member_suffix) else data)
    return output.getvalue()


@pytest.mark.parametrize("name", ["state_dict.pt", "module.pt", "views.pt", "legacy.pt", "model.safetensors",
                                  "script.pt"])
@FUZZ_SETTINGS
@given(data=st.data())
def test_raw_byte_damage_is_a_memlayout_error(originals: dict[str, bytes], name: str, data: st.DataObject) -> None:
    _inspect_bytes(name, data.draw(byte_edits(originals[name])))


@pytest.mark.parametrize("name", ["state_dict.pt", "module.pt", "views.pt", "script.pt"])
@FUZZ_SETTINGS
@given(data=st.data())
def test_damaged_pickle_behind_a_valid_crc_is_a_memlayout_error(
    originals: dict[str, bytes], name: str, data: st.DataObject
) -> None:
    # The zip's CRC would reject raw edits of data.pkl; re-zipping lets them reach the unpickler.
    archive = _rezipped(originals[name], lambda pkl: data.draw(byte_edits(pkl)), "data.pkl")
    _inspect_bytes(name, archive)


@pytest.fixture(scope="module")
def dcp_metadata(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """A torch.distributed.checkpoint directory and its `.metadata` bytes."""
    import torch.distributed.checkpoint as dcp

    folder = tmp_path_factory.mktemp("dcp") / "checkpoint"
    dcp.save({"w": torch.randn(4, 4), "b": torch.randn(3)}, checkpoint_id=str(folder))
    return folder, (folder / ".metadata").read_bytes()


@FUZZ_SETTINGS
@given(data=st.data())
def test_damaged_dcp_metadata_is_a_memlayout_error(dcp_metadata: tuple[Path, bytes], data: st.DataObject) -> None:
    # .metadata is a bare pickle with no checksum: every edit reaches the unpickler.
    folder, metadata = dcp_metadata
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "checkpoint"
        shutil.copytree(folder, copy)
        (copy / ".metadata").write_bytes(data.draw(byte_edits(metadata)))
        _inspect_path(copy)


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats(allow_nan=False) | st.text(max_size=6)
    | st.sampled_from(["F32", "BF16", "I64", "BOOL", "F8_E4M3", "F4"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@FUZZ_SETTINGS
@given(data=st.data())
def test_edited_safetensors_header_is_a_memlayout_error(originals: dict[str, bytes], data: st.DataObject) -> None:
    # The header re-serialised with one field replaced by any JSON value: what a
    # hand-edited or hostile header looks like once it parses as JSON.
    original = originals["model.safetensors"]
    (length,) = struct.unpack("<Q", original[:8])
    header = json.loads(original[8 : 8 + length])
    name = data.draw(st.sampled_from(sorted(header)))
    if name == "__metadata__" or data.draw(st.booleans()):
        header[name] = data.draw(_JSON_VALUES)
    else:
        field = data.draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
        header[name][field] = data.draw(_JSON_VALUES)
    encoded = json.dumps(header).encode()
    _inspect_bytes("model.safetensors", struct.pack("<Q", len(encoded)) + encoded + original[8 + length :])


# Regressions: cases the runs above found.


def _state_dict_zip(tmp_path: Path, rebuild_args: tuple[object, ...]) -> Path:
    """A torch.save zip whose one tensor is rebuilt with `rebuild_args` after the storage."""

    class StorageRef:
        pass

    class TensorRef:
        def __reduce__(self) -> tuple[object, tuple[object, ...]]:
            return (torch._utils._rebuild_tensor_v2, (storage, *rebuild_args, False, collections.OrderedDict()))

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: object) -> object:
            return ("storage", torch.FloatStorage, "0", "cpu", 16) if obj is storage else None

    storage = StorageRef()
    buffer = io.BytesIO()
    Pickler(buffer, protocol=2).dump({"w": TensorRef()})
    path = tmp_path / "model.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", buffer.getvalue())
        archive.writestr("archive/data/0", bytes(64))
    return path


@pytest.mark.parametrize(
    ("rebuild_args", "problem"),
    [
        ((0, (4, 4), (4,)), "differ in length"),
        ((0, (4, collections.OrderedDict()), (4, 1)), "not a tuple of non-negative ints"),
        ((0, (4, -4), (4, 1)), "not a tuple of non-negative ints"),
        ((0, (4, 4), (4, -1)), "not a tuple of non-negative ints"),
        ((-3, (4, 4), (4, 1)), "storage offset -3"),
    ],
)
def test_impossible_tensor_geometry_is_a_load_error(
    tmp_path: Path, rebuild_args: tuple[object, ...], problem: str
) -> None:
    path = _state_dict_zip(tmp_path, rebuild_args)
    with pytest.raises(CorruptCheckpointError, match=problem):
        memlayout.inspect(str(path))
    assert_one_line_error(run_cli("inspect", str(path)), "tensor 'w'", problem)


def test_a_view_past_the_end_of_its_storage_is_a_load_error_as_torch_load_refuses_it(tmp_path: Path) -> None:
    # Found by the property that every reported tensor lies inside its storage:
    # a 4x4 float32 view from element 1 of a 16-element storage reaches byte 68 of 64.
    path = _state_dict_zip(tmp_path, (1, (4, 4), (4, 1)))
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("archive/version", "3\n")  # so that torch.load gets as far as the tensor
    with pytest.raises(RuntimeError, match="resize storage that is not resizable"):
        torch.load(path)  # set_() would have to grow the 64-byte storage it loaded
    assert_one_line_error(run_cli("inspect", str(path)), "tensor 'w' reaches byte 68 of storage '0', which holds 64")


def test_the_properties_see_a_view_past_its_storage() -> None:
    # The checker itself, on records a loader could return: it must not pass what torch refuses.
    from memlayout.load.records import LoadedSource, StorageRecord, TensorKind, TensorRecord
    from tests.invariants import _record_violations

    record = TensorRecord("w", TensorKind.TENSOR, "float32", (4, 4), (4, 1), "0", 1)
    source = LoadedSource("model.pt", "torch-zip", [record], {"0": StorageRecord("0", "cpu", 64)})
    assert _record_violations(source) == ["tensor 'w' reaches byte 68 of storage '0', which holds 64"]
    assert _record_violations(dataclasses.replace(source, tensors=[record._replace(offset=0)])) == []


def test_sound_tensor_geometry_still_loads(tmp_path: Path) -> None:
    # The control for the cases above: the same writer with a sound geometry.
    report = memlayout.inspect(str(_state_dict_zip(tmp_path, (0, (4, 4), (4, 1)))))
    (tensor,) = report.facts.tensors
    assert (tensor.shape, tensor.stride, tensor.offset) == ((4, 4), (4, 1), 0)


@pytest.mark.parametrize("dtype", [[], {}, 7, None])
def test_safetensors_dtype_that_is_not_a_name(tmp_path: Path, dtype: object) -> None:
    header = json.dumps({"w": {"dtype": dtype, "shape": [2], "data_offsets": [0, 8]}}).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    assert_one_line_error(run_cli("inspect", str(path)), "tensor 'w' has dtype", "expected a dtype name")


def test_torchscript_member_that_fails_to_inflate(tmp_path: Path, originals: dict[str, bytes]) -> None:
    # Deflate every member, then make data.pkl's stream start with a reserved block
    # type: zipfile's decompressor raises zlib.error, not a zipfile error.
    deflated = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(originals["script.pt"])) as source, zipfile.ZipFile(
        deflated, "w", zipfile.ZIP_DEFLATED
    ) as target:
        for info in source.infolist():
            target.writestr(info.filename, source.read(info))
    data = bytearray(deflated.getvalue())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("/data.pkl"))
    name_length, extra_length = struct.unpack_from("<HH", data, info.header_offset + 26)
    data[info.header_offset + 30 + name_length + extra_length] = 0xFF
    path = tmp_path / "script.pt"
    path.write_bytes(bytes(data))
    assert_one_line_error(run_cli("inspect", str(path)), "not a readable TorchScript archive", "invalid block type")


def test_unpickling_error_without_a_message_names_its_type(tmp_path: Path) -> None:
    # A BYTEARRAY8 claiming 2**52 bytes: the unpickler's allocation fails with a
    # MemoryError whose message is empty, and the line must still say something.
    path = tmp_path / "model.pkl"
    path.write_bytes(b"\x80\x05\x96" + (1 << 52).to_bytes(8, "little") + b"abc")
    assert_one_line_error(run_cli("inspect", str(path)), "could not be read: MemoryError")


def test_only_the_bytearray_dealloc_report_is_dropped_while_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    # That report's timing depends on uninitialised memory, so the hook is driven
    # directly: the report CPython makes is dropped, any other reaches the old hook.
    forwarded: list[str] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, trace: forwarded.append(str(value)))

    class Reporting(pickle.Unpickler):
        def load(self) -> object:
            sys.excepthook(SystemError, SystemError("deallocated bytearray object has exported buffers"), None)
            sys.excepthook(RuntimeError, RuntimeError("someone else's report"), None)
            return "loaded"

    assert run_unpickler(Reporting(io.BytesIO(b"")), "the pickle") == "loaded"
    assert forwarded == ["someone else's report"]
    sys.excepthook(SystemError, SystemError("deallocated bytearray object has exported buffers"), None)
    assert len(forwarded) == 2, "the hook must be restored after loading"
