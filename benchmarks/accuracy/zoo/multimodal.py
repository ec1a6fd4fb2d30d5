"""Inputs for image-text-to-text models: images, and text with one placeholder token per image feature.

A processor would expand each image placeholder into as many tokens as the
vision tower gives features, but processors need tokenizer files from the hub.
Here the count comes from the tiny model itself: the rows its
`get_image_features` returns for the images (run once, without grad), or, for a
model without that method, the feature count its own placeholder check reports
when given none. Models that take images without placeholders (BLIP, GIT,
Pix2Struct) get images and text side by side.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from benchmarks.accuracy.zoo.inputs import BATCH, TOKENS, decoder_inputs, text_ids

IGNORE = -100
"""Labels at the image placeholders: transformers' losses skip this index."""
FEATURES = re.compile(r"features:? (\d+)")
"""The count in transformers' "Image features and image tokens do not match, tokens: 0, features: 64"."""


def _vision(config: Any) -> Any:
    for name in ("vision_config", "visual_config", "vision_tower_config", "encoder"):
        sub = getattr(config, name, None)
        if sub is not None and not isinstance(sub, (int, str)):
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
    side = _side(config)
    if "image_grid_thw" in parameters:
        # Qwen2-VL and its kind: the processor's flattened patches, and each image's grid in patches
        patch = int(getattr(vision, "patch_size", 14))
        temporal = int(getattr(vision, "temporal_patch_size", None) or 2)
        merge = int(getattr(vision, "spatial_merge_size", None) or 2)
        grid = 2 * merge
        pixels = torch.randn(BATCH * grid * grid, channels * temporal * patch * patch, generator=generator)
        return {"pixel_values": pixels, "image_grid_thw": torch.tensor([[1, grid, grid]] * BATCH)}
    if "spatial_shapes" in parameters:
        # SigLIP 2 towers: patches already cut, each image's grid, and which patches are real
        patch = int(getattr(vision, "patch_size", 16))
        grid = side // patch
        return {"pixel_values": torch.randn(BATCH, grid * grid, channels * patch * patch, generator=generator),
                "pixel_attention_mask": torch.ones(BATCH, grid * grid, dtype=torch.long),
                "spatial_shapes": torch.tensor([[grid, grid]] * BATCH)}
    pixels = torch.randn(BATCH, channels, side, side, generator=generator)
    if "qformer_input_ids" in parameters:
        # InstructBLIP's Q-Former reads the instruction beside the image
        return {"pixel_values": pixels, "qformer_input_ids": text_ids(config, (BATCH, TOKENS // 8), generator)}
    if "pixel_attention_mask" in parameters:
        # Idefics 2/3 and SmolVLM: a list of images per sample, and which pixels are real
        return {"pixel_values": pixels.unsqueeze(1),
                "pixel_attention_mask": torch.ones(BATCH, 1, side, side, dtype=torch.bool)}
    if "image_sizes" in parameters and "pixtral" in str(getattr(vision, "model_type", "")):
        # Pixtral towers take each image's size beside the batch
        return {"pixel_values": pixels, "image_sizes": torch.tensor([[side, side]] * BATCH)}
    return {"pixel_values": pixels}


def image_token_id(config: Any) -> int | None:
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def features_per_image(model: Any, images: dict[str, Any], placeholder: int, generator: Any) -> int:
    """How many placeholder tokens one image needs."""
    import torch

    if hasattr(model, "get_image_features"):
        with torch.no_grad():
            output = model.get_image_features(**images)
        features = getattr(output, "pooler_output", None)
        if features is None:
            features = output
        if isinstance(features, (list, tuple)):
            rows = sum(int(f.numel() // f.shape[-1]) for f in features)
        else:
            rows = int(features.numel() // features.shape[-1])
    else:
        ids = text_ids(model.config, (BATCH, TOKENS), generator)
        try:
            with torch.no_grad():
                model(input_ids=ids, **images)
        except Exception as exc:
            found = FEATURES.search(str(exc))
            if found is None:
                raise
            rows = int(found.group(1))
        else:
            raise ValueError("the model takes images with no placeholder and says nothing of its features")
    if rows % BATCH:
        raise ValueError(f"the vision tower gave {rows} feature rows for {BATCH} images")
    return rows // BATCH


def image_text_inputs(model: Any, generator: Any) -> dict[str, Any]:
    """Images, and text that starts with one placeholder per image feature; labels skip the placeholders."""
    config = model.config
    images = image_kwargs(model, generator)
    placeholder = image_token_id(config)
    if placeholder is None:
        ids = text_ids(config, (BATCH, TOKENS), generator)
        if getattr(config, "is_encoder_decoder", False):
            return {**images, **decoder_inputs(config, ids)}
        return {**images, "input_ids": ids, "labels": ids.clone()}
    count = features_per_image(model, images, placeholder, generator)
    ids = text_ids(config, (BATCH, count + TOKENS), generator)
    ids[:, :count] = placeholder
    labels = ids.clone()
    labels[:, :count] = IGNORE
    extra: dict[str, Any] = {}
    parameters = inspect.signature(model.forward).parameters
    if "mm_token_type_ids" in parameters:
        # Qwen-VL style rotary positions tell image tokens (1) from text (0) by this mask
        extra["mm_token_type_ids"] = (ids == placeholder).long()
    return {"input_ids": ids, "labels": labels, **images, **extra}
