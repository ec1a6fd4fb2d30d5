"""Tensor-parallel serving across the zoo: each rank's forward, predicted against 2 real gloo ranks.

Usage: python -m benchmarks.accuracy.tp_serving_sweep [--sample N] [--seed S] [--timeout SECONDS] [--arch NAME ...]
                                              [--new-tokens N]

For each causal language model of the zoo's catalog (or `--sample N` of them drawn with `--seed`), less the Llama
the tests check, in a process of its own with a timeout: `analyze_ranks` with `--step inference --world-size 2
--tp 2` on the model as the zoo builds it (its prompt cut to 32 tokens), then 2 real gloo ranks
(tests/activations/real_ranks.py `measure_serving`), twice, that build the same model, run the
`parallelize_module` code the report prints, and measure one forward as serving code runs it by the CPU
allocator's events. Each record keeps every real rank's peak, and is within 2% when the prediction is within 2% of
every one whose profile saw all its frees. A model whose projections the plan cannot split (a fused q/k/v, Conv1D
layers) is recorded as unsupported, with the one-line reason memlayout gives. Not part of
`make bench`: torch 2.14 or later (serving_step.py). Writes `benchmarks/results/tp_serving_sweep.json`.

With `--new-tokens N`, the step is `--step generate --new-tokens N` (transformers' default cache) instead: a greedy
`model.generate` of N tokens after the prompt on each side, the real ranks' end-of-sequence id one no token can be,
so that they run all N. Writes `benchmarks/results/tp_generate_sweep.json`.

Both sides run the real ranks' prompt (real_ranks.py `serving_prompt`): whether its tokens hold the model's pad id
decides whether transformers builds an attention mask, and with it which attention kernel runs. Each real rank's
peak is from a profile that saw every free (real_ranks.py `gloo_releases_first`): one that missed a free made on
gloo's worker thread read up to 22% high.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "tp_serving_sweep.json"
TOLERANCE = 0.02
PROMPT = 32
WORLD = 2
RUNS = 2
"""Real runs of each step (each on WORLD ranks)."""
ARCH_VARIABLE = "MEMLAYOUT_TP_SWEEP_ARCH"
"""How the real ranks, spawned processes, learn which architecture to build (`build_from_environment`)."""
TUNED_ON = frozenset({"LlamaForCausalLM"})
NEW_TOKENS_VARIABLE = "MEMLAYOUT_TP_SWEEP_NEW_TOKENS"
"""How each architecture's process learns `--new-tokens` (unset: one forward)."""


def build_from_environment() -> Any:
    """The zoo's model named by ARCH_VARIABLE, in eval mode: what each real rank builds."""
    from benchmarks.accuracy.zoo.catalog import by_name

    return by_name()[os.environ[ARCH_VARIABLE]].build().model.eval()


