"""docs/activations-weights.md's table of `--weights` beside `accelerate estimate-memory`, rendered from
benchmarks/results/weights.json (written by bench_weights.py).

The page names the table by a marker that the site's build replaces with this
rendering (docs/hooks.py), so the page shows the last benchmark's figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results" / "weights.json"
MARKER = "<!-- memlayout:weights-vs-accelerate -->"


def gib(count: float) -> str:
    return f"{count / 2**30:.2f} GiB"


def table_markdown(results: dict[str, Any] | None = None) -> str:
    """docs/activations-weights.md's table: each dtype's weights and float32 training, memlayout beside accelerate."""
    raw = (results if results is not None else json.loads(RESULTS.read_text()))["raw"]
    lines = ["| model | dtype | memlayout weights | accelerate Total Size | memlayout training (weights, gradients, "
             "AdamW state) | accelerate Training using Adam | real model and AdamW step |",
             "|---|---|---|---|---|---|---|"]
    names = {"float32": "float32", "bfloat16": "float16", "int8": "int8", "int4": "int4"}
    for folder, figures in raw.items():
        ours, theirs, real = figures["memlayout"], figures["accelerate"]["dtypes"], figures.get("real")
        for row in ours["dtypes"]:
            dtype = names[row["dtype"]]
            training = row["training"]
            accelerate_training = theirs[dtype]["training_using_adam"]
            measured = ""
            if real and row["dtype"] == "float32":
                measured = gib(real["weights_bytes"] + real["gradient_bytes"] + real["optimizer_bytes"])
            lines.append(
                f"| {folder} ({ours['class']}) | {row['dtype']} | {gib(row['weights_bytes'])} "
                f"| {gib(theirs[dtype]['total_size'])} | {gib(training['total_bytes']) if training else '-'} "
                f"| {gib(accelerate_training) if accelerate_training is not None else 'N/A'} | {measured} |"
            )
    commands = [f"- {folder}: `{figures['memlayout']['command']}`; accelerate: {figures['accelerate']['command']}"
                + (f"; the real model: {figures['real']['command']}" if figures.get("real") else "")
                for folder, figures in raw.items()]
    return ("\n".join(lines) + "\n\nEach figure's command, run from the repository's root:\n\n" + "\n".join(commands)
            + "\n")


