"""`--fit batch` over the zoo's language models: each answer's decision checked on real CPU steps.

For each causal and masked language model of the zoo catalog (benchmarks/accuracy/zoo/catalog.py,
transformers' registry built from tiny configs), in a fresh process with a timeout:
- memlayout's predictions of the step at batch 4 and 5 x 64 tokens (AdamW), and a budget
  between the two peaks, at a share drawn per architecture (seeded by its name) as a
  user's card falls anywhere between two batches' peaks: the plain answer lands near 4,
  and a plan has room to reach further;
- `fit(model, ["int64[4,64]<V", "labels=int64[4,64]<V"], budget=...)`, both answers;
- the decisions, on real CPU steps of the model built for real with token ids that avoid its
  special ids, each step's peak by the CPU allocator's own events (tests/activations/measure.py's
  allocator_peak_step, the zoo's measure):
  - no plan: the step at s fits the budget and the step at s + 1 does not;
  - with the plan: the plan `--fit` reports, applied with torch.utils.checkpoint, fits at its
    size s, and the same plan at s + 1 does not. (That no other plan fits at s + 1 is the
    `--budget` search's claim, which the size search confirms by running it there.)
  A decision holds when both sides do; where one does not, the record gives by how much, and
  memlayout's own prediction of the plan at s + 1 beside it (a miss with that prediction over
  the budget is the prediction's; under it, the search's).

None of these architectures is one the fit tests were written against (tests/activations/
test_fit.py uses the project's own GPT-2, Llama and LSTM).

Prints each architecture's answers and decisions and the share that hold, and writes
benchmarks/results/fit_sweep.json.

Usage:
    python -m benchmarks.accuracy.fit_sweep --sample 20 --seed 44 --jobs 2
    python -m benchmarks.accuracy.fit_sweep --arch MistralForCausalLM
"""

from __future__ import annotations

import contextlib
import json
import random
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "fit_sweep.json"
FAMILIES = ("causal-lm", "masked-lm")
"""Families whose step takes token ids and labels alone, which `--fit batch` scales as --input specs."""
BATCH, TOKENS = 4, 64


def _specs(vocab: int, size: int) -> list[str]:
    """The step's inputs at this batch, as --input specs: token ids and labels."""
    return [f"int64[{size},{TOKENS}]<{vocab}", f"labels=int64[{size},{TOKENS}]<{vocab}"]


def _planned(model: Any, plan: Any) -> Any:
    """`apply_plan` for a plan with something to checkpoint, else nothing."""
    import memlayout.activations as act

    return contextlib.nullcontext() if plan is None or plan.empty else act.apply_plan(model, plan)


def _real_peak(arch: Any, config: Any, size: int, plan: Any = None) -> int:
    """A real CPU step (AdamW, steady state) of the model built for real at this batch, by the allocator's events."""
    import torch

    from benchmarks.accuracy.zoo.check import seed_other_generators
    from benchmarks.accuracy.zoo.inputs import text_ids
    from tests.activations.measure import allocator_peak_step

    seed_other_generators()
    model = arch.build().model
    generator = torch.Generator().manual_seed(0)
    ids, labels = text_ids(config, (size, TOKENS), generator), text_ids(config, (size, TOKENS), generator)
    with _planned(model, plan):
        return allocator_peak_step(model, (ids,), {"labels": labels}).peak_bytes


def _predicted(arch: Any, vocab: int, size: int, plan: Any = None) -> int:
    """memlayout's prediction of the step at this batch, with the plan applied when one is given."""
    import memlayout.activations as act

    model = arch.build().model
    with _planned(model, plan):
        return act.analyze(model, _specs(vocab, size)).summary.peak_bytes


def _decision(budget: int, size: int, at: int | None, over: int | None) -> dict[str, Any]:
    """Whether s fits and s + 1 does not, on the real steps measured (None: not measured, size 0 or the cap)."""
    fits = at is None or at <= budget
    over_budget = over is None or over > budget
    return {"size": size, "real_peak_bytes": at, "real_next_peak_bytes": over, "holds": fits and over_budget,
            "over_at_s": None if fits or at is None else round(at / budget - 1, 5),
            "under_at_s_plus_1": None if over_budget or over is None else round(1 - over / budget, 5)}


