"""The anchors people quote for "will it fit", run side by side on the same models and settings.

Training (batch 1, 128 tokens, labels, float32, AdamW), for each config in
benchmarks/configs (GPT-2 124M, BERT base, T5 small, Llama 7B), in one run:

- memlayout: `analyze`, what `memlayout activations CONFIG --input ... --input labels=...`
  prints as the step's peak, and `weights_report`'s float32 training total, what
  `--weights` prints (weights, gradients, AdamW's state: no activations);
- a real CPU step, where the model fits this machine: the model built from the same
  config as the same class, one steady-state AdamW step, its peak by the CPU
  allocator's own events (tests/activations/measure.py's `allocator_peak_step`, the
  reference the project's other checks use). Llama 7B (27 GB in float32) is not built;
- accelerate: `accelerate.commands.estimate.gather_data`, its command's own code,
  "Training using Adam" for float32, its Hub lookup answered by the local config;
- DeepSpeed: `estimate_zero2_model_states_mem_needs_all_live(model)`, its own
  function, on the real model (one GPU, one node), its printed "per GPU" figure for
  `offload_optimizer=none`. On Llama 7B, which is not built, the same ZeRO-2
  arithmetic (`estimate_zero2_model_states_mem_needs`) is given the parameter
  count as `model_to_params` takes it (once per tensor).

Generation (prompt of 128 tokens, 32 new tokens, greedy, transformers' default
cache, float32), for GPT-2, T5 small, TinyLlama 1.1B (grouped-query attention) and
Llama 7B:

- a real `model.generate` on the CPU (not for Llama 7B): the bytes of every tensor
  its returned cache holds, by storage, and the positions it holds;
- the textbook formula, 2 * layers * kv_heads * head_dim * tokens * bytes, with
  tokens = prompt + new tokens and the config's decoder layers and heads;
- hf-mem's own `compute_safetensors_kv_cache_size` (hf_mem.safetensors.kv_cache)
  on the config.json, with max_model_len = prompt + new tokens and the F32 dtype
  (its `--kv-cache-dtype` has no float32 choice; the config names none);
- memlayout: `analyze(..., step="generate", new_tokens=32)`, what `memlayout activations
  CONFIG --input input_ids=int64[1,128]<VOCAB --step generate --new-tokens 32` prints:
  the cache at the end and the step's peak (the generate sweep, benchmarks/accuracy/generate_sweep.py,
  compares that peak with real generates' allocator events).

No GPU column is measured: this machine has none, and the results say so.

Usage: python benchmarks/accuracy/bench_anchors.py [--quick]   (--quick: GPT-2 only)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from harness import Row, print_table, quick_requested, write_results  # noqa: E402

from benchmarks.accuracy.anchors_table import PROMPT, TOKENS, gib, table_markdown  # noqa: E402

NEW_TOKENS = 32
TRAINING = {"gpt2": True, "bert-base": True, "t5-small": True, "llama-7b": False}
"""Config folder -> whether the real model is built and stepped here."""
GENERATION = {"gpt2": True, "t5-small": True, "llama-1.1b": True, "llama-7b": False}
NO_GPU = "not measured: no GPU on this machine"


def _config(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "config.json").read_text())


def _specs(vocab: int) -> list[str]:
    return [f"input_ids=int64[1,{TOKENS}]<{vocab}", f"labels=int64[1,{TOKENS}]<{vocab}"]


def memlayout_training(folder: Path) -> dict[str, Any]:
    from memlayout.activations import analyze
    from memlayout.activations.report.weights import weights_report_dict
    from memlayout.activations.weights import weights_report

    specs = _specs(_config(folder)["vocab_size"])
    report = analyze(str(folder), specs)
    weights = weights_report_dict(weights_report(str(folder)))
    relative = folder.relative_to(ROOT)
    return {"class": report.model_class, "peak_bytes": report.summary.peak_bytes,
            "model_states_bytes": weights["dtypes"][0]["training"]["total_bytes"],
            "parameters": weights["parameters"]["count"],
            "command": f"memlayout activations {relative} " + " ".join(f"--input '{s}'" for s in specs),
            "weights_command": f"memlayout activations {relative} --weights"}


def memlayout_generate(folder: Path) -> dict[str, Any]:
    from memlayout.activations import analyze

    spec = f"input_ids=int64[1,{PROMPT}]<{_config(folder)['vocab_size']}"
    report = analyze(str(folder), [spec], step="generate", new_tokens=NEW_TOKENS)
    assert report.generation is not None
    return {"class": report.model_class, "cache_bytes": report.generation.cache_bytes,
            "peak_bytes": report.summary.peak_bytes,
            "command": f"memlayout activations {folder.relative_to(ROOT)} --input '{spec}' --step generate "
                       f"--new-tokens {NEW_TOKENS}"}


def _real_model(folder: Path, model_class: str) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(folder)
    return getattr(transformers, model_class)(config)


def real_training(folder: Path, model_class: str) -> tuple[dict[str, Any], Any]:
    """One steady-state AdamW step of the real model, by the CPU allocator's events; and the model, for DeepSpeed."""
    import torch

    from tests.activations.measure import allocator_peak_step

    model = _real_model(folder, model_class)
    ids = torch.randint(0, model.config.vocab_size, (1, TOKENS))
    measured = allocator_peak_step(model, (), {"input_ids": ids, "labels": ids.clone()})
    for parameter in model.parameters():
        parameter.grad = None
    return {"peak_bytes": measured.peak_bytes,
            "command": f"{model_class}(config) on the CPU, one AdamW step after a first, the CPU allocator's events "
                       "(tests/activations/measure.py allocator_peak_step, "
                       "benchmarks/accuracy/bench_anchors.py)"}, model


