"""The architectures the sweep covers, each built tiny with random weights, and its inputs.

- transformers: every model class in the auto-model registries of FAMILIES,
  once each, built from a tiny config (tiny.py) as the auto class builds it for
  a user: the registry's class, `_from_config(config)` (a sub-config where the
  class takes one, as `AutoModelFor...from_config` hands over `text_config`);
- diffusers: its UNets, VAEs and diffusion transformers, from small configs
  written here (the sizes diffusers' own tests use);
- torch.nn: nn.Transformer and its encoder and decoder, stacked and
  bidirectional RNNs.

Listing the catalog imports no model code; `build()` builds one architecture.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from benchmarks.accuracy.zoo.inputs import BATCH, IMAGE, TOKENS, transformers_inputs


@dataclass(frozen=True)
class Built:
    """A model in train mode, and the inputs of its training step."""

    model: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    size: str
    """How the model was made small, for the record."""


class NoInputs(Exception):
    """The model builds, but the sweep cannot make inputs its forward accepts."""


@dataclass(frozen=True)
class Architecture:
    """One entry of the sweep."""

    name: str
    """Unique: the model class (transformers, diffusers) or the torch.nn model."""
    source: str
    """Where the architecture comes from: the package, its version, and the registry entry."""
    family: str
    build: Callable[[], Built] = field(repr=False, compare=False)
    probe_default: Callable[[], str | None] | None = field(default=None, repr=False, compare=False)
    """Why the model does not build from its config class's defaults, or None (transformers only)."""


