"""Memory across ranks: `memlayout activations --world-size N --fsdp` against the truth and the other estimates.

Every figure is measured in this run:
- scale: a Llama-7B config at 1x4096 tokens per rank on 64 ranks, the command
  timed end to end with its own peak RSS, against torch's FSDPMemTracker run on
  fake ranks by an independent script (the peer), and the goals' limits;
- real ranks: each rank's predicted peak against two real gloo ranks on this CPU,
  measured by FSDPMemTracker, and a plan followed for real;
- will it fit: the same models side by side, memlayout, FSDPMemTracker on fake
  ranks, accelerate's `estimate-memory` arithmetic, DeepSpeed's ZeRO-3 estimate,
  and the real run where one fits here. docs/evidence-fit.md renders its table
  from this file's results (benchmarks/results/will_it_fit.json).

Usage: python benchmarks/accuracy/bench_ranks.py [--quick]
       python benchmarks/accuracy/bench_ranks.py --child NAME MODEL   (one figure, as the docs print it)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from harness import RESULTS, Row, print_table, quick_requested, write_results  # noqa: E402

GIB = 2**30
PYTHON = "python"
"""How the commands the docs print start Python (the bench runs them with sys.executable)."""


@dataclass(frozen=True)
class Case:
    """One model, one layout, one rank's batch."""

    label: str
    target: str
    """What `memlayout activations` is given: pkg.module:build or a config directory."""
    world_size: int
    batch: int
    length: int
    vocab: int
    real: bool
    """Small enough for two real gloo ranks on this machine."""
    builder: str = ""
    """pkg.module:function building the model on any device (the real ranks and the peers)."""
    flags: tuple[str, ...] = ()
    """More of the command's flags."""

    @property
    def inputs(self) -> list[str]:
        shape = f"int64[{self.batch},{self.length}]<{self.vocab}"
        return [f"input_ids={shape}", f"labels={shape}"]

    def command(self) -> str:
        inputs = " ".join(f"--input '{spec}'" for spec in self.inputs)
        flags = "".join(f" {flag}" for flag in self.flags)
        return f"memlayout activations {self.target} {inputs} --world-size {self.world_size} --fsdp{flags}"


CASES = {
    "llama-style": Case(
        "Llama-style in plain torch: 4 layers, hidden 128, vocab 1000",
        "tests.activations.sharded_models:llama_style", 2, 2, 128, 1000, True,
        "tests.activations.sharded_models:llama_style"),
    "llama-tiny": Case(
        "Llama (transformers), 4 layers, hidden 128, vocab 1000", "benchmarks/configs/llama-tiny", 2, 2, 128, 1000,
        True, "bench_ranks:llama_tiny"),
    "llama-7b-8": Case(
        "Llama-7B (transformers config)", "benchmarks/configs/llama-7b", 8, 1, 4096, 32000,
        False, "bench_ranks:llama_7b"),
    "llama-7b-64": Case(
        "Llama-7B (transformers config)", "benchmarks/configs/llama-7b", 64, 1, 4096, 32000,
        False, "bench_ranks:llama_7b"),
}
QUICK_CASES = ("llama-style", "llama-tiny")
GPU_CASE = Case(
    "Llama 3.1 8B (transformers config), 2x8192 per rank, for an H100, op-level AC", "benchmarks/configs/llama-3.1-8b",
    8, 2, 8192, 128256, False, flags=("--gpu", "h100", "--selective-ac", "torchtitan", "--dtype", "bf16"))
"""The goal of issue 54: 8 fake CUDA ranks of Llama 3.1 8B for an H100 with selective checkpointing, under 60 s and
2 GiB, the reserved peak per rank on the card included."""


def llama_tiny() -> Any:
    return _llama("llama-tiny")


def llama_7b() -> Any:
    return _llama("llama-7b")


def _llama(name: str) -> Any:
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    torch.manual_seed(0)
    return LlamaForCausalLM(AutoConfig.from_pretrained(ROOT / "benchmarks" / "configs" / name)).train()


def _resolve(spec: str) -> Any:
    import importlib

    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


# ------------------------------------------------------------------------------------------------
# children: each figure in a process of its own, printed as one JSON line