def accelerate_training(folder: Path) -> dict[str, Any]:
    import accelerate
    import accelerate.commands.estimate as estimate

    config = _config(folder)
    estimate.verify_on_hub = lambda repo, token=None: types.SimpleNamespace(config=config, library_name="transformers")
    args = argparse.Namespace(model_name=str(folder), library_name="transformers", dtypes=["float32"],
                              trust_remote_code=False)
    ((_, _, _, training),) = estimate.gather_data(args)
    return {"version": accelerate.__version__, "training_using_adam": int(max(training.values())),
            "command": f"accelerate estimate-memory's gather_data on {folder.relative_to(ROOT)}/config.json, float32"}


def deepspeed_training(model: Any, folder: Path) -> dict[str, Any]:
    import deepspeed
    from deepspeed.runtime.zero.stage_1_and_2 import (
        estimate_zero2_model_states_mem_needs,
        estimate_zero2_model_states_mem_needs_all_live,
        model_to_params,
    )

    if model is not None:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            estimate_zero2_model_states_mem_needs_all_live(model, num_gpus_per_node=1, num_nodes=1)
        line = next(line for line in printed.getvalue().splitlines() if "offload_optimizer=none" in line)
        per_gpu_gb = float(re.findall(r"([\d.]+)GB", line)[1])
        total = model_to_params(model)
        how = "estimate_zero2_model_states_mem_needs_all_live(model), the real model, 1 GPU"
    else:
        printed, per_gpu_gb = None, None
        total = _meta_parameter_count(folder)
        how = "estimate_zero2_model_states_mem_needs(total_params, cpu_offload=False), 1 GPU: the model not built"
    _, gpu = estimate_zero2_model_states_mem_needs(total, num_gpus_per_node=1, num_nodes=1, cpu_offload=False)
    return {"version": deepspeed.__version__, "total_params": total, "per_gpu_bytes": gpu,
            "printed_per_gpu_gb": per_gpu_gb, "printed": printed.getvalue() if printed else None, "command": how}


def _meta_parameter_count(folder: Path) -> int:
    """`model_to_params`'s count (each tensor once) of the model built on the meta device, where every
    data_ptr() is 0 and the function itself would count one tensor."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = getattr(transformers, config.architectures[0])(config)
    return sum({id(p): p.numel() for p in model.parameters()}.values())


def real_cache(folder: Path) -> dict[str, Any]:
    """A real greedy `generate` on the CPU: the bytes of the cache it returns, by storage."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    model = _real_model(folder, config.architectures[0]).eval()
    model.generation_config.eos_token_id = None  # all NEW_TOKENS, whatever a random model says
    model.generation_config.pad_token_id = 0
    ids = torch.randint(0, config.vocab_size, (1, PROMPT))
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                             min_new_tokens=NEW_TOKENS, return_dict_in_generate=True)
    tensors = list(_tensors(out.past_key_values, set()))
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    positions = sorted({t.shape[-2] for t in tensors if t.dim() == 4})
    new = out.sequences.shape[-1] - (0 if config.is_encoder_decoder else PROMPT)
    cache_class = type(out.past_key_values).__name__
    del model, out, tensors
    gc.collect()
    return {"cache_bytes": sum(storages.values()), "cache_class": cache_class, "positions": positions,
            "new_tokens": new,
            "command": f"{config.architectures[0]}(config).generate(prompt {PROMPT}, max_new_tokens={NEW_TOKENS}, "
                       "do_sample=False) on the CPU, the returned cache's tensors by storage "
                       "(benchmarks/accuracy/bench_anchors.py)"}


