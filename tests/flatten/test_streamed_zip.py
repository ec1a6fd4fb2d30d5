"""torch.save files flattened by moving bytes from file to file: OUT is what torch.save writes, proved."""

from __future__ import annotations

import io
import os
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from memlayout.errors import CorruptCheckpointError, FlattenError
from memlayout.flatten.files import FlattenOptions, flatten_path
from memlayout.io.zip_archive import ZipReader
from tests.flatten.conftest import bits
from tests.flatten.models import LstmLM, TransposedTie
from tests.flatten.strategies import build_checkpoint, layout_steps

SERIALIZATION_ID = ".data/serialization_id"


def _flatten(src: Path, out: Path | str, **options: Any) -> Any:
    return flatten_path(str(src), FlattenOptions(out=str(out), device="cpu", **options))


def _masked_serialization_id(path: Path) -> bytes:
    """The file's bytes with its serialization id, and that record's CRC fields, zeroed.

    torch.save draws a fresh random id for every file, so it is the one record two
    saves of the same tree never share.
    """
    data = bytearray(path.read_bytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        reader = ZipReader(fd, len(data), 0, str(path))
        (name,) = [n for n in reader.names if n.endswith("/" + SERIALIZATION_ID)]
        entry = reader.entry(name)
        start = reader.data_start(entry)
    finally:
        os.close(fd)
    crc = entry.crc.to_bytes(4, "little")
    data[start : start + entry.size] = bytes(entry.size)
    # The data descriptor after it (magic, then CRC), and the directory entry's CRC.
    assert data[start + entry.size + 4 : start + entry.size + 8] == crc
    data[start + entry.size + 4 : start + entry.size + 8] = bytes(4)
    directory = data.rfind(b"PK\x01\x02\x00\x00\x00\x00\x08\x08\x00\x00\x00\x00\x00\x00" + crc)
    assert directory > 0
    data[directory + 16 : directory + 20] = bytes(4)
    return bytes(data)


def _assert_out_is_what_torch_save_writes(out: Path, tmp_path: Path, trust: bool = False) -> None:
    # torch.save of the tree torch.load reads from OUT, to a file of the same name
    # (torch names the archive's folder after the file).
    reference = tmp_path / "reference" / out.name
    reference.parent.mkdir()
    torch.save(torch.load(out, weights_only=not trust), reference)
    assert _masked_serialization_id(out) == _masked_serialization_id(reference)


def test_state_dict_out_is_byte_for_byte_what_torch_save_writes(tmp_path: Path) -> None:
    state = LstmLM().state_dict()
    state["slice"] = torch.randn(1000)[5:15]
    state["transposed"] = torch.randn(4, 6).t()
    state["empty"] = torch.empty(0)
    state["half"] = torch.randn(7).half()
    state["step"] = torch.tensor(3)
    src, out = tmp_path / "in.pt", tmp_path / "flat.pt"
    torch.save(state, src)
    _flatten(src, out)
    _assert_out_is_what_torch_save_writes(out, tmp_path)


def test_training_checkpoint_out_is_byte_for_byte_what_torch_save_writes(tmp_path: Path) -> None:
    model = TransposedTie()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 6)).sum().backward()
    optimizer.step()
    src, out = tmp_path / "in.pt", tmp_path / "flat.pt"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3}, src)
    _flatten(src, out)
    _assert_out_is_what_torch_save_writes(out, tmp_path)


def test_module_pickle_out_is_byte_for_byte_what_torch_save_writes(tmp_path: Path) -> None:
    src, out = tmp_path / "in.pt", tmp_path / "flat.pt"
    torch.save(LstmLM(), src)
    _flatten(src, out, trust=True)
    _assert_out_is_what_torch_save_writes(out, tmp_path, trust=True)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(layout_steps())
def test_generated_checkpoints_come_out_as_torch_save_writes_them(tmp_path: Path, steps: list[tuple[str, int]]) -> None:
    folder = tmp_path / str(len(list(tmp_path.iterdir())))
    folder.mkdir()
    src, out = folder / "in.pt", folder / "flat.pt"
    torch.save(build_checkpoint(steps), src)
    _flatten(src, out)
    _assert_out_is_what_torch_save_writes(out, folder)


def test_in_is_never_loaded_by_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, out = tmp_path / "in.pt", tmp_path / "flat.pt"
    torch.save(LstmLM().state_dict(), src)
    loaded: list[str] = []
    real_load = torch.load

    def recording_load(f: Any, *args: Any, **kwargs: Any) -> Any:
        loaded.append(str(f))
        return real_load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    _flatten(src, out)
    # Only verification opens a file with torch.load: OUT, before it is committed.
    assert len(loaded) == 1
    assert loaded[0] != str(src)


