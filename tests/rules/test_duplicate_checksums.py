"""ML102 settles torch.save candidates by the zip directory's CRC-32s before reading any bytes."""

from __future__ import annotations

import struct
from pathlib import Path

import torch

from memlayout.load import load_path
from memlayout.load.records import LoadedSource
from memlayout.pipeline.inspection import inspect_source
from memlayout.rules import RuleConfig


class CountingReader:
    """Forwards to the loader's reader and remembers which storages were read."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.read_keys: list[str] = []

    def read(self, storage_key: str, start: int, length: int) -> bytes | memoryview:
        self.read_keys.append(storage_key)
        return self.inner.read(storage_key, start, length)  # type: ignore[attr-defined, no-any-return]

    def checksum(self, storage_key: str, start: int, length: int) -> int | None:
        return self.inner.checksum(storage_key, start, length)  # type: ignore[attr-defined, no-any-return]


def _inspect_counting(path: Path, config: RuleConfig) -> tuple[set[str], list[str], LoadedSource]:
    source = load_path(str(path))
    counting = CountingReader(source.reader)
    source.reader = counting
    try:
        report = inspect_source(source, config, select=["ML102"])
    finally:
        source.close()
    duplicates = {name for finding in report.findings for name in finding.tensors}
    keys_read = {
        next(s.key for s in report.facts.storages if s.id == t.storage): t.name for t in report.facts.tensors
    }
    return duplicates, [keys_read[key] for key in counting.read_keys], source


def _checkpoint(tmp_path: Path) -> Path:
    generator = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(32, 32, generator=generator) for i in range(12)}
    state["copy.weight"] = state["layer3.weight"].clone()
    path = tmp_path / "lost_tie.pt"
    torch.save(state, path)
    return path


def test_different_checksums_settle_candidates_without_reading_them(tmp_path: Path) -> None:
    duplicates, read, _ = _inspect_counting(_checkpoint(tmp_path), RuleConfig())
    assert duplicates == {"layer3.weight", "copy.weight"}
    # Only the true pair (equal CRCs) is ever read; the 11 look-alikes are not.
    assert set(read) == {"layer3.weight", "copy.weight"}


def test_without_checksums_every_candidate_is_probed(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path)
    source = load_path(str(path))
    source.reader.checksums.clear()  # type: ignore[union-attr]
    counting = CountingReader(source.reader)
    source.reader = counting
    try:
        report = inspect_source(source, RuleConfig(), select=["ML102"])
    finally:
        source.close()
    assert {name for f in report.findings for name in f.tensors} == {"layer3.weight", "copy.weight"}
    assert len(set(counting.read_keys)) == 13


def _damage_directory_crc(path: Path, entry_suffix: bytes) -> None:
    # Flip the CRC-32 of one entry in the central directory (not the local header),
    # as a damaged or doctored file might.
    data = bytearray(path.read_bytes())
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        name_length = struct.unpack_from("<H", data, at + 28)[0]
        name = bytes(data[at + 46 : at + 46 + name_length])
        if name.endswith(entry_suffix):
            crc = struct.unpack_from("<I", data, at + 16)[0]
            struct.pack_into("<I", data, at + 16, crc ^ 0xFFFF)
            path.write_bytes(bytes(data))
            return
        at = data.find(b"PK\x01\x02", at + 4)
    raise AssertionError(f"no entry ends with {entry_suffix!r}")


def test_deep_compares_contents_whatever_the_checksums_say(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path)
    # torch.save numbers storages in order of first use: copy.weight's is the 13th, key "12".
    _damage_directory_crc(path, b"/data/12")
    shallow, _, _ = _inspect_counting(path, RuleConfig())
    deep, _, _ = _inspect_counting(path, RuleConfig(deep=True))
    assert shallow == set()  # the recorded CRCs differ, and a metadata run trusts them
    assert deep == {"layer3.weight", "copy.weight"}
