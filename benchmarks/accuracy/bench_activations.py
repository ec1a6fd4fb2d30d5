"""`memlayout activations`: predicted training-step memory against the measured truth and torchinfo.

Every figure is measured in this run:
- accuracy: memlayout's prediction on fake tensors, PyTorch's MemTracker on a
  real CPU step (the truth), and torchinfo's "Estimated Total Size", on GPT-2,
  BERT, a flat nn.Sequential CNN and an LSTM language model; activation_bytes
  against what a saved_tensors_hooks pack hook sees, once per storage;
- the plan holds: the plan for a budget, applied for real, measured by MemTracker,
  with the loss and every gradient compared bit for bit;
- no real memory: GPT-2 at 64 x 512 tokens, predicted in one process and run for
  real in another, each process's peak RSS;
- scale: a Llama-architecture 7B config at 1 x 4096 tokens, against PyTorch's
  MemTracker run on the same fake model (the peer), and the goals' limits.

Usage: python benchmarks/accuracy/bench_activations.py [--quick]
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
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from harness import Row, print_table, quick_requested, write_results  # noqa: E402

GIB = 2**30


def mib(count: float) -> str:
    return f"{count / 2**20:.1f} MiB"


def within(value: float, truth: float, share: float = 0.02) -> bool:
    return abs(value - truth) <= share * truth


# children: each figure that needs its own process (RSS) runs this file with --child NAME
def child_gpt2_predict(batch: int, length: int) -> dict[str, Any]:
    import memlayout.activations as act
    from tests.activations import models

    start, cpu = time.perf_counter(), time.process_time()
    report = act.analyze(models.gpt2(**GPT2_BIG), [f"int64[{batch},{length}]<{GPT2_BIG['vocab']}",
                                                  f"labels=int64[{batch},{length}]<{GPT2_BIG['vocab']}"])
    return {"peak_bytes": report.summary.peak_bytes, "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu}


def child_gpt2_real(batch: int, length: int) -> dict[str, Any]:
    from tests.activations import models
    from tests.activations.measure import memtracker_step

    args, kwargs = models.token_inputs(batch, length, GPT2_BIG["vocab"])
    start = time.perf_counter()
    real = memtracker_step(models.gpt2(**GPT2_BIG), args, kwargs)
    return {"peak_bytes": real.peak_bytes, "seconds": time.perf_counter() - start}


def llama_config(layers: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=layers, num_attention_heads=32,
                       num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096)


def child_llama_memlayout(layers: int, length: int) -> dict[str, Any]:
    import tempfile

    start, cpu = time.perf_counter(), time.process_time()
    import memlayout.activations as act

    with tempfile.TemporaryDirectory() as directory:
        llama_config(layers).save_pretrained(directory)
        report = act.analyze(directory, [f"int64[1,{length}]<32000", f"labels=int64[1,{length}]<32000"])
    return {"peak_bytes": report.summary.peak_bytes, "parameter_bytes": report.summary.parameter_bytes,
            "seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu}


def child_llama_memtracker(layers: int, length: int) -> dict[str, Any]:
    start, cpu = time.perf_counter(), time.process_time()
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import LlamaForCausalLM

    from memlayout.activations.step.run import run_step

    with FakeTensorMode():
        model = LlamaForCausalLM(llama_config(layers)).train()
        ids = torch.randint(0, 32000, (1, length))
        # AdamW, as memlayout's default; its state comes from a first step, as in training
        optimizer = torch.optim.AdamW(model.parameters())
        run_step(model, (ids,), {"labels": ids})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tracker = MemTracker()
        tracker.track_external(model, optimizer, ids)
        with tracker:
            run_step(model, (ids,), {"labels": ids})
            optimizer.step()
        peak = sum(s["Total"] for s in tracker.get_tracker_snapshot("peak").values())
    return {"peak_bytes": int(peak), "seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu}


CHILDREN = {
    "gpt2-predict": child_gpt2_predict,
    "gpt2-real": child_gpt2_real,
    "llama-memlayout": child_llama_memlayout,
    "llama-memtracker": child_llama_memtracker,
}


def in_child(name: str, *args: int) -> dict[str, Any]:
    """Run CHILDREN[name](*args) in a fresh interpreter; its own peak RSS comes back with the result."""
    command = [sys.executable, __file__, "--child", name, *map(str, args)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"child {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def peak_rss_bytes() -> int:
    """This process's peak RSS (VmHWM). Not getrusage's ru_maxrss: Linux carries that over
    exec from the forking parent, so a child would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child_main(name: str, args: list[str]) -> None:
    result = CHILDREN[name](*map(int, args))
    result["max_rss_bytes"] = peak_rss_bytes()
    print(json.dumps(result))


