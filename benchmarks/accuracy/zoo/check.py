"""One architecture of the sweep: the real step, memlayout's prediction, and a plan applied for real.

`python -m benchmarks.accuracy.zoo.check NAME` prints the record as one JSON line (run.py
runs each architecture this way, in a fresh process with a timeout).

The record:
- the real CPU training step, its peak by the CPU allocator's own events (torch.profiler with
  profile_memory=True, summed in order, plus what was live before the step:
  tests/activations/measure.py's allocator_peak_step). Those events see kernel scratch and
  buffers an op frees inside itself, which no op output shows. Beside it, the figures of two
  counters of op outputs: the live storages with no hooks attached (storage_peak_step), and
  PyTorch's MemTracker. MemTracker's module tracker hooks every module's inputs, and those
  hooks hold the inputs' autograd nodes in a reference cycle (torch/autograd/graph.py,
  register_multi_grad_hook, mode "all"), so a part of the graph the loss never reaches stays
  alive until the garbage collector runs: with MemTracker attached the step keeps memory the
  user's step frees;
- memlayout's prediction for the same model, inputs and optimizer, on fake tensors;
- a plan for a budget of BUDGET_SHARE x the measured peak, applied for real with
  torch.utils.checkpoint: verified when the measured peak fits the budget and the
  loss and every gradient are bitwise equal to the unplanned step's (same seed).
  A planned step is measured by the allocator's events too (MemTracker's hooks change
  what a checkpointed step keeps); MemTracker's figure is recorded beside it.
  With MEMLAYOUT_ZOO_PLANS=0 (run.py --no-plans) the plan stages are skipped;
- where memlayout answers that the budget cannot be met, the lowest peak it states
  is checked for real: its own lowest plan, and every set of the model's top-level
  modules checkpointed (top_level_modules), each measured for real. The statement is
  "unreachable-verified" when none of them fits the budget and the lowest of them
  is within TOLERANCE of the stated peak.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.accuracy.zoo.catalog import Architecture, Built, NoInputs, by_name
from benchmarks.accuracy.zoo.render import range_miss

OPTIMIZER = "adamw"
"""The step measured and predicted: forward, backward and AdamW's step, its state there from the start."""
BUDGET_SHARE = 0.7
TOLERANCE = 0.02
"""How close a prediction must be to the measured peak, and a stated lowest peak to the real lowest."""
SUBSETS_UP_TO = 6
"""Every set of the top-level modules is tried up to this many modules; beyond, singles and the whole level."""
UNREACHABLE_SECONDS = 120.0
"""Time for the real plans that check an unreachable budget; the record says how many of them ran."""
REAL_HINT = "pass --real"
"""The hint memlayout gives when a step reads a value its fake tensors do not have; the sweep follows it."""
PLANS_VARIABLE = "MEMLAYOUT_ZOO_PLANS"
CHECK_SECONDS = 200.0
"""...and they stop when the whole check has run this long, within run.py's 300 s timeout."""


@dataclass(frozen=True)
class Measured:
    peak_bytes: int
    loss: Any
    grads: dict[str, Any]


def seed_other_generators() -> None:
    """Seed numpy's and Python's generators too: the measured steps seed only torch's.

    wav2vec2-style models draw SpecAugment's masks and their layer drop from
    numpy (modeling_wav2vec2.py, `np.random.choice`, `np.random.random()`), so
    two runs of the same step differ unless numpy starts from the same state.
    """
    import random

    import numpy as np

    np.random.seed(0)
    random.seed(0)


def _autocast(name: str | None) -> Any:
    """torch.autocast on the CPU in `name` (bf16, fp16) around forward and loss, as `--autocast` traces it; None."""
    from memlayout.activations.step.run import Autocast

    return Autocast("cpu", name) if name is not None else None


def measure(built: Built, autocast: str | None = None) -> Measured:
    """One real steady-state step under MemTracker (tests/activations/measure.py)."""
    from tests.activations.measure import memtracker_step

    seed_other_generators()
    real = memtracker_step(built.model, built.args, built.kwargs, optimizer=OPTIMIZER, autocast=_autocast(autocast))
    return Measured(real.peak_bytes, real.loss, real.grads)


def count_storages(built: Built, autocast: str | None = None) -> Measured:
    """The same step counted by live storages alone, with no module hooks: op outputs only."""
    from tests.activations.measure import storage_peak_step

    seed_other_generators()
    real = storage_peak_step(built.model, built.args, built.kwargs, optimizer=OPTIMIZER, autocast=_autocast(autocast))
    return Measured(real.peak_bytes, real.loss, real.grads)