def check_one(name: str) -> dict[str, Any]:
    """One architecture's record: the fit's two answers, each decision checked on real steps."""
    from benchmarks.accuracy.zoo.check import memlayout_error, one_line, sweep_start
    from memlayout.activations.fit.size_search import fit

    arch, built, record = sweep_start(name)
    if built is None:
        return record
    config = built.model.config
    vocab = int(getattr(config.get_text_config(decoder=True), "vocab_size", None) or config.vocab_size)
    specs = _specs(vocab, BATCH)
    try:
        _real_peak(arch, config, 1)
    except Exception as exc:
        return record | {"status": "unsupported", "reason": f"the real step fails: {one_line(exc)}"[:300]}
    try:
        at_batch, at_next = _predicted(arch, vocab, BATCH), _predicted(arch, vocab, BATCH + 1)
        share = round(random.Random(name).uniform(0.05, 0.95), 3)
        budget = at_batch + int(share * (at_next - at_batch))
        started = time.perf_counter()
        report = fit(arch.build().model, specs, budget=budget)
        seconds = time.perf_counter() - started
    except Exception as exc:
        return record | {"status": "failed", "reason": f"no answer: {memlayout_error(exc)}"[:300]}
    record |= {"inputs": specs, "budget_bytes": budget, "budget_share": share, "fit_seconds": round(seconds, 1),
               "probes": len(report.probes)}
    plain = report.without_plan
    try:
        record["without_plan"] = _decision(
            budget, plain.size, _real_peak(arch, config, plain.size) if plain.size else None,
            _real_peak(arch, config, plain.size + 1) if report.limit is None else None)
        planned = report.with_plan
        if planned is not None and planned.size > plain.size and planned.plan is not None:
            plan = planned.plan.plan  # type: ignore[union-attr]
            record["with_plan"] = _decision(budget, planned.size, _real_peak(arch, config, planned.size, plan),
                                            _real_peak(arch, config, planned.size + 1, plan))
            record["with_plan"]["checkpointed"] = len(plan.checkpoint) + len(plan.sequential)
            if not record["with_plan"]["holds"]:
                record["with_plan"]["predicted_next_peak_bytes"] = _predicted(arch, vocab, planned.size + 1, plan)
        elif planned is not None:
            record["with_plan"] = {"size": planned.size, "holds": None,
                                   "reason": "no plan reaches past the plain answer"}
    except Exception as exc:
        return record | {"status": "failed", "reason": f"a real step at the answer fails: {one_line(exc)}"[:300]}
    decisions = [record[k]["holds"] for k in ("without_plan", "with_plan")
                 if record.get(k, {}).get("holds") is not None]
    record["status"] = "ok" if all(decisions) else "missed"
    return record


def run_child(name: str, timeout: float) -> dict[str, Any]:
    """`check_one` in a fresh process (benchmarks/accuracy/zoo/check.py's `run_check_in_child`)."""
    from benchmarks.accuracy.zoo.check import run_check_in_child

    return run_check_in_child("benchmarks.accuracy.fit_sweep", name, timeout)


def main(argv: list[str]) -> int:
    from benchmarks.accuracy.zoo.check import drawn, sweep_parser

    options = sweep_parser("benchmarks.accuracy.fit_sweep", __doc__.splitlines()[0], timeout=600.0).parse_args(argv)
    if options.one:
        print(json.dumps(check_one(options.one)))
        return 0
    from benchmarks.accuracy.zoo.catalog import by_name

    names = drawn(lambda: sorted(name for name, arch in by_name().items() if arch.family in FAMILIES), options)
    started = time.perf_counter()
    with ThreadPoolExecutor(options.jobs) as pool:
        records = list(pool.map(lambda name: run_child(name, options.timeout), names))

    def shown(record: dict[str, Any], key: str) -> str:
        decision = record.get(key)
        if not isinstance(decision, dict):
            return f"{key} -"
        verdict = {True: "holds", False: "MISSED", None: "n/a"}[decision.get("holds")]
        return f"{key} {decision.get('size')} {verdict}"

    for record in records:
        print(f"{record['architecture']}: {record['status']}, {shown(record, 'without_plan')}, "
              f"{shown(record, 'with_plan')} {record.get('reason', '')}")
    checked = [record[key] for record in records for key in ("without_plan", "with_plan")
               if isinstance(record.get(key), dict) and record[key].get("holds") is not None]
    held = sum(1 for decision in checked if decision["holds"])
    answered = sum(1 for record in records if record["status"] in ("ok", "missed"))
    print(f"decisions that hold on real steps: {held} of {len(checked)} "
          f"({answered} of {len(records)} drawn architectures answered)")
    from benchmarks.accuracy.zoo.run import versions

    result = {"command": shlex.join(["python", "-m", "benchmarks.accuracy.fit_sweep", *argv]), "versions": versions(),
              "wall_seconds": round(time.perf_counter() - started, 1), "architectures": len(records),
              "decisions": len(checked), "hold": held, "answered": answered, "records": records}
    from memlayout.io.atomic_write import write_text

    write_text(str(RESULTS), json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
