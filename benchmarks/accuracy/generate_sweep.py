"""`--step generate` over the zoo's architectures: the prediction against a real generate's allocator events.

For each architecture of the zoo catalog (benchmarks/accuracy/zoo/catalog.py) in the families
that generate text (causal-lm and seq2seq) whose model can generate, in a fresh
process with a timeout, and for each cache (transformers' default DynamicCache and the
static one):
- the real `model.generate(prompt, max_new_tokens=32, do_sample=False)` as serving code
  runs it (eval mode, `torch.inference_mode`, the cache turned on), its peak by the CPU
  allocator's own events (tests/activations/measure.py's allocator_generate_peak), a
  first generate run unprofiled. It is given an end-of-sequence id no token can be
  (2**40), so that it runs all 32 tokens whatever its random weights pick, and the
  record says how many it returned;
- memlayout's prediction, `analyze(..., step="generate", new_tokens=32, cache=...)`, on
  fake tensors.

The prompt is the zoo's token ids cut to PROMPT tokens (4 sequences). A record is
within 2% when the peak of every cache its real generate runs with is (a model whose real
generate refuses the static cache is judged by the dynamic one). Prints each ratio and the share within 2%, and
writes benchmarks/results/generate_sweep.json.

Usage:
    python -m benchmarks.accuracy.generate_sweep --sample 40 --seed 3 --jobs 2
    python -m benchmarks.accuracy.generate_sweep --arch LlamaForCausalLM --arch T5ForConditionalGeneration
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "generate_sweep.json"
TOLERANCE = 0.02
NEW_TOKENS = 32
PROMPT = 32
FAMILIES = ("causal-lm", "seq2seq")
CACHES = ("dynamic", "static")
NO_TOKEN = 1 << 40
"""The real generate's end-of-sequence id: no vocabulary is that large."""
TUNED_ON = frozenset({"LlamaForCausalLM", "GPT2LMHeadModel", "T5ForConditionalGeneration"})
"""The architectures tests/activations/step/test_generate.py checks; the sweep leaves them out."""


def _use_cache(config: Any) -> None:
    """The cache on, as generate runs (the zoo builds its models for training, with use_cache=False)."""
    from transformers import PreTrainedConfig

    if hasattr(config, "use_cache"):
        config.use_cache = True
    for value in vars(config).values():
        if isinstance(value, PreTrainedConfig):
            _use_cache(value)


def _built(name: str) -> tuple[Any, Any]:
    """The architecture's model, ready to generate, and its prompt."""
    from benchmarks.accuracy.zoo.catalog import by_name

    built = by_name()[name].build()
    model = built.model
    _use_cache(model.config)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.use_cache = True  # made from the config when the model was built
    ids = built.kwargs.get("input_ids")
    if ids is None or not model.can_generate():
        raise LookupError("it takes no input_ids" if ids is None else f"{type(model).__name__} cannot generate")
    return model, ids[:, :PROMPT].contiguous()


def check_one(name: str) -> dict[str, Any]:
    """One architecture's record: built, measured for real, predicted, for each cache."""
    import torch

    from benchmarks.accuracy.zoo.catalog import by_name

    torch.set_num_threads(1)  # the sweep shares the machine; one thread also keeps the kernels' order fixed
    record: dict[str, Any] = {"architecture": name, "family": by_name()[name].family, "status": "ok", "caches": {}}
    for cache in CACHES:
        try:
            record["caches"][cache] = _check_cache(name, cache)
        except _NotRun as why:
            record["caches"][cache] = {"status": why.status, "reason": str(why)[:300]}
    statuses = {c["status"] for c in record["caches"].values()}
    record["status"] = "unsupported" if statuses == {"unsupported"} else "failed" if "failed" in statuses else "ok"
    ran = [c for c in record["caches"].values() if c["status"] == "ok"]
    record["within_2pct"] = record["status"] == "ok" and all(c["within_2pct"] for c in ran)
    return record


class _NotRun(Exception):
    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        """unsupported (the model or its real generate does not run) or failed (memlayout's prediction)."""


