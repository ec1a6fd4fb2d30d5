"""The inputs of a transformers model's training step, by family: token ids, images, audio, and labels.

Every input is drawn from a generator seeded 0, so that the unplanned and the
planned step see the same values.
"""

from __future__ import annotations

import inspect
from typing import Any

BATCH = 4
TOKENS = 64
"""Text inputs are BATCH x TOKENS: enough that activations, not the tiny weights, make the peak."""
IMAGE = 32
CNN_IMAGE = 64
"""Image side for models whose config has no image_size (CNNs): five halvings leave 2 x 2."""
AUDIO_SAMPLES = 16000
"""Raw audio for wav2vec2-style encoders: one second, 49 frames after their convolutions (downsampling by
320), more than SpecAugment's mask length of 10 that training applies."""
TARGET_TOKENS = 8
"""Labels of sequence-to-sequence and CTC heads."""


def special_ids(config: Any) -> set[int]:
    """Every token id the config reserves (padding, image and audio placeholders...), sub-configs too."""
    from transformers import PreTrainedConfig

    found: set[int] = set()
    for name, value in vars(config).items():
        if isinstance(value, PreTrainedConfig):
            found |= special_ids(value)
        elif name.endswith(("_token_id", "_token_index")) and isinstance(value, int):
            found.add(value)
        elif name.endswith(("_token_id", "_token_index")) and isinstance(value, list):
            found |= {v for v in value if isinstance(v, int)}
    return found


def text_ids(config: Any, shape: tuple[int, ...], generator: Any) -> Any:
    """Token ids drawn from the vocabulary without the special ids, which change a model's path."""
    import torch

    text = config.get_text_config(decoder=True)
    vocab = int(getattr(text, "vocab_size", None) or getattr(config, "vocab_size", 99))
    allowed = torch.tensor(sorted(set(range(vocab)) - special_ids(config)))
    picks = torch.randint(0, len(allowed), shape, generator=generator)
    return allowed[picks]