# transformers ------------------------------------------------------------------
FAMILIES: tuple[tuple[str, str, str], ...] = (
    # (family, registry in transformers.models.auto.modeling_auto, auto class)
    ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"),
    ("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM"),
    ("seq2seq", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM"),
    ("image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForImageClassification"),
    ("audio-ctc", "MODEL_FOR_CTC_MAPPING_NAMES", "AutoModelForCTC"),
    ("audio-classification", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "AutoModelForAudioClassification"),
    ("speech-seq2seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "AutoModelForSpeechSeq2Seq"),
    ("image-text-to-text", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "AutoModelForImageTextToText"),
)


def _transformers_entries() -> list[Architecture]:
    import transformers
    from transformers.models.auto import modeling_auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    entries: list[Architecture] = []
    # A class that takes images and text (GIT, Gemma 3) is checked with both, in its
    # image-text-to-text entry, even where the causal-LM registry lists it first.
    seen: set[str] = set()
    multimodal = {
        classes[0] if isinstance(classes, tuple) else classes
        for classes in modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.values()
    }
    for family, registry, auto in FAMILIES:
        mapping = getattr(modeling_auto, registry)
        for model_type, classes in _own_types_first(mapping, CONFIG_MAPPING_NAMES):
            class_name = classes[0] if isinstance(classes, tuple) else classes
            if class_name in seen or (class_name in multimodal and family != "image-text-to-text"):
                # one model class listed twice: by two registries (a speech model in seq2seq too),
                # or for two model types (internlm3 builds LlamaForCausalLM)
                continue
            seen.add(class_name)
            entries.append(Architecture(
                name=class_name,
                source=f"transformers {transformers.__version__}: {registry}[{model_type!r}]",
                family=family,
                build=_transformers_builder(model_type, auto, family),
                probe_default=partial(probe_default_config, model_type, auto),
            ))
    return entries


def _own_types_first(mapping: Any, configs: Any) -> list[tuple[str, Any]]:
    """The registry's entries, a class's own model type first (llama before internlm3 for LlamaForCausalLM)."""

    def own(item: tuple[str, Any]) -> bool:
        model_type, classes = item
        class_name = classes[0] if isinstance(classes, tuple) else classes
        return class_name.removesuffix("Model").startswith(configs.get(model_type, "").removesuffix("Config"))

    items = list(mapping.items())
    return [item for item in items if own(item)] + [item for item in items if not own(item)]


def _transformers_builder(model_type: str, auto: str, family: str) -> Callable[[], Built]:
    # A partial of a module-level function, not a closure: the sweep's runner starts each check
    # with spawn, which pickles the architecture into the child.
    return partial(_transformers_build, model_type, auto, family)


def _transformers_build(model_type: str, auto: str, family: str) -> Built:
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from benchmarks.accuracy.zoo.tiny import describe, tiny_config

    config_class = getattr(transformers, CONFIG_MAPPING_NAMES[model_type])
    config = tiny_config(config_class, model_type)
    _for_training(config)
    _for_family(config, family)
    torch.manual_seed(0)
    model = _model_class(model_type, auto)._from_config(_own_config(config, model_type, auto)).train()
    if hasattr(model, "set_default_language"):
        # X-MOD routes each input through a language adapter and has no default language
        model.set_default_language(config.languages[0])
    try:
        inputs = transformers_inputs(family, model)
    except Exception as exc:
        raise NoInputs(f"{type(exc).__name__}: {exc}") from exc
    return Built(model, (), inputs, describe(config))


def _model_class(model_type: str, auto: str) -> Any:
    """The class the auto class builds for this model type (the first, where the registry lists several)."""
    import transformers
    from transformers.models.auto import modeling_auto

    registry = next(name for _, name, cls in FAMILIES if cls == auto)
    classes = getattr(modeling_auto, registry)[model_type]
    return getattr(transformers, classes[0] if isinstance(classes, tuple) else classes)


def _own_config(config: Any, model_type: str, auto: str) -> Any:
    """The sub-config the model class is built from, where a composite config holds it under another name.

    The auto classes hand a model class `config.text_config` when that is its config
    class; MusicGen's decoder-only model reads `config.decoder` instead.
    """
    wanted = getattr(_model_class(model_type, auto), "config_class", None)
    if wanted is None or isinstance(config, wanted):
        return config
    for value in vars(config).values():
        if isinstance(value, wanted):
            return value
    return config


def probe_default_config(model_type: str, auto: str) -> str | None:
    """Why transformers cannot build the model from its own default config (on the meta device), or None."""
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    try:
        config = getattr(transformers, CONFIG_MAPPING_NAMES[model_type])()
        with torch.device("meta"):
            _model_class(model_type, auto)._from_config(_own_config(config, model_type, auto))
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return None


def _for_training(config: Any) -> None:
    """use_cache=False, as training runs: a key/value cache is for generation.

    apply_plan turns the cache off too (a checkpointed layer would append to it
    twice), and on some models the cache changes the step's numbers: BioGPT's
    gradients differ by 4e-9 with and without it, with no checkpoint at all. The
    unplanned and the planned step are compared with the same setting.
    """
    from transformers import PreTrainedConfig

    if hasattr(config, "use_cache"):
        config.use_cache = False
    for value in vars(config).values():
        if isinstance(value, PreTrainedConfig):
            _for_training(value)


def _for_family(config: Any, family: str) -> None:
    """What a family's head needs from a config that its defaults leave open.

    BERT-style models serve as causal LMs only with is_decoder=True (transformers
    warns otherwise) and as masked LMs only without it; a sequence-to-sequence head
    needs a padding id, and a CTC head a vocabulary.
    """
    own = vars(config)
    if "is_decoder" in own and family in ("causal-lm", "masked-lm"):
        config.is_decoder = family == "causal-lm"
    if family in ("seq2seq", "speech-seq2seq") and getattr(config, "pad_token_id", 0) is None:
        config.pad_token_id = 0
    if family == "audio-ctc" and getattr(config, "vocab_size", 0) is None:
        config.vocab_size = 32


# diffusers -----------------------------------------------------------------------
# Small configs in the sizes diffusers' own model tests use (block_out_channels
# (32, 64), one layer per block, norm groups of 32 or fewer).
DIFFUSERS: dict[str, dict[str, Any]] = {
    "UNet2DModel": {
        "sample_size": IMAGE, "in_channels": 3, "out_channels": 3, "block_out_channels": (32, 64),
        "layers_per_block": 1, "down_block_types": ("DownBlock2D", "AttnDownBlock2D"),
        "up_block_types": ("AttnUpBlock2D", "UpBlock2D"), "attention_head_dim": 8, "norm_num_groups": 32,
    },
    "UNet2DConditionModel": {
        "sample_size": IMAGE, "in_channels": 4, "out_channels": 4, "block_out_channels": (32, 64),
        "layers_per_block": 1, "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"),
        "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D"), "cross_attention_dim": 32, "attention_head_dim": 8,
        "norm_num_groups": 32,
    },
    "AutoencoderKL": {
        "in_channels": 3, "out_channels": 3, "block_out_channels": (32, 64), "latent_channels": 4,
        "down_block_types": ("DownEncoderBlock2D", "DownEncoderBlock2D"),
        "up_block_types": ("UpDecoderBlock2D", "UpDecoderBlock2D"), "norm_num_groups": 32, "layers_per_block": 1,
    },
    "AutoencoderTiny": {
        "in_channels": 3, "out_channels": 3, "encoder_block_out_channels": (32, 32),
        "decoder_block_out_channels": (32, 32), "num_encoder_blocks": (1, 2), "num_decoder_blocks": (2, 1),
        "latent_channels": 4,
    },
    "VQModel": {
        "in_channels": 3, "out_channels": 3, "block_out_channels": (32, 64), "latent_channels": 3,
        "down_block_types": ("DownEncoderBlock2D", "DownEncoderBlock2D"),
        "up_block_types": ("UpDecoderBlock2D", "UpDecoderBlock2D"), "norm_num_groups": 32, "layers_per_block": 1,
        "num_vq_embeddings": 64,
    },
    "ControlNetModel": {
        "in_channels": 4, "block_out_channels": (32, 64), "layers_per_block": 1,
        "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"), "cross_attention_dim": 32,
        "attention_head_dim": 8, "norm_num_groups": 32, "conditioning_embedding_out_channels": (16, 32),
    },
    "DiTTransformer2DModel": {
        "num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 4, "out_channels": 8,
        "num_layers": 2, "sample_size": 8, "patch_size": 2, "num_embeds_ada_norm": 1000, "norm_num_groups": 32,
    },
    "SD3Transformer2DModel": {
        "sample_size": 8, "patch_size": 2, "in_channels": 4, "num_layers": 2, "attention_head_dim": 8,
        "num_attention_heads": 4, "caption_projection_dim": 32, "joint_attention_dim": 32,
        "pooled_projection_dim": 64, "out_channels": 4,
    },
    "FluxTransformer2DModel": {
        "patch_size": 1, "in_channels": 4, "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 16,
        "num_attention_heads": 2, "joint_attention_dim": 32, "pooled_projection_dim": 32,
        "axes_dims_rope": (4, 4, 8),
    },
}


