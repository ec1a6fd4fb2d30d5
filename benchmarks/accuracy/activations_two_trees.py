"""`memlayout activations`' reports in two source trees of memlayout, compared byte for byte.

Usage: python benchmarks/accuracy/activations_two_trees.py OLD_TREE NEW_TREE [--only TEXT] [--jobs N] [--cache FILE]

For "the reports did not change" claims about a refactoring of the activations command:
each command of COMMANDS (the suite's and the docs' kinds of run, on small models:
one device, --budget, --real, meta, inference, generate, --fit, FSDP2, tensor
parallel, DDP, LoRA, --weights, and the refusals of settings that do not go together)
runs in a fresh process with each tree first on PYTHONPATH and its own working
directory, so `tests.activations.models:gpt2` and `benchmarks/configs/...` resolve in
that tree. Its exit status, stdout and stderr are compared; a difference prints a
unified diff. Exit 0 when every command's three agree.

The CPU's roofline, which prices what a plan reruns, is measured by each process
(device/roofline.py), and on a machine others share the same command can price a
plan differently from one run to the next and choose another: each run here takes
the same fixed rates instead (`FIXED_ROOFLINE`), so that only the code differs.

Make OLD_TREE with `git archive COMMIT | tar -x -C DIR`; the NEW_TREE is a checkout.
`--cache FILE` keeps the old tree's runs in FILE (JSON) and reads them from there
next time, so that a second comparison runs the new tree alone.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

GPT2 = ["tests.activations.models:gpt2", "--input", "int64[2,32]<500", "--input", "labels=int64[2,32]<500"]
LLAMA = ["tests.activations.models:llama", "--input", "int64[2,16]<500", "--input", "labels=int64[2,16]<500"]
CNN = ["tests.activations.models:flat_cnn", "--input", "float32[2,3,16,16]"]
RANKS = ["tests.activations.sharded_models:llama_style", "--input", "input_ids=int64[2,16]<500",
         "--input", "labels=int64[2,16]<500"]
CONFIG = ["benchmarks/configs/gpt2-124m"]
COMMANDS: list[list[str]] = [
    # one device
    GPT2,
    [*GPT2, "--format", "json"],
    [*GPT2, "--budget", "2700KiB"],
    [*GPT2, "--budget", "2700KiB", "--format", "json"],
    [*GPT2, "--budget", "100KiB"],
    ["fixtures.activation_models:cnn", "--input", "float32[4,3,32,32]", "--budget", "12MiB", "--depth", "1"],
    [*CNN, "--real"],
    [*CNN, "--device", "meta"],
    [*CNN, "--optimizer", "sgd", "--depth", "1"],
    [*LLAMA, "--dtype", "bf16"],
    [*LLAMA, "--autocast", "bf16", "--format", "json"],
    [*LLAMA, "--step", "inference"],
    ["tests.activations.models:llama", "--input", "int64[2,16]<500", "--step", "generate", "--new-tokens", "4"],
    ["tests.activations.models:llama", "--input", "int64[2,16]<500", "--step", "generate", "--new-tokens", "4",
     "--cache", "static", "--format", "json"],
    ["tests.activations.models:lstm_lm", "--input", "int64[2,16]<100"],
    # --fit
    [*GPT2, "--fit", "batch", "--budget", "3MiB"],
    [*GPT2, "--fit", "seq", "--budget", "3MiB", "--format", "json"],
    [*CNN, "--fit", "batch", "--budget", "2MiB", "--step", "inference"],
    # ranks
    [*RANKS, "--world-size", "2", "--fsdp"],
    ["tests.activations.sharded_models:llama_style_even", *RANKS[1:], "--world-size", "4", "--fsdp", "--tp", "2",
     "--format", "json"],
    [*RANKS, "--world-size", "2", "--fsdp", "--param-dtype", "bfloat16", "--reduce-dtype", "float32",
     "--no-reshard-after-forward"],
    [*RANKS, "--world-size", "2", "--fsdp", "--budget", "11MiB"],
    [*RANKS, "--world-size", "2", "--fsdp", "--budget", "3MiB"],
    [*RANKS, "--world-size", "2", "--ddp", "--bucket-cap-mb", "1"],
    [*RANKS, "--world-size", "2", "--fsdp", "--fit", "batch", "--budget", "12MiB"],
    # adapters
    [*LLAMA, "--lora", "8"],
    [*LLAMA, "--lora", "8", "--lora-targets", "q_proj,v_proj", "--lora-dropout", "0.1", "--format", "json"],
    [*LLAMA, "--dora"],
    # without a step
    CONFIG,
    [*CONFIG, "--weights", "--format", "json"],
    [*CONFIG, "--optimizer", "sgd"],
    ["benchmarks/configs/gpt2-124m", "--model-class", "GPT2Model", "--input", "int64[1,16]<50257", "--depth", "1"],
    # refusals: one line on stderr, exit 2
    ["tests.activations.models:gpt2", "--inputs", "tests.activations.models:gpt2_inputs", "--input", "int64[2]<5"],
    [*CONFIG, "--weights", "--budget", "1GiB"],
    [*CONFIG, "--weights", "--lora", "8"],
    [*CONFIG, "--fsdp"],
    [*CONFIG, "--weights", "--world-size", "2"],
    [*GPT2, "--fsdp"],
    [*GPT2, "--world-size", "2", "--fsdp", "--bucket-cap-mb", "1"],
    [*GPT2, "--world-size", "2", "--ddp", "--param-dtype", "bfloat16"],
    [*GPT2, "--world-size", "2"],
    [*GPT2, "--world-size", "3", "--fsdp", "--tp", "2"],
    [*GPT2, "--world-size", "2", "--fsdp", "--param-dtype", "int8"],
    [*GPT2, "--new-tokens", "4"],
    [*GPT2, "--cache", "static"],
    [*GPT2, "--step", "generate"],
    [*GPT2, "--step", "generate", "--new-tokens", "0"],
    [*GPT2, "--step", "generate", "--new-tokens", "2", "--cache", "paged"],
    [*GPT2, "--step", "sample"],
    [*GPT2, "--step", "inference", "--optimizer", "sgd"],
    [*GPT2, "--step", "inference", "--budget", "1GiB"],
    [*GPT2, "--optimizer", "lion"],
    [*GPT2, "--autocast", "fp8"],
    [*GPT2, "--dtype", "fp64"],
    [*GPT2, "--lora-targets", "c_attn"],
    [*GPT2, "--lora", "8", "--lora-targets", ","],
    [*GPT2, "--lora", "8", "--world-size", "2", "--fsdp"],
    [*GPT2, "--quantize", "nf4", "--world-size", "2", "--fsdp"],
    [*GPT2, "--gpu", "h100"],
    [*GPT2, "--gpu", "h100", "--world-size", "2", "--fsdp"],
    [*GPT2, "--device", "cuda"],
    [*GPT2, "--fit", "batch", "--real", "--budget", "1GiB"],
    ["tests.activations.models:gpt2", "--inputs", "tests.activations.models:gpt2_inputs", "--fit", "batch",
     "--budget", "1GiB"],
    [*GPT2, "--fit", "batch", "--allow-offload", "--budget", "1GiB"],
    [*GPT2, "--fit", "width", "--budget", "1GiB"],
    [*GPT2, "--fit", "batch"],
    [*GPT2, "--fit", "batch", "--budget", "1KiB"],
    [*GPT2, "--world-size", "2", "--fsdp", "--real"],
    [*GPT2, "--world-size", "2", "--fsdp", "--device", "meta"],
    [*GPT2, "--world-size", "2", "--fsdp", "--budget", "0.9"],
    [*GPT2, "--world-size", "2", "--ddp", "--allow-offload"],
    [*GPT2, "--world-size", "2", "--fsdp", "--step", "inference", "--fit", "batch", "--budget", "1GiB"],
    [*GPT2, "--world-size", "2", "--fsdp", "--autocast", "bf16", "--fit", "batch", "--budget", "1GiB"],
    [*GPT2, "--world-size", "2", "--tp", "2", "--step", "inference"],
    ["tests.activations.sharded_models:transformers_llama", "--input", "input_ids=int64[2,16]<500", "--world-size", "2",
     "--tp", "2", "--step", "inference", "--budget", "1GiB"],
    [*GPT2, "--budget", "lots"],
    [*GPT2, "--budget", "1.5"],
    ["tests.activations.models:gpt2"],
    ["no_such_module_xyz:build", "--input", "float32[2]"],
]


FIXED_ROOFLINE = """
import sys
from memlayout.activations.device import roofline
rates = roofline.Roofline("this machine's CPU", 2.0**37, 2.0**36, 2.0**34, roofline.CPU_RATES_SOURCE)
roofline.cpu_roofline = lambda: rates
from memlayout.cli.app import main
sys.exit(main(sys.argv[1:]))
"""
"""Runs `memlayout ARGS` with the CPU's rates fixed (128 TFLOP/s is no CPU's: a plan's price only orders plans)."""


