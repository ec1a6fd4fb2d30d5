"""Op-level checkpointing: memlayout's policies against torchtitan's own, on ranks FSDPMemTracker measures.

torchtitan is a benchmark dependency (the `bench` extra, which `make venv` installs and the torch
matrix's venvs do not: the Makefile's MATRIX_TESTS leave this file out).

torchtitan (the package, imported: benchmarks/accuracy/torchtitan_llama.py) applies its selective
op-level checkpointing with its own `checkpoint_wrapper` and policy; memlayout applies its
built-in policy by the sharding code it prints. Saving what torchtitan saves, the ranks'
figures are the same to the byte; `torchtitan` as memlayout names it also saves the CPU's
attention kernel, which torchtitan's list lacks (it names CUDA's two).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from memlayout.activations.ranks import analyze_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks" / "accuracy"))

SPEC = ["int64[2,256]<1000", "int64[2,256]<1000"]
BLOCKS = ("model.layers.*",)


def _ranks(target: str, **settings: object) -> int:
    report = analyze_ranks(f"torchtitan_llama:{target}", SPEC, world_size=2, fsdp=True, fsdp_modules=BLOCKS, **settings)
    return report.largest.peak_bytes


@pytest.fixture(scope="module")
def torchtitans() -> int:
    return _ranks("debug_model")


def test_saving_what_torchtitan_saves_gives_its_figure_to_the_byte(torchtitans: int) -> None:
    ours = _ranks("debug_model_plain", selective_ac="every-other-matmul,collectives,max", ac_modules=BLOCKS)
    assert ours == torchtitans


def test_memlayouts_torchtitan_policy_saves_the_cpus_attention_too(torchtitans: int) -> None:
    ours = _ranks("debug_model_plain", selective_ac="torchtitan", ac_modules=BLOCKS)
    # Attention's outputs are kept rather than rerun: at the peak (in backward) at least one block's, [2, 256, 256] in
    # float32 (16 heads of 16), with its log-sum-exp.
    assert ours - torchtitans >= 2 * 256 * 256 * 4