def transformers_inputs(family: str, model: Any) -> dict[str, Any]:
    import torch

    config = model.config
    generator = torch.Generator().manual_seed(0)
    if family in ("causal-lm", "masked-lm"):
        codebooks = getattr(config, "num_codebooks", None)
        if isinstance(codebooks, int) and model.main_input_name == "input_ids" and "Musicgen" in type(model).__name__:
            # MusicGen's decoder reads one row per (sample, codebook) and predicts every codebook
            ids = text_ids(config, (BATCH, TOKENS, codebooks), generator)
            return {"input_ids": ids.transpose(1, 2).reshape(BATCH * codebooks, TOKENS), "labels": ids}
        ids = text_ids(config, (BATCH, TOKENS), generator)
        return {"input_ids": ids, "labels": ids.clone()}
    if family == "seq2seq":
        ids = text_ids(config, (BATCH, TOKENS), generator)
        if not getattr(config, "is_encoder_decoder", False):
            return {"input_ids": ids, "labels": ids.clone()}  # a decoder-only model in the seq2seq registry
        return {"input_ids": ids, **decoder_inputs(config, text_ids(config, (BATCH, TARGET_TOKENS), generator))}
    if family == "image-classification":
        return _image_classification_inputs(model, generator)
    if family in ("audio-ctc", "audio-classification", "speech-seq2seq"):
        if family == "audio-ctc":
            targets = {"labels": torch.randint(1, config.vocab_size, (BATCH, TARGET_TOKENS // 2), generator=generator)}
        elif family == "audio-classification":
            targets = {"labels": torch.randint(0, config.num_labels, (BATCH,), generator=generator)}
        else:
            targets = decoder_inputs(config, text_ids(config, (BATCH, TARGET_TOKENS), generator))
        return _first_that_runs(model, [{**audio, **targets} for audio in _audio_inputs(model, generator)])
    if family == "image-text-to-text":
        from benchmarks.accuracy.zoo.multimodal import image_text_inputs

        return image_text_inputs(model, generator)
    raise ValueError(f"no inputs for the family {family!r}")


def decoder_inputs(config: Any, labels: Any) -> dict[str, Any]:
    """Labels, and the decoder's inputs: the labels shifted right behind the start token.

    Given explicitly, because not every config names its decoder's start token.
    """
    import torch

    start = getattr(config, "decoder_start_token_id", None)
    if not isinstance(start, int):
        start = getattr(config, "pad_token_id", None) or 0
    shifted = torch.cat([torch.full((labels.shape[0], 1), start, dtype=labels.dtype), labels[:, :-1]], dim=1)
    return {"labels": labels, "decoder_input_ids": shifted}


def _image_classification_inputs(model: Any, generator: Any) -> dict[str, Any]:
    import torch

    config = model.config
    labels = torch.randint(0, config.num_labels, (BATCH,), generator=generator)
    if model.main_input_name == "input_ids":
        # ImageGPT classifies sequences of colour-cluster ids
        return {"input_ids": text_ids(config, (BATCH, TOKENS), generator), "labels": labels}
    channels = int(getattr(config, "num_channels", 3))
    size = getattr(config, "image_size", None)
    side = int(size[0] if isinstance(size, (list, tuple)) else size or CNN_IMAGE)
    if "spatial_shapes" in inspect.signature(model.forward).parameters:
        # SigLIP 2 takes images as patches already, with each image's grid and a patch mask
        patch = int(config.vision_config.patch_size if hasattr(config, "vision_config") else config.patch_size)
        grid = side // patch
        return {"pixel_values": torch.randn(BATCH, grid * grid, channels * patch * patch, generator=generator),
                "pixel_attention_mask": torch.ones(BATCH, grid * grid, dtype=torch.long),
                "spatial_shapes": torch.tensor([[grid, grid]] * BATCH), "labels": labels}
    return {"pixel_values": torch.randn(BATCH, channels, side, side, generator=generator), "labels": labels}


def _audio_inputs(model: Any, generator: Any) -> list[dict[str, Any]]:
    """The model's main audio input, in each layout an encoder of its kind may read.

    Raw samples for wav2vec2-style encoders; a spectrogram for the others, as
    frames x bins or bins x frames (Whisper), which the tiny model tells apart
    by running (see _first_that_runs).
    """
    import torch

    config = model.config
    name = model.main_input_name
    if name == "input_values" and hasattr(config, "max_length") and hasattr(config, "num_mel_bins"):
        # the audio spectrogram transformer: frames x mel bins
        return [{name: torch.randn(BATCH, config.max_length, config.num_mel_bins, generator=generator)}]
    if name == "input_values":
        return [{name: torch.randn(BATCH, AUDIO_SAMPLES, generator=generator)}]
    if name != "input_features":
        raise ValueError(f"no input recipe for the main input {name!r}")
    bins = _audio_field(config, ("feature_projection_input_dim", "num_mel_bins", "input_feat_per_channel",
                                 "input_dim", "feature_size"), 80)
    frames = 2 * _audio_field(config, ("max_source_positions",), 32)
    spectrogram = torch.randn(BATCH, frames, bins, generator=generator)
    layouts = [{name: spectrogram}, {name: spectrogram.transpose(1, 2).contiguous()}]
    if "attention_mask" not in inspect.signature(model.forward).parameters:
        return layouts
    # some encoders (Parakeet) need the frames' mask to know each sample's length
    mask = torch.ones(BATCH, frames, dtype=torch.long)
    return layouts + [{**layout, "attention_mask": mask} for layout in layouts]


def _audio_field(config: Any, names: tuple[str, ...], default: int) -> int:
    """The first of these fields the config or its audio sub-config sets."""
    from transformers import PreTrainedConfig

    configs = [config, *(value for value in vars(config).values() if isinstance(value, PreTrainedConfig))]
    for candidate in configs:
        for name in names:
            value = getattr(candidate, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return default


def _first_that_runs(model: Any, candidates: list[dict[str, Any]]) -> dict[str, Any]:
    """The first inputs a forward (without grad) accepts; the last one's error if none does."""
    import torch

    for index, kwargs in enumerate(candidates):
        try:
            with torch.no_grad():
                model(**kwargs)
        except Exception:
            if index == len(candidates) - 1:
                raise
            continue
        return kwargs
    raise ValueError("no candidate inputs")
