"""The headline figures the performance page leads with, picked from the last full `make bench` run.

The page's figures block is rendered from benchmarks/results/*.json by
`headlines_markdown()`, and a test holds the page to it (`pytest --overwrite`
rewrites the block after a new run), so the headlines are only figures that a
results file holds, each with the command that produced it. Every figure of every
run is further down the same page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks.harness import goal_cell, read_results


@dataclass(frozen=True)
class Headline:
    """One headline row: which results row it shows, and how to reproduce it."""

    label: str
    benchmark: str
    """The results file's name (`benchmarks/results/<benchmark>.json`)."""
    metric: str
    """The row's metric, exactly."""
    peer: str
    """The start of the row's peer: a metric is often compared with several."""
    script: str
    """The script under benchmarks/ that measures it (`make bench` runs them all)."""


HEADLINES = (
    Headline("`memlayout inspect` of a small safetensors file: start-up", "startup",
             "memlayout inspect (table) (small-mlp.safetensors, 8 tensors)", "python -c", "speed/bench_startup.py"),
    Headline("`memlayout inspect`, 1 GiB torch.save file, 400 tensors, JSON out", "inspect",
             "CLI memlayout inspect --format json (1GiB)", "import torch", "speed/bench_inspect.py"),
    Headline("`memlayout inspect`, torch.save file of 40,000 tensors", "many_tensors",
             "CLI json: torch.save, 40,000 tensors", "torch.load", "speed/bench_many_tensors.py"),
    Headline("`memlayout inspect`, Hugging Face directory of 100,000 tensors", "many_tensors",
             "CLI json: HF safetensors, 20 shards, 100,000 tensors", "safetensors", "speed/bench_many_tensors.py"),
    Headline("`memlayout inspect --deep`: every value of 1 GiB scanned", "deep",
             "--deep scan GB/s (1GiB, 400 tensors)", "torch copy_", "speed/bench_deep.py"),
    Headline("`memlayout flatten IN -o OUT`, 1 GiB, verified and fsynced", "flatten",
             "flatten IN -o OUT, end to end", "naive peer", "speed/bench_flatten.py"),
    Headline("`memlayout.flatten(model)`, tensors in memory", "flatten",
             "flatten throughput", "machine limit", "speed/bench_flatten.py"),
    Headline("peak memory of `memlayout flatten`, 1 GiB", "flatten",
             "peak RSS flattening from disk", "model", "speed/bench_flatten.py"),
    Headline("HTML storage map of 100,000 tensors, opened in chromium", "html",
             "open in chromium (storages, 100,000 tensors)", "same-size page, data inert", "speed/bench_html.py"),
    Headline("`memlayout activations` peak, GPT-2 training step", "bench_activations",
             "GPT-2 (4 layers, 128 wide) 8x128: peak, memlayout (fake tensors)", "MemTracker",
             "accuracy/bench_activations.py"),
    Headline("`memlayout activations`, Llama 7B config at 4096 tokens, wall time", "bench_activations",
             "Llama 32 layers x 4096 (6.74B params) 1x4096: memlayout wall time (import, build, trace)", "limit",
             "accuracy/bench_activations.py"),
    Headline("a flat model sent to a worker process and back", "share_memory",
             "send model to a worker and back", "per-tensor", "speed/bench_share_memory.py"),
)


def headline_row(headline: Headline) -> dict[str, Any]:
    """The results row a headline names; a missing one names the headline, so a renamed metric is caught."""
    rows = read_results(headline.benchmark)["rows"]
    for row in rows:
        if row["metric"] == headline.metric and row["peer"].startswith(headline.peer):
            return dict(row)
    raise LookupError(f"benchmarks/results/{headline.benchmark}.json has no row {headline.metric!r} vs "
                      f"{headline.peer!r}")


def headlines_markdown() -> str:
    """The headlines table of the performance page."""
    lines = ["| figure | memlayout | compared with | ratio | goal | command |", "|---|---|---|---|---|---|"]
    for headline in HEADLINES:
        row = headline_row(headline)
        cells = (headline.label, row["value"], row["peer"], f"{row['ratio']:.2f}x", goal_cell(row),
                 f"`python benchmarks/{headline.script}`")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