# sections -------------------------------------------------------------------
GPT2_BIG = {"layers": 3, "width": 128, "heads": 4, "vocab": 2048, "positions": 512}


def cases(quick: bool) -> dict[str, tuple[Any, Any, float, str]]:
    """name -> (model, inputs, budget as a share of the measured peak, optimizer).

    The names stay as before the optimizer was part of the step (headlines.py picks rows by them); the
    optimizer of each case is in its raw results.
    """
    from tests.activations import models

    scale = 1 if quick else 2
    return {
        "GPT-2 (4 layers, 128 wide) 8x128": (
            lambda: models.gpt2(layers=4, width=128, vocab=1000, positions=256),
            lambda: models.token_inputs(4 * scale, 128, 1000), 0.7, "adamw"),
        "BERT (4 layers, 128 wide) 8x128": (
            lambda: models.bert(layers=4, width=128, vocab=1000, positions=256),
            lambda: models.token_inputs(4 * scale, 128, 1000), 0.7, "adamw"),
        "flat CNN (nn.Sequential) 32x3x64x64": (
            lambda: models.flat_cnn(channels=32), lambda: models.image_inputs(16 * scale, 64), 0.8, "sgd"),
        "LSTM LM (2 layers, 256) 16x128": (
            lambda: models.lstm_lm(vocab=2000, width=128, hidden=256),
            lambda: models.token_inputs(8 * scale, 128, 2000, labels=False), 0.95, "none"),
    }


