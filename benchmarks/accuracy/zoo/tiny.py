"""Tiny transformers configs, made generically from each config class's own defaults.

transformers' test suites give each model a small config by hand; those files are
not installed with the package. Here every config is the class's defaults with
the sizes shrunk by field name (SHRINK), recursively into sub-configs, and the
special token ids moved inside the small vocabulary. OVERRIDES holds the few
architectures whose config ties sizes together in a way the names do not say.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

SIZE_VARIABLE = "MEMLAYOUT_ZOO_SIZE"
"""`small` (the default) or `large`: the sweep runs every architecture at one of two sizes. run.py's
--size sets it for the checks it spawns, which read it when they import this module."""
SIZES: dict[str, dict[str, int]] = {
    "small": {"WIDTH": 32, "HEADS": 4, "KV_HEADS": 2, "HEAD_DIM": 8, "FFN": 64, "MOE_FFN": 32, "LAYERS": 2},
    # Where kernel scratch and storage rounding are a smaller share of the peak, and terms that vanish at
    # width 32 (a head of 8, two layers) do not.
    "large": {"WIDTH": 256, "HEADS": 8, "KV_HEADS": 4, "HEAD_DIM": 32, "FFN": 512, "MOE_FFN": 128, "LAYERS": 4},
}
SIZE = os.environ.get(SIZE_VARIABLE, "small")
_SIZE = SIZES[SIZE]
VOCAB = 99
WIDTH = _SIZE["WIDTH"]
HEADS = _SIZE["HEADS"]
KV_HEADS = _SIZE["KV_HEADS"]
HEAD_DIM = _SIZE["HEAD_DIM"]
FFN = _SIZE["FFN"]
MOE_FFN = _SIZE["MOE_FFN"]
LAYERS = _SIZE["LAYERS"]
EXPERTS = 4
IMAGE = 32
PATCH = 8
POSITIONS = 512
SOURCE_POSITIONS = 32
"""Whisper-style encoders take exactly twice this many input frames."""
SPECTROGRAM_FRAMES = 64


def _at_most(limit: int) -> Callable[[Any], Any]:
    def shrink(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            return value
        return min(value, limit)

    return shrink


def _list_of(limit: int) -> Callable[[Any], Any]:
    def shrink(value: Any) -> Any:
        if (isinstance(value, (list, tuple)) and value
                and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
            return [min(v, limit) for v in value]
        return _at_most(limit)(value)

    return shrink


def _widths(value: Any) -> Any:
    """Per-stage channel lists of a CNN ([256, 512, 1024, 2048]) keep their doubling, from WIDTH.

    WIDTH, not less: group norms of 32 groups need 32 channels.
    """
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        return [min(v, WIDTH * 2**i) for i, v in enumerate(value)]
    return _at_most(WIDTH)(value)


def _heads(value: Any) -> Any:
    """Heads per stage ([3, 6, 12, 24] in a Swin) become HEADS everywhere: they must divide the widths."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        return [HEADS] * len(value)
    return _at_most(HEADS)(value)


def _image(value: Any) -> Any:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return [min(value[0], IMAGE), min(value[1], IMAGE)]
    return _at_most(IMAGE)(value)


