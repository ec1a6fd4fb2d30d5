"""`memlayout activations --weights` beside `accelerate estimate-memory`, and both beside the real model.

For each config in benchmarks/configs (GPT-2 124M, BERT base, T5 small, Llama 7B),
in the same run:

- memlayout: `weights_report`, what `memlayout activations CONFIG --weights` prints;
- accelerate: `accelerate.commands.estimate.gather_data`, its command's own code,
  with its Hub lookup answered by the local config (the one network call it makes);
  "Training using Adam" is the largest of its figures, as its table prints it;
- the real model, where it fits this machine: built on the CPU from the config, its
  parameters and buffers counted by storage, then one real training step with
  torch's AdamW (batch 1, 8 tokens, labels), its gradients and optimizer state
  counted by storage. Llama 7B (27 GB in float32) is not built.

Figures are bytes; the ratio rows compare memlayout with the real model (goal: the
same, 1.00x) and with accelerate (anchors: docs/evidence-fit.md says why they
differ); the wall-time row compares the two tools' answers, each the best of 3
runs in this process. `--quick` runs the small configs only.

Usage: python benchmarks/accuracy/bench_weights.py [--quick]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from harness import Row, best_of, print_table, quick_requested, write_results  # noqa: E402

from benchmarks.accuracy.weights_table import gib, table_markdown  # noqa: E402

CONFIGS = {"gpt2": True, "bert-base": True, "t5-small": True, "llama-7b": False}
"""Config folder -> whether the real model is built and stepped here."""
ACCELERATE_DTYPES = ("float32", "float16", "int8", "int4")
REPEAT = 3
"""Each tool's answer is timed best of 3: the first run of either pays its imports (transformers, torch's meta
kernels), which the other's first run may have paid already."""


def memlayout_figures(folder: Path) -> dict[str, Any]:
    from memlayout.activations.report.weights import weights_report_dict
    from memlayout.activations.weights import weights_report

    found: list[Any] = []
    seconds = best_of(lambda: found.append(weights_report(str(folder))), REPEAT)
    data = weights_report_dict(found[-1])
    return {"seconds": seconds, "class": data["target"]["class"], "parameters": data["parameters"],
            "dtypes": data["dtypes"],
            "command": f"memlayout activations {folder.relative_to(ROOT)} --weights --format json"}


def accelerate_figures(folder: Path) -> dict[str, Any]:
    import accelerate
    import accelerate.commands.estimate as estimate

    config = json.loads((folder / "config.json").read_text())
    estimate.verify_on_hub = lambda repo, token=None: types.SimpleNamespace(config=config, library_name="transformers")
    args = argparse.Namespace(model_name=str(folder), library_name="transformers", dtypes=list(ACCELERATE_DTYPES),
                              trust_remote_code=False)
    found: list[Any] = []
    seconds = best_of(lambda: found.append(estimate.gather_data(args)), REPEAT)
    rows = found[-1]
    figures = {}
    for dtype, largest, total, training in rows:
        most = max(training.values())
        figures[dtype] = {"largest_layer": int(largest), "total_size": int(total),
                          "training_using_adam": None if most == -1 else int(most)}
    return {"seconds": seconds, "version": accelerate.__version__, "dtypes": figures,
            "command": f"accelerate estimate-memory's gather_data on {folder.relative_to(ROOT)}/config.json "
                       "(benchmarks/accuracy/bench_weights.py)"}


def real_figures(folder: Path, model_class: str) -> dict[str, Any]:
    """The model built for real on the CPU, and one real AdamW step's gradients and state."""
    import torch
    import transformers

    def distinct(tensors: list[Any]) -> int:
        return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())

    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(folder)
    model = getattr(transformers, model_class)(config)
    weights = distinct([*model.parameters(), *model.buffers()])
    count = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, config.vocab_size, (1, 8))
    optimizer = torch.optim.AdamW(model.parameters())
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    gradients = distinct([p.grad for p in model.parameters() if p.grad is not None])
    state = distinct([v for s in optimizer.state.values() for v in s.values()])
    del model, optimizer
    gc.collect()
    return {"parameters": count, "weights_bytes": weights, "gradient_bytes": gradients, "optimizer_bytes": state,
            "command": f"{model_class}(config) on the CPU, one torch.optim.AdamW step "
                       "(benchmarks/accuracy/bench_weights.py)"}


def main() -> None:
    quick = quick_requested(sys.argv)
    raw: dict[str, Any] = {}
    rows: list[Row] = []
    for name, build_real in CONFIGS.items():
        if quick and not build_real:
            continue
        folder = ROOT / "benchmarks" / "configs" / name
        ours = memlayout_figures(folder)
        theirs = accelerate_figures(folder)
        figures: dict[str, Any] = {"memlayout": ours, "accelerate": theirs}
        float32 = ours["dtypes"][0]
        training = float32["training"]
        if build_real:
            real = real_figures(folder, ours["class"])
            figures["real"] = real
            rows.append(Row(f"{name}: parameters, memlayout --weights", f"{ours['parameters']['count']:,}",
                            f"the real model: {real['parameters']:,}", ours["parameters"]["count"] / real["parameters"],
                            "== 1.00x", ours["parameters"]["count"] == real["parameters"]))
            measured = real["weights_bytes"] + real["gradient_bytes"] + real["optimizer_bytes"]
            rows.append(Row(f"{name}: float32 training before activations", f"{training['total_bytes']:,} B",
                            f"a real AdamW step: {measured:,} B", training["total_bytes"] / measured, "== 1.00x",
                            training["total_bytes"] == measured))
        accelerate_training = theirs["dtypes"]["float32"]["training_using_adam"]
        rows.append(Row(f"{name}: accelerate 'Training using Adam', float32", gib(accelerate_training),
                        f"memlayout {gib(training['total_bytes'])}", accelerate_training / training["total_bytes"],
                        "(anchor)", True))
        rows.append(Row(f"{name}: accelerate 'Total Size', float32", gib(theirs["dtypes"]["float32"]["total_size"]),
                        f"memlayout {gib(float32['weights_bytes'])}",
                        theirs["dtypes"]["float32"]["total_size"] / float32["weights_bytes"], "(anchor)", True))
        rows.append(Row(f"{name}: memlayout --weights wall time", f"{ours['seconds']:.2f} s",
                        f"accelerate {theirs['seconds']:.2f} s", ours["seconds"] / theirs["seconds"],
                        "(for information)",
                        True))
        raw[name] = figures
    print_table("memlayout activations --weights beside accelerate estimate-memory and the real model", rows)
    write_results("weights", rows, raw, quick)
    print()
    print(table_markdown({"raw": raw}))


if __name__ == "__main__":
    main()
