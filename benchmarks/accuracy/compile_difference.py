"""What torch.compile changes in a training step's memory, measured for real on the CPU: the figure
memlayout/activations/model/compiled.py and docs/ranks-gpu.md quote.

tests' Llama-style decoder (4 blocks, width 128, vocab 1000), 2x128 tokens, AdamW: the
steady-state step's peak by the CPU allocator's own events (tests/activations/measure.py),
eager and with each block `torch.compile`'d (Inductor, as torchtitan's `apply_compile`
does), against memlayout's prediction of the eager step.

Usage: python benchmarks/accuracy/compile_difference.py   (about 2 minutes: Inductor compiles 4 blocks)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> int:
    import torch

    from memlayout.activations import analyze
    from tests.activations.measure import allocator_peak_step
    from tests.activations.sharded_models import BATCH_SPECS, llama_style, token_batch

    peaks = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        model = llama_style()
        if compiled:
            for index, block in enumerate(model.layers):
                model.layers[index] = torch.compile(block)
        peaks["compiled" if compiled else "eager"] = allocator_peak_step(model, (), token_batch(seed=1)).peak_bytes
    predicted = analyze("tests.activations.sharded_models:llama_style", list(BATCH_SPECS)).summary.peak_bytes
    result = {**peaks, "predicted_eager": predicted,
              "compiled_under_eager": 1 - peaks["compiled"] / peaks["eager"], "torch": torch.__version__}
    print(json.dumps(result, indent=2))
    (ROOT / "benchmarks" / "results" / "compile_difference.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
