"""ML203 fires only where torch really hands out misaligned memory.

Each case asks torch itself where the tensor lands (`data_ptr() % 16`) with the
loader a user would call, and requires ML203 to agree: a file's offsets count
only where torch uses the file's bytes in place (a zip under `mmap=True`, a
safetensors file); a legacy file is read into fresh, aligned memory. A
safetensors file is judged by its format's own standard (each tensor on a multiple
of its element size) unless the project asks for 16 bytes (`alignment = 16`).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import safetensors.torch
import torch
from typer.testing import CliRunner

from memlayout.cli.app import app
from memlayout.load import load_path
from memlayout.pipeline.inspection import run_inspection
from memlayout.rules import Finding, RuleConfig

ALIGNMENT = 16


def _findings(path: Path, alignment: int | None = None) -> list[Finding]:
    return list(run_inspection(str(path), RuleConfig(alignment=alignment), select=["ML203"]).findings)


def _misaligned_by_memlayout(path: Path, alignment: int | None = None) -> set[str]:
    return {name for f in _findings(path, alignment) for name in f.tensors}


def _misaligned_by_torch(tensors: dict[str, torch.Tensor], alignment: int = ALIGNMENT) -> set[str]:
    return {
        name for name, t in tensors.items()
        if t.numel() * t.element_size() >= ALIGNMENT and t.data_ptr() % alignment
    }


def _off_their_element_size(tensors: dict[str, torch.Tensor]) -> set[str]:
    return {
        name for name, t in tensors.items()
        if t.numel() * t.element_size() >= ALIGNMENT and t.data_ptr() % t.element_size()
    }


def _odd_sized_state() -> dict[str, torch.Tensor]:
    # Odd element counts put every storage after the first at an odd file offset.
    return {f"w{i}": torch.randn(3 + 2 * i) for i in range(6)}


def test_legacy_file_at_odd_offsets_is_aligned_once_loaded(tmp_path: Path) -> None:
    path = tmp_path / "legacy.pt"
    torch.save(_odd_sized_state(), path, _use_new_zipfile_serialization=False)
    with load_path(str(path)) as source:
        spans = source.reader.spans  # type: ignore[union-attr]
        assert any(span.start % ALIGNMENT for span in spans.values()), "the case needs unaligned file offsets"
    assert _misaligned_by_torch(torch.load(path, weights_only=True)) == set()
    assert _misaligned_by_memlayout(path) == set()


def test_legacy_file_with_a_view_into_its_storage_is_misaligned(tmp_path: Path) -> None:
    base = torch.randn(1025)
    path = tmp_path / "legacy_view.pt"
    torch.save({"w": base[1:], "ok": torch.randn(64)}, path, _use_new_zipfile_serialization=False)
    assert _misaligned_by_torch(torch.load(path, weights_only=True)) == {"w"}
    assert _misaligned_by_memlayout(path) == {"w"}


def test_zip_file_counts_its_offsets_under_mmap(tmp_path: Path) -> None:
    base = torch.randn(1025)
    path = tmp_path / "view.pt"
    torch.save({"w": base[1:], "ok": torch.randn(64)}, path)
    assert _misaligned_by_torch(torch.load(path, weights_only=True, mmap=True)) == {"w"}
    assert _misaligned_by_memlayout(path) == {"w"}


def test_safetensors_counts_its_file_offsets(tmp_path: Path) -> None:
    # safetensors sorts by element size; a 3-byte uint8 tensor after a 20-byte
    # float32 tensor puts the next uint8 tensor at an odd offset in the mapping.
    path = tmp_path / "odd.safetensors"
    safetensors.torch.save_file(
        {"f": torch.randn(5), "a": torch.zeros(3, dtype=torch.uint8), "b": torch.ones(40, dtype=torch.uint8)}, path
    )
    loaded = safetensors.torch.load_file(path)
    # As safetensors' own writer lays it out: every tensor on a multiple of its element size.
    assert _off_their_element_size(loaded) == set() == _misaligned_by_memlayout(path)
    # Asked for 16 bytes, ML203 names exactly the tensors torch hands out off 16.
    assert _misaligned_by_torch(loaded)
    assert _misaligned_by_memlayout(path, 16) == _misaligned_by_torch(loaded)


def test_safetensors_hint_is_the_copy_that_aligns_not_a_flatten_that_cannot(tmp_path: Path) -> None:
    path = tmp_path / "odd.safetensors"
    safetensors.torch.save_file(
        {"f": torch.randn(5), "a": torch.zeros(3, dtype=torch.uint8), "b": torch.ones(40, dtype=torch.uint8)}, path
    )
    (finding,) = _findings(path, 16)
    assert "memlayout flatten" not in finding.hint and "`.clone()`" in finding.hint
    # Follow it: a clone after loading starts on an aligned address.
    loaded = safetensors.torch.load_file(path)
    assert _misaligned_by_torch({name: loaded[name].clone() for name in finding.tensors}) == set()


def test_safetensors_shifted_only_by_its_header_gets_flatten_and_flatten_aligns_it(tmp_path: Path) -> None:
    tensors = {"a": torch.randn(8), "b": torch.randn(4, 4), "c": torch.randn(12)}  # 32, 64 and 48 bytes
    path = tmp_path / "shifted.safetensors"
    # Pad the header (through __metadata__) until the data section starts 8 bytes past a boundary.
    for length in range(64):
        safetensors.torch.save_file(tensors, path, metadata={"note": "x" * length})
        header = int.from_bytes(path.read_bytes()[:8], "little")
        if (8 + header) % ALIGNMENT == 8:
            break
    assert _misaligned_by_torch(safetensors.torch.load_file(path)) == set(tensors)
    # The format's own standard holds: each tensor on a multiple of its element size.
    assert _misaligned_by_memlayout(path) == set()

    (finding,) = _findings(path, 16)
    (command,) = [part for part in finding.hint.split("`") if part.startswith("memlayout flatten")]
    assert command == "memlayout flatten --align 16"
    out = tmp_path / "flat.safetensors"
    result = CliRunner().invoke(app, [*shlex.split(command)[1:], str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    # Followed: safetensors itself hands out every tensor aligned, and ML203 agrees.
    assert _misaligned_by_torch(safetensors.torch.load_file(out)) == set()
    assert _misaligned_by_memlayout(out, 16) == set()