def allocator_events(built: Built, autocast: str | None = None) -> Measured:
    """The same step, its peak by the CPU allocator's own events, with no module hooks.

    The measure of every step. MemTracker's module hooks keep tensors alive that the
    step without them frees (a graph branch the loss never reaches; a checkpointed
    module's recomputed forward: CpmAnt with ten modules checkpointed measures
    4,556,388 bytes with MemTracker attached, 4,458,084 without), so it measures a
    step that is not the one a user runs; and both it and the storage counter count
    op outputs only, so neither sees kernel scratch. Each record has all three figures.
    """
    from tests.activations.measure import allocator_peak_step

    seed_other_generators()
    real = allocator_peak_step(built.model, built.args, built.kwargs, optimizer=OPTIMIZER, autocast=_autocast(autocast))
    return Measured(real.peak_bytes, real.loss, real.grads)


def plans_wanted() -> bool:
    """False under MEMLAYOUT_ZOO_PLANS=0: the sweep then checks the unplanned prediction only."""
    import os

    return os.environ.get(PLANS_VARIABLE, "1") != "0"


def same_step(a: Measured, b: Measured) -> str | None:
    """None when the loss and every gradient are bitwise equal; else what differs."""
    import torch

    if not torch.equal(a.loss, b.loss):
        return f"the loss differs ({float(a.loss)!r} vs {float(b.loss)!r})"
    if a.grads.keys() != b.grads.keys():
        missing = sorted(a.grads.keys() ^ b.grads.keys())
        return f"gradients of different parameters ({', '.join(missing[:3])})"
    differ = [name for name, grad in a.grads.items() if not torch.equal(grad, b.grads[name])]
    if differ:
        return f"{len(differ)} gradients differ ({', '.join(differ[:3])})"
    return None


def stage(name: str) -> None:
    """Announce a stage on stderr: run.py names it when this process times out or dies."""
    print(f"zoo-stage: {name}", file=sys.stderr, flush=True)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def sweep_start(name: str) -> tuple[Architecture, Built | None, dict[str, Any]]:
    """How a sweep's check of one architecture starts: one thread (the sweep shares the machine; one thread also
    keeps the kernels' order fixed), the model built, and the record's opening. Where the model does not build,
    `built` is None and the record says so, as "unsupported"."""
    import torch

    torch.set_num_threads(1)
    arch = by_name()[name]
    record: dict[str, Any] = {"architecture": name, "family": arch.family, "status": "ok"}
    try:
        return arch, arch.build(), record
    except Exception as exc:
        return arch, None, record | {"status": "unsupported", "reason": f"does not build: {one_line(exc)}"[:300]}


def memlayout_error(exc: BaseException, limit: int | None = 400) -> str:
    """What `memlayout activations` would print for this error: a MemlayoutError's one line, anything else
    as the CLI's "unexpected ..." (a bug: the figures count these)."""
    from memlayout.errors import MemlayoutError

    if isinstance(exc, MemlayoutError):
        return f"memlayout: error: {exc.one_line()}"[:limit]
    return f"unexpected {one_line(exc)}"


def describe_inputs(built: Built) -> str:
    """`input_ids=int64[4,64], labels=int64[4,64]`: what the step was given."""
    import torch

    def one(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            return f"{str(value.dtype).removeprefix('torch.')}[{','.join(map(str, value.shape))}]"
        return type(value).__name__

    return ", ".join([one(value) for value in built.args] + [f"{k}={one(v)}" for k, v in built.kwargs.items()])


def mib(count: float) -> str:
    return f"{count / 2**20:.2f} MiB"


def top_level_modules(model: Any) -> list[str]:
    """The modules a user would checkpoint first: the model's children, looking through containers.

    A child that holds the rest of the model (transformers' base model, an
    nn.ModuleList or nn.Sequential of layers) is replaced by its own children.
    """
    import torch

    base = getattr(model, "base_model_prefix", None)
    found: list[str] = []

    def visit(module: Any, prefix: str, depth: int) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if not any(True for _ in child.parameters()):
                continue  # nothing of its own to save: checkpointing it changes nothing
            opens = isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)) or (
                depth == 0 and name == base) or (isinstance(child, torch.nn.Sequential) and depth == 0)
            if opens and depth < 2:
                visit(child, f"{path}.", depth + 1)
            elif isinstance(child, torch.nn.ModuleDict | torch.nn.ModuleList):
                continue
            else:
                found.append(path)

    visit(model, "", 0)
    return found


