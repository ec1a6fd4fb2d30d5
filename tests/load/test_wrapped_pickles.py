"""Pickles however wrapped: compressed streams and zip and tar archives, read by content, within caps.

Every file is written by the library a user writes it with (joblib, torch into
gzip.open and lzma.open, zipfile, tarfile), and what memlayout says a file's
pickles import is checked against what the real loader asks `find_class` for
(`tests/load/real_unpicklers.py`: an audit hook refuses the payload's call, so
nothing runs).
"""

from __future__ import annotations

import gzip
import io
import lzma
import os
import pickle
import struct
import tarfile
import zipfile
import zlib
from pathlib import Path

import joblib
import numpy as np
import pytest
import torch

from memlayout.errors import CorruptCheckpointError, UnpackLimitError, UnrecognizedFormatError
from memlayout.load import codecs, load_path
from memlayout.pipeline.inspection import run_inspection
from tests.load.conftest import assert_one_line_error, run_cli
from tests.load.real_unpicklers import imported_by


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch '{self.marker}'",)


def _codecs() -> list[str]:
    import importlib.util

    return ["zlib", "gzip", "bz2", "lzma", "xz", *(["lz4"] if importlib.util.find_spec("lz4") else [])]


def _globals(path: Path) -> set[tuple[str, str]]:
    with load_path(str(path)) as source:
        return {(g.module, g.name) for g in source.pickle_globals}


@pytest.mark.parametrize("codec", _codecs())
def test_every_codec_joblib_writes_is_read_and_names_what_joblib_load_imports(
    codec: str, tmp_path: Path, marker: Path
) -> None:
    path = tmp_path / "model.joblib"
    joblib.dump({"coef": np.arange(6.0).reshape(2, 3), "labels": np.array(["a", "b"], dtype=object),
                 "hook": Payload(marker)}, path, compress=(codec, 3))
    imported, _ = imported_by("joblib.load", path)
    assert _globals(path) == imported and ("posix", "system") in imported
    report = run_inspection(str(path))
    assert report.facts.source.format == codec
    assert [(m.member, m.within, m.format) for m in report.facts.source.contents] == [("", (codec,), "pickle")]
    (finding,) = [f for f in report.findings if f.code == "ML601"]
    assert finding.severity.value == "error" and "joblib.load" in finding.message
    assert not marker.exists()


def test_a_clean_compressed_joblib_file_is_cleared(tmp_path: Path) -> None:
    path = tmp_path / "scaler.joblib"
    joblib.dump({"mean": np.arange(4.0), "scale": np.ones(4)}, path, compress=3)
    assert run_inspection(str(path)).findings == ()


@pytest.mark.parametrize(("opener", "loader"), [(gzip.open, "gzip"), (lzma.open, "xz")])
def test_torch_save_into_a_compressed_stream_is_read_with_its_tensors(
    opener: object, loader: str, tmp_path: Path, marker: Path
) -> None:
    path = tmp_path / "model.pt.compressed"
    with opener(path, "wb") as stream:  # type: ignore[operator]
        torch.save({"w": torch.arange(6.0).reshape(2, 3), "hook": Payload(marker)}, stream)
    report = run_inspection(str(path))
    assert report.facts.source.format == loader
    assert [(t.name, t.shape) for t in report.facts.tensors] == [("w", (2, 3))]
    assert "ML601" in {f.code for f in report.findings}
    assert {(g.module, g.name) for g in report.facts.source.pickle_globals} == {
        ("posix", "system"), ("torch._utils", "_rebuild_tensor_v2"), ("collections", "OrderedDict"),
        ("torch", "FloatStorage"),
    }
    assert not marker.exists()


def test_a_deep_scan_reads_the_bytes_of_a_checkpoint_inside_gzip(tmp_path: Path) -> None:
    from memlayout.rules import RuleConfig

    path = tmp_path / "twins.pt.gz"
    twin = torch.arange(2048.0)
    with gzip.open(path, "wb") as stream:
        torch.save({"a": twin, "b": twin.clone()}, stream)
    report = run_inspection(str(path), config=RuleConfig(deep=True))
    assert "ML102" in {f.code for f in report.findings}  # the duplicate is found from the bytes inside


