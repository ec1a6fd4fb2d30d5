"""`--fit`'s answers checked as a user acts on them: the answer s has a plan under `--budget` at s, and none at s + 1.

For each model, GPU and precision: `memlayout activations MODEL --fit batch` (with --gpu, the whole
card as torch reports it is the budget; on the CPU a --budget), then `--budget` at the batch it
answers and at one more, as separate commands, each in a process of its own. The decision holds
when the first finds a plan (exit 0) whose compared figure (on a GPU: the allocator's reserved
peak plus the CUDA context, cuBLAS and its workspaces) is within the card, and the second finds
none (exit 1); where `--fit` answers that not even a batch of 1 fits (exit 1), when `--budget` at
batch 1 finds no plan either. Tracing for a GPU needs torch's CUDA build (no GPU): run it with one (the 2.14.1+cu130
of the torch matrix). `--fit`'s time is printed beside one plain prediction of the same step.

Usage: python benchmarks/accuracy/fit_decisions.py [--quick] [--only KEY ...]
(results: benchmarks/results/fit_decisions.json)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "fit_decisions.json"
MARKER = "<!-- memlayout:fit-decisions -->"
CONFIGS = ROOT / "benchmarks" / "configs"

MODELS = {
    "gpt2-124m": ("GPT-2 124M", CONFIGS / "gpt2-124m", 1024, 50257),
    "llama-1.1b": ("Llama 2048 wide, 22 layers (1.1B)", CONFIGS / "llama-1.1b", 2048, 32000),
    "llama-7b": ("Llama-7B", CONFIGS / "llama-7b", 4096, 32000),
}
PRECISIONS = {"fp32": [], "autocast-bf16": ["--autocast", "bf16"], "bf16": ["--dtype", "bf16"]}
CASES = [
    (model, target, precision)
    for model in MODELS
    for target in ("h100", "a100-40gb")
    for precision in ("fp32", "autocast-bf16")
] + [("llama-7b", target, "bf16") for target in ("h100", "a100-40gb")] + [
    (model, "cpu", precision) for model in ("gpt2-124m", "llama-1.1b") for precision in ("fp32", "autocast-bf16")
]
CPU_BUDGET = "16GiB"
"""The CPU cases' --budget: a machine's RAM a step may take."""


def inputs(model: str, batch: int) -> list[str]:
    _, _, length, vocab = MODELS[model]
    return [f"--input=input_ids=int64[{batch},{length}]<{vocab}", f"--input=labels=int64[{batch},{length}]<{vocab}"]


def command(model: str, target: str, precision: str, batch: int, *extra: str) -> list[str]:
    where = ["--gpu", target] if target != "cpu" else ["--device", "cpu"]
    # From the repository's root (run's cwd), so the commands shown work from any clone.
    config = MODELS[model][1].relative_to(ROOT)
    return [sys.executable, "-m", "memlayout", "activations", str(config), *inputs(model, batch), *where,
            *PRECISIONS[precision], "--format", "json", *extra]


def run(argv: list[str]) -> tuple[int, dict[str, Any] | None, str, float]:
    start = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=ROOT, env=env)
    seconds = time.perf_counter() - start
    data = json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else None
    return done.returncode, data, done.stderr, seconds


def shown(argv: list[str]) -> str:
    return "memlayout " + " ".join(a if " " not in a and "<" not in a and "[" not in a else f"'{a}'"
                                   for a in argv[3:])


def check(model: str, target: str, precision: str) -> dict[str, Any]:
    budget = ["--budget", "1.0"] if target != "cpu" else ["--budget", CPU_BUDGET]
    fit_argv = command(model, target, precision, 1, "--fit", "batch", *(budget if target == "cpu" else []))
    code, data, stderr, seconds = run(fit_argv)
    record: dict[str, Any] = {"model": model, "target": target, "precision": precision, "fit_command": shown(fit_argv),
                              "fit_seconds": seconds, "fit_exit": code, "fit_stderr": stderr.strip()}
    if data is None:
        record["nothing_fits"] = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {code}"
        # "Not even a batch of 1 fits" is a decision too: --budget at batch 1 must find no plan either.
        one_argv = command(model, target, precision, 1, *budget)
        code_one, _, stderr_one, _ = run(one_argv)
        # Exit 2 is the budget below the model's own state, before any step is traced: no batch fits either.
        below_state = code == 2 and "below the model's own state" in record["nothing_fits"]
        record.update(next_command=shown(one_argv), next_exit=code_one, next_stderr=stderr_one.strip(),
                      decision_holds=(code == 1 or below_state) and code_one == 1)
        return record
    fit = data["fit"]
    planned, plain = fit["with_plan"], fit["without_plan"]
    size = planned["size"]
    record.update(without_plan=plain["size"], with_plan=size, budget_bytes=fit["budget_bytes"],
                  budget_from=fit["budget_from"], compared=fit["compared"],
                  compared_bytes=planned["compared_bytes"], next_compared_bytes=planned["next_compared_bytes"],
                  plan_modules=len((planned["plan"] or {}).get("checkpoint", [])),
                  recompute_seconds=(planned["plan"] or {}).get("recompute_seconds"),
                  probes=len(fit["probes"]))
    predict_argv = command(model, target, precision, max(size, 1))
    _, _, _, record["predict_seconds"] = run(predict_argv)
    if size:
        at_argv = command(model, target, precision, size, *budget)
        code_at, at, stderr_at, _ = run(at_argv)
        record.update(at_command=shown(at_argv), at_exit=code_at, at_stderr=stderr_at.strip(),
                      at_compared_bytes=(at or {}).get("plan", {}).get("compared_bytes"))
    next_argv = command(model, target, precision, size + 1, *budget)
    code_next, _, stderr_next, _ = run(next_argv)
    record.update(next_command=shown(next_argv), next_exit=code_next, next_stderr=stderr_next.strip())
    holds = (code_next == 1 and (size == 0 or (record["at_exit"] == 0 and record["at_compared_bytes"] is not None
                                               and record["at_compared_bytes"] <= fit["budget_bytes"])))
    record["decision_holds"] = holds
    return record


def table_markdown(results: dict[str, Any] | None = None) -> str:
    """The table docs/evidence-fit.md shows, from the results file."""
    results = results if results is not None else json.loads(RESULTS.read_text())
    lines = [
        "| model, tokens | target | precision | batch, no plan | batch s, with a plan | compared at s / budget "
        "| `--budget` at s | `--budget` at s + 1 | `--fit` / one prediction |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for record in results["records"]:
        label, _, length, _ = MODELS[record["model"]]
        head = f"| {label}, {length} | {record['target']} | {record['precision']} "
        if "nothing_fits" in record:
            after = {0: "plan found", 1: "no plan"}.get(record.get("next_exit", -1), f"exit {record.get('next_exit')}")
            lines.append(head + f"| 0 | 0 | {record['nothing_fits'].removeprefix('memlayout: error: ')[:120]} "
                                f"| n/a | {after} | {record['fit_seconds']:.0f} s |")
            continue
        ratio = record["fit_seconds"] / record["predict_seconds"] if record.get("predict_seconds") else 0.0
        at = {0: "plan found", 1: "no plan"}.get(record.get("at_exit", -1), f"exit {record.get('at_exit')}")
        after = {0: "plan found", 1: "no plan"}.get(record["next_exit"], f"exit {record['next_exit']}")
        lines.append(
            head + f"| {record['without_plan']} | {record['with_plan']} "
            f"| {record['compared_bytes'] / 2**30:.2f} / {record['budget_bytes'] / 2**30:.2f} GiB "
            f"| {at if record['with_plan'] else 'n/a'} | {after} "
            f"| {record['fit_seconds']:.0f} s / {record['predict_seconds']:.0f} s ({ratio:.1f}x) |"
        )
    commands = [f"- `{r['fit_command']}`" for r in results["records"]]
    return "\n".join(lines) + ("\n\nEach row's `--fit` command, from the repository's root (then `--budget` at "
                               "s and s + 1 with the same flags):\n\n" + "\n".join(commands))


def main(argv: list[str]) -> int:
    only = argv[argv.index("--only") + 1:] if "--only" in argv else None
    quick = "--quick" in argv
    cases = [c for c in CASES if only is None or f"{c[0]}/{c[1]}/{c[2]}" in only]
    if quick:
        cases = [c for c in cases if c[0] == "gpt2-124m"][:2]
    import torch

    records = []
    previous = json.loads(RESULTS.read_text())["records"] if RESULTS.exists() and only else []
    for model, target, precision in cases:
        record = check(model, target, precision)
        records.append(record)
        print(json.dumps({k: v for k, v in record.items() if not k.endswith(("command", "stderr"))}), flush=True)
    if not quick:
        kept = [r for r in previous if (r["model"], r["target"], r["precision"]) not in
                {(r2["model"], r2["target"], r2["precision"]) for r2 in records}]
        order = {c: i for i, c in enumerate(CASES)}
        merged = sorted(kept + records, key=lambda r: order.get((r["model"], r["target"], r["precision"]), 99))
        RESULTS.write_text(json.dumps({"torch": torch.__version__, "records": merged}, indent=1) + "\n")
    failed = [r for r in records if r.get("decision_holds") is False]
    print(f"{len(records)} cases, {len(failed)} where the decision does not hold")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
