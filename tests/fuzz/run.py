"""`make fuzz`: every target, N mutated inputs each, one process per target; prints the figures.

Exit 0 only when every target reached N inputs with 0 tracebacks, 0 inputs over
5 s, 0 executions, 0 property violations and a peak RSS under 512 MiB. Inputs that broke a figure are in
`--out` (default `.bench-data/fuzz/`), ready to become regression files under
`tests/corpus/`. A target whose process dies (a native crash, libFuzzer's own
timeout or RSS limit) counts as a traceback; its input is the `*-crash-*` file.

    python -m tests.fuzz.run --runs 10000 [--jobs 2] [--targets a,b] [--engine atheris|hypothesis] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.fuzz.harness import RSS_LIMIT_MIB, SLOW_SECONDS, WORK
from tests.fuzz.targets import TARGETS

REPO_ROOT = Path(__file__).resolve().parents[2]


def fuzz_target(name: str, runs: int, out: Path, engine: str | None, seed: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "tests.fuzz.harness", name, "--runs", str(runs), "--out", str(out), "--seed",
               str(seed)]
    if engine:
        command += ["--engine", engine]
    log = out / f"{name}.log"
    out.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as stream:
        process = subprocess.run(command, cwd=REPO_ROOT, stdout=stream, stderr=subprocess.STDOUT)
    # What a crashed run could not clean up: its scratch files and corpus.
    for leftover in [*(out / WORK).glob(f"{name}.*"), *(out / WORK).glob(f"corpus-{name}.*")]:
        shutil.rmtree(leftover, ignore_errors=True)
    summary_path = out / f"{name}.summary.json"
    summary: dict[str, Any] = json.loads(summary_path.read_text()) if summary_path.exists() else {"target": name}
    summary["exit_code"] = process.returncode
    if process.returncode != 0 or summary.get("inputs", 0) < runs:
        summary["tracebacks"] = summary.get("tracebacks", 0) + 1
        summary.setdefault("failures", []).append(f"the fuzz process ended with {process.returncode}; see {log}")
    return summary


def passed(summary: dict[str, Any], runs: int) -> bool:
    return (
        summary.get("inputs", 0) >= runs and summary["tracebacks"] == 0 and summary.get("slow_inputs", 1) == 0
        and summary.get("executions", 1) == 0 and summary.get("property_violations", 1) == 0
        and summary.get("read_rss_mib", RSS_LIMIT_MIB) < RSS_LIMIT_MIB
    )


def table(summaries: list[dict[str, Any]], runs: int) -> str:
    header = f"{'target':22} {'engine':10} {'inputs':>7} {'traceb.':>7} {f'>{SLOW_SECONDS:g}s':>5} {'exec.':>5} " \
             f"{'prop.':>5} {'max s':>6} {'peak RSS':>9} {'ok/err':>11}  verdict"
    lines = [header, "-" * len(header)]
    for s in summaries:
        outcomes = s.get("outcomes", {})
        ok = outcomes.get("ok", 0)
        lines.append(
            f"{s['target']:22} {s.get('engine', '?'):10} {s.get('inputs', 0):7} {s['tracebacks']:7} "
            f"{s.get('slow_inputs', '?'):>5} {s.get('executions', '?'):>5} {s.get('property_violations', '?'):>5} "
            f"{s.get('max_seconds', 0):6.2f} "
            f"{s.get('peak_rss_mib', 0):6.0f} MiB {ok:>5}/{sum(outcomes.values()) - ok:<5}  "
            f"{'pass' if passed(s, runs) else 'FAIL'}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--engine", choices=["atheris", "hypothesis"], default=None)
    parser.add_argument("--seed", type=int, default=20261122)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / ".bench-data" / "fuzz")
    parser.add_argument("--json", type=Path, help="also write every summary here")
    args = parser.parse_args()
    names = [n for n in args.targets.split(",") if n]
    unknown = sorted(set(names) - set(TARGETS))
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {', '.join(TARGETS)}")
    started = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        summaries = list(pool.map(lambda n: fuzz_target(n, args.runs, args.out, args.engine, args.seed), names))
    print(table(summaries, args.runs))
    print(f"{len(names)} targets, {sum(s.get('inputs', 0) for s in summaries)} inputs, "
          f"{time.perf_counter() - started:.0f} s; failing inputs (if any) in {args.out}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": args.runs, "targets": summaries}, indent=1) + "\n")
    return 0 if all(passed(s, args.runs) for s in summaries) else 1


if __name__ == "__main__":
    raise SystemExit(main())