def _tar_gz(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def test_archives_are_read_member_by_member_and_say_where_each_global_is(tmp_path: Path, marker: Path) -> None:
    inner = io.BytesIO()
    torch.save({"w": torch.zeros(2)}, inner)
    bundle = io.BytesIO()
    with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("model/weights.pt", inner.getvalue())
        archive.writestr("model/hook.pkl", pickle.dumps(Payload(marker)))
        archive.writestr("README.md", "a model")
    _tar_gz(tmp_path / "release.tar.gz", {"release/model.zip": bundle.getvalue(), "release/notes.txt": b"v1\n"})
    with load_path(str(tmp_path / "release.tar.gz")) as source:
        contents = {(m.member, m.within, m.format, m.what) for m in source.contents}
        refused = {(g.module, g.name, g.member) for g in source.pickle_globals if not g.allowed}
        tensors = [t.name for t in source.tensors]
    assert contents == {
        ("release/model.zip!model/weights.pt", ("gzip", "tar", "zip"), "torch-zip", ""),
        ("release/model.zip!model/hook.pkl", ("gzip", "tar", "zip"), "pickle", ""),
        ("release/model.zip!README.md", ("gzip", "tar", "zip"), "data", "text"),
        ("release/notes.txt", ("gzip", "tar"), "data", "text"),
    }
    assert refused == {("posix", "system", "release/model.zip!model/hook.pkl")}
    assert tensors == ["w"]  # the one checkpoint inside: its tensors are the archive's
    assert not marker.exists()


def test_a_pth_tar_is_read_for_what_it_is(tmp_path: Path) -> None:
    # PyTorch's ImageNet example saves `checkpoint.pth.tar`: a torch.save zip, no tar, and no lie.
    path = tmp_path / "checkpoint.pth.tar"
    torch.save({"state_dict": {"w": torch.zeros(2)}, "epoch": 3}, path)
    report = run_inspection(str(path))
    assert report.facts.source.format == "torch-zip" and "ML604" not in {f.code for f in report.findings}
    _tar_gz(tmp_path / "real.pth.tar", {"model.pkl": pickle.dumps({"epoch": 3})})
    (tmp_path / "real.pth.tar").write_bytes(gzip.decompress((tmp_path / "real.pth.tar").read_bytes()))
    assert run_inspection(str(tmp_path / "real.pth.tar")).facts.source.format == "tar"


def test_nesting_deeper_than_the_cap_is_refused_in_one_line(tmp_path: Path) -> None:
    data = pickle.dumps({"epoch": 1})
    for _ in range(codecs.MAX_DEPTH):
        data = gzip.compress(data)
    (tmp_path / "deep.gz").write_bytes(data)
    assert run_inspection(str(tmp_path / "deep.gz")).facts.source.format == "gzip"  # 4 deep: read
    (tmp_path / "deeper.gz").write_bytes(gzip.compress(data))
    assert_one_line_error(run_cli("inspect", str(tmp_path / "deeper.gz")), f"more than {codecs.MAX_DEPTH} deep")


def test_a_decompression_bomb_is_one_line_and_the_rest_of_its_folder_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "drop"
    folder.mkdir()
    # A pickle whose first object claims 64 MiB of bytes, all zeros: 64 KiB of gzip.
    claim = b"\x80\x04\x8e" + struct.pack("<Q", 64 << 20)
    (folder / "bomb.joblib").write_bytes(gzip.compress(claim + bytes(64 << 20), compresslevel=1))
    (folder / "model.pkl").write_bytes(pickle.dumps({"w": [1.0]}))
    assert (folder / "bomb.joblib").stat().st_size < 512 << 10
    monkeypatch.setattr(codecs, "MAX_UNPACKED_BYTES", 16 << 20)
    with pytest.raises(UnpackLimitError, match=r"unpacks to more than 16\.0 MiB"):
        load_path(str(folder / "bomb.joblib"))
    result = run_cli("inspect", str(folder), "--format", "json")
    assert result.exit_code == 2 and result.stderr.count("memlayout: error:") == 1
    assert "bomb.joblib unpacks to more than" in result.stderr and "decompression bomb" in result.stderr
    assert '"model.pkl"' in result.stdout or "model.pkl" in result.stdout  # nothing else lost


def test_a_truncated_or_damaged_stream_is_one_line(tmp_path: Path) -> None:
    data = gzip.compress(pickle.dumps(list(range(5000))))
    (tmp_path / "cut.gz").write_bytes(data[: len(data) // 2])
    assert_one_line_error(run_cli("inspect", str(tmp_path / "cut.gz")), "cut short")
    damaged = bytearray(zlib.compress(pickle.dumps(list(range(5000)))))
    damaged[40:60] = bytes(20)
    (tmp_path / "damaged.joblib").write_bytes(bytes(damaged))
    assert_one_line_error(run_cli("inspect", str(tmp_path / "damaged.joblib")), "damaged")


def test_text_that_opens_like_a_zlib_header_is_no_stream(tmp_path: Path) -> None:
    path = tmp_path / "notes"
    path.write_bytes(b"x^2 + y^2 = r^2\n")  # 0x78 0x5e: a valid zlib header, then no deflate stream
    with pytest.raises(UnrecognizedFormatError, match="not a checkpoint format"):
        load_path(str(path))


def test_a_compressed_stream_of_no_pickle_is_said_to_be_data(tmp_path: Path) -> None:
    (tmp_path / "log.gz").write_bytes(gzip.compress(b"step 1 loss 0.5\n" * 100))
    with pytest.raises(UnrecognizedFormatError, match="a gzip stream of text: no pickle or checkpoint inside"):
        load_path(str(tmp_path / "log.gz"))


def test_zip_members_are_read_whatever_their_flags_say(tmp_path: Path, marker: Path) -> None:
    # picklescan's malicious1_0x1/0x20/0x40.zip: flag bits a lenient reader ignores, Python's zipfile not.
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model/config.pkl", pickle.dumps(Payload(marker)))
    for bits in (0x20, 0x40):
        data = bytearray(buffer.getvalue())
        for magic, at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
            start = data.find(magic)
            struct.pack_into("<H", data, start + at, struct.unpack_from("<H", data, start + at)[0] | bits)
        path = tmp_path / f"flags-{bits:#x}.zip"
        path.write_bytes(bytes(data))
        with pytest.raises((zipfile.BadZipFile, NotImplementedError)), zipfile.ZipFile(path) as strict:
            strict.read("model/config.pkl")
        assert ("posix", "system") in _globals(path)


def test_an_encrypted_member_is_refused_not_cleared(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("secret.bin", bytes(range(256)) * 4)
    data = bytearray(buffer.getvalue())
    for magic, at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        start = data.find(magic)
        struct.pack_into("<H", data, start + at, struct.unpack_from("<H", data, start + at)[0] | 0x1)
    (tmp_path / "locked.zip").write_bytes(bytes(data))
    assert_one_line_error(run_cli("inspect", str(tmp_path / "locked.zip")), "secret.bin is encrypted")


def test_a_7z_archive_is_refused_as_unopened(tmp_path: Path) -> None:
    (tmp_path / "model.7z").write_bytes(b"7z\xbc\xaf\x27\x1c\x00\x04" + bytes(100))
    assert_one_line_error(run_cli("inspect", str(tmp_path / "model.7z")),
                          "a 7-Zip archive, which memlayout does not open")


def test_billions_of_appends_in_a_few_kilobytes_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bz2

    monkeypatch.setattr(codecs, "MAX_PICKLE_BYTES", 1 << 20)
    # Each NONE + APPEND builds a list slot; bz2 packs millions of them into a few kilobytes.
    (tmp_path / "appends.pkl.bz2").write_bytes(bz2.compress(b"\x80\x02]" + b"Na" * (1 << 20) + b"."))
    with pytest.raises(UnpackLimitError, match="more than 1 MiB of opcodes"):
        load_path(str(tmp_path / "appends.pkl.bz2"))


def test_a_long_payload_in_a_streamed_pickle_is_stepped_over(tmp_path: Path) -> None:
    # pandas' to_pickle(compression="gzip") writes each column's bytes in the pickle: read past, not held.
    blob = os.urandom(3 << 20)
    (tmp_path / "frame.pkl.gz").write_bytes(gzip.compress(pickle.dumps({"column": blob, "name": "x" * (2 << 20)})))
    with load_path(str(tmp_path / "frame.pkl.gz")) as source:
        assert source.format == "gzip" and not source.pickle_globals


def test_too_many_members_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codecs, "MAX_MEMBERS", 10)
    with zipfile.ZipFile(tmp_path / "many.zip", "w") as archive:
        for index in range(11):
            archive.writestr(f"{index}.pkl", pickle.dumps(index))
    with pytest.raises(UnpackLimitError, match="more than 10 archive members"):
        load_path(str(tmp_path / "many.zip"))


def test_a_broken_pickle_inside_a_stream_names_what_it_would_have_imported(tmp_path: Path, marker: Path) -> None:
    data = pickle.dumps(Payload(marker), protocol=2)[:-1] + b"\xff"  # STOP replaced: damaged after the payload
    (tmp_path / "broken.pkl.gz").write_bytes(gzip.compress(data))
    with pytest.raises(CorruptCheckpointError, match=r"before that point it names posix\.system") as caught:
        load_path(str(tmp_path / "broken.pkl.gz"))
    assert caught.value.named == (("posix", "system"),)  # type: ignore[attr-defined]
    assert not marker.exists()


def test_an_lz4_file_without_the_lz4_package_is_refused_not_cleared(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    path = tmp_path / "model.joblib"
    path.write_bytes(b"\x04\x22\x4d\x18" + bytes(60))  # an lz4 frame's magic: what joblib's compress="lz4" opens with
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lz4" else real(name, *a))
    with pytest.raises(CorruptCheckpointError, match="needs the lz4 package"):
        load_path(str(path))
