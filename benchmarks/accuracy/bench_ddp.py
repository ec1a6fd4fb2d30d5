"""DistributedDataParallel ranks: `memlayout activations --world-size 2 --ddp` against two real gloo ranks.

The docs quote this file's figures (docs/activations-ranks.md, "Many GPUs: DDP ranks"); a test checks them.
Every figure is measured in this run:
- each case's prediction (the command, in a child process, timed) against two real gloo
  ranks on this CPU, each judged by the CPU allocator's events over its fourth step
  (tests/activations/real_ddp_ranks.py), with gradient_as_bucket_view on and off, and the
  buckets the report lists against the ones DDP's own logging data gives on the real rank;
- for scale, the textbook estimate of a DDP rank with AdamW (accelerate's "Training using
  Adam", four times the parameter bytes, plus the buckets: five), which leaves out the batch;
- the batch `--fit batch` finds for a budget, with the real ranks at that batch and at one more.

Usage: python benchmarks/accuracy/bench_ddp.py [--quick]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from harness import Row, print_table, quick_requested, write_results  # noqa: E402

WORLD_SIZE = 2
SHORT = ("input_ids=int64[1,16]<1000", "labels=int64[1,16]<1000")
LONG = ("input_ids=int64[2,128]<1000", "labels=int64[2,128]<1000")
FIT_BUDGET = 48 * 2**20
"""The budget of the --fit case: a few samples of the Llama-style model's 128 tokens."""


@dataclass(frozen=True)
class Case:
    """One model, one rank's batch, one bucket cap (None: DDP's default)."""

    label: str
    builder: str
    batch: str
    """pkg.module:function making one rank's batch (args, kwargs) from a seed (the real ranks)."""
    specs: tuple[str, ...]
    """The same batch as --input specs."""
    bucket_cap_mb: float | None

    def command(self, view: bool) -> list[str]:
        inputs = [arg for spec in self.specs for arg in ("--input", spec)]
        cap = ["--bucket-cap-mb", f"{self.bucket_cap_mb:g}"] if self.bucket_cap_mb is not None else []
        return ["memlayout", "activations", self.builder, *inputs, "--world-size", str(WORLD_SIZE), "--ddp", *cap,
                *(["--gradient-as-bucket-view"] if view else [])]


TOKENS = "tests.activations.sharded_models:short_token_step_batch"
CASES = {
    "llama": Case("Llama (transformers), 2 layers, hidden 64, 1x16 tokens",
                  "tests.activations.sharded_models:transformers_llama", TOKENS, SHORT, 0.1),
    "gpt2": Case("GPT-2 (transformers), 2 layers, width 64, 1x16 tokens", "tests.activations.sharded_models:gpt2",
                 TOKENS, SHORT, 0.1),
    "bert": Case("BERT (transformers, masked LM), 2 layers, width 64, 1x16 tokens",
                 "tests.activations.sharded_models:bert", TOKENS, SHORT, 0.1),
    "cnn": Case("CNN, 5 convolutions with batch norm, 64 channels, 1x3x8x8",
                "tests.activations.sharded_models:wide_cnn", "tests.activations.sharded_models:image_batch",
                ("float32[1,3,8,8]",), 0.25),
    "llama-long": Case("Llama (transformers), 2x128 tokens, DDP's default buckets",
                       "tests.activations.sharded_models:transformers_llama",
                       "tests.activations.sharded_models:token_step_batch", LONG, None),
}
QUICK_CASES = ("llama",)


def predict(case: Case, view: bool) -> dict[str, Any]:
    """The command as a user runs it, in a child process; its report and wall time."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRANSFORMERS_VERBOSITY="error")
    command = [sys.executable, "-m", "memlayout", *case.command(view)[1:], "--format", "json"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env, cwd=ROOT)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(case.command(view))} failed:\n{done.stderr[-3000:]}")
    return {"report": json.loads(done.stdout), "seconds": seconds}


def real(case: Case, view: bool, batch_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Two real gloo ranks, each judged by the CPU allocator's events over its last step (real_ddp_ranks.py)."""
    from tests.activations import real_ddp_ranks, real_ranks

    options: dict[str, Any] = {"gradient_as_bucket_view": view}
    if case.bucket_cap_mb is not None:
        options["bucket_cap_mb"] = case.bucket_cap_mb
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        ranks = real_ranks.run_ranks(real_ddp_ranks.measure_ddp_step, WORLD_SIZE, Path(folder), case.builder,
                                     case.batch, options, None, batch_options)
    return {"ranks": ranks, "seconds": time.perf_counter() - start}


def mib(count: float) -> str:
    return f"{count / 2**20:.2f} MiB"


def within(value: float, truth: float, share: float) -> bool:
    return abs(value - truth) <= share * truth


