"""Will it fit, true at the decision: `--fit`'s answer s has a plan under `--budget` at s and none at s + 1,
a GPU answer is judged by what runs out on that GPU, plans under autocast rerun under autocast, and a rerun's
price counts the bytes it moves."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import memlayout.activations as act
from memlayout import _torch
from memlayout.activations.analysis import prepare_step
from memlayout.activations.device.gpus import gpu_spec
from memlayout.activations.facts import Phase
from memlayout.activations.fit.size_search import fit
from memlayout.activations.plans.plan import Plan
from memlayout.activations.request.step_request import StepRequest
from memlayout.errors import BudgetUnreachableError

ROOT = Path(__file__).resolve().parents[3]
GPT2 = "tests.activations.models:gpt2"
SPECS = ["input_ids=int64[2,64]<500", "labels=int64[2,64]<500"]


def _decision_holds(budget: int | float, **options: object) -> int:
    """Fit, then run the budget search at s and at s + 1 as `--budget` does; return s."""
    report = fit(GPT2, SPECS, budget=budget, **options)  # type: ignore[arg-type]
    planned = report.with_plan
    assert planned is not None and planned.size >= 1 and planned.plan is not None
    size = planned.size

    def at(n: int) -> list[str]:
        return [spec.replace("[2,", f"[{n},", 1) for spec in SPECS]

    found = act.analyze(GPT2, at(size), budget=budget, **options)  # type: ignore[arg-type]
    assert found.plan is not None and found.plan.plan == planned.plan.plan  # type: ignore[union-attr]
    # The probes skip the search's pruning, which the answer's own search runs: its figures are the pruned plan's.
    assert (planned.peak_bytes, planned.compared_bytes) == (found.plan.peak_bytes, found.plan.compared_bytes)
    assert found.plan.judged_bytes <= found.plan.budget_bytes
    with pytest.raises(BudgetUnreachableError):
        act.analyze(GPT2, at(size + 1), budget=budget, **options)  # type: ignore[arg-type]
    return size


def test_on_the_cpu_fits_answer_has_a_plan_at_s_and_none_at_s_plus_1() -> None:
    one = act.analyze(GPT2, SPECS).summary.peak_bytes
    size = _decision_holds(int(one * 2.2))
    assert size >= 3  # the plan fits more than the plain step would


@pytest.mark.cuda_build
@pytest.mark.parametrize("autocast", [None, "bf16"])
def test_on_a_gpu_fits_answer_has_a_plan_at_s_and_none_at_s_plus_1(autocast: str | None) -> None:
    one = act.analyze(GPT2, SPECS, gpu="a100-40gb", autocast=autocast)
    runtime = one.summary.reserved_peak_bytes
    assert runtime is not None
    share = (runtime * 2.5 + 700 * 2**20) / gpu_spec("a100-40gb").total_memory
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning from a successful step, the plans' reruns included
        _decision_holds(share, gpu="a100-40gb", autocast=autocast)


@pytest.mark.cuda_build
def test_a_gpu_answer_is_judged_by_reserved_plus_the_runtime_against_the_card() -> None:
    from memlayout.activations.device.cuda_runtime import cuda_runtime

    runtime = cuda_runtime((9, 0)).beside_step_bytes
    one = act.analyze(GPT2, SPECS, gpu="h100").summary.reserved_peak_bytes
    assert one is not None
    share = (runtime + 3 * one) / gpu_spec("h100").total_memory
    report = fit(GPT2, SPECS, gpu="h100", budget=share)
    assert "reserved peak" in report.compared
    assert report.budget_bytes == int(share * gpu_spec("h100").total_memory)
    # what is compared is what runs out on the card: the allocator's reserved peak plus context and workspaces
    plain = report.without_plan
    at = act.analyze(GPT2, [s.replace("[2,", f"[{plain.size},", 1) for s in SPECS], gpu="h100")
    assert at.summary.reserved_peak_bytes is not None
    assert plain.compared_bytes == at.summary.reserved_peak_bytes + runtime <= report.budget_bytes
    assert plain.next_compared_bytes is not None and plain.next_compared_bytes > report.budget_bytes


@pytest.mark.cuda_build
def test_a_plan_under_cuda_autocast_reruns_in_bf16_as_forward_ran() -> None:
    # Sizes chosen so that no two tensors have one byte count: the hidden [24, 208] is 9,984 B in bf16 and
    # 19,968 B in float32; the weights cast to bf16 are 16,640 B.
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(40, 208), torch.nn.GELU(),
                                                      torch.nn.Linear(208, 40)) for _ in range(3)])
    step, *_ = prepare_step(StepRequest(model, input=("float32[24,40]",), device="cuda", optimizer="none",
                                        autocast="bf16", gpu="h100"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = step.trace(Plan(checkpoint=("1",)))  # a rerun in float32 raises CheckpointError (other metadata)
    assert not [w for w in caught if "autocast" in str(w.message).lower()]
    rerun = next(c for c in trace.calls if c.path == "1" and c.recompute)
    made_again = [s.nbytes for s in trace.storages if rerun.start < s.born <= rerun.end and s.phase is Phase.RECOMPUTE]
    assert 24 * 208 * 2 in made_again and 24 * 208 * 4 not in made_again


def test_torchs_warning_when_cuda_autocast_switches_itself_off_is_the_one_silenced() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: torch.autocast('cuda') stays on")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.autocast("cuda", dtype=torch.bfloat16)
    assert any(re.search(_torch.CUDA_AUTOCAST_OFF_WARNING, str(w.message)) for w in caught)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _torch.cuda_autocast_off_unsaid():
            torch.autocast("cuda", dtype=torch.bfloat16)
            warnings.warn("another warning still reaches the user", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another warning still reaches the user"]


@pytest.mark.cuda_build
def test_a_successful_gpu_run_with_a_plan_under_autocast_writes_nothing_to_stderr() -> None:
    from memlayout.activations.device.cuda_runtime import cuda_runtime

    one = act.analyze(GPT2, SPECS, gpu="h100", autocast="bf16").summary.reserved_peak_bytes
    assert one is not None
    budget = cuda_runtime((9, 0)).beside_step_bytes + 3 * one
    done = subprocess.run(
        [sys.executable, "-m", "memlayout", "activations", GPT2, *[f"--input={s}" for s in SPECS],
         "--gpu", "h100", "--autocast", "bf16", "--fit", "batch", "--budget", str(budget), "--format", "json"],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_the_h100_row_is_torchs_total_memory_measured_on_the_h100() -> None:
    recorded = (ROOT / "benchmarks/results/gpu/device-h100.txt").read_text()
    mib = int(re.search(r"name='NVIDIA H100 80GB HBM3'.*?total_memory=(\d+)MB", recorded).group(1))  # type: ignore[union-attr]
    h100 = gpu_spec("h100")
    assert h100.memory_source == "measured"
    assert h100.total_memory == mib * 2**20 == 85_017_493_504
    assert f"{mib:,} MiB" in (ROOT / "docs/gpu.md").read_text()


def test_every_gpu_row_says_where_its_memory_comes_from_in_torchs_convention() -> None:
    from memlayout.activations.device.gpus import GPUS

    for spec in GPUS:
        assert spec.memory_source in ("measured", "reported", "derived"), spec.key
        assert spec.float32_flops < spec.half_flops and spec.memory_bandwidth > 0
    measured = [s for s in GPUS if s.memory_source == "measured"]
    assert {s.key for s in measured} == {"h100", "h200"}


def test_a_norm_layers_rerun_costs_time_though_it_counts_no_flops() -> None:
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre = torch.nn.Sequential(torch.nn.LayerNorm(256), torch.nn.GELU())
            self.proj = torch.nn.Linear(256, 256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(self.pre(x))

    from memlayout.activations.plans.plan import Planner

    baseline = act.analyze(Block(), ["float32[512,256]"], optimizer="none")
    planner = Planner(baseline.trace)
    pre = next(o for o in planner.options if o.path == "pre" and o.segments is None)
    # torch's flop counter counts a layer norm and a GELU as 0 FLOPs; their rerun reads and writes [512, 256] twice
    assert pre.flops == 0
    assert pre.seconds >= 2 * 512 * 256 * 4 / baseline_bandwidth()
    assert baseline.summary.forward_seconds > pre.seconds


def baseline_bandwidth() -> float:
    from memlayout.activations.trace import world

    return world.cpu_roofline().memory_bandwidth  # the rates the planner prices with (tests pin them)


def test_the_cpu_rates_are_measured_here_and_rounded_down_to_powers_of_two() -> None:
    from memlayout.activations.device.roofline import cpu_roofline

    rates = cpu_roofline()
    for rate in (rates.float32_flops, rates.half_flops, rates.memory_bandwidth):
        assert rate >= 1 and math.log2(rate).is_integer()
    # The 512x512 float32 matmul takes about 0.27 GFLOP: a rate above 1e13 would be a mistimed run
    assert 1e8 < rates.float32_flops < 1e13