SHRINK: dict[str, Callable[[Any], Any]] = {}
for _names, _rule in (
    (("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "hidden_dim", "emb_dim", "d_embed",
      "projection_dim", "text_hidden_size", "out_hidden_size", "projector_hidden_size", "encoder_hidden_size",
      "word_embed_proj_dim", "embedding_dim", "xvector_output_dim", "classifier_proj_size", "codevector_dim",
      "proj_codevector_dim", "output_dim", "vision_output_dim", "intra_bottleneck_size", "d_latents",
      "audio_hidden_size", "projector_input_dim", "projector_output_dim", "decoder_hidden_size"), _at_most(WIDTH)),
    (("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads", "decoder_attention_heads",
      "num_attention_heads_decoder"), _heads),
    (("head_dim", "attention_head_size", "d_kv", "d_head", "kv_channels", "dim_head", "qk_nope_head_dim",
      "qk_rope_head_dim", "v_head_dim", "linear_key_head_dim", "linear_value_head_dim", "swa_head_dim",
      "index_head_dim"), _at_most(HEAD_DIM)),
    (("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner", "dff", "d_inner",
      "intermediate_size_mlp", "mlp_dim", "ffn_hidden_size", "dim_ff", "feed_forward_size",
      "speech_encoder_intermediate_size", "t2u_encoder_ffn_dim", "t2u_decoder_ffn_dim"), _at_most(FFN)),
    (("moe_intermediate_size", "shared_expert_intermediate_size", "expert_ffn_hidden_size",
      "moe_shared_expert_intermediate_size", "shared_intermediate_size", "dense_intermediate_size",
      "shared_experts_intermediate_size", "kv_lora_rank", "q_lora_rank", "o_lora_rank"), _at_most(MOE_FFN)),
    (("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), _at_most(EXPERTS)),
    (("num_experts_per_tok", "moe_topk", "num_experts_per_token", "top_k", "moe_k"), _at_most(2)),
    (("n_shared_experts", "n_group", "num_group", "num_expert_group", "topk_group", "first_k_dense_replace"),
     _at_most(1)),
    (("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers", "decoder_layers",
      "num_decoder_layers", "num_encoder_layers", "max_window_layers", "speech_encoder_layers",
      "t2u_encoder_layers", "t2u_decoder_layers"), _at_most(LAYERS)),
    (("vocab_size", "vocab_size_per_layer_input", "t2u_vocab_size", "unit_hifi_gan_vocab_size"), _at_most(VOCAB)),
    (("hidden_size_per_layer_input",), _at_most(HEAD_DIM)),
    (("max_position_embeddings", "n_positions", "n_ctx", "max_target_positions", "max_seq_len"), _at_most(POSITIONS)),
    (("image_size",), _image),
    (("patch_size",), _at_most(PATCH)),
    (("hidden_sizes", "embedding_size", "embed_dims"), _widths),
    (("conv_dim", "tdnn_dim"), _list_of(WIDTH)),
    (("max_source_positions",), _at_most(SOURCE_POSITIONS)),
    (("max_length",), _at_most(SPECTROGRAM_FRAMES)),
    (("depths",), _list_of(1)),
    (("num_conv_pos_embeddings",), _at_most(16)),
    (("num_codevectors_per_group",), _at_most(8)),
    (("index_topk",), _at_most(16)),
    (("mm_tokens_per_image",), _at_most(4)),  # pooled from the tiny image's 4 x 4 patches
    (("rotary_dim",), _at_most(HEAD_DIM // 2)),
    (("mamba_n_heads", "mamba_num_heads"), _at_most(8)),
    (("mamba_d_state", "ssm_state_size", "state_size"), _at_most(16)),
    (("mamba_d_head", "mamba_head_dim"), _at_most(HEAD_DIM)),
    # Layer drop skips each layer at random in training, so the measured step would be one draw of many
    # and a plan's check another. memlayout states it as an assumption with a range
    # (tests/activations/trace/test_data_dependent.py); the sweep measures the step every layer runs in.
    (("layerdrop", "encoder_layerdrop", "decoder_layerdrop", "speech_encoder_layerdrop", "layer_drop"),
     lambda value: 0.0 if isinstance(value, float) else value),
):
    for _name in _names:
        SHRINK[_name] = _rule


def _is_token_id(name: str) -> bool:
    return name.endswith(("_token_id", "_token_index")) or name in ("decoder_start_token_id",)


QSA = {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": HEAD_DIM, "indexer_budget": 16,
       "indexer_compress_ratio": 4}
"""Qwen4-Exp's sparse attention: off when every field is None, yet its attention divides them."""

MROPE = {"text_config": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                              "mrope_section": [2, 1, 1]}}}
"""Qwen2-VL-style rotary sections for time, height and width: half the tiny head (their modeling files
default to [16, 24, 24], for a head of 128)."""

OVERRIDES: dict[str, dict[str, Any]] = {
    # model_type: values the generic shrink cannot guess. Mostly fields whose default is None,
    # which the modeling code reads as a number (the test suites set them by hand too).
    "esm": {"vocab_size": 33, "pad_token_id": 1, "mask_token_id": 32},  # ESM's alphabet; the defaults are None
    "bit": {"num_groups": 8},  # group norms over bottlenecks of a quarter of the tiny widths
    "mobilevitv2": {"image_size": 64},
    # BLIP-2's language model reads its query tokens at placeholders; the default names no placeholder id
    "blip-2": {"image_token_index": 90},
    "instructblip": {"image_token_index": 90},
    "instructblipvideo": {"image_token_index": 90},
    # the default taps layers 6, -8, -11 of a deep tower  # five halvings of a 32-pixel image leave nothing to unfold
    "vipllava": {"vision_feature_layers": [-2, -1]},
    "textnet": {"stem_out_channels": 32},  # the first stage's width
    "hgnet_v2": {"hidden_sizes": [256, 512, 1024, 2048]},  # the head reads the stages' own (unshrunk) widths
    "neomme": {"head_dim": 2 * HEAD_DIM},  # M-RoPE needs a rotated part of a multiple of 4 dims
    "perceiver": {"max_position_embeddings": 64},  # the MLM decoder predicts exactly this many positions
    # Swin-style windows: 4 x 4-pixel patches of a 32-pixel image, windows of 2 x 2 patches
    "swin": {"patch_size": 4, "window_size": 2},
    "swinv2": {"patch_size": 4, "window_size": 2},
    "donut-swin": {"patch_size": 4, "window_size": 2},
    "deepseek_v2": {"num_experts_per_tok": 2, "n_group": 1, "topk_group": 1},
    "dots1": {"n_routed_experts": EXPERTS, "num_experts_per_tok": 2, "n_shared_experts": 1},
    "dots3_note": {"text_config": {"per_layer_config": None, "swa_head_dim": 2 * HEAD_DIM}},
    "dots3_note_text": {"per_layer_config": None, "swa_head_dim": 2 * HEAD_DIM},
    "gemma3n_text": {"num_kv_shared_layers": 0},
    "gemma4_assistant": {"text_config": {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0}},
    "gemma4_unified_assistant": {"num_kv_shared_layers": 0},
    "gpt_neo": {"attention_types": [[["global", "local"], LAYERS // 2]], "num_layers": LAYERS},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_hidden_layers": 2},
    "mamba2": {"hidden_size": WIDTH, "num_heads": 8, "head_dim": WIDTH // 4, "n_groups": 1},  # heads x head = 2 x width
    "qwen4_exp": {"text_config": QSA},
    "qwen2_vl": MROPE, "qwen2_5_vl": MROPE, "glm4v": MROPE, "glm4v_moe": MROPE, "glm46v": MROPE, "glm_ocr": MROPE,
    "qwen4_exp_text": QSA,
    "recurrent_gemma": {"num_hidden_layers": 3},
    # two shared-transformer (hybrid) layers: the tied-weights pattern expects more than one
    "zamba": {"layers_block_type": ["linear_attention", "hybrid", "linear_attention", "hybrid"],
              "num_hidden_layers": 4},
    "reformer": {"axial_pos_shape": [8, 8], "axial_pos_embds_dim": [16, 16]},  # their product is the length
}


def tiny_config(config_class: Any, model_type: str) -> Any:
    """The config class's defaults with every size shrunk (see SHRINK), sub-configs included."""
    overrides = OVERRIDES.get(model_type, {})
    default = config_class(**overrides)
    kwargs = _shrunk(default)
    _merge(kwargs, overrides)
    return config_class(**kwargs)


def _merge(into: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Overrides win; a dict overrides a sub-config's values one by one."""
    for name, value in overrides.items():
        if isinstance(value, dict) and isinstance(into.get(name), dict):
            _merge(into[name], value)
        else:
            into[name] = value


DESCRIBED = ("hidden_size", "d_model", "num_hidden_layers", "num_layers", "num_attention_heads", "intermediate_size",
             "vocab_size", "num_experts", "num_local_experts", "n_routed_experts", "image_size", "patch_size",
             "hidden_sizes", "depths")


def describe(config: Any) -> str:
    """The main sizes of a config and its sub-configs, e.g. `hidden_size=32, num_hidden_layers=2, ...`."""
    from transformers import PreTrainedConfig

    parts = [f"{name}={getattr(config, name)}" for name in DESCRIBED if getattr(config, name, None) not in (None, [])]
    for name, value in vars(config).items():
        if isinstance(value, PreTrainedConfig):
            parts.append(f"{name}({describe(value)})")
    return ", ".join(parts)


KV_HEAD_FIELDS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")
HEAD_FIELDS = ("num_attention_heads", "n_head", "num_heads")
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
LAYER_TYPE_FIELDS = ("layer_types", "layers_block_type", "block_types")


def _shrunk(config: Any, ids: _TokenIds | None = None) -> dict[str, Any]:
    from transformers import PreTrainedConfig

    ids = ids if ids is not None else _TokenIds()
    out: dict[str, Any] = {}
    values = dict(vars(config))
    for name, value in values.items():
        if name.startswith("_"):
            continue
        if isinstance(value, PreTrainedConfig):
            out[name] = {"model_type": value.model_type, **_shrunk(value, ids)}
            continue
        rule = SHRINK.get(name)
        if rule is not None:
            new = rule(value)
            if new != value:
                out[name] = new
    if "head_dim" in values:
        # None means "hidden_size // heads" to most configs, yet a few modeling files read it as is
        out["head_dim"] = HEAD_DIM
    _shrink_kv_heads(values, out)
    _keep_every_layer_type(values, out)
    _shrink_mrope(values, out)
    vocab = out.get("vocab_size", values.get("vocab_size"))
    text = out.get("text_config")
    if not isinstance(vocab, int) and isinstance(text, dict):
        # a composite config's placeholders (image_token_id) index its language model's vocabulary
        vocab = text.get("vocab_size", VOCAB)
    if isinstance(vocab, int):
        ids.move(values, out, vocab)
    return out


class _TokenIds:
    """Moves special token ids that fall outside a small vocabulary into it, each to an id of its own.

    One instance serves a config and its sub-configs, so that an image placeholder
    of the composite never lands on the language model's end-of-text id.
    """

    def __init__(self) -> None:
        self.taken: set[int] = set()

    def move(self, values: dict[str, Any], out: dict[str, Any], vocab: int) -> None:
        for name, value in sorted(values.items()):
            if not _is_token_id(name) or not isinstance(value, int) or isinstance(value, bool):
                continue
            if 0 <= value < vocab and value not in self.taken:
                self.taken.add(value)
                continue
            spare = vocab - 1
            while spare in self.taken:
                spare -= 1
            out[name] = spare
            self.taken.add(spare)


def _shrink_kv_heads(values: dict[str, Any], out: dict[str, Any]) -> None:
    """Grouped-query attention keeps fewer key/value heads than heads; multi-head (and MLA) keeps as many."""
    heads = next((values[name] for name in HEAD_FIELDS if isinstance(values.get(name), int)), None)
    for name in KV_HEAD_FIELDS:
        kv = values.get(name)
        if not isinstance(kv, int) or isinstance(kv, bool):
            continue
        out[name] = KV_HEADS if heads is not None and kv < heads else min(kv, HEADS)
    if any(name in values and values[name] is None for name in KV_HEAD_FIELDS[:1]) and heads is not None:
        # None means "as many as heads", yet a few modeling files divide by it
        out["num_key_value_heads"] = HEADS


def _shrink_mrope(values: dict[str, Any], out: dict[str, Any]) -> None:
    """Multimodal rotary sections ([16, 24, 24] for time, height, width) must add up to half the head."""
    rope = values.get("rope_parameters")
    if not isinstance(rope, dict) or not isinstance(rope.get("mrope_section"), list):
        return
    sections = rope["mrope_section"]
    half = HEAD_DIM // 2
    shrunk = [1] * len(sections)
    shrunk[0] += half - len(sections)
    out["rope_parameters"] = {**rope, "mrope_section": shrunk}


def _keep_every_layer_type(values: dict[str, Any], out: dict[str, Any]) -> None:
    """A hybrid stack (linear attention and full attention, mamba and attention) keeps one layer of each kind.

    Two layers cut from the front of the pattern are often all of one kind, and a
    model with no attention layer then fails where it asks its cache for a length.
    """
    field = next((name for name in LAYER_TYPE_FIELDS if isinstance(values.get(name), (list, tuple))), None)
    if field is None:
        return
    layer_types = values[field]
    if not all(isinstance(kind, str) for kind in layer_types):
        return
    kinds = list(dict.fromkeys(layer_types))
    if len(kinds) < 2:
        return
    out[field] = kinds
    for name in LAYER_FIELDS:
        if isinstance(values.get(name), int):
            out[name] = len(kinds)
