"""`--fit`: the largest batch (or sequence) whose peak fits a budget, checked against real CPU steps."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

import memlayout.activations as act
from memlayout.activations.fit.bracket import largest_fitting
from memlayout.activations.fit.size_search import FLOOR_REACH, FitProbe, fit, scaled_dims
from memlayout.activations.model.input_specs import parse_input_spec
from memlayout.activations.report.fit import fit_dict, render_fit_table
from memlayout.cli.app import app
from memlayout.errors import UsageError
from tests.activations import models
from tests.activations.measure import (
    allocator_peak_step,
    inference_peak,
    storage_peak_step,
    within_2_percent,
)
from tests.activations.sharded_models import BATCH_SPECS

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "memlayout" / "activations" / "schema_v1.json").read_text())
MIB = 2**20
GPT2 = ["activations", "tests.activations.models:gpt2"]


def real_peak(build: Callable[[], object], batch: int, length: int, plan: act.Plan | None = None) -> int:
    """A real CPU training step (AdamW, steady state) at this size, counted by storages."""
    model = build()
    args, kwargs = models.token_inputs(batch, length, 500)
    if plan is None or plan.empty:
        return storage_peak_step(model, args, kwargs).peak_bytes  # type: ignore[arg-type]
    with act.apply_plan(model, plan):  # type: ignore[arg-type]
        return storage_peak_step(model, args, kwargs).peak_bytes  # type: ignore[arg-type]


def test_the_batch_found_fits_a_real_step_and_one_more_does_not() -> None:
    budget = 40 * MIB
    report = fit(models.gpt2(), ["int64[4,64]<500", "labels=int64[4,64]<500"], budget=budget)
    plain = report.without_plan
    assert plain.size > 4
    at, over = real_peak(models.gpt2, plain.size, 64), real_peak(models.gpt2, plain.size + 1, 64)
    assert at <= budget < over, (plain.size, at, over)
    # the step between them is several % of the peak: the answer is not decided by rounding
    assert (over - at) / at > 0.03
    assert plain.peak_bytes == at and plain.next_peak_bytes == over

    planned = report.with_plan
    assert planned is not None and planned.plan is not None
    assert planned.size > plain.size and not planned.plan.plan.empty
    plan = planned.plan.plan
    at = real_peak(models.gpt2, planned.size, 64, plan)
    over = real_peak(models.gpt2, planned.size + 1, 64, plan)
    assert at <= budget < over, (planned.size, at, over)


def test_the_floor_that_aims_the_planned_search_is_a_real_step_with_the_lowest_plan() -> None:
    # --fit traces the planner's lowest plan once, far above the plain answer, and aims its first size with a
    # plan at where the line from the model's state through that figure meets the budget.
    budget = 40 * MIB
    report = fit(models.gpt2(), ["int64[4,64]<500", "labels=int64[4,64]<500"], budget=budget)
    floor = report.floor
    assert floor is not None and floor.size == FLOOR_REACH * (report.without_plan.size + 1)
    assert not floor.plan.empty
    model = models.gpt2()
    args, kwargs = models.token_inputs(floor.size, 64, 500)
    with act.apply_plan(model, floor.plan):  # type: ignore[arg-type]
        real = allocator_peak_step(model, args, kwargs).peak_bytes  # type: ignore[arg-type]
    assert within_2_percent(floor.compared_bytes, real), (real, floor.compared_bytes)
    planned = [p.size for p in report.probes if p.with_plan]
    assert report.with_plan is not None and report.with_plan.size + 1 in planned
    table = render_fit_table(report)
    assert f"first the lowest plan at batch {floor.size}" in " ".join(table.split())
    assert json.loads(json.dumps(fit_dict(report)))["floor"] == {"size": floor.size,
                                                                 "compared_bytes": floor.compared_bytes}


def test_the_sequence_found_fits_a_real_step_and_one_more_token_does_not() -> None:
    budget = 8 * MIB
    report = fit(models.llama(), ["int64[8,16]<500", "labels=int64[8,16]<500"], axis="seq", budget=budget)
    assert [(d.input, d.dim) for d in report.dims] == [("int64[8,16]<500", 1), ("labels=int64[8,16]<500", 1)]
    plain = report.without_plan
    assert 16 < plain.size < 256
    at, over = real_peak(models.llama, 8, plain.size), real_peak(models.llama, 8, plain.size + 1)
    assert at <= budget < over, (plain.size, at, over)
    planned = report.with_plan
    assert planned is not None and planned.plan is not None and planned.size > plain.size
    at = real_peak(models.llama, 8, planned.size, planned.plan.plan)
    over = real_peak(models.llama, 8, planned.size + 1, planned.plan.plan)
    assert at <= budget < over, (planned.size, at, over)


def test_an_inference_batch_found_fits_a_real_forward_and_one_more_does_not() -> None:
    budget = 12 * MIB
    report = fit(models.gpt2(), ["int64[4,64]<500"], budget=budget, step="inference")
    assert report.with_plan is None
    size = report.without_plan.size

    def forward(batch: int) -> int:
        args, kwargs = models.token_inputs(batch, 64, 500, labels=False)
        return inference_peak(models.gpt2(), args, kwargs)

    assert forward(size) <= budget < forward(size + 1), size


def test_a_sequence_is_capped_at_the_models_positions() -> None:
    report = fit(models.gpt2(), ["int64[1,16]<500"], axis="seq", budget=1 << 40, with_plan=False)
    assert report.without_plan.size == 128  # gpt2() is built with n_positions=128
    assert report.limit is not None and "128" in report.limit


def _planned_search(answer: int, estimate_slope: int) -> tuple[int, list[int]]:
    """The planned size search over a floor of 1000 + 37 n whose largest fitting size is `answer`, each plan
    found giving the planner's estimate 1000 + `estimate_slope` n as its guide: what it answers, and the sizes
    it probed."""
    def floor(n: int) -> int:
        return 1000 + 37 * n

    budget = floor(answer) + 20
    calls: list[int] = []

    def probe(n: int) -> FitProbe:
        calls.append(n)
        fits = floor(n) <= budget
        return FitProbe(n, True, budget if fits else floor(n), fits,
                        estimated_guide_bytes=1000 + estimate_slope * n if fits else None)

    return largest_fitting(probe, 2, known_fit=1, anchor=(0, 1000), budget=budget), calls


@pytest.mark.parametrize("answer", [16, 60, 300])
def test_an_estimate_that_runs_ahead_of_the_step_does_not_make_the_search_crawl(answer: int) -> None:
    # The 1.1B Llama in float32 on an A100 40GB: the planner's estimate of the floor passed the budget at batch
    # 9 while plans fitted up to 16, and the search probed every size from 9 to 17.
    found, calls = _planned_search(answer, estimate_slope=74)
    assert found == answer
    assert len(calls) <= 2 * math.log2(answer) + 2, calls


@pytest.mark.parametrize("answer", [3, 12, 40, 150])
def test_an_estimate_that_grows_too_slowly_steers_only_until_a_size_does_not_fit(answer: int) -> None:
    # Llama-7B at 4,096 tokens on an H100: the planner's estimate of the floor grew at a third of the traced
    # floor's rate. Drawn between an estimate below the budget and a traced figure above it, the line sent the
    # search through 37, 8, 11, 24 and 13 for an answer of 12.
    found, calls = _planned_search(answer, estimate_slope=12)
    assert found == answer
    assert len(calls) <= 5, calls  # growth by at most 16x a step, then the traced line, then s and s + 1


@pytest.mark.parametrize("peak", [
    lambda n: 1000 + 37 * n,                     # a training step's peak: nearly linear in the batch
    lambda n: 1000 + 5 * n + n * n // 3,         # attention's scores: quadratic in the sequence
    lambda n: 1000 + 64 * math.ceil(n / 8),      # kernels that pad the batch to a multiple of 8
])
def test_the_search_finds_the_largest_size_that_fits(peak: Callable[[int], int]) -> None:
    for budget in range(1040, 60000, 997):
        calls: list[int] = []

        def probe(n: int, calls: list[int] = calls, budget: int = budget) -> FitProbe:
            calls.append(n)
            return FitProbe(n, False, peak(n), peak(n) <= budget)

        truth = 0
        while peak(truth + 1) <= budget:  # every peak here grows with n
            truth += 1
        found = largest_fitting(probe, 4, budget=budget, anchor=(0, 1000))
        assert found == truth, (budget, found, truth)
        assert len(calls) == len(set(calls))
        assert len(calls) <= 2 * math.log2(max(truth, 2)) + 6, (budget, calls)


def test_the_batch_rule_scales_dim_0_and_the_seq_rule_the_integer_inputs_dim_1() -> None:
    specs = [parse_input_spec(s) for s in ("int64[4,128]<100", "mask=int64[4,128]<2", "pixels=float32[4,3,8,8]")]
    dims, given = scaled_dims(specs, "batch")
    assert [d.dim for d in dims] == [0, 0, 0] and given == 4
    dims, given = scaled_dims(specs, "seq")
    assert [(d.input, d.dim) for d in dims] == [("int64[4,128]<100", 1), ("mask=int64[4,128]<2", 1)] and given == 128
    dims, given = scaled_dims(specs, "seq", 3)
    assert [(d.input, d.dim) for d in dims] == [("pixels=float32[4,3,8,8]", 3)] and given == 8


def test_fit_json_follows_the_schema() -> None:
    result = CliRunner().invoke(app, [*GPT2, "--input", "int64[4,64]<500", "--input", "labels=int64[4,64]<500",
                                      "--fit", "batch", "--budget", "40MiB", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    jsonschema.validate(report, SCHEMA)
    fitted = report["fit"]
    assert fitted["axis"] == "batch" and fitted["budget_bytes"] == 40 * MIB
    assert fitted["with_plan"]["size"] > fitted["without_plan"]["size"]
    assert fitted["with_plan"]["plan"]["peak_bytes"] <= 40 * MIB
    # the report around it is the plain step at the batch that fits
    assert report["inputs"][0] == f"int64[{fitted['without_plan']['size']},64]<500"
    assert report["summary"]["peak_bytes"] == fitted["without_plan"]["peak_bytes"]


def test_fit_table_gives_both_answers() -> None:
    result = CliRunner().invoke(app, [*GPT2, "--input", "int64[4,64]<500", "--step", "inference", "--fit", "batch",
                                      "--budget", "12MiB"])
    assert result.exit_code == 0, result.stderr
    assert "no plan     batch" in result.stdout and "a forward-only step has no backward" in result.stdout
    # Each size probed is counted once, as a size: a forward-only step's are all of the plain step.
    assert re.search(r"probes +(\d+) sizes traced \(\1 of the plain step, 0 through the budget search\)",
                     result.stdout), result.stdout


def _one_line_exit(args: list[str], code: int, message: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize(("extra", "message"), [
    (["--inputs", "tests.activations.models:gpt2_inputs", "--fit", "batch", "--budget", "1GiB"],
     "needs them as --input specs"),
    (["--input", "int64[4,64]<500", "--fit", "batch"], "--fit needs a budget"),
    (["--input", "int64[4,64]<500", "--fit", "batch", "--gpu", "h1000"], "unknown --gpu 'h1000'"),
    (["--input", "int64[4,64]<500", "--fit", "width", "--budget", "1GiB"], "is not batch, seq or seq:N"),
    (["--input", "int64[4,64]<500", "--fit", "batch", "--budget", "1GiB", "--real"], "--real does not apply"),
    (["--input", "int64[4,64]<500", "--input", "labels=int64[2,64]<500", "--fit", "batch", "--budget", "1GiB"],
     "the inputs disagree on its size"),
    (["--input", "int64[4,64]<500", "--fit", "batch", "--budget", "100KiB"], "is below the model's own state"),
    (["--input", "int64[4,64]<500", "--fit", "batch", "--budget", "1GiB", "--tp", "2"], "--tp needs --world-size"),
])
def test_bad_fit_input_is_one_line_and_exit_2(extra: list[str], message: str) -> None:
    _one_line_exit([*GPT2, *extra], 2, message)


def test_seq_without_an_integer_sequence_input_is_one_line_and_exit_2() -> None:
    _one_line_exit(["activations", "tests.activations.models:flat_cnn", "--input", "float32[8,3,32,32]", "--fit",
                    "seq", "--budget", "1GiB"], 2, "no --input has the dimension it scales")


def test_a_budget_no_batch_of_one_fits_is_one_line_and_exit_1() -> None:
    report = act.analyze(models.gpt2(), ["int64[1,64]<500", "labels=int64[1,64]<500"])
    s = report.summary
    budget = s.parameter_bytes + s.buffer_bytes + s.optimizer_bytes + 1024
    _one_line_exit([*GPT2, "--input", "int64[1,64]<500", "--input", "labels=int64[1,64]<500", "--fit", "batch",
                    "--budget", str(budget)], 1, "not even a batch of 1 fits")


def test_the_nothing_fits_hint_to_lower_precision_works_and_is_not_given_to_a_bf16_run() -> None:
    """Followed, `--dtype bf16` fits batch 1 under a budget float32 misses, at the figure the hint gave; a bf16 run
    is not told to pass it."""
    from memlayout.errors import NothingFitsError

    specs = ["--input", "int64[1,64]<500", "--input", "labels=int64[1,64]<500"]
    bf16 = act.analyze(models.gpt2(), ["int64[1,64]<500", "labels=int64[1,64]<500"], dtype="bf16").summary
    tight = bf16.parameter_bytes + bf16.buffer_bytes + bf16.optimizer_bytes + 1024
    result = CliRunner().invoke(app, [*GPT2, *specs, "--dtype", "bf16", "--fit", "batch", "--budget", str(tight)])
    assert result.exit_code == 1 and "not even a batch of 1 fits" in result.stderr, result.stderr
    hint = " ".join(result.stderr.split())
    assert "--dtype" not in hint
    lora = r"LoRA \(--lora 16\): [\d.]+ \w+ \(\d+ bytes\); QLoRA \(--lora 16 with --quantize nf4\)"
    assert re.search(lora, hint), hint
    with pytest.raises(NothingFitsError) as caught:
        fit("tests.activations.models:gpt2", [parse_input_spec(s) for s in specs[1::2]], budget=tight, dtype="bf16")
    # Nor more ranks: `dtype` is not traced with `world_size` yet, and a hint names nothing the command refuses.
    assert [a.name for a in caught.value.alternatives] == ["LoRA", "QLoRA"]
    assert caught.value.alternatives[0].bytes is not None and caught.value.alternatives[0].setting == "`lora=16`"
    float32 = act.analyze(models.gpt2(), ["int64[1,64]<500", "labels=int64[1,64]<500"]).summary
    budget = float32.parameter_bytes + float32.buffer_bytes + float32.optimizer_bytes + 1024  # over bf16's lowest plan
    refused = CliRunner().invoke(app, [*GPT2, *specs, "--fit", "batch", "--budget", str(budget)])
    assert refused.exit_code == 1, refused.stderr
    said = re.search(r"bf16 \(--dtype bf16\): [\d.]+ \w+ \((\d+) bytes\)", " ".join(refused.stderr.split()))
    assert said is not None, refused.stderr
    followed = CliRunner().invoke(app, [*GPT2, *specs, "--dtype", "bf16", "--fit", "batch", "--budget", str(budget),
                                        "--format", "json"])
    assert followed.exit_code == 0, followed.stderr
    report = json.loads(followed.stdout)["fit"]
    assert report["with_plan"]["size"] >= 1
    # The figure is batch 1's plain step in bf16, as the search followed traces it, to the byte.
    assert [p["compared_bytes"] for p in report["probes"] if p["size"] == 1 and not p["with_plan"]] == [
        int(said.group(1))]


def test_on_a_gpu_the_nothing_fits_figure_is_the_reserved_peak_with_the_runtime_that_following_it_gives() -> None:
    """For a GPU each figure is what the budget is compared with there, the allocator's reserved peak plus the CUDA
    runtime; followed at that figure as the budget, `--dtype bf16` fits batch 1 at it, to the byte."""
    specs = ["--input", "int64[1,64]<500", "--input", "labels=int64[1,64]<500", "--gpu", "h100", "--fit", "batch"]
    below = " ".join(CliRunner().invoke(app, [*GPT2, *specs, "--budget", "1MiB"]).stderr.split())
    state = re.search(r"\((\d+) bytes: parameters", below)
    assert state is not None
    # Below the state too, the refusal names each setting with its figure at batch 1.
    assert re.search(r"no batch fits \(try, .*bf16 \(--dtype bf16\): [\d.]+ \w+ \(\d+ bytes\); LoRA", below), below
    refused = CliRunner().invoke(app, [*GPT2, *specs, "--budget", str(int(state.group(1)) + 1024)])
    assert refused.exit_code == 1, refused.stderr
    said = re.search(r"bf16 \(--dtype bf16\): [\d.]+ \w+ \((\d+) bytes\)", " ".join(refused.stderr.split()))
    assert said is not None, refused.stderr
    figure = int(said.group(1))
    followed = CliRunner().invoke(app, [*GPT2, *specs, "--dtype", "bf16", "--budget", str(figure), "--format", "json"])
    assert followed.exit_code == 0, followed.stderr
    report = json.loads(followed.stdout)["fit"]
    assert report["without_plan"]["size"] >= 1
    assert [p["compared_bytes"] for p in report["probes"] if p["size"] == 1 and not p["with_plan"]] == [figure]


def test_with_ranks_the_batch_found_is_the_largest_whose_largest_rank_fits() -> None:
    from memlayout.activations.ranks import analyze_ranks
    from memlayout.activations.ranks.parallel import ShardingOptions

    target, sharding = "tests.activations.sharded_models:llama_style", ShardingOptions(world_size=2)
    specs = [parse_input_spec(s) for s in BATCH_SPECS]
    one = analyze_ranks(target, specs, sharding=sharding).largest.peak_bytes
    budget = 3 * one  # a few times one rank's peak at the batch given
    report = fit(target, specs, budget=budget, sharding=sharding, with_plan=False)
    assert report.world_size == 2
    size = report.without_plan.size
    assert size > specs[0].shape[0]

    def largest_rank(batch: int) -> int:
        batch_specs = [s.describe().replace(f"[{s.shape[0]},", f"[{batch},", 1) for s in specs]
        return analyze_ranks(target, batch_specs, sharding=sharding).largest.peak_bytes

    assert largest_rank(size) <= budget < largest_rank(size + 1)


def test_a_gpus_budget_is_its_memory_as_torch_reports_it_against_reserved_plus_the_runtime() -> None:
    from memlayout.activations.budget import card_budget, resolve_budget
    from memlayout.activations.device.cuda_runtime import cuda_runtime
    from memlayout.activations.device.gpus import gpu_spec
    from memlayout.activations.sizes import BudgetSpec

    h100 = gpu_spec("h100")
    runtime = cuda_runtime((9, 0))
    card = card_budget(h100)
    assert card.bytes == h100.total_memory and card.figure == "reserved"
    assert card.runtime_bytes == (runtime.context_bytes + runtime.outside_allocator_bytes
                                  + runtime.workspace_reserved_bytes)
    assert card.said.startswith("--gpu h100") and "total_memory" in card.said
    share = resolve_budget(BudgetSpec(fraction=0.9), cuda=True, gpu=h100)
    assert (share is not None and share.bytes == int(0.9 * h100.total_memory)
            and share.runtime_bytes == card.runtime_bytes)
    cpu = resolve_budget(BudgetSpec(bytes=10**9), cuda=False, gpu=None)
    assert cpu is not None and cpu.figure == "peak" and cpu.runtime_bytes is None
    with pytest.raises(UsageError, match="share of a GPU"):
        resolve_budget(BudgetSpec(fraction=0.9), cuda=False, gpu=None)


@pytest.mark.parametrize(("text", "expected"), [
    ("0.9", (None, 0.9)), ("90%", (None, 0.9)), (".5", (None, 0.5)), ("1.0", (None, 1.0)), ("100%", (None, 1.0)),
    ("78GiB", (78 * 2**30, None)), ("84899201024", (84899201024, None)), ("1", (1, None)),
])
def test_budget_is_a_size_or_a_share_of_the_gpu(text: str, expected: tuple[int | None, float | None]) -> None:
    from memlayout.activations.sizes import parse_budget

    spec = parse_budget(text)
    assert (spec.bytes, spec.fraction) == expected


@pytest.mark.parametrize("text", ["1.5", "150%", "0%", "0.0", "lots"])
def test_a_budget_neither_size_nor_share_is_one_line(text: str) -> None:
    from memlayout.activations.sizes import parse_budget

    with pytest.raises(UsageError):
        parse_budget(text)


@pytest.mark.parametrize("aimed", [False, True], ids=["from-the-size-after", "aimed-by-a-traced-floor"])
@pytest.mark.parametrize("peak", [
    lambda n: 1000 + 37 * n,                      # a planned step's floor: nearly in a line from the state at 0
    lambda n: max(1900, 1000 + 37 * n),           # the optimizer's step, the same at every size, outweighs it first
    lambda n: 1000 + 37 * n + 4000 * (n > 40),    # a jump (a kernel that switches algorithm at a size)
    lambda n: 1000 + 5 * n + n * n // 3,          # quadratic, as attention's scores in the sequence
    lambda n: 1000 + 37 * n + 300 * (n % 5 == 0),  # not monotone: allocator rounding at some sizes
])
def test_the_search_above_a_known_fit_finds_what_brute_force_finds(peak: Callable[[int], int], aimed: bool) -> None:
    # As fit() searches with a plan: from one above the plain answer, which is known to fit, with the model's
    # state at size 0 as the anchor of the line, and (aimed) the lowest plan traced once at FLOOR_REACH times the
    # size after the plain answer drawing the first line. Each probe is a budget search, fitting where the peak
    # does.
    for budget in range(1400, 40000, 577):
        known = 0
        while peak(known + 1) <= budget and known < 8:
            known += 1
        calls: list[int] = []

        def probe(n: int, calls: list[int] = calls, budget: int = budget) -> FitProbe:
            calls.append(n)
            fits = peak(n) <= budget
            # A plan found gives the planner's estimate of the floor (here exact); a size where none fits, the
            # lowest figure traced.
            return FitProbe(n, True, budget if fits else peak(n), fits, estimated_guide_bytes=peak(n) if fits else None)

        far = FLOOR_REACH * (known + 1)
        found = largest_fitting(probe, known + 1, known_fit=known, anchor=(0, 1000),
                                floor=(far, peak(far)) if aimed else None, budget=budget)
        truth = known
        while peak(truth + 1) <= budget:
            truth += 1
        if all(peak(n) > budget for n in range(truth + 1, truth + 60)):  # where the peak grows past the answer
            assert found == truth, (budget, found, truth, calls)
        assert len(calls) == len(set(calls)) and min(calls) > known
        assert found in (known, *calls) and found + 1 in calls  # the answer and the size after it were probed
        assert len(calls) <= 2 * math.log2(max(truth, 2)) + 6, (budget, calls)


def test_a_floor_on_its_line_takes_the_answer_and_the_size_after_it_and_nothing_else() -> None:
    def floor(n: int) -> int:
        return 1000 + 37 * n

    for answer in (3, 12, 40, 150, 1000):
        budget = floor(answer) + 20
        calls: list[int] = []

        def probe(n: int, calls: list[int] = calls, budget: int = budget) -> FitProbe:
            calls.append(n)
            return FitProbe(n, True, floor(n), floor(n) <= budget)

        found = largest_fitting(probe, 2, known_fit=1, anchor=(0, 1000), floor=(32, floor(32)), budget=budget)
        assert found == answer and calls == [answer, answer + 1]


def test_the_docs_give_the_fit_sweeps_figures() -> None:
    root = Path(__file__).resolve().parents[3]
    sweep = json.loads((root / "benchmarks" / "results" / "fit_sweep.json").read_text())
    docs = " ".join((root / "docs" / "evidence-fit.md").read_text().split())
    assert f"{sweep['hold']} of {sweep['decisions']} decisions hold" in docs, "rerun the sweep or mend the docs"
    assert sweep["command"] in docs


def test_with_ranks_for_a_gpu_each_size_is_judged_by_its_reserved_peak_and_the_runtime() -> None:
    from memlayout.activations.ranks import analyze_ranks
    from memlayout.activations.ranks.parallel import ShardingOptions

    target, sharding = "tests.activations.sharded_models:llama_style", ShardingOptions(world_size=2)
    specs = [parse_input_spec(s) for s in BATCH_SPECS]
    given = analyze_ranks(target, specs, sharding=sharding, gpu="h100").largest
    assert given.compared_bytes is not None and given.judged_bytes > given.peak_bytes
    # The runtime beside the step (context, cuBLAS) is hundreds of MiB, the step's tensors a few: judged by the
    # peak of live tensors alone, this budget would take a batch many times larger.
    budget = given.judged_bytes + given.peak_bytes // 2

    def largest_rank(batch: int) -> int:
        batch_specs = [s.describe().replace(f"[{s.shape[0]},", f"[{batch},", 1) for s in specs]
        return analyze_ranks(target, batch_specs, sharding=sharding, gpu="h100").largest.judged_bytes

    report = fit(target, specs, budget=budget, sharding=sharding, gpu="h100", with_plan=False)
    size = report.without_plan.size
    assert size >= specs[0].shape[0]
    assert largest_rank(size) <= budget < largest_rank(size + 1)