def test_a_bad_write_fails_verification_and_leaves_out_as_it_was(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from memlayout.flatten.writers import torch_zip_out

    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(LstmLM().state_dict(), src)
    out.write_bytes(b"old")
    real_move = torch_zip_out._Mover.move

    def corrupting_move(self: Any, start: int, length: int) -> None:
        real_move(self, start, length)
        position = os.lseek(self.target, 0, os.SEEK_CUR)
        byte = os.pread(self.target, 1, position - 1)
        os.pwrite(self.target, bytes([byte[0] ^ 0xFF]), position - 1)

    monkeypatch.setattr(torch_zip_out._Mover, "move", corrupting_move)
    with pytest.raises(FlattenError, match="does not hold the bytes meant for it"):
        _flatten(src, out)
    assert out.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.pt", "out.pt"]


def test_a_re_strided_tensor_built_wrong_fails_verification_by_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its record's CRC-32 is of the bytes built in memory, so only reading its values back catches a wrong build."""
    from memlayout.flatten.writers import torch_zip

    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save({"weight": torch.randn(16, 8).t(), "bias": torch.randn(16)}, src)
    out.write_bytes(b"old")
    real_dense_bytes = torch_zip._dense_bytes

    def transposed_wrong(source: int, record_start: int, slot: Any) -> bytes:
        built = real_dense_bytes(source, record_start, slot)
        return built[4:] + built[:4]  # every value one element off: same length, same bytes, other order

    monkeypatch.setattr(torch_zip, "_dense_bytes", transposed_wrong)
    with pytest.raises(FlattenError, match="weight read back with other values than IN's"):
        _flatten(src, out)
    assert out.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.pt", "out.pt"]


def test_a_damaged_in_record_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save({"a": torch.arange(64.0), "b": torch.ones(8)}, src)
    data = bytearray(src.read_bytes())
    fd = os.open(src, os.O_RDONLY)
    try:
        reader = ZipReader(fd, len(data), 0, str(src))
        start = reader.data_start(reader.entry("in/data/0"))
    finally:
        os.close(fd)
    data[start + 5] ^= 0x01  # the directory still records the old CRC-32
    src.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"data/0 fails its zip checksum; IN is damaged"):
        _flatten(src, out)
    assert not out.exists()


def test_progress_reports_every_byte_copied_and_verified(tmp_path: Path) -> None:
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save({f"w{i}": torch.randn(4096) for i in range(5)}, src)
    seen: dict[str, list[tuple[int, int]]] = {}
    lock = threading.Lock()

    def progress(task: str, done: int, total: int) -> None:
        with lock:
            seen.setdefault(task, []).append((done, total))

    flatten_path(str(src), FlattenOptions(out=str(out), device="cpu"), progress)
    copied = seen["copy"]
    assert copied[-1] == (5 * 4096 * 4, 5 * 4096 * 4)
    assert [done for done, _ in copied] == sorted(done for done, _ in copied)
    assert max(done for done, _ in seen["verify"]) == max(total for _, total in seen["verify"]) >= 5 * 4096 * 4


@pytest.mark.parametrize("ways", [("copy_file_range",), ("copy_file_range", "sendfile")])
def test_without_kernel_copies_the_plain_reads_write_the_same_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ways: tuple[str, ...]
) -> None:
    from memlayout.flatten.writers import torch_zip_out

    src = tmp_path / "in.pt"
    torch.save(LstmLM().state_dict(), src)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _flatten(src, tmp_path / "a" / "flat.pt")
    real_init = torch_zip_out._Mover.__init__

    def without(self: Any, source: int, target: int) -> None:
        real_init(self, source, target)
        self.kernel_copy = "copy_file_range" not in ways
        self.sendfile = "sendfile" not in ways

    monkeypatch.setattr(torch_zip_out._Mover, "__init__", without)
    _flatten(src, tmp_path / "b" / "flat.pt")
    assert _masked_serialization_id(tmp_path / "a" / "flat.pt") == _masked_serialization_id(tmp_path / "b" / "flat.pt")


def test_out_can_be_a_pipe(tmp_path: Path) -> None:
    src = tmp_path / "in.pt"
    state = LstmLM().state_dict()
    torch.save(state, src)
    read_end, write_end = os.pipe()
    received = bytearray()

    def drain() -> None:
        while chunk := os.read(read_end, 1 << 16):
            received.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        result = _flatten(src, f"/dev/fd/{write_end}")
    finally:
        os.close(write_end)
        reader.join()
        os.close(read_end)
    assert not result.verified
    loaded = torch.load(io.BytesIO(bytes(received)), weights_only=True)
    for name, value in state.items():
        assert torch.equal(bits(loaded[name]), bits(value)), name


def test_torch_reads_out_with_its_calculated_storage_offsets(tmp_path: Path) -> None:
    # torch can compute each storage's offset from the previous one's instead of
    # reading local headers; that holds only for torch's own record layout and order.
    from torch.utils.serialization import config

    src, out = tmp_path / "in.pt", tmp_path / "flat.pt"
    state = {"model": TransposedTie().state_dict(), "slice": torch.randn(100)[3:9],
             "rnn": torch.nn.GRU(3, 4).state_dict()}
    torch.save(state, src)
    _flatten(src, out)
    previous = config.load.calculate_storage_offsets
    config.load.calculate_storage_offsets = True
    try:
        loaded = torch.load(out, mmap=True, weights_only=True)
    finally:
        config.load.calculate_storage_offsets = previous
    for section, values in state.items():
        expected = values if isinstance(values, dict) else {"": values}
        got = loaded[section] if isinstance(values, dict) else {"": loaded[section]}
        for name, value in expected.items():
            assert torch.equal(bits(got[name]), bits(value)), (section, name)


def test_a_file_saved_big_endian_is_refused(tmp_path: Path) -> None:
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save({"a": torch.arange(4.0)}, src)
    rewritten = io.BytesIO()
    with zipfile.ZipFile(src) as original, zipfile.ZipFile(rewritten, "w") as copy:
        for info in original.infolist():
            payload = b"big" if info.filename.endswith("/byteorder") else original.read(info)
            copy.writestr(info.filename, payload)
    src.write_bytes(rewritten.getvalue())
    with pytest.raises(FlattenError, match="big-endian machine"):
        _flatten(src, out)
    assert not out.exists()