def _tensors(value: Any, seen: set[int]) -> Any:
    """Every tensor a cache object holds, through its attributes, lists and dicts."""
    import torch

    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item, seen)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item, seen)
    elif hasattr(value, "__dict__") and type(value).__module__.startswith("transformers"):
        for item in vars(value).values():
            yield from _tensors(item, seen)


def textbook_cache(config: dict[str, Any]) -> dict[str, Any]:
    """2 * layers * kv_heads * head_dim * tokens * bytes, each factor read from the config as its model names it."""
    layers = config.get("num_decoder_layers") or config.get("num_hidden_layers") or config.get("n_layer")
    heads = config.get("num_attention_heads") or config.get("num_heads") or config.get("n_head")
    kv_heads = config.get("num_key_value_heads") or heads
    width = config.get("hidden_size") or config.get("d_model") or config.get("n_embd")
    head_dim = config.get("head_dim") or config.get("d_kv") or width // heads
    tokens = PROMPT + NEW_TOKENS
    return {"cache_bytes": 2 * layers * kv_heads * head_dim * tokens * 4, "layers": layers, "kv_heads": kv_heads,
            "head_dim": head_dim, "tokens": tokens}


def hf_mem_cache(config: dict[str, Any]) -> dict[str, Any]:
    from importlib.metadata import version

    from hf_mem.safetensors.kv_cache import compute_safetensors_kv_cache_size

    try:
        size = compute_safetensors_kv_cache_size(config, "F32", max_model_len=PROMPT + NEW_TOKENS, batch_size=1)
    except KeyError as exc:
        return {"version": version("hf-mem"), "cache_bytes": None, "error": f"KeyError: {exc}"}
    return {"version": version("hf-mem"), "cache_bytes": size, "error": None}


def main() -> None:
    quick = quick_requested(sys.argv)
    rows: list[Row] = []
    training: dict[str, Any] = {}
    for name, build_real in TRAINING.items():
        if quick and name != "gpt2":
            continue
        folder = ROOT / "benchmarks" / "configs" / name
        ours = memlayout_training(folder)
        figures: dict[str, Any] = {"memlayout": ours, "accelerate": accelerate_training(folder), "gpu": NO_GPU}
        model = None
        if build_real:
            figures["real"], model = real_training(folder, ours["class"])
            real = figures["real"]["peak_bytes"]
            rows.append(Row(f"{name}: training step peak, memlayout", f"{ours['peak_bytes']:,} B",
                            f"a real CPU step: {real:,} B", ours["peak_bytes"] / real, "within 2%",
                            abs(ours["peak_bytes"] / real - 1) <= 0.02))
        figures["deepspeed"] = deepspeed_training(model, folder)
        del model
        gc.collect()
        for tool, figure in (("accelerate Training using Adam", figures["accelerate"]["training_using_adam"]),
                             ("DeepSpeed ZeRO-2 per GPU", figures["deepspeed"]["per_gpu_bytes"])):
            rows.append(Row(f"{name}: {tool}", gib(figure), f"memlayout's step {gib(ours['peak_bytes'])}",
                            figure / ours["peak_bytes"], "(anchor)", True))
        training[name] = figures
    generation: dict[str, Any] = {}
    for name, run_real in GENERATION.items():
        if quick and name != "gpt2":
            continue
        folder = ROOT / "benchmarks" / "configs" / name
        config = _config(folder)
        figures = {"textbook": textbook_cache(config), "hf_mem": hf_mem_cache(config),
                   "memlayout": memlayout_generate(folder), "gpu": NO_GPU}
        if run_real:
            figures["real"] = real_cache(folder)
            real = figures["real"]["cache_bytes"]
            for tool in ("memlayout", "textbook", "hf_mem"):
                figure = figures[tool]["cache_bytes"]
                if figure is not None:
                    rows.append(Row(f"{name}: KV cache, {tool}", f"{figure:,} B", f"a real generate: {real:,} B",
                                    figure / real, "(anchor)", True))
        generation[name] = figures
    print_table("Will it fit: the anchors on the same models and settings", rows)
    raw = {"settings": {"tokens": TOKENS, "prompt": PROMPT, "new_tokens": NEW_TOKENS, "dtype": "float32",
                        "optimizer": "AdamW", "batch": 1},
           "training": training, "generation": generation}
    write_results("anchors", rows, raw, quick)
    print()
    print(table_markdown({"raw": raw}))


if __name__ == "__main__":
    main()