def torchinfo_estimate(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """torchinfo's "Estimated Total Size": input + forward/backward pass size + parameters."""
    import torchinfo

    data: Any = {"input_ids": args[0], **kwargs} if kwargs else list(args)
    stats = torchinfo.summary(model, input_data=data, mode="train", verbose=0)
    return int(stats.total_input + stats.total_output_bytes + stats.total_param_bytes)


def accuracy_and_plans(quick: bool) -> tuple[list[Row], dict[str, Any]]:
    import torch

    import memlayout.activations as act
    from tests.activations.measure import memtracker_step, saved_bytes_seen_by_pack_hook

    rows: list[Row] = []
    raw: dict[str, Any] = {}
    for name, (build, make_inputs, share, optimizer) in cases(quick).items():
        args, kwargs = make_inputs()
        truth = memtracker_step(build(), args, kwargs, optimizer=optimizer)
        start = time.perf_counter()
        report = act.analyze(build(), list(args), kwargs=kwargs, optimizer=optimizer)
        seconds = time.perf_counter() - start
        estimate = torchinfo_estimate(build(), args, kwargs)
        saved_truth = saved_bytes_seen_by_pack_hook(build(), args, kwargs)
        predicted = report.summary.peak_bytes
        rows.append(Row(f"{name}: peak, memlayout (fake tensors)", mib(predicted),
                        f"MemTracker, real CPU step {mib(truth.peak_bytes)}",
                        predicted / truth.peak_bytes, "within 2%", within(predicted, truth.peak_bytes)))
        rows.append(Row(f"{name}: peak, torchinfo estimate", mib(estimate), f"MemTracker {mib(truth.peak_bytes)}",
                        estimate / truth.peak_bytes, "(anchor)", True))
        activation = report.summary.activation_bytes
        rows.append(Row(f"{name}: activation_bytes", mib(activation), f"pack hook, once per storage {mib(saved_truth)}",
                        activation / saved_truth, "within 2%", within(activation, saved_truth)))
        budget = int(truth.peak_bytes * share)
        planned = act.analyze(build(), list(args), kwargs=kwargs, budget=budget, optimizer=optimizer).plan
        assert planned is not None
        model = build()
        with act.apply_plan(model, planned.plan):
            measured = memtracker_step(model, args, kwargs, optimizer=optimizer)
        equal = torch.equal(measured.loss, truth.loss) and all(
            torch.equal(measured.grads[k], g) for k, g in truth.grads.items())
        rows.append(Row(f"{name}: plan applied for real, peak / budget {share:.2f}x",
                        mib(measured.peak_bytes), f"budget {mib(budget)}", measured.peak_bytes / budget,
                        "<= 1.00x, loss+grads bitwise equal", measured.peak_bytes <= budget and equal))
        raw[name] = {
            "memtracker_peak": truth.peak_bytes, "memlayout_peak": predicted, "torchinfo_estimate": estimate,
            "activation_bytes": activation, "pack_hook_bytes": saved_truth, "trace_seconds": seconds,
            "budget": budget, "plan": planned.plan.to_dict(), "plan_predicted_peak": planned.peak_bytes,
            "plan_measured_peak": measured.peak_bytes, "bitwise_equal": equal,
            "recompute_flops": planned.recompute_flops, "forward_flops": report.summary.forward_flops,
            "optimizer": optimizer,
        }
    return rows, raw


def no_real_memory(quick: bool) -> tuple[list[Row], dict[str, Any]]:
    batch, length = (16, 512) if quick else (64, 512)
    predicted = in_child("gpt2-predict", batch, length)
    real = in_child("gpt2-real", batch, length)
    label = f"GPT-2 ({GPT2_BIG['layers']} layers, vocab {GPT2_BIG['vocab']}) {batch}x{length}"
    rows = [
        Row(f"{label}: peak predicted", mib(predicted["peak_bytes"]),
            f"real step, MemTracker {mib(real['peak_bytes'])}",
            predicted["peak_bytes"] / real["peak_bytes"], "within 2%",
            within(predicted["peak_bytes"], real["peak_bytes"])),
        Row(f"{label}: memlayout process peak RSS", mib(predicted["max_rss_bytes"]), "limit 1024.0 MiB",
            predicted["max_rss_bytes"] / GIB, "< 1.00x", predicted["max_rss_bytes"] < GIB),
        Row(f"{label}: memlayout process peak RSS", mib(predicted["max_rss_bytes"]),
            f"real step's process {mib(real['max_rss_bytes'])}", predicted["max_rss_bytes"] / real["max_rss_bytes"],
            "(info)", True),
    ]
    if not quick:
        rows.append(Row(f"{label}: the real step needs", mib(real["peak_bytes"]), "3 GiB",
                        real["peak_bytes"] / (3 * GIB),
                        "> 1.00x", real["peak_bytes"] > 3 * GIB))
    return rows, {"batch": batch, "length": length, "predict": predicted, "real": real}


def scale(quick: bool) -> tuple[list[Row], dict[str, Any]]:
    layers, length = (4, 1024) if quick else (32, 4096)
    ours = in_child("llama-memlayout", layers, length)
    peer = in_child("llama-memtracker", layers, length)
    label = f"Llama {layers} layers x 4096 ({ours['parameter_bytes'] / 4 / 1e9:.2f}B params) 1x{length}"
    rows = [
        Row(f"{label}: memlayout wall time (import, build, trace)", f"{ours['seconds']:.1f} s", "limit 60 s",
            ours["seconds"] / 60, "< 1.00x", ours["seconds"] < 60),
        Row(f"{label}: memlayout CPU time", f"{ours['cpu_seconds']:.1f} s",
            f"MemTracker on the same fake model {peer['cpu_seconds']:.1f} s", ours["cpu_seconds"] / peer["cpu_seconds"],
            "(info)", True),
        Row(f"{label}: memlayout peak RSS", mib(ours["max_rss_bytes"]), "limit 2048.0 MiB",
            ours["max_rss_bytes"] / (2 * GIB), "< 1.00x", ours["max_rss_bytes"] < 2 * GIB),
        Row(f"{label}: predicted peak", mib(ours["peak_bytes"]),
            f"MemTracker on fake tensors {mib(peer['peak_bytes'])}",
            ours["peak_bytes"] / peer["peak_bytes"], "within 2%", within(ours["peak_bytes"], peer["peak_bytes"])),
        Row(f"{label}: predicted peak", mib(ours["peak_bytes"]), f"this machine's memory {mib(24 * GIB)}",
            ours["peak_bytes"] / (24 * GIB), "(info: cannot run for real here)", True),
    ]
    return rows, {"layers": layers, "length": length, "memlayout": ours, "memtracker_fake": peer}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        child_main(argv[1], argv[2:])
        return 0
    quick = quick_requested(argv)
    rows: list[Row] = []
    raw: dict[str, Any] = {}
    for section, run in (("accuracy", accuracy_and_plans), ("no_real_memory", no_real_memory), ("scale", scale)):
        section_rows, raw[section] = run(quick)
        rows += section_rows
    print_table("memlayout activations: prediction vs measured truth, torchinfo and the goals", rows)
    write_results("bench_activations", rows, raw, quick)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
