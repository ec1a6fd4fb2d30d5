"""`memlayout activations --device cuda --autocast bf16`: what a fake-CUDA prediction costs against a CPU one.

The goal (issue 27): a `--device cuda --autocast bf16` prediction costs at most 1.5x
the CPU prediction of the same model. Each model is predicted three ways through
`memlayout.activations.analyze`, the call `memlayout activations` makes, with the
model given as a Hugging Face config directory (built from its config, no hub):

- (a) `device="cpu"`, no autocast: the float32 CPU prediction;
- (b) `device="cpu", autocast="bf16"`: the same mixed precision on the CPU;
- (c) `device="cuda", autocast="bf16", gpu="h100"` (`--gpu h100`): fake CUDA tensors,
  no GPU needed, on torch's CUDA build.

The variants alternate round by round (a, b, c, a, b, c, ...), so that the shared
machine's drift hits all three alike; the goal rows are the medians of the rounds
and the ratios c/a and c/b of CPU time (the figure to read on a loaded machine;
wall times are beside them). Everything runs in one process, which first makes one
prediction of each variant on a few tokens of the tiny Llama (imports: torch's CUDA
modules, transformers, memlayout's; kept in the raw results). Each model's first
round is then its first prediction in the process: on the CPU that round also runs
real kernels to learn their output storage and scratch (kernel_storage.py, cached
per op and shape for the process), as every `memlayout activations` command does
once, so it is shown on rows of its own (one run each) and left out of the medians.

It needs torch's CUDA build (`make test-torch-2.14.1` builds `.venv-torch-2.14.1`,
which run_all.py runs it with where it exists). On a CPU-only torch it prints one
line saying so, with the install hint `--device cuda` gives, and exits 0.

Usage: python benchmarks/gpu/bench_cuda_prediction.py [--quick]
"""

from __future__ import annotations

import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from harness import Row, print_table, quick_requested, write_results  # noqa: E402

GOAL = 1.5
VARIANTS: dict[str, dict[str, Any]] = {
    "cpu fp32": {"device": "cpu"},
    "cpu bf16": {"device": "cpu", "autocast": "bf16"},
    "cuda bf16": {"device": "cuda", "autocast": "bf16", "gpu": "h100"},
}
"""The three predictions of each model: analyze's keyword arguments, as the CLI's flags give them."""


def cuda_build_missing() -> str | None:
    """Why this torch cannot trace fake CUDA tensors, in memlayout's own words and hint; None where it can."""
    from memlayout.activations.trace.world import StepWorld
    from memlayout.errors import UsageError

    try:
        StepWorld("fake", "cuda")
    except UsageError as exc:
        return exc.one_line()
    return None


def _llama_tiny(directory: str) -> str:
    return str(ROOT / "benchmarks" / "configs" / "llama-tiny")


def _gpt2(directory: str) -> str:
    from transformers import GPT2Config

    GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=8000, n_positions=512,
               architectures=["GPT2LMHeadModel"]).save_pretrained(directory)
    return directory


def _bert(directory: str) -> str:
    from transformers import BertConfig

    BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
               vocab_size=8000, max_position_embeddings=512,
               architectures=["BertForMaskedLM"]).save_pretrained(directory)
    return directory


def _llama_1b_width(directory: str) -> str:
    from transformers import LlamaConfig

    # real_reserved.llama_1b's config (the 1.1B Llama of docs/gpu.md's tables), 4 of its 16 layers: each
    # layer costs the same, and 16 would take about 4 minutes a round here
    LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=4, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096,
                architectures=["LlamaForCausalLM"]).save_pretrained(directory)
    return directory


def _tokens(batch: int, length: int, vocab: int) -> list[str]:
    return [f"int64[{batch},{length}]<{vocab}", f"labels=int64[{batch},{length}]<{vocab}"]


