"""Names and the index of a model directory converted to safetensors (`to_safetensors`), as transformers writes them."""

from __future__ import annotations

import json
import os
from typing import Any

from memlayout.load.hf_dir import BIN_INDEX, SAFETENSORS_INDEX


def converted_name(name: str) -> str:
    """A weight file's name in the converted directory, as transformers names safetensors files.

    Args:
        name: IN's file name ("pytorch_model-00001-of-00002.bin").

    Returns:
        "model-00001-of-00002.safetensors" (a safetensors file keeps its name).
    """
    if name.endswith(".safetensors"):
        return name
    stem = name[: -len(".bin")] if name.endswith(".bin") else name
    if stem.startswith("pytorch_model"):
        stem = "model" + stem[len("pytorch_model"):]
    return stem + ".safetensors"


def converted_index(weight_map: dict[str, str], dropped: set[str], sizes: int, metadata: dict[str, Any]) -> bytes:
    """The `model.safetensors.index.json` of a converted directory.

    Args:
        weight_map: Every stored tensor name -> its converted file.
        dropped: Tied names no file stores (transformers' index lists only stored names).
        sizes: Bytes of every stored tensor (`metadata.total_size`).
        metadata: IN's index metadata, kept apart from `total_size`.

    Returns:
        The JSON text.
    """
    kept = {name: file for name, file in sorted(weight_map.items()) if name not in dropped}
    text = json.dumps({"metadata": {**metadata, "total_size": sizes}, "weight_map": kept}, indent=2)
    return (text + "\n").encode()


def index_metadata(directory: str) -> dict[str, Any]:
    """The metadata of IN's index, if it has one (transformers adds `total_parameters`)."""
    for name in (SAFETENSORS_INDEX, BIN_INDEX):
        index = os.path.join(directory, name)
        if os.path.isfile(index):
            with open(index, "rb") as handle:
                loaded = json.load(handle)
            metadata = loaded.get("metadata") if isinstance(loaded, dict) else None
            return {k: v for k, v in metadata.items() if k != "total_size"} if isinstance(metadata, dict) else {}
    return {}
