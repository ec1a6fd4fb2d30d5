"""docs/evidence-fit.md's tables of the anchors side by side, rendered from benchmarks/results/anchors.json
(written by bench_anchors.py).

The page names the tables by a marker that the site's build replaces with this
rendering (docs/hooks.py), so the page shows the last benchmark's figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results" / "anchors.json"
MARKER = "<!-- memlayout:anchors -->"
TOKENS = 128
"""A training step's sequence length, batch 1."""
PROMPT = 128
"""A generation's prompt, in tokens."""


def gib(count: float) -> str:
    return f"{count / 2**30:.3f} GiB"


def mib(count: float) -> str:
    return f"{count / 2**20:.2f} MiB"


def _ratio(figure: float | None, truth: float | None) -> str:
    return f" ({figure / truth:.2f}x)" if figure is not None and truth else ""


def table_markdown(results: dict[str, Any] | None = None) -> str:
    """Two tables: a training step's anchors, and the KV cache's, each figure beside the measured one."""
    raw = (results if results is not None else json.loads(RESULTS.read_text()))["raw"]
    settings = raw["settings"]
    lines = [f"Training: batch {settings['batch']}, {settings['tokens']} tokens with labels, {settings['dtype']}, "
             f"{settings['optimizer']}. Each tool's ratio is to the real CPU step where one ran, else to memlayout's.",
             "",
             "| model (class) | memlayout: the step's peak | a real CPU step (allocator events) | a real GPU step "
             "| memlayout --weights (weights, gradients, AdamW state) | accelerate: Training using Adam "
             "| DeepSpeed ZeRO-2, per GPU |",
             "|---|---|---|---|---|---|---|"]
    for name, figures in raw["training"].items():
        ours, real = figures["memlayout"], figures.get("real")
        truth = real["peak_bytes"] if real else ours["peak_bytes"]
        states = ours["model_states_bytes"]
        adam = figures["accelerate"]["training_using_adam"]
        zero2 = figures["deepspeed"]["per_gpu_bytes"]
        lines.append(
            f"| {name} ({ours['class']}) | {gib(ours['peak_bytes'])}{_ratio(ours['peak_bytes'], real and truth)} "
            f"| {gib(real['peak_bytes']) if real else 'not built: too large for this machine'} | {figures['gpu']} "
            f"| {gib(states)}{_ratio(states, truth)} | {gib(adam)}{_ratio(adam, truth)} "
            f"| {gib(zero2)}{_ratio(zero2, truth)} |"
        )
    lines += ["", f"Generation: a prompt of {settings['prompt']} tokens, {settings['new_tokens']} new tokens, greedy, "
              f"transformers' default cache, {settings['dtype']}. Each cache's ratio is to the real cache.", "",
              "| model | a real generate's cache (positions held) | memlayout --step generate "
              "| textbook: 2 * layers * kv_heads * head_dim * tokens * bytes | hf-mem | a real GPU generate |",
              "|---|---|---|---|---|---|"]
    for name, figures in raw["generation"].items():
        real = figures.get("real")
        truth = real["cache_bytes"] if real else None
        book = figures["textbook"]
        hf_mem = figures["hf_mem"]
        hf_mem_cell = (f"{mib(hf_mem['cache_bytes'])}{_ratio(hf_mem['cache_bytes'], truth)}"
                       if hf_mem["cache_bytes"] is not None else f"fails: {hf_mem['error']}")
        real_cell = (f"{mib(real['cache_bytes'])} ({', '.join(map(str, real['positions']))})" if real
                     else "not built: too large for this machine")
        ours = figures["memlayout"]
        ours_cell = (f"{mib(ours['cache_bytes'])}{_ratio(ours['cache_bytes'], truth)} cache; "
                     f"the step's peak {mib(ours['peak_bytes'])}")
        lines.append(
            f"| {name} | {real_cell} | {ours_cell} "
            f"| {mib(book['cache_bytes'])}{_ratio(book['cache_bytes'], truth)} "
            f"(2 * {book['layers']} * {book['kv_heads']} * {book['head_dim']} * {book['tokens']} * 4) "
            f"| {hf_mem_cell} | {figures['gpu']} |"
        )
    commands = []
    for name, figures in raw["training"].items():
        parts = [f"memlayout: `{figures['memlayout']['command']}` and `{figures['memlayout']['weights_command']}`",
                 f"accelerate {figures['accelerate']['version']}: {figures['accelerate']['command']}",
                 f"DeepSpeed {figures['deepspeed']['version']}: {figures['deepspeed']['command']}"]
        if figures.get("real"):
            parts.insert(1, f"the real step: {figures['real']['command']}")
        commands.append(f"- {name}, training: " + "; ".join(parts))
    for name, figures in raw["generation"].items():
        parts = [f"memlayout: `{figures['memlayout']['command']}`"]
        if figures.get("real"):
            parts.append(f"the real generate: {figures['real']['command']}")
        commands.append(f"- {name}, generation: " + "; ".join(parts) + f"; hf-mem "
                            f"{figures['hf_mem']['version']}: compute_safetensors_kv_cache_size(config.json, 'F32')")
    return ("\n".join(lines) + "\n\nEach figure's source, run by `python benchmarks/accuracy/bench_anchors.py` "
            "from the repository's root:\n\n" + "\n".join(commands) + "\n")
