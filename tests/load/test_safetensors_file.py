"""safetensors files: header-only metadata, validation, and storage reads."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from memlayout.errors import CorruptCheckpointError
from memlayout.load import load_path
from memlayout.pipeline.inspection import run_inspection
from tests.load.conftest import assert_one_line_error, run_cli


def write_raw(path: Path, header: dict[str, Any], data: bytes, declared_length: int | None = None) -> Path:
    """A safetensors file written byte by byte, so tests can damage any part."""
    encoded = json.dumps(header).encode()
    length = len(encoded) if declared_length is None else declared_length
    path.write_bytes(struct.pack("<Q", length) + encoded + data)
    return path


def test_reads_names_dtypes_shapes_and_file_offsets(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.randn(3, 4), "ids": torch.arange(5), "h": torch.ones(2, dtype=torch.bfloat16)}, str(path))
    source = load_path(str(path))
    by_name = {t.name: t for t in source.tensors}
    assert source.format == "safetensors"
    assert (by_name["w"].dtype, by_name["w"].shape, by_name["w"].stride) == ("float32", (3, 4), (4, 1))
    assert (by_name["ids"].dtype, by_name["ids"].shape) == ("int64", (5,))
    assert by_name["h"].dtype == "bfloat16"
    # The data section is one storage at its absolute file offset; each tensor a view of it.
    raw = path.read_bytes()
    header_length = struct.unpack("<Q", raw[:8])[0]
    data_start = 8 + header_length
    (storage,) = source.storages.values()
    assert storage.base_address == data_start and storage.nbytes == len(raw) - data_start
    offsets = json.loads(raw[8:data_start])
    for record in source.tensors:
        itemsize = {"float32": 4, "int64": 8, "bfloat16": 2}[record.dtype]
        assert record.storage_key == storage.key
        assert record.offset * itemsize == offsets[record.name]["data_offsets"][0]


def test_one_storage_is_what_safetensors_maps(tmp_path: Path) -> None:
    # safe_open maps the file once: each tensor's pointer is the mapping plus its file
    # offset, which is what one storage with element offsets says.
    from safetensors import safe_open

    path = tmp_path / "model.safetensors"
    save_file({"w": torch.randn(3, 4), "ids": torch.arange(5), "h": torch.ones(2, dtype=torch.bfloat16)}, str(path))
    source = load_path(str(path))
    with safe_open(str(path), "pt") as opened:
        loaded = {name: opened.get_tensor(name) for name in opened.keys()}  # noqa: SIM118
    by_name = {t.name: t for t in source.tensors}
    base = {name: t.data_ptr() - by_name[name].offset * t.element_size() for name, t in loaded.items()}
    assert len(set(base.values())) == 1


def test_reader_returns_the_bytes_safetensors_wrote(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    weights = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    save_file({"w": weights, "b": torch.zeros(7, dtype=torch.int16)}, str(path))
    source = load_path(str(path))
    try:
        assert source.reader is not None
        w = next(t for t in source.tensors if t.name == "w")
        start = w.offset * 4
        assert bytes(source.reader.read(w.storage_key, start, 48)) == weights.numpy().tobytes()
        assert bytes(source.reader.read(w.storage_key, start + 4, 4)) == weights.numpy().tobytes()[4:8]
        with pytest.raises(CorruptCheckpointError):
            source.reader.read(w.storage_key, source.storages[w.storage_key].nbytes - 8, 16)
    finally:
        source.close()


def test_metadata_is_kept_as_a_note(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.zeros(2)}, str(path), metadata={"origin": "unit-test"})
    source = load_path(str(path))
    assert any("origin=unit-test" in note for note in source.notes)


def test_detection_is_by_content_not_extension(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    save_file({"w": torch.zeros(4)}, str(path))
    assert load_path(str(path)).format == "safetensors"


def test_packed_float4_halves_the_last_dimension(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "f4.safetensors", {"q": {"dtype": "F4", "shape": [2, 4], "data_offsets": [0, 4]}},
                     b"\0" * 4)
    (tensor,) = load_path(str(path)).tensors
    assert (tensor.dtype, tensor.shape) == ("float4_e2m1fn_x2", (2, 2))


def test_empty_and_zero_size_tensors_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "z.safetensors"
    save_file({"empty": torch.zeros(0, 3), "w": torch.ones(2)}, str(path))
    names = sorted(t.name for t in load_path(str(path)).tensors)
    assert names == ["empty", "w"]


def test_inspect_reports_duplicates_across_tensors(tmp_path: Path) -> None:
    path = tmp_path / "dup.safetensors"
    weights = torch.randn(64, 64)
    save_file({"a": weights, "b": weights.clone()}, str(path))
    report = run_inspection(str(path))
    assert "ML102" in {f.code for f in report.findings}


CORRUPT_CASES: dict[str, tuple[dict[str, Any], bytes, int | None, str]] = {
    "header length beyond the file": ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, 10_000,
                                      "header claims"),
    "offsets out of range": ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, None,
                             "outside"),
    "overlapping tensors": (
        {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
        },
        b"\0" * 12,
        None,
        "overlaps",
    ),
    "a hole between tensors": (
        {
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
            "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
        },
        b"\0" * 12,
        None,
        "hole",
    ),
    "trailing bytes": ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8, None, "not covered"),
    "shape and size disagree": ({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, None,
                                "needs 12 bytes"),
    "unknown dtype": ({"w": {"dtype": "F13", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, None, "unknown dtype"),
    "negative shape": ({"w": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}, b"", None, "shape"),
    "offsets not a pair": ({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0]}}, b"\0", None, "data_offsets"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT_CASES))
def test_corrupt_header_is_a_one_line_cli_error(tmp_path: Path, case: str) -> None:
    header, data, declared, fragment = CORRUPT_CASES[case]
    path = write_raw(tmp_path / "bad.safetensors", header, data, declared)
    with pytest.raises(CorruptCheckpointError):
        load_path(str(path))
    assert_one_line_error(run_cli("inspect", str(path)), "invalid safetensors header", fragment)


def test_invalid_json_header_is_a_one_line_cli_error(tmp_path: Path) -> None:
    body = b'{"w": {"dtype": '
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(body)) + body)
    assert_one_line_error(run_cli("inspect", str(path)), "not valid JSON")


def test_header_that_is_not_an_object_is_rejected(tmp_path: Path) -> None:
    body = b"{}"
    path = tmp_path / "ok.safetensors"
    path.write_bytes(struct.pack("<Q", len(body)) + body)
    assert load_path(str(path)).tensors == []
    path.write_bytes(struct.pack("<Q", 5) + b"{ 1:2")
    assert_one_line_error(run_cli("inspect", str(path)), "invalid safetensors header")


def test_noise_with_a_brace_at_byte_8_is_not_taken_for_safetensors(tmp_path: Path) -> None:
    path = tmp_path / "noise.bin"
    path.write_bytes(b"\xff" * 8 + b"{" + b"\x00" * 100)
    assert_one_line_error(run_cli("inspect", str(path)), "not a checkpoint format")
