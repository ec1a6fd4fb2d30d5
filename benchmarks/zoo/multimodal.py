"""Inputs for image-text-to-text models: images, and text with one placeholder token per image feature.

A processor would expand each image placeholder into as many tokens as the
vision tower gives features, but processors need tokenizer files from the hub.
Here the count is taken from the tiny model itself: its `get_image_features`
runs once on the images (without grad) and the rows it returns are the
placeholder tokens the text needs.
"""

from __future__ import annotations

import inspect
from typing import Any

from benchmarks.zoo.catalog import BATCH, TOKENS, _text_ids

IGNORE = -100
"""Labels at the image placeholders: transformers' losses skip this index."""


def _vision(config: Any) -> Any:
    for name in ("vision_config", "visual_config", "vision_tower_config"):
        sub = getattr(config, name, None)
        if sub is not None:
            return sub
    return config


def _side(config: Any) -> int:
    size = getattr(_vision(config), "image_size", None) or 32
    if isinstance(size, (list, tuple)):
        return int(size[0])
    if isinstance(size, dict):
        return int(size.get("height") or next(iter(size.values())))
    return int(size)


def image_kwargs(model: Any, generator: Any) -> dict[str, Any]:
    """The image inputs the model's forward takes, in the layout its vision tower reads."""
    import torch

    config = model.config
    vision = _vision(config)
    channels = int(getattr(vision, "num_channels", None) or getattr(vision, "in_channels", None) or 3)
    parameters = inspect.signature(model.forward).parameters
    if "image_grid_thw" in parameters:
        # Qwen2-VL and its kind: the processor's flattened patches, and each image's grid in patches
        patch = int(getattr(vision, "patch_size", 14))
        temporal = int(getattr(vision, "temporal_patch_size", 2))
        merge = int(getattr(vision, "spatial_merge_size", 2))
        side = 2 * merge
        rows = BATCH * side * side
        pixels = torch.randn(rows, channels * temporal * patch * patch, generator=generator)
        grid = torch.tensor([[1, side, side]] * BATCH)
        return {"pixel_values": pixels, "image_grid_thw": grid}
    side = _side(config)
    pixels = torch.randn(BATCH, channels, side, side, generator=generator)
    if "image_sizes" in parameters:
        return {"pixel_values": pixels.unsqueeze(1), "image_sizes": torch.tensor([[side, side]] * BATCH)}
    return {"pixel_values": pixels}


def image_token_id(config: Any) -> int:
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    raise ValueError("the config names no image token (image_token_id or image_token_index)")


def features_per_image(model: Any, images: dict[str, Any]) -> int:
    """How many placeholder tokens one image needs: the rows `get_image_features` gives, per image."""
    import torch

    with torch.no_grad():
        output = model.get_image_features(**images)
    features = getattr(output, "pooler_output", None)
    if features is None:
        features = output
    if isinstance(features, (list, tuple)):
        rows = sum(int(f.numel() // f.shape[-1]) for f in features)
    else:
        rows = int(features.numel() // features.shape[-1])
    if rows % BATCH:
        raise ValueError(f"get_image_features gave {rows} rows for {BATCH} images")
    return rows // BATCH


def image_text_inputs(model: Any, generator: Any) -> dict[str, Any]:
    """Images, and text that starts with one placeholder per image feature; labels skip the placeholders."""
    images = image_kwargs(model, generator)
    placeholder = image_token_id(model.config)
    count = features_per_image(model, images)
    ids = _text_ids(model.config, (BATCH, count + TOKENS), generator)
    ids[:, :count] = placeholder
    labels = ids.clone()
    labels[:, :count] = IGNORE
    return {"input_ids": ids, "labels": labels, **images}