def top_level_plans(modules: list[str]) -> list[tuple[str, ...]]:
    """Sets of top-level modules to checkpoint: all of them and each alone first, then every other set."""
    if not modules:
        return []
    plans = [tuple(modules), *((module,) for module in modules)]
    if len(modules) <= SUBSETS_UP_TO:
        for size in range(len(modules) - 1, 1, -1):
            plans += itertools.combinations(modules, size)
    return list(dict.fromkeys(plans))


def run_check(arch: Architecture, autocast: str | None = None) -> dict[str, Any]:
    """The record of one architecture; with `autocast` (bf16, fp16) every real step and every prediction runs
    forward and loss under torch.autocast on the CPU, judged by the same criteria."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the sweep shares the machine; one thread also keeps the kernels' order fixed
    started = time.perf_counter()
    record: dict[str, Any] = {
        "architecture": arch.name, "source": arch.source, "family": arch.family, "status": "ok",
        "predicted_peak_bytes": None, "measured_peak_bytes": None, "ratio": None, "within_2pct": None,
        "plan": "none", "reason": "", "optimizer": OPTIMIZER,
    }
    if autocast is not None:
        record["autocast"] = autocast
    from benchmarks.accuracy.zoo.tiny import SIZE

    record["sweep_size"] = SIZE
    record["_started"] = started
    try:
        _check(arch, record)
    finally:
        del record["_started"]
        record["seconds"] = round(time.perf_counter() - started, 1)
        torch.set_num_threads(threads)
    return record


def _check(arch: Architecture, record: dict[str, Any]) -> None:
    import memlayout.activations as act

    stage("build")
    try:
        built = arch.build()
    except NoInputs as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        record.update(status="unsupported", reason=f"builds, but the sweep has no inputs it accepts: {first}"[:400])
        return
    except Exception as exc:
        default = arch.probe_default() if arch.probe_default is not None else None
        if default is not None:
            reason = f"does not build, not even from its config class's defaults (on the meta device): {default}"
        else:
            reason = f"builds from its config class's defaults but not from the tiny config: {one_line(exc)}"
        record.update(status="unsupported", reason=reason[:400])
        return
    record["size"] = built.size
    record["inputs"] = describe_inputs(built)
    record["parameters"] = sum(p.numel() for p in built.model.parameters())
    stage("real step")
    try:
        # Without the plan stages the sweep is about the unplanned peak alone: MemTracker's figure is skipped.
        tracked = measure(built, record.get("autocast")) if plans_wanted() else None
        counted = count_storages(arch.build(), record.get("autocast"))
        plain = allocator_events(arch.build(), record.get("autocast"))
    except Exception as exc:
        record.update(status="unsupported", reason=f"the real CPU step fails on the sweep's inputs: {one_line(exc)}")
        return
    record["measured_peak_bytes"] = plain.peak_bytes
    record["measured_by"] = "allocator events"
    record["storage_counter_peak_bytes"] = counted.peak_bytes
    if tracked is not None:
        record["memtracker_peak_bytes"] = tracked.peak_bytes
    if (differs := same_step(plain, tracked if tracked is not None else counted)) is not None:
        record["reproducible"] = False
        record["reason"] = f"two unplanned real steps are not bitwise equal: {differs}"
    stage("prediction")
    try:
        report = act.analyze(arch.build().model, list(built.args), kwargs=built.kwargs, optimizer=OPTIMIZER,
                             autocast=record.get("autocast"))
    except Exception as exc:
        message = memlayout_error(exc)
        # the hint ends a long line: look for it before memlayout_error cuts the line to 400 characters
        if REAL_HINT not in memlayout_error(exc, limit=None):
            record.update(status="failed", reason=f"no prediction: {message}")
            return
        # memlayout says the step reads a value of its weights and names --real: a user would follow
        # that hint, so the sweep does, and checks that the hint works (prediction and plan, for real).
        record["mode"] = "real"
        record["reason"] = f"followed the hint --real: {message.removeprefix('memlayout: error: ')}"[:400]
        try:
            report = act.analyze(arch.build().model, list(built.args), kwargs=built.kwargs, optimizer=OPTIMIZER,
                                 mode="real", autocast=record.get("autocast"))
        except Exception as real_exc:
            record.update(status="failed", reason=f"no prediction, even with --real: {memlayout_error(real_exc)}")
            return
    predicted = report.summary.peak_bytes
    record["predicted_peak_bytes"] = predicted
    record["ratio"] = round(predicted / plain.peak_bytes, 4)
    if tracked is not None:
        record["memtracker_ratio"] = round(predicted / tracked.peak_bytes, 4)
    record["storage_counter_ratio"] = round(predicted / counted.peak_bytes, 4)
    record["optimizer_bytes"] = report.summary.optimizer_bytes
    if report.fallbacks:
        record["fallbacks"] = {op: count for op, count in report.fallbacks}
    if report.data_dependent:
        record["data_dependent"] = [{"op": op, "assumed": kind, "calls": calls}
                                    for op, kind, calls in report.data_dependent]
    low, high = report.summary.peak_bytes_min, report.summary.peak_bytes_max
    if low is not None and high is not None:
        record["peak_bytes_min"], record["peak_bytes_max"] = low, high
        record["measured_in_range"] = low <= plain.peak_bytes <= high
        if not record["measured_in_range"]:
            record["reason"] = "; ".join(part for part in (record["reason"], range_miss(plain.peak_bytes, low, high))
                                         if part)
    record["within_2pct"] = abs(predicted - plain.peak_bytes) <= TOLERANCE * plain.peak_bytes
    if not record["within_2pct"]:
        record["reason"] = (f"{record['reason']}; " if record.get("mode") else "") + (
                            f"predicted {mib(predicted)} against {mib(plain.peak_bytes)} measured "
                            f"({record['ratio']:.3f}x)")
    if plans_wanted():
        _check_plan(arch, plain, record)
    else:
        record["plan"] = "not run"


def _check_plan(arch: Architecture, plain: Measured, record: dict[str, Any]) -> None:
    import memlayout.activations as act

    budget = int(plain.peak_bytes * BUDGET_SHARE)
    record["budget_bytes"] = budget
    built = arch.build()
    stage("plan search")
    try:
        planned = act.analyze(arch.build().model, list(built.args), kwargs=built.kwargs, budget=budget,
                              optimizer=OPTIMIZER, mode=record.get("mode", "fake"), autocast=record.get("autocast"))
    except act.BudgetUnreachableError as unreachable:
        _check_unreachable(arch, plain, budget, unreachable, record)
        return
    except Exception as exc:
        _plan_failed(record, f"the plan search fails: {memlayout_error(exc)}")
        return
    assert planned.plan is not None
    record["plan_checkpoints"] = planned.plan.plan.to_dict()
    _record_excluded(record, planned.plan.excluded)
    record["plan_predicted_peak_bytes"] = planned.plan.peak_bytes
    stage("plan applied for real")
    try:
        with act.apply_plan(built.model, planned.plan.plan):
            applied = allocator_events(built, record.get("autocast"))
        observed = arch.build()
        with act.apply_plan(observed.model, planned.plan.plan):
            record["plan_memtracker_peak_bytes"] = measure(observed, record.get("autocast")).peak_bytes
    except Exception as exc:
        _plan_failed(record, f"the plan fails when applied for real: {one_line(exc)}")
        return
    record["plan_measured_peak_bytes"] = applied.peak_bytes
    if applied.peak_bytes > budget:
        _plan_failed(record, f"the plan applied for real measures {mib(applied.peak_bytes)}, over the budget "
                             f"{mib(budget)} (memlayout traced {mib(planned.plan.peak_bytes)})")
    elif (differs := same_step(plain, applied)) is not None:
        _plan_failed(record, f"the plan changes the step: {differs}")
    else:
        record["plan"] = "verified"


def _check_unreachable(arch: Architecture, plain: Measured, budget: int, unreachable: Any,
                       record: dict[str, Any]) -> None:
    import memlayout.activations as act

    stated = unreachable.lowest.peak_bytes
    record["plan_checkpoints"] = unreachable.lowest.plan.to_dict()
    _record_excluded(record, unreachable.lowest.excluded)
    record["plan_predicted_peak_bytes"] = stated
    stage("unreachable budget checked for real")
    tried: dict[str, int] = {}
    refused: list[str] = []
    plans = [("memlayout's lowest plan", unreachable.lowest.plan)]
    probe = arch.build().model
    plans += [(" + ".join(paths), act.Plan(checkpoint=paths)) for paths in top_level_plans(top_level_modules(probe))]
    started = time.perf_counter()
    record["unreachable_plans"] = len(plans)
    for label, plan in plans:
        now = time.perf_counter()
        if tried and (now - started > UNREACHABLE_SECONDS or now - record["_started"] > CHECK_SECONDS):
            break  # the lowest plan, all modules together and each alone come first
        built = arch.build()
        try:
            with act.apply_plan(built.model, plan):
                measured = allocator_events(built, record.get("autocast"))
        except Exception as exc:
            refused.append(f"{label}: {one_line(exc)}")
            continue
        if (differs := same_step(plain, measured)) is not None:
            refused.append(f"{label}: changes the step ({differs})")
            continue
        tried[label] = measured.peak_bytes
    record["unreachable_checked_plans"] = len(tried)
    if refused:
        record["unreachable_refused_plans"] = refused[:5]
    lowest_plan = tried.get("memlayout's lowest plan")
    if lowest_plan is None:
        _plan_failed(record, f"memlayout's lowest plan cannot be applied for real: {refused[0]}")
        return
    record["plan_measured_peak_bytes"] = lowest_plan
    observed = arch.build()
    with act.apply_plan(observed.model, unreachable.lowest.plan):
        record["plan_memtracker_peak_bytes"] = measure(observed, record.get("autocast")).peak_bytes
    best_label, best = min(tried.items(), key=lambda item: item[1])
    if best <= budget:
        _plan_failed(record, f"memlayout calls {mib(budget)} unreachable, but checkpointing {best_label} "
                             f"measures {mib(best)}")
    elif abs(lowest_plan - stated) > TOLERANCE * lowest_plan:
        _plan_failed(record, f"the stated lowest peak {mib(stated)} measures {mib(lowest_plan)} for real")
    elif best < stated * (1 - TOLERANCE):
        _plan_failed(record, f"the stated lowest peak is {mib(stated)}, but checkpointing {best_label} "
                             f"measures {mib(best)}")
    else:
        record["plan"] = "unreachable-verified"
        record["real_lowest_peak_bytes"] = best


def _record_excluded(record: dict[str, Any], excluded: tuple[tuple[str, str], ...]) -> None:
    """The modules memlayout found it cannot checkpoint, each with its reason (issue: never crash)."""
    if excluded:
        record["excluded"] = [{"module": module, "reason": reason} for module, reason in excluded]


def _plan_failed(record: dict[str, Any], reason: str) -> None:
    record["plan"] = "failed"
    record["status"] = "failed"
    record["reason"] = "; ".join(part for part in (record["reason"], reason) if part)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m benchmarks.accuracy.zoo.check ARCHITECTURE", file=sys.stderr)
        return 2
    entries = by_name()
    if argv[0] not in entries:
        print(f"no architecture {argv[0]!r} in the catalog", file=sys.stderr)
        return 2
    print(json.dumps(run_check(entries[argv[0]])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def sweep_parser(module: str, description: str, *, timeout: float, jobs: bool = True) -> argparse.ArgumentParser:
    """The options every zoo sweep takes: --arch, --sample and --seed (`drawn`), --jobs, --timeout, and the hidden
    --one its child process runs (`run_check_in_child`)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("--arch", action="append", default=[], help="an architecture of the catalog (repeatable)")
    parser.add_argument("--sample", type=int, help="this many of the sweep's architectures, drawn at random")
    parser.add_argument("--seed", type=int, default=0, help="the draw's seed")
    if jobs:
        parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=timeout, help="seconds for one architecture")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    return parser


def drawn(candidates: Callable[[], list[str]], options: argparse.Namespace) -> list[str]:
    """The architectures a sweep runs: --arch as given, else --sample of the candidates drawn with --seed, else all."""
    if options.arch:
        return list(options.arch)
    names = candidates()
    if options.sample is None:
        return names
    return sorted(random.Random(options.seed).sample(names, min(options.sample, len(names))))


def run_check_in_child(module: str, name: str, timeout: float) -> dict[str, Any]:
    """`python -m MODULE --one NAME` (a sweep's `check_one`) in a fresh process: one architecture's crash or hang
    ends its record only. The record is the child's last JSON line, or a failed record saying why."""
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", module, "--one", name], cwd=Path(__file__).resolve().parents[3],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        record = {"architecture": name, "status": "failed", "reason": f"stopped at the {timeout:g} s timeout"}
    else:
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        record = json.loads(lines[-1]) if done.returncode == 0 and lines else {
            "architecture": name, "status": "failed",
            "reason": f"the check exited {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1]}"[:300]}
    record["seconds"] = round(time.perf_counter() - started, 1)
    return record