def check_one(name: str) -> dict[str, Any]:
    """One architecture's record: predicted, then measured on real ranks running the printed code."""
    import torch

    from benchmarks.accuracy.zoo.catalog import by_name
    from benchmarks.accuracy.zoo.check import memlayout_error, one_line
    from memlayout.activations.ranks import analyze_ranks
    from memlayout.activations.ranks.parallel import ShardingOptions
    from memlayout.activations.step.generate import Generation
    from memlayout.errors import UsageError
    from tests.activations.real_ranks import measure_serving, run_ranks, serving_prompt

    torch.set_num_threads(1)
    record: dict[str, Any] = {"architecture": name, "status": "ok"}
    try:
        built = by_name()[name].build()
    except Exception as exc:
        return {**record, "status": "unsupported", "reason": f"does not build: {one_line(exc)}"}
    ids = built.kwargs.get("input_ids")
    if ids is None:
        return {**record, "status": "unsupported", "reason": "it takes no input_ids"}
    vocab = int(built.model.config.vocab_size)
    # The real ranks' own prompt: whether its tokens hold the pad id decides whether transformers builds an
    # attention mask, and so which attention kernel runs (the zoo's prompt had none where the ranks' had some).
    ids = serving_prompt([int(ids.shape[0]), min(PROMPT, int(ids.shape[1]))], vocab)
    os.environ[ARCH_VARIABLE] = name
    new_tokens = int(os.environ[NEW_TOKENS_VARIABLE]) if os.environ.get(NEW_TOKENS_VARIABLE) else None
    generation = None if new_tokens is None else Generation(new_tokens=new_tokens, cache="dynamic")
    sharding = ShardingOptions(world_size=WORLD, fsdp=False, tp=WORLD,
                               serving="inference" if generation is None else "generate")
    try:
        report = analyze_ranks(build_from_environment(), [ids], sharding=sharding, generation=generation)
        predicted, code, plan = report.summary.peak_bytes, report.sharding.code(), report.sharding.tp_plan
    except UsageError as exc:
        return {**record, "status": "unsupported", "reason": exc.one_line()[:300]}
    except Exception as exc:
        return {**record, "status": "failed", "reason": f"no prediction: {memlayout_error(exc)}"}
    ranks: list[dict[str, Any]] = []
    try:
        for _ in range(RUNS):
            with tempfile.TemporaryDirectory() as folder:
                ranks += run_ranks(measure_serving, WORLD, Path(folder),
                                   "benchmarks.accuracy.tp_serving_sweep:build_from_environment",
                                   code, list(ids.shape), vocab, new_tokens)
    except Exception as exc:
        # A rank's exception arrives as a ProcessRaisedException whose first line is a header; its last is the error.
        lines = [line for line in str(exc).splitlines() if line.strip()]
        return {**record, "status": "failed",
                "reason": f"the real ranks fail: {one_line(exc)} {lines[-1] if lines else ''}"[:400]}
    measured = [r["peak_bytes"] for r in ranks]
    complete = [r["peak_bytes"] for r in ranks if r["complete"]]
    return {**record, "predicted_peak_bytes": predicted, "measured_peak_bytes": measured,
            "ratio_to_lowest": round(predicted / min(measured), 4),
            "ratio_to_highest": round(predicted / max(measured), 4),
            "within_2pct": bool(complete) and all(abs(predicted - peak) <= TOLERANCE * peak for peak in complete),
            "incomplete_profiles": len(ranks) - len(complete), "profiles": sum(r["profiles"] for r in ranks),
            "sharded_modules": len(plan)}


def candidates() -> list[str]:
    from benchmarks.accuracy.zoo.catalog import by_name

    return sorted(n for n, a in by_name().items() if a.family == "causal-lm" and n not in TUNED_ON)


def main(argv: list[str]) -> int:
    from benchmarks.accuracy.zoo.check import drawn, sweep_parser

    # No --jobs: each architecture's real ranks take both cores.
    parser = sweep_parser("benchmarks.accuracy.tp_serving_sweep", __doc__.splitlines()[0], timeout=600.0, jobs=False)
    parser.add_argument("--new-tokens", type=int, help="predict and measure a generate of this many tokens")
    options = parser.parse_args(argv)
    if options.one:
        print(json.dumps(check_one(options.one)))
        return 0
    from benchmarks.accuracy.zoo.check import run_check_in_child
    from benchmarks.accuracy.zoo.run import versions

    names = drawn(candidates, options)
    if options.new_tokens is not None:
        os.environ[NEW_TOKENS_VARIABLE] = str(options.new_tokens)  # inherited by each architecture's process
    started = time.perf_counter()
    records = [run_check_in_child("benchmarks.accuracy.tp_serving_sweep", name, options.timeout) for name in names]
    runnable = [r for r in records if r["status"] != "unsupported"]
    within = [r for r in runnable if r.get("within_2pct")]
    for r in records:
        print(f"{r['architecture']}: {r['status']} {r.get('ratio_to_lowest', '')} {r.get('reason', '')}")
    print(f"within 2% of every real rank's peak: {len(within)} of {len(runnable)} runnable "
          f"({len(records)} drawn)")
    result = {"command": shlex.join(["python", "-m", "benchmarks.accuracy.tp_serving_sweep", *argv]),
              "versions": versions(), "prompt": PROMPT, "new_tokens": options.new_tokens, "world_size": WORLD,
              "runs": RUNS, "wall_seconds": round(time.perf_counter() - started, 1),
              "architectures": len(records), "runnable": len(runnable), "within_2pct": len(within),
              "records": records}
    from memlayout.io.atomic_write import write_text

    results = RESULTS if options.new_tokens is None else RESULTS.with_name("tp_generate_sweep.json")
    write_text(str(results), json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