def _diffusers_entries() -> list[Architecture]:
    import diffusers

    return [
        Architecture(name=name, source=f"diffusers {diffusers.__version__}: {name}", family="diffusion",
                     build=_diffusers_builder(name))
        for name in DIFFUSERS
    ]


def _diffusers_builder(name: str) -> Callable[[], Built]:
    # A partial of a module-level function, not a closure: the sweep's runner starts each check
    # with spawn, which pickles the architecture into the child.
    return partial(_diffusers_build, name)


def _diffusers_build(name: str) -> Built:
    import diffusers
    import torch

    torch.manual_seed(0)
    model = getattr(diffusers, name)(**DIFFUSERS[name]).train()
    generator = torch.Generator().manual_seed(0)
    size = ", ".join(f"{key}={value}" for key, value in DIFFUSERS[name].items())
    return Built(model, (), _diffusers_inputs(name, model, generator), size)


def _diffusers_inputs(name: str, model: Any, generator: Any) -> dict[str, Any]:
    import torch

    config = model.config
    timestep = torch.tensor([10] * BATCH)
    text = torch.randn(BATCH, 8, int(config.get("cross_attention_dim") or config.get("joint_attention_dim") or 32),
                       generator=generator)
    if name.startswith("Autoencoder") or name == "VQModel":
        return {"sample": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=generator)}
    if name == "UNet2DModel":
        return {"sample": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=generator), "timestep": timestep}
    if name == "UNet2DConditionModel":
        return {"sample": torch.randn(BATCH, 4, IMAGE, IMAGE, generator=generator), "timestep": timestep,
                "encoder_hidden_states": text}
    if name == "ControlNetModel":
        return {"sample": torch.randn(BATCH, 4, IMAGE, IMAGE, generator=generator), "timestep": timestep,
                "encoder_hidden_states": text,
                "controlnet_cond": torch.randn(BATCH, 3, IMAGE * 8, IMAGE * 8, generator=generator)}
    if name == "DiTTransformer2DModel":
        return {"hidden_states": torch.randn(BATCH, 4, 8, 8, generator=generator), "timestep": timestep,
                "class_labels": torch.randint(0, 1000, (BATCH,), generator=generator)}
    if name == "SD3Transformer2DModel":
        return {"hidden_states": torch.randn(BATCH, 4, 8, 8, generator=generator), "timestep": timestep,
                "encoder_hidden_states": text, "pooled_projections": torch.randn(BATCH, 64, generator=generator)}
    if name == "FluxTransformer2DModel":
        pixels = 16
        return {"hidden_states": torch.randn(BATCH, pixels, 4, generator=generator), "timestep": timestep.float(),
                "encoder_hidden_states": text, "pooled_projections": torch.randn(BATCH, 32, generator=generator),
                "img_ids": torch.zeros(pixels, 3), "txt_ids": torch.zeros(text.shape[1], 3)}
    raise ValueError(f"no inputs for {name}")