def run(tree: str, args: list[str]) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of `memlayout activations ARGS` with `tree`'s memlayout."""
    env = {**os.environ, "PYTHONPATH": tree, "COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"}
    done = subprocess.run([sys.executable, "-c", FIXED_ROOFLINE, "activations", *args], env=env, cwd=tree,
                          capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout, done.stderr


def compare(before: tuple[int, str, str], after: tuple[int, str, str]) -> list[str]:
    """The differences between two runs of one command, as unified-diff lines; empty when none."""
    lines: list[str] = []
    if before[0] != after[0]:
        lines.append(f"exit status {before[0]} -> {after[0]}")
    for name, a, b in (("stdout", before[1], after[1]), ("stderr", before[2], after[2])):
        if a != b:
            lines.extend(difflib.unified_diff(a.splitlines(), b.splitlines(), f"old {name}", f"new {name}",
                                              lineterm=""))
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--only", help="run only the commands whose arguments contain this text")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--cache", help="keep the old tree's runs in this JSON file, and read them from it")
    options = parser.parse_args(argv)
    chosen = [args for args in COMMANDS if options.only is None or options.only in " ".join(args)]
    cached: dict[str, list[object]] = {}
    if options.cache and os.path.exists(options.cache):
        with open(options.cache, encoding="utf-8") as handle:
            cached = json.load(handle)

    def old_run(args: list[str]) -> tuple[int, str, str]:
        key = json.dumps(args)
        if key not in cached:
            cached[key] = list(run(options.old, args))
        code, out, err = cached[key]
        return int(str(code)), str(out), str(err)

    with ThreadPoolExecutor(options.jobs) as pool:
        results = list(pool.map(lambda args: compare(old_run(args), run(options.new, args)), chosen))
    if options.cache:
        with open(options.cache, "w", encoding="utf-8") as handle:
            json.dump(cached, handle)
    differing = 0
    for args, lines in zip(chosen, results, strict=True):
        shown = "memlayout activations " + " ".join(args)
        if lines:
            differing += 1
            print(f"DIFFERS: {shown}")
            print("\n".join(f"    {line}" for line in lines))
        else:
            print(f"same:    {shown}")
    print(f"{len(chosen) - differing} of {len(chosen)} commands the same byte for byte (exit status, stdout, "
          "stderr)")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
