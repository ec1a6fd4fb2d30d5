"""Checkpoints with many small tensors, as mixture-of-experts models have: generated once into `.bench-data/`.

Three sources, each written by its real writer:

- a `torch.save` state dict of 40,000 tensors;
- a Hugging Face directory of safetensors shards whose index names 100,000 tensors;
- a `torch.distributed.checkpoint` directory of 100,000 tensor shards.

Names follow a mixture-of-experts model (`model.layers.L.mlp.experts.E.w1.weight`,
attention projections, norms); the tensors are small, so that the cost measured is
the cost per tensor, not per byte.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from .checkpoints import DATA_DIR

EXPERTS = 64
"""Experts per layer; each has three projections (w1, w2, w3)."""


def moe_names(count: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(name, shape) of the first `count` tensors of a mixture-of-experts model, layer by layer."""
    made = 0
    layer = 0
    while True:
        per_layer: list[tuple[str, tuple[int, ...]]] = [
            (f"model.layers.{layer}.mlp.experts.{expert}.{w}.weight", (16, 8) if w != "w2" else (8, 16))
            for expert in range(EXPERTS)
            for w in ("w1", "w2", "w3")
        ]
        per_layer += [(f"model.layers.{layer}.self_attn.{p}.weight", (8, 8))
                      for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
        per_layer += [
            (f"model.layers.{layer}.mlp.gate.weight", (EXPERTS, 8)),
            (f"model.layers.{layer}.input_layernorm.weight", (8,)),
            (f"model.layers.{layer}.post_attention_layernorm.weight", (8,)),
        ]
        for item in per_layer:
            if made == count:
                return
            yield item
            made += 1
        layer += 1


def _state(count: int, seed: int = 0) -> dict[str, object]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    # Random values: no two tensors are equal, as in a trained model.
    return {name: torch.randn(shape, generator=generator) for name, shape in moe_names(count)}


def _fresh(path: Path) -> Path:
    partial = path.with_name(path.name + ".partial")
    if partial.is_dir():
        shutil.rmtree(partial)
    elif partial.exists():
        partial.unlink()
    return partial


def torch_save_file(count: int, transposed: bool = False) -> Path:
    """A `torch.save` state dict of `count` tensors; `transposed` saves each as a transposed view (an ML201 each)."""
    import torch

    path = DATA_DIR / f"moe-{count}{'-transposed' if transposed else ''}.pt"
    if not path.exists():
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        partial = _fresh(path)
        state = _state(count)
        if transposed:
            state = {name: tensor.t() if tensor.dim() == 2 else tensor for name, tensor in state.items()}  # type: ignore[attr-defined]
        torch.save(state, partial)
        os.replace(partial, path)
    return path


def hf_sharded_dir(count: int, shards: int) -> Path:
    """A Hugging Face model directory: `shards` safetensors files and an index naming `count` tensors."""
    from safetensors.torch import save_file

    path = DATA_DIR / f"moe-hf-{count}"
    if not path.exists():
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        partial = _fresh(path)
        partial.mkdir()
        state = _state(count)
        names = list(state)
        per_shard = -(-len(names) // shards)
        weight_map = {}
        for index in range(shards):
            shard = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
            part = {name: state[name] for name in names[index * per_shard : (index + 1) * per_shard]}
            save_file(part, partial / shard, metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(part, shard))
        total = sum(t.nbytes for t in state.values())  # type: ignore[attr-defined]
        index_json = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (partial / "model.safetensors.index.json").write_text(json.dumps(index_json))
        (partial / "config.json").write_text(json.dumps({"model_type": "mixtral", "tie_word_embeddings": False}))
        os.replace(partial, path)
    return path


def dcp_dir(count: int) -> Path:
    """A `torch.distributed.checkpoint` directory of `count` tensors, one shard each, written by `dcp.save`."""
    import warnings

    import torch.distributed.checkpoint as dcp

    path = DATA_DIR / f"moe-dcp-{count}"
    if not path.exists():
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        partial = _fresh(path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "torch.distributed is disabled": one process is the point
            dcp.save(_state(count), checkpoint_id=str(partial))
        os.replace(partial, path)
    return path
