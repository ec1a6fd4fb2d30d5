"""flatten's summary says what reading OUT back proved, for each kind of change (issue 40).

A user flattened a checkpoint whose weight had strides [1, 32], read "verified
read back: every record's CRC-32 matches IN's bytes" and took it at its word, but
the re-strided weight's bytes are not IN's: they are IN's values in another
order. Each `verified` line now names the kind of change it covers, and each is
checked here against the files themselves.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import torch
from safetensors.torch import save_file

COPY_CLAUSE = "bytes copied from IN: each record of OUT, read back, has the CRC-32 of the bytes meant for it"
VALUES_CLAUSE = "tensors re-strided into dense order: every value, read back from OUT, equals IN's, bit for bit"


def memlayout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memlayout", *args], capture_output=True, text=True, timeout=300)


def verified_lines(summary: str) -> list[str]:
    """The clauses under `verified`: its line and the lines indented under it."""
    lines = summary.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  verified  "))
    clauses = [lines[start].removeprefix("  verified  ")]
    clauses += [line.strip() for line in lines[start + 1 :] if line.startswith(" " * 12) and line.strip()]
    return clauses


def as_bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.uint8)


def test_a_re_strided_tensor_is_said_to_match_by_value_not_by_bytes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    state = {"proj.weight": torch.randn(32, 16).t(), "head.weight": torch.randn(8, 16), "head.bias": torch.randn(8)}
    source, out = tmp_path / "model.pt", tmp_path / "flat.pt"
    torch.save(state, source)

    done = memlayout("flatten", str(source), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "proj.weight: strides [1, 16] -> [32, 1] (made dense)" in done.stdout, done.stdout
    clauses = verified_lines(done.stdout)
    assert any(c.startswith(COPY_CLAUSE) for c in clauses), clauses
    assert VALUES_CLAUSE in clauses, clauses
    assert not any("every record's CRC-32 matches IN's bytes" in c for c in clauses), clauses

    # What the values line says: every value of OUT is IN's, bit for bit, in dense strides.
    before, after = torch.load(source, weights_only=True), torch.load(out, weights_only=True)
    assert after["proj.weight"].is_contiguous()
    for name, value in before.items():
        assert torch.equal(as_bits(after[name]), as_bits(value)), name
    # Why no line may say the bytes are IN's: the re-strided weight's bytes in OUT are
    # found nowhere in IN's records.
    weight = as_bits(after["proj.weight"]).numpy().tobytes()
    with zipfile.ZipFile(source) as archive:
        records = [archive.read(name) for name in archive.namelist() if "/data/" in name]
    assert not any(weight in record for record in records)


def test_no_line_claims_a_check_the_writer_did_not_make(tmp_path: Path) -> None:
    """A change of order alone is proved by CRC; no values line appears where nothing was re-strided."""
    torch.manual_seed(0)
    source, out = tmp_path / "model.pt", tmp_path / "flat.pt"
    torch.save({f"layer{i}.weight": torch.randn(8, 8) for i in range(4)}, source)
    done = memlayout("flatten", str(source), "-o", str(out))
    assert done.returncode == 0, done.stderr
    clauses = verified_lines(done.stdout)
    assert any(c.startswith(COPY_CLAUSE) for c in clauses) and VALUES_CLAUSE not in clauses, clauses


def test_a_directory_says_what_was_verified_for_each_kind_of_file(tmp_path: Path) -> None:
    """One shard already flat (copied) and one rewritten: the summary names both checks, each by its kind.

    Both are laid out as safetensors lays a file out; the second is rewritten because the
    project asks for its data section on 64 bytes (`--align 64`), where save_file puts it on 8.
    """
    torch.manual_seed(0)
    directory = tmp_path / "model"
    directory.mkdir()
    save_file({"a.weight": torch.randn(16, 16)}, tmp_path / "raw_a.safetensors")
    # Shard 1 is what flatten writes (already flat); shard 2 is as safetensors wrote it.
    first = memlayout("flatten", str(tmp_path / "raw_a.safetensors"), "-o",
                      str(directory / "model-00001-of-00002.safetensors"), "--align", "64")
    assert first.returncode == 0, first.stderr
    save_file({"b.weight": torch.randn(4, 3), "b.bias": torch.randn(3, dtype=torch.float16)},
              directory / "model-00002-of-00002.safetensors")
    weight_map = {"a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors",
                  "b.bias": "model-00002-of-00002.safetensors"}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert memlayout("flatten", "--check", str(directory)).returncode == 0
    checked = memlayout("flatten", "--check", str(directory), "--align", "64")
    assert checked.returncode == 1 and "model-00001" not in checked.stdout, checked.stdout

    done = memlayout("flatten", str(directory), "-o", str(tmp_path / "flat"), "--align", "64")
    assert done.returncode == 0, done.stderr
    clauses = verified_lines(done.stdout)
    assert any(c.startswith("a file already flat, copied: OUT's bytes equal IN's") for c in clauses), clauses
    assert any(c.startswith("a file rewritten in flat order: every tensor, read back") for c in clauses), clauses
    copied = directory / "model-00001-of-00002.safetensors"
    assert (tmp_path / "flat" / copied.name).read_bytes() == copied.read_bytes()