def _check_cache(name: str, cache: str) -> dict[str, Any]:
    import memlayout.activations as act
    from benchmarks.accuracy.zoo.check import memlayout_error, one_line, seed_other_generators
    from tests.activations.measure import allocator_generate_peak

    extra = {"cache_implementation": "static"} if cache == "static" else {}
    try:
        model, ids = _built(name)
    except Exception as exc:
        raise _NotRun("unsupported", f"does not build: {one_line(exc)}") from exc
    try:
        seed_other_generators()
        measured, out = allocator_generate_peak(model, (ids,), {}, max_new_tokens=NEW_TOKENS, do_sample=False,
                                                eos_token_id=NO_TOKEN, **extra)
    except Exception as exc:
        raise _NotRun("unsupported", f"the real generate fails: {one_line(exc)}") from exc
    model, ids = _built(name)
    try:
        report = act.analyze(model, [ids], step="generate", new_tokens=NEW_TOKENS, cache=cache)
    except Exception as exc:
        raise _NotRun("failed", f"no prediction: {memlayout_error(exc)}") from exc
    predicted = report.summary.peak_bytes
    assert report.generation is not None
    return {
        "status": "ok", "measured_peak_bytes": measured, "predicted_peak_bytes": predicted,
        "ratio": round(predicted / measured, 4), "within_2pct": abs(predicted - measured) <= TOLERANCE * measured,
        "tokens_returned": int(out.shape[1]), "cache_bytes": report.generation.cache_bytes,
        "peak_forward": report.generation.peak_forward,
    }


def run_child(name: str, timeout: float) -> dict[str, Any]:
    """`check_one` in a fresh process (benchmarks/accuracy/zoo/check.py's `run_check_in_child`)."""
    from benchmarks.accuracy.zoo.check import run_check_in_child

    return run_check_in_child("benchmarks.accuracy.generate_sweep", name, timeout)


def candidates() -> list[str]:
    """The catalog's architectures in the families that generate text, less those the tests were tuned on."""
    from benchmarks.accuracy.zoo.catalog import by_name

    return sorted(name for name, arch in by_name().items() if arch.family in FAMILIES and name not in TUNED_ON)


def main(argv: list[str]) -> int:
    from benchmarks.accuracy.zoo.check import drawn, sweep_parser

    parser = sweep_parser("benchmarks.accuracy.generate_sweep", __doc__.splitlines()[0], timeout=900.0)
    parser.add_argument("--retry-failed", action="store_true",
                        help="run again the architectures the results file records as failed (a timeout on a busy "
                             "machine), with this run's --timeout and --jobs, and keep the others' records")
    options = parser.parse_args(argv)
    if options.one:
        print(json.dumps(check_one(options.one)))
        return 0
    previous = json.loads(RESULTS.read_text()) if options.retry_failed else None
    if previous is not None:
        names = [r["architecture"] for r in previous["records"] if r["status"] == "failed"]
    else:
        names = drawn(candidates, options)
    started = time.perf_counter()
    with ThreadPoolExecutor(options.jobs) as pool:
        records = list(pool.map(lambda name: run_child(name, options.timeout), names))
    wall_seconds = round(time.perf_counter() - started, 1)
    command = shlex.join(["python", "-m", "benchmarks.accuracy.generate_sweep", *argv])
    retried = None
    if previous is not None:
        # The draw stays the first run's; the retry's own command and time are recorded beside it.
        again = {r["architecture"]: r for r in records}
        records = [again.get(r["architecture"], r) for r in previous["records"]]
    from benchmarks.accuracy.zoo.run import versions

    run_versions = versions()
    if previous is not None:
        retried = {"command": command, "versions": run_versions, "architectures": sorted(again),
                   "wall_seconds": wall_seconds}
        command, wall_seconds, run_versions = previous["command"], previous["wall_seconds"], previous["versions"]

    runnable = [r for r in records if r["status"] != "unsupported"]
    within = [r for r in runnable if r.get("within_2pct")]
    for record in records:
        ratios = ", ".join(f"{cache} {c['ratio']:.4f}" if "ratio" in c else f"{cache} {c['status']}: {c['reason']}"
                           for cache, c in record.get("caches", {}).items()) or "-"
        print(f"{record['architecture']}: {record['status']}, predicted/measured {ratios} {record.get('reason', '')}")
    print(f"within 2% of the allocator's peak, both caches: {len(within)} of {len(runnable)} runnable "
          f"({len(records)} drawn)")
    result = {"command": command, "versions": run_versions, "new_tokens": NEW_TOKENS, "prompt": PROMPT,
              "wall_seconds": wall_seconds, "architectures": len(records), "runnable": len(runnable),
              "within_2pct": len(within), "records": records, **({"retried": retried} if retried else {})}
    from memlayout.io.atomic_write import write_text

    write_text(str(RESULTS), json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
