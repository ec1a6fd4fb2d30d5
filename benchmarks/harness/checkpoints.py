"""Benchmark checkpoints: generated once into `.bench-data/` and reused across runs.

Every checkpoint holds the same 400 tensors in the same shapes pattern, scaled so
the file reaches a target size; a size sweep then isolates the cost of bytes from
the cost of tensor count. Each has a `.safetensors` twin holding the same tensors,
so the in-process benchmark can compare against safetensors' own header listing.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = Path(os.environ.get("MEMLAYOUT_BENCH_DATA", ROOT / ".bench-data"))
TENSOR_COUNT = 400
MIB = 1 << 20


@dataclass(frozen=True)
class Checkpoint:
    """One generated checkpoint and its safetensors twin."""

    label: str
    torch_path: Path
    safetensors_path: Path
    nbytes: int
    """Bytes of tensor data (the file is that plus a few KiB of zip and pickle)."""


def _shapes(total_bytes: int) -> list[tuple[int, ...]]:
    # A transformer-like mix: per block, 4 square projections, 2 MLP matrices and
    # 2 norm/bias vectors; 50 blocks make 400 tensors. Shapes repeat across blocks,
    # as in real models, so ML102's (dtype, shape) buckets hold many candidates.
    blocks = TENSOR_COUNT // 8
    # Per block: 4*h*h + 2*h*4h = 12*h*h float32 elements, plus 2*h for vectors.
    hidden = max(8, int(math.sqrt(total_bytes / 4 / blocks / 12)))
    per_block: list[tuple[int, ...]] = [
        (hidden, hidden), (hidden, hidden), (hidden, hidden), (hidden, hidden),
        (4 * hidden, hidden), (hidden, 4 * hidden), (hidden,), (hidden,),
    ]
    return per_block * blocks


def checkpoint(label: str, total_bytes: int, twin: bool = False) -> Checkpoint:
    """The checkpoint named `label` of about `total_bytes`, created on first use.

    Args:
        label: File stem, e.g. "1GiB".
        total_bytes: Target bytes of tensor data.
        twin: Also make sure the safetensors twin exists (only the in-process
            comparison reads it, so the big sizes skip it and save disk).

    Returns:
        The paths of the torch.save file and its safetensors twin.
    """
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    torch_path = DATA_DIR / f"ckpt-{label}.pt"
    safetensors_path = DATA_DIR / f"ckpt-{label}.safetensors"
    shapes = _shapes(total_bytes)
    nbytes = sum(4 * math.prod(shape) for shape in shapes)
    wanted = [torch_path, safetensors_path] if twin else [torch_path]
    if not all(path.exists() for path in wanted):
        _write(shapes, [path for path in wanted if not path.exists()])
    return Checkpoint(label, torch_path, safetensors_path, nbytes)


def _write(shapes: list[tuple[int, ...]], paths: list[Path]) -> None:
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    state = {}
    for index, shape in enumerate(shapes):
        # Random values: no two tensors share contents, so ML102 has nothing to report
        # and every candidate is settled by its probe, as in a real trained model.
        state[f"blocks.{index // 8}.t{index % 8}"] = torch.randn(shape, generator=generator)
    for path in paths:
        save = save_file if path.suffix == ".safetensors" else torch.save
        partial = path.with_suffix(path.suffix + ".partial")
        save(state, str(partial))
        os.replace(partial, path)