MODELS: dict[str, tuple[Callable[[str], str], list[str], bool]] = {
    "Llama tiny (configs/llama-tiny: 4 layers, 128 wide) 4x256": (_llama_tiny, _tokens(4, 256, 1000), True),
    "GPT-2 (4 layers, 256 wide, vocab 8000) 4x512": (_gpt2, _tokens(4, 512, 8000), True),
    "BERT MLM (4 layers, 256 wide, vocab 8000) 8x256": (_bert, _tokens(8, 256, 8000), True),
    "Llama 1.1B's layers (2048 wide, GQA 32/8, 4 of 16 layers) 1x2048": (_llama_1b_width, _tokens(1, 2048, 32000),
                                                                          False),
}
"""name -> (writes the config into a directory and returns the target, inputs, in --quick too)."""


def predict(target: str, inputs: list[str], variant: dict[str, Any]) -> dict[str, Any]:
    import memlayout.activations as act

    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    report = act.analyze(target, inputs, **variant)
    return {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
            "peak_bytes": report.summary.peak_bytes}


def warm_process() -> dict[str, Any]:
    """One prediction of each variant on a few tokens of the tiny Llama: what the process imports, paid once."""
    target = _llama_tiny("")
    return {name: predict(target, _tokens(1, 8, 1000), variant) for name, variant in VARIANTS.items()}


def measure(target: str, inputs: list[str], rounds: int) -> dict[str, Any]:
    """The model's first round (its first prediction in the process), then `rounds` rounds of the variants in turn."""
    first = {name: predict(target, inputs, variant) for name, variant in VARIANTS.items()}
    timed: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    for _ in range(rounds):
        for name, variant in VARIANTS.items():
            timed[name].append(predict(target, inputs, variant))
    medians = {name: {"seconds": statistics.median(r["seconds"] for r in runs),
                      "cpu_seconds": statistics.median(r["cpu_seconds"] for r in runs),
                      "peak_bytes": runs[-1]["peak_bytes"]} for name, runs in timed.items()}
    return {"first_round": first, "rounds": timed, "medians": medians}


def rows_for(label: str, measured: dict[str, Any]) -> list[Row]:
    rows = []
    for kind, figures, goal in (("median of warm rounds", measured["medians"], True),
                                ("first in the process", measured["first_round"], False)):
        cuda = figures["cuda bf16"]
        for peer_name in ("cpu fp32", "cpu bf16"):
            peer = figures[peer_name]
            ratio = cuda["cpu_seconds"] / peer["cpu_seconds"]
            rows.append(Row(f"{label}: cuda bf16 / {peer_name}, {kind}",
                            f"{cuda['cpu_seconds']:.2f} s CPU ({cuda['seconds']:.2f} s wall)",
                            f"{peer_name} {peer['cpu_seconds']:.2f} s CPU ({peer['seconds']:.2f} s wall)", ratio,
                            f"<= {GOAL:.2f}x" if goal else "(info: one run)", ratio <= GOAL or not goal))
    return rows


def main(argv: list[str]) -> int:
    import torch

    missing = cuda_build_missing()
    if missing is not None:
        print(f"bench_cuda_prediction: skipped, no figures: {missing}; `make test-torch-2.14.1` builds "
              ".venv-torch-2.14.1, which benchmarks/run_all.py runs this script with")
        return 0
    quick = quick_requested(argv)
    rows: list[Row] = []
    raw: dict[str, Any] = {"torch": torch.__version__, "variants": VARIANTS, "process_warmup": warm_process()}
    for label, (write_config, inputs, in_quick) in MODELS.items():
        if quick and not in_quick:
            continue
        rounds = 2 if quick else (3 if not in_quick else 5)
        with tempfile.TemporaryDirectory() as directory:
            raw[label] = {"inputs": inputs, **measure(write_config(directory), inputs, rounds)}
        rows += rows_for(label, raw[label])
        print(f"{label}: done", file=sys.stderr, flush=True)
    print_table(f"memlayout activations: a --device cuda --autocast bf16 prediction against the CPU's "
                f"(torch {torch.__version__}, medians of alternating rounds)", rows)
    write_results("cuda_prediction", rows, raw, quick)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
