"""--deep streams with bounded memory: RSS grows by about one tensor, not by the file."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

MIB = 1 << 20
TENSOR_MIB = 32
TENSORS = 8

# The child (benchmarks/speed/deep_rss_probe.py, which bench_deep.py runs too) polls its
# own RSS while the deep run goes; see there for why ru_maxrss cannot serve.
_PROBE = Path(__file__).resolve().parents[2] / "benchmarks" / "speed" / "deep_rss_probe.py"


def big_state() -> dict[str, torch.Tensor]:
    elements = TENSOR_MIB * MIB // 4
    side = int(elements**0.5)
    state = {f"w{i}": torch.randn(side, side) for i in range(TENSORS - 1)}
    state["w0"][3, 5] = float("nan")
    return state


def write_torch_zip(directory: Path) -> Path:
    state = big_state()
    state["w_t"] = torch.randn(*state["w0"].shape).t()  # a strided tensor takes the gather path
    torch.save(state, directory / "big.pt")
    return directory / "big.pt"


def write_safetensors(directory: Path) -> Path:
    save_file(big_state(), directory / "big.safetensors")
    return directory / "big.safetensors"


def write_sharded_hf_directory(directory: Path) -> Path:
    model = directory / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    state = big_state()
    names = list(state)
    weight_map = {}
    for index, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        shard = f"model-0000{index + 1}-of-00002.safetensors"
        save_file({n: state[n] for n in part}, model / shard)
        weight_map.update(dict.fromkeys(part, shard))
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return model


@pytest.mark.parametrize("write", [write_torch_zip, write_safetensors, write_sharded_hf_directory])
def test_deep_scan_memory_stays_near_one_tensor(tmp_path: Path, write: Callable[[Path], Path]) -> None:
    path = write(tmp_path)
    result = subprocess.run([sys.executable, str(_PROBE), str(path)], capture_output=True, text=True, check=True)
    measured = json.loads(result.stdout)
    assert "ML503" in measured["codes"]
    # The promise is ~64 MiB beyond one tensor; the files are over 200 MiB, so a scan
    # that kept its pages mapped would grow by far more than this generous bound.
    assert measured["growth"] < (TENSOR_MIB + 96) * MIB, measured