def accuracy(keys: tuple[str, ...]) -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    raw: dict[str, Any] = {}
    for key in keys:
        case = CASES[key]
        for view in (False, True):
            label = f"{case.label}, gradient_as_bucket_view={'on' if view else 'off'}"
            ours, truth = predict(case, view), real(case, view)
            report = ours["report"]
            predicted = report["summary"]["peak_bytes"]
            buckets = [b["bytes"] for b in report["distributed"]["ddp"]["buckets"]]
            raw[f"{key}-{'view' if view else 'beside'}"] = {
                "command": " ".join(case.command(view)), "predicted": predicted, "buckets": buckets,
                "seconds": ours["seconds"], "real": [r["peak_bytes"] for r in truth["ranks"]],
                "real_buckets": truth["ranks"][0]["bucket_bytes"], "real_seconds": truth["seconds"],
            }
            for rank in truth["ranks"]:
                rows.append(Row(f"{label}: rank {rank['rank']}", mib(predicted),
                                f"real gloo rank {rank['rank']} {mib(rank['peak_bytes'])}",
                                predicted / rank["peak_bytes"],
                                "within 2%", within(predicted, rank["peak_bytes"], 0.02)))
            same = buckets == truth["ranks"][0]["bucket_bytes"]
            rows.append(Row(f"{label}: buckets", f"{len(buckets)}, {mib(sum(buckets))}",
                            f"DDP's own logging data {len(truth['ranks'][0]['bucket_bytes'])}",
                            float(len(buckets)) / len(truth["ranks"][0]["bucket_bytes"]), "the same bytes", same))
            state = report["ranks"][0]["shard_bytes"]
            formula = 5 * state  # parameters, gradients, two AdamW moments, buckets
            measured = max(r["peak_bytes"] for r in truth["ranks"])
            rows.append(Row(f"{label}: 5 x parameter bytes (no batch)", mib(formula), f"real {mib(measured)}",
                            formula / measured, "(anchor)", True))
            rows.append(Row(f"{label}: the prediction's wall time", f"{ours['seconds']:.1f} s",
                            f"two real ranks, four steps {truth['seconds']:.1f} s", ours["seconds"] / truth["seconds"],
                            "(info)", True))
    return rows, raw


FIT = Case("Llama-style in plain torch, 128 tokens a sample, --fit batch",
           "tests.activations.sharded_models:llama_style",
           TOKENS, ("input_ids=int64[1,128]<1000", "labels=int64[1,128]<1000"), None)


def fit_for_real() -> tuple[list[Row], dict[str, Any]]:
    """`--fit batch` with DDP on 2 ranks: the answer and one more, each run on two real gloo ranks."""
    from memlayout.activations.fit.size_search import fit
    from memlayout.activations.ranks.ddp import DdpOptions
    from memlayout.activations.ranks.parallel import ShardingOptions

    options = ShardingOptions(world_size=WORLD_SIZE, fsdp=False, ddp=DdpOptions())
    start = time.perf_counter()
    report = fit(FIT.builder, list(FIT.specs), budget=FIT_BUDGET, sharding=options, with_plan=False)
    seconds = time.perf_counter() - start
    size = report.without_plan.size
    at, over = real(FIT, False, {"batch": size, "length": 128}), real(FIT, False, {"batch": size + 1, "length": 128})
    at_peak = max(r["peak_bytes"] for r in at["ranks"])
    over_peak = max(r["peak_bytes"] for r in over["ranks"])
    command = (f"memlayout activations {FIT.builder} " + " ".join(f"--input '{s}'" for s in FIT.specs)
               + f" --world-size {WORLD_SIZE} --ddp --fit batch --budget {FIT_BUDGET}")
    rows = [
        Row(f"{FIT.label}: batch {size}, real ranks", mib(at_peak), f"budget {mib(FIT_BUDGET)}", at_peak / FIT_BUDGET,
            "<= 1.00x", at_peak <= FIT_BUDGET),
        Row(f"{FIT.label}: batch {size + 1}, real ranks", mib(over_peak), f"budget {mib(FIT_BUDGET)}",
            over_peak / FIT_BUDGET, "> 1.00x", over_peak > FIT_BUDGET),
    ]
    return rows, {"command": command, "size": size, "predicted": report.without_plan.peak_bytes,
                  "predicted_next": report.without_plan.next_peak_bytes, "real": at_peak, "real_next": over_peak,
                  "probes": len(report.probes), "seconds": seconds}


def table_markdown(results: dict[str, Any]) -> str:
    """The table docs/activations-ranks.md shows (a test checks that the page holds it): each case of the results file's
    last full run, memlayout's peak against each real gloo rank's."""
    lines = [
        "| model, one rank's batch | gradient_as_bucket_view | buckets | memlayout | real gloo ranks 0, 1 "
        "| memlayout / real |",
        "|---|---|---|---|---|---|",
    ]
    for key, case in CASES.items():
        for view in (False, True):
            figures = results["raw"]["cases"][f"{key}-{'view' if view else 'beside'}"]
            real_peaks = figures["real"]
            ratios = "; ".join(f"{figures['predicted'] / peak:.4f}" for peak in real_peaks)
            lines.append(
                f"| {case.label} | {'on' if view else 'off'} | {len(figures['buckets'])}, "
                f"{mib(sum(figures['buckets']))} | {mib(figures['predicted'])} | "
                f"{', '.join(mib(peak) for peak in real_peaks)} | {ratios} |"
            )
    return "\n".join(lines)


def fit_markdown(results: dict[str, Any]) -> str:
    """The sentence docs/activations-ranks.md gives `--fit batch` with DDP, from the results file's last full run."""
    figures = results["raw"]["fit"]
    return (f"`{figures['command']}` answers batch {figures['size']}; two real gloo ranks peak at "
            f"{mib(figures['real'])} at batch {figures['size']} and {mib(figures['real_next'])} at batch "
            f"{figures['size'] + 1}, against a budget of {mib(FIT_BUDGET)}.")


def main(argv: list[str]) -> int:
    quick = quick_requested(argv)
    rows, raw = accuracy(QUICK_CASES if quick else tuple(CASES))
    results: dict[str, Any] = {"cases": raw}
    if not quick:
        fit_rows, results["fit"] = fit_for_real()
        rows += fit_rows
    print_table("memlayout activations --world-size 2 --ddp: each rank against two real gloo ranks", rows)
    write_results("ddp", rows, results, quick)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