# torch.nn ----------------------------------------------------------------------------
def _torch_entries() -> list[Architecture]:
    import torch

    version = torch.__version__.split("+")[0]
    return [
        Architecture(name=f"torch.nn.{name}", source=f"torch {version}: torch.nn", family="torch.nn",
                     build=_torch_builder(name))
        for name in TORCH_MODELS
    ]


def _torch_builder(name: str) -> Callable[[], Built]:
    # A partial of a module-level function, not a closure: the sweep's runner starts each check
    # with spawn, which pickles the architecture into the child.
    return partial(_torch_build, name)


def _torch_build(name: str) -> Built:
    import torch

    torch.manual_seed(0)
    make, shape, size = TORCH_MODELS[name]
    model = make().train()
    inputs = tuple(torch.randn(*s, generator=torch.Generator().manual_seed(index)) for index, s in enumerate(shape))
    return Built(model, inputs, {}, size)


def _transformer() -> Any:
    from torch import nn

    return nn.Transformer(d_model=64, nhead=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=128,
                          batch_first=True)


def _encoder() -> Any:
    from torch import nn

    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False)


def _decoder() -> Any:
    from torch import nn

    layer = nn.TransformerDecoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True, norm_first=True)
    return nn.TransformerDecoder(layer, num_layers=2)


def _rnn(kind: str, **options: Any) -> Callable[[], Any]:
    def make() -> Any:
        from torch import nn

        return getattr(nn, kind)(input_size=32, hidden_size=64, batch_first=True, **options)

    return make


TORCH_MODELS: dict[str, tuple[Callable[[], Any], tuple[tuple[int, ...], ...], str]] = {
    # name: (factory, input shapes, size)
    "Transformer": (_transformer, ((BATCH, TOKENS, 64), (BATCH, TOKENS // 2, 64)),
                    "d_model=64, nhead=4, 2+2 layers, dim_feedforward=128"),
    "TransformerEncoder": (_encoder, ((BATCH, TOKENS, 64),), "d_model=64, nhead=4, 3 layers, dim_feedforward=128"),
    "TransformerDecoder": (_decoder, ((BATCH, TOKENS, 64), (BATCH, TOKENS // 2, 64)),
                           "d_model=64, nhead=4, 2 layers, norm_first, dim_feedforward=128"),
    "LSTM (3 layers, dropout)": (_rnn("LSTM", num_layers=3, dropout=0.1), ((BATCH, TOKENS, 32),),
                                 "input 32, hidden 64, 3 layers, dropout 0.1"),
    "LSTM (2 layers, bidirectional)": (_rnn("LSTM", num_layers=2, bidirectional=True), ((BATCH, TOKENS, 32),),
                                       "input 32, hidden 64, 2 layers, bidirectional"),
    "LSTM (2 layers, proj_size)": (_rnn("LSTM", num_layers=2, proj_size=16), ((BATCH, TOKENS, 32),),
                                   "input 32, hidden 64, 2 layers, proj_size 16"),
    "GRU (2 layers, bidirectional)": (_rnn("GRU", num_layers=2, bidirectional=True), ((BATCH, TOKENS, 32),),
                                      "input 32, hidden 64, 2 layers, bidirectional"),
    "RNN (3 layers, tanh)": (_rnn("RNN", num_layers=3), ((BATCH, TOKENS, 32),), "input 32, hidden 64, 3 layers"),
}


# the catalog ------------------------------------------------------------------------
def architectures() -> list[Architecture]:
    """Every architecture of the sweep, in its order: transformers, diffusers, torch.nn."""
    return [*_transformers_entries(), *_diffusers_entries(), *_torch_entries()]


def by_name() -> dict[str, Architecture]:
    return {entry.name: entry for entry in architectures()}