def child_memlayout(case: Case) -> dict[str, Any]:
    """The command as a user runs it, timed end to end; its own peak RSS (benchmarks/speed/measure_child.py)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "report.json"
        command = [sys.executable, "-m", "memlayout", "activations", case.target,
                   *[a for spec in case.inputs for a in ("--input", spec)],
                   "--world-size", str(case.world_size), "--fsdp", *case.flags, "--format", "json", "-o", str(out)]
        measured = json.loads(subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "speed" / "measure_child.py"), *command],
            capture_output=True, text=True, check=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        ).stdout)
        if measured["exit"] != 0:
            failed = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                                    env=dict(os.environ, PYTHONPATH=str(ROOT)))
            raise RuntimeError(f"{' '.join(command)} exited {measured['exit']}: {failed.stderr.strip()[-500:]}")
        report = json.loads(out.read_text())
    return {"peak_bytes": report["summary"]["peak_bytes"], "ranks": report["ranks"], "seconds": measured["seconds"],
            "max_rss_bytes": int(measured["max_rss_mib"] * 2**20), "command": case.command(),
            "reserved_peak_bytes": report["summary"].get("reserved_peak_bytes"), "card": report.get("card")}


def child_fsdpmemtracker(case: Case) -> dict[str, Any]:
    """The peer: torch's FSDPMemTracker on rank 0 of fake ranks, written as torch's own tests use it.

    The model is built inside FakeTensorMode, the device mesh before it; two steps
    of AdamW, the module statistics reset after the first.
    """
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    start = time.perf_counter()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=case.world_size)
    mesh = init_device_mesh("cpu", (case.world_size,))
    with FakeTensorMode():
        model = _resolve(case.builder)()
        blocks = model.model.layers if hasattr(model, "model") else model.layers
        for block in blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
        ids = torch.randint(0, case.vocab, (case.batch, case.length))
        labels = torch.randint(0, case.vocab, (case.batch, case.length))
        tracker = FSDPMemTracker(model, optimizer)
        tracker.track_inputs((ids, labels))
        with tracker:
            for iteration in range(2):
                loss = model(input_ids=ids, labels=labels)["loss"]
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                if iteration == 0:
                    tracker.reset_mod_stats()
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    dist.destroy_process_group()
    return {"peak_bytes": int(peak), "seconds": time.perf_counter() - start,
            "command": f"{PYTHON} benchmarks/accuracy/bench_ranks.py --child fsdpmemtracker {_key(case)}"}


def _meta_model(case: Case, base: bool = False) -> Any:
    """The model on the meta device; `base` is what accelerate builds for a transformers config (AutoModel)."""
    import torch

    if case.target.startswith("benchmarks/configs/"):
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(ROOT / case.target)
        with torch.device("meta"):
            return (AutoModel if base else AutoModelForCausalLM).from_config(config, torch_dtype=torch.float32)
    with torch.device("meta"):
        return _resolve(case.builder)()


def child_accelerate(case: Case) -> dict[str, Any]:
    """`accelerate estimate-memory`'s arithmetic, on the model built from its config instead of the hub.

    estimate-memory builds `AutoModel.from_config` (the base model, without an LM
    head) under init_empty_weights, sums it with calculate_maximum_sizes, and
    reports "Training using Adam" as the largest of estimate_training_usage's figures.
    """
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes

    total, _largest_layer = calculate_maximum_sizes(_meta_model(case, base=True))
    usage = estimate_training_usage(total, "float32")
    return {"training_adam_bytes": int(max(usage.values())), "model_bytes": int(total),
            "command": f"{PYTHON} benchmarks/accuracy/bench_ranks.py --child accelerate {_key(case)}"}


def child_deepspeed(case: Case) -> dict[str, Any]:
    """DeepSpeed's ZeRO-3 estimate of model states per GPU (no offload, zero_init), for the same ranks.

    deepspeed's model_to_params counts parameters once per data_ptr(), which is 0
    for every meta tensor, so the same sums are taken here per parameter object.
    """
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    model = _meta_model(case)
    total = sum({id(p): p.numel() for p in model.parameters()}.values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    _, gpu, _ = estimate_zero3_model_states_mem_needs(
        total, largest, num_gpus_per_node=case.world_size, num_nodes=1, cpu_offload=False, cpu_offload_params=False,
        zero_init=True,
    )
    return {"per_gpu_bytes": int(gpu), "total_params": total, "largest_layer_params": largest,
            "command": f"{PYTHON} benchmarks/accuracy/bench_ranks.py --child deepspeed {_key(case)}"}


def child_real(case: Case) -> dict[str, Any]:
    """Two real gloo ranks, each measured by FSDPMemTracker (tests/activations/real_ranks.py)."""
    from tests.activations import real_ranks

    with tempfile.TemporaryDirectory() as folder:
        results = real_ranks.run_ranks(real_ranks.measure_step, case.world_size, Path(folder), case.builder, None,
                                       "tests.activations.sharded_models:token_batch")
    return {"ranks": {str(r["rank"]): r["peak_bytes"] for r in results},
            "command": f"{PYTHON} benchmarks/accuracy/bench_ranks.py --child real {_key(case)}"}


CHILDREN = {
    "memlayout": child_memlayout,
    "fsdpmemtracker": child_fsdpmemtracker,
    "accelerate": child_accelerate,
    "deepspeed": child_deepspeed,
    "real": child_real,
}


def _key(case: Case) -> str:
    return next(key for key, value in CASES.items() if value == case)


def in_child(name: str, key: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", name, key]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'benchmarks'}", TRANSFORMERS_VERBOSITY="error")
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"child {name} {key} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------
# sections


def mib(count: float) -> str:
    """MiB, or GiB from 1 GiB on."""
    return f"{count / GIB:.2f} GiB" if count >= GIB else f"{count / 2**20:.1f} MiB"


def gib(count: float) -> str:
    return f"{count / GIB:.2f} GiB"


def within(value: float, truth: float, share: float) -> bool:
    return abs(value - truth) <= share * truth


def will_it_fit(keys: tuple[str, ...]) -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    raw: dict[str, Any] = {}
    for key in keys:
        case = CASES[key]
        figures: dict[str, Any] = {"case": asdict(case), "memlayout_command": case.command()}
        for name in ("memlayout", "fsdpmemtracker", "accelerate", "deepspeed"):
            figures[name] = in_child(name, key)
        if case.real:
            figures["real"] = in_child("real", key)
        raw[key] = figures
        ours, peer = figures["memlayout"], figures["fsdpmemtracker"]
        label = f"{case.label}, {case.world_size} ranks"
        rows.append(Row(f"{label}: memlayout, largest rank", mib(ours["peak_bytes"]),
                        f"FSDPMemTracker, fake rank 0 {mib(peer['peak_bytes'])}",
                        ours["peak_bytes"] / peer["peak_bytes"],
                        "within 1%", within(ours["peak_bytes"], peer["peak_bytes"], 0.01)))
        if case.real:
            predicted = {str(r["rank"]): r["peak_bytes"] for r in ours["ranks"]}
            for rank, measured in figures["real"]["ranks"].items():
                mine = predicted.get(rank, ours["ranks"][0]["peak_bytes"])
                rows.append(Row(f"{label}: rank {rank} predicted", mib(mine), f"real gloo rank {rank} {mib(measured)}",
                                mine / measured, "within 2%", within(mine, measured, 0.02)))
        rows.append(Row(f"{label}: accelerate 'Training using Adam' (one device)",
                        mib(figures["accelerate"]["training_adam_bytes"]), f"memlayout {mib(ours['peak_bytes'])}",
                        figures["accelerate"]["training_adam_bytes"] / ours["peak_bytes"], "(anchor)", True))
        rows.append(Row(f"{label}: DeepSpeed ZeRO-3 model states per GPU", mib(figures["deepspeed"]["per_gpu_bytes"]),
                        f"memlayout {mib(ours['peak_bytes'])}",
                        figures["deepspeed"]["per_gpu_bytes"] / ours["peak_bytes"],
                        "(anchor)", True))
    return rows, raw


def scale(raw_fit: dict[str, Any]) -> list[Row]:
    figures = raw_fit["llama-7b-64"]
    ours, peer = figures["memlayout"], figures["fsdpmemtracker"]
    label = "Llama-7B, 64 ranks, 1x4096 per rank"
    return [
        Row(f"{label}: memlayout wall time (the command, end to end)", f"{ours['seconds']:.1f} s", "limit 60 s",
            ours["seconds"] / 60, "<= 1.00x", ours["seconds"] <= 60),
        Row(f"{label}: memlayout peak RSS", mib(ours["max_rss_bytes"]), "limit 2048.0 MiB",
            ours["max_rss_bytes"] / (2 * GIB), "< 1.00x", ours["max_rss_bytes"] < 2 * GIB),
        Row(f"{label}: largest rank's peak", gib(ours["peak_bytes"]),
            f"FSDPMemTracker, fake ranks {gib(peer['peak_bytes'])}",
            ours["peak_bytes"] / peer["peak_bytes"], "within 1%", within(ours["peak_bytes"], peer["peak_bytes"], 0.01)),
        Row(f"{label}: memlayout wall time", f"{ours['seconds']:.1f} s",
            f"the peer script {peer['seconds']:.1f} s (no import, no report)", ours["seconds"] / peer["seconds"],
            "(info)", True),
    ]


def gpu_speed() -> tuple[list[Row], dict[str, Any]]:
    """8 fake CUDA ranks of Llama 3.1 8B for an H100 with op-level checkpointing: time and memory, against the goals."""
    case = GPU_CASE
    try:
        ours = child_memlayout(case)
    except RuntimeError as exc:  # a torch whose fake CUDA device cannot run says so in one line
        return [Row(f"{case.label}, {case.world_size} ranks: not run", str(exc)[-160:], "limit 60 s", 0.0, "<= 1.00x",
                    False)], {"error": str(exc), "command": case.command()}
    label = f"{case.label}, {case.world_size} ranks"
    reserved = ours["reserved_peak_bytes"] or 0
    return [
        Row(f"{label}: wall time (the command, end to end)", f"{ours['seconds']:.1f} s", "limit 60 s",
            ours["seconds"] / 60, "<= 1.00x", ours["seconds"] <= 60),
        Row(f"{label}: peak RSS", mib(ours["max_rss_bytes"]), "limit 2048.0 MiB", ours["max_rss_bytes"] / (2 * GIB),
            "< 1.00x", ours["max_rss_bytes"] < 2 * GIB),
        Row(f"{label}: reserved per rank", gib(reserved), f"peak of live tensors {gib(ours['peak_bytes'])}",
            reserved / ours["peak_bytes"], "(info)", True),
    ], ours


def plan_for_real() -> tuple[list[Row], dict[str, Any]]:
    """A plan for 0.8x of the measured peak, followed for real on two gloo ranks, as the report prints it."""
    from memlayout.activations.ranks import analyze_ranks
    from memlayout.activations.ranks.parallel import ShardingOptions
    from tests.activations import real_ranks

    case = CASES["llama-style"]
    batch = "tests.activations.sharded_models:token_batch"
    with tempfile.TemporaryDirectory() as folder:
        baseline = real_ranks.run_ranks(real_ranks.measure_step, 2, Path(folder) / "a", case.builder, None, batch)
        budget = int(max(r["peak_bytes"] for r in baseline) * 0.8)
        report = analyze_ranks(case.target, case.inputs, sharding=ShardingOptions(world_size=2), budget=budget)
        assert report.plan is not None
        followed = real_ranks.run_ranks(real_ranks.measure_step, 2, Path(folder) / "b", case.builder,
                                        report.plan.sharding.code(), batch)
    rows = []
    for result in followed:
        same = result["losses"] == baseline[result["rank"]]["losses"]
        rows.append(Row(f"{case.label}: plan followed for real, rank {result['rank']} / budget 0.80x",
                        mib(result["peak_bytes"]), f"budget {mib(budget)}", result["peak_bytes"] / budget,
                        "<= 1.00x, losses bitwise equal", result["peak_bytes"] <= budget and same))
    return rows, {"budget": budget, "checkpoint": list(report.plan.sharding.checkpoint),
                  "predicted": [r.peak_bytes for r in report.plan.ranks],
                  "measured": [r["peak_bytes"] for r in followed],
                  "command": f"{case.command()} --budget {budget}"}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        print(json.dumps(CHILDREN[argv[1]](CASES[argv[2]])))
        return 0
    quick = quick_requested(argv)
    keys = QUICK_CASES if quick else tuple(CASES)
    rows, raw_fit = will_it_fit(keys)
    raw: dict[str, Any] = {"will_it_fit": raw_fit}
    if not quick:
        rows = scale(raw_fit) + rows
        gpu_rows, raw["gpu_speed"] = gpu_speed()
        rows = gpu_rows + rows
    plan_rows, raw["plan"] = plan_for_real()
    rows += plan_rows
    print_table("memlayout activations --world-size: each rank against FSDPMemTracker, real ranks and the estimates",
                rows)
    write_results("ranks", rows, raw, quick)
    if not quick:
        (RESULTS / "will_it_fit.json").write_text(json.dumps(raw_fit, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
