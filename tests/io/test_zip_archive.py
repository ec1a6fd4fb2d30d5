"""memlayout.io.zip_archive: reading torch's zips, and laying records out exactly as torch.save does."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memlayout.errors import CorruptCheckpointError
from memlayout.io import zip_archive
from memlayout.io.zip_archive import (
    ZipReader,
    crc32_combine,
    end_of_archive,
    layout_records,
    torch_archive_name,
)


def _entries_in_file_order(path: Path) -> list[zip_archive.ZipEntry]:
    fd = os.open(path, os.O_RDONLY)
    try:
        entries = ZipReader(fd, os.path.getsize(path), 0, str(path)).entries
    finally:
        os.close(fd)
    return sorted(entries, key=lambda entry: entry.header_offset)


def _assert_laid_out_as_torch_did(path: Path) -> list[zip_archive.ZipEntry]:
    """Every byte torch.save wrote outside the records' data is what our layout writes.

    The file is read with pread around each record, never whole: the zip64 case is
    a sparse file of several GiB.
    """
    entries = _entries_in_file_order(path)
    layouts = layout_records((entry.name, entry.size) for entry in entries)
    fd = os.open(path, os.O_RDONLY)
    try:
        for entry, layout in zip(entries, layouts, strict=True):
            assert layout.header_offset == entry.header_offset, entry.name
            header = layout.local_header()
            assert os.pread(fd, len(header), layout.header_offset) == header, entry.name
            assert layout.data_offset % 64 == 0
            descriptor = layout.descriptor(entry.crc)
            assert os.pread(fd, len(descriptor), layout.data_offset + layout.size) == descriptor, entry.name
        tail = end_of_archive(layouts, [entry.crc for entry in entries])
        assert os.pread(fd, len(tail) + 1, layouts[-1].end) == tail
    finally:
        os.close(fd)
    return entries


def test_record_layout_matches_torch_save_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save({"a": torch.arange(10.0), "b": torch.ones(3, 3), "empty": torch.empty(0)}, path)
    entries = _assert_laid_out_as_torch_did(path)
    assert any(e.size == 0 for e in entries)


def test_zip64_layout_matches_torch_save_past_4_gib(tmp_path: Path) -> None:
    # skip_data writes every header and leaves the data as a hole, so a 5 GiB record
    # and records whose headers start past 4 GiB cost no disk and no memory.
    path = tmp_path / "huge.pt"
    state = {"small": torch.ones(4), "big": torch.empty(5 << 30, dtype=torch.uint8), "after": torch.ones(3)}
    with torch.serialization.skip_data():
        torch.save(state, path)
    entries = _assert_laid_out_as_torch_did(path)
    assert any(e.size >= 1 << 32 for e in entries) and any(e.header_offset >= 1 << 32 for e in entries)


@pytest.mark.parametrize("name", ["model.pt", "model", "model.v1.bin", "with space.pth"])
def test_archive_name_is_what_torch_save_gives_the_file(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    torch.save({"a": torch.ones(1)}, path)
    entries = _entries_in_file_order(path)
    assert entries[0].name.split("/")[0] == torch_archive_name(str(path))


def test_a_name_torch_cannot_use_gets_the_buffer_archive_name() -> None:
    assert torch_archive_name("/some/dir/.pt") == "archive"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_crc32_combine_equals_the_crc_of_the_concatenation(first: bytes, second: bytes) -> None:
    expected = zlib.crc32(first + second)
    assert crc32_combine(zlib.crc32(first), zlib.crc32(second), len(second)) == expected
    assert zip_archive.crc._crc32_combine_python(zlib.crc32(first), zlib.crc32(second), len(second)) == expected


def test_crc32_combine_handles_lengths_past_4_gib() -> None:
    # crc(a + zeros(n)) from crc(a) and crc(zeros(n)); zeros(n)'s own CRC comes from
    # squaring: crc(z(2k)) = combine(crc(z(k)), crc(z(k)), k).
    zeros = {1: zlib.crc32(b"\0")}
    length = 1
    while length < 5 << 30:
        zeros[2 * length] = crc32_combine(zeros[length], zeros[length], length)
        length *= 2
    assert zeros[1 << 20] == zlib.crc32(bytes(1 << 20))
    big = 1 << 33
    c_value = crc32_combine(zlib.crc32(b"head"), zeros[big], big)
    assert c_value == zip_archive.crc._crc32_combine_python(zlib.crc32(b"head"), zeros[big], big)


def test_reader_reads_members_and_record_spans(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    values = torch.arange(6, dtype=torch.int16)
    torch.save({"v": values}, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        reader = ZipReader(fd, os.path.getsize(path), 0, str(path))
        assert reader.read("model/byteorder") == b"little"
        entry = reader.entry("model/byteorder")  # built positionally: each value in its field
        assert len(entry) == len(entry._fields)
        assert entry._replace(header_offset=0)._asdict() == {
            "name": "model/byteorder", "method": 0, "compressed_size": 6, "size": 6, "header_offset": 0,
            "crc": zlib.crc32(b"little"),
        }
        assert os.pread(fd, 6, reader.data_start(entry)) == b"little"
        spans = reader.record_spans("model/data/")
        assert os.pread(fd, spans.sizes["0"], spans.starts["0"]) == values.numpy().tobytes()
        assert spans.checksums["0"] == zlib.crc32(values.numpy().tobytes())
        with pytest.raises(CorruptCheckpointError, match="has no model/missing"):
            reader.read("model/missing")
    finally:
        os.close(fd)


def test_reader_refuses_a_damaged_member(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save({"v": torch.ones(4)}, path)
    data = bytearray(path.read_bytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        reader = ZipReader(fd, len(data), 0, str(path))
        start = reader.data_start(reader.entry("model/byteorder"))
    finally:
        os.close(fd)
    data[start] ^= 0xFF
    path.write_bytes(bytes(data))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(CorruptCheckpointError, match="fails its zip checksum"):
            ZipReader(fd, len(data), 0, str(path)).read("model/byteorder")
    finally:
        os.close(fd)


def test_not_a_zip_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.pt"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(CorruptCheckpointError, match=r"junk\.pt is not a readable zip archive"):
            ZipReader(fd, 104, 0, str(path))
    finally:
        os.close(fd)
    assert zip_archive.central_directory_bytes(str(path)) == b""


@pytest.mark.parametrize(
    ("names", "said"),
    [(["m/data.pkl", "m/Data.pkl"], "both m/data.pkl and m/Data.pkl"),
     (["m/data.pkl", "m/data.pkl"], "m/data.pkl twice")],
)
def test_names_equal_without_case_are_refused(tmp_path: Path, names: list[str], said: str) -> None:
    import warnings
    import zipfile

    path = tmp_path / "model.pt"
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as archive:
        warnings.simplefilter("ignore")  # zipfile warns of a duplicate name, and writes it
        for name in ["m/version", *names]:
            archive.writestr(name, b"x")
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(CorruptCheckpointError, match=f"holds {said}; torch's reader matches"):
            ZipReader(fd, os.path.getsize(path), 0, str(path))
    finally:
        os.close(fd)
