"""Which transformers class a config.json builds, and why: the one rule, said in every report.

In this order:

1. `--model-class NAME`: a transformers class (`T5ForConditionalGeneration`), or
   one of the auto classes below (`AutoModelForSeq2SeqLM`, or `AutoModel` for the
   base model without a head), resolved through transformers' own mapping for the
   config's model type;
2. the config's `architectures`: the first one transformers has (what
   `from_pretrained` builds for the same directory);
3. with neither, the model type's first head with a loss, so that `labels` give the
   step a real loss, as training builds it: `HEADS_WITH_A_LOSS`, in order, with the
   encoder-decoder heads first for a config that says `is_encoder_decoder` (a T5
   has no causal-LM head and its base `T5Model` takes no labels; a BART has both,
   and trains as a sequence-to-sequence model), and the masked-LM head first for
   one that says neither that nor `is_decoder` (a BERT, which has both, pretrains
   as a masked LM). A type with none of them is built as transformers' base
   `AutoModel`.

A config whose `auto_map` names its own code (`--trust`) is built by transformers'
auto classes from that code, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memlayout.errors import UsageError

AUTO_MAPPINGS = {
    "AutoModelForCausalLM": "MODEL_FOR_CAUSAL_LM_MAPPING",
    "AutoModelForMaskedLM": "MODEL_FOR_MASKED_LM_MAPPING",
    "AutoModelForSeq2SeqLM": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING",
    "AutoModelForSpeechSeq2Seq": "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING",
    "AutoModelForImageClassification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING",
    "AutoModelForAudioClassification": "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING",
    "AutoModelForSequenceClassification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING",
    "AutoModel": "MODEL_MAPPING",
}
"""Each auto class `--model-class` takes, and the public transformers mapping (config class -> model class) it reads."""

HEADS_WITH_A_LOSS = (
    "AutoModelForCausalLM",
    "AutoModelForMaskedLM",
    "AutoModelForSeq2SeqLM",
    "AutoModelForSpeechSeq2Seq",
    "AutoModelForImageClassification",
    "AutoModelForAudioClassification",
    "AutoModelForSequenceClassification",
)
"""The order a config without `architectures` is given a head in; each takes `labels` and returns a loss."""

ENCODER_DECODER_FIRST = ("AutoModelForSeq2SeqLM", "AutoModelForSpeechSeq2Seq")
"""Tried first for a config with `is_encoder_decoder`: such a model trains whole, encoder and decoder."""

ENCODER_FIRST = ("AutoModelForMaskedLM",)
"""Tried first for a config that is neither an encoder-decoder nor says `is_decoder`: a type with both a masked and
a causal LM head (BERT, RoBERTa) is an encoder, pretrained as a masked LM; its causal head wants `is_decoder=True`.
A decoder-only type (GPT-2, Llama) has no masked LM head, and gets its causal one."""

BASE = "AutoModel"


@dataclass(frozen=True)
class ChosenClass:
    """The class a config builds (None: transformers' auto classes build it from the config's own code)."""

    cls: Any
    chosen_by: str
    """Why this class, as reports say it: "architectures in config.json", "--model-class", ..."""


def heads_in_order(config: Any) -> tuple[str, ...]:
    """HEADS_WITH_A_LOSS in the order tried for this config, then the base model."""
    if getattr(config, "is_encoder_decoder", False):
        first: tuple[str, ...] = ENCODER_DECODER_FIRST
    elif not getattr(config, "is_decoder", False):
        first = ENCODER_FIRST
    else:
        first = ()
    return (*first, *(head for head in HEADS_WITH_A_LOSS if head not in first), BASE)


def choose_class(config: Any, requested: str | None, config_name: str) -> ChosenClass:
    """The class to build `config` with, by the module's rule, and why.

    Args:
        config: The transformers config.
        requested: `--model-class`, or None.
        config_name: How messages name the config ("config.json", a URL).

    Raises:
        UsageError: `requested` is no transformers class, or is one for another model type.
    """
    import transformers

    model_type = getattr(config, "model_type", "?")
    if requested is not None:
        if requested in AUTO_MAPPINGS:
            found = _mapped(config, requested)
            if found is None:
                raise UsageError(f"`model_class` {requested}: transformers has no {requested} class for model type "
                                 f"{model_type}", f"pick one of {', '.join(_available(config))}")
            return ChosenClass(found, f"--model-class {requested}")
        cls = getattr(transformers, requested, None)
        if not isinstance(cls, type) or not hasattr(cls, "_from_config"):
            raise UsageError(f"`model_class` {requested}: transformers has no model class of that name",
                             f"for model type {model_type}, pick one of {', '.join(_available(config))}")
        expected = getattr(cls, "config_class", None)
        if isinstance(expected, type) and not isinstance(config, expected):
            raise UsageError(
                f"`model_class` {requested} is built from a {expected.__name__}, and {config_name} is a "
                f"{type(config).__name__} (model type {model_type})",
                f"pick one of {', '.join(_available(config))}",
            )
        return ChosenClass(cls, "--model-class")
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return ChosenClass(cls, f"architectures in {config_name}")
    if getattr(config, "auto_map", None):
        return ChosenClass(None, f"auto_map in {config_name} (the model's own code)")
    for head in heads_in_order(config):
        found = _mapped(config, head)
        if found is not None:
            what = "the base model" if head == BASE else "the first head with a loss"
            return ChosenClass(found, f"{config_name} names no architectures: {what} for model type {model_type} "
                                      f"({head}); --model-class NAME builds another")
    raise UsageError(f"transformers has no model class for model type {model_type}",
                     "give `model_class` NAME, or pkg.module:build")


def _mapped(config: Any, auto_name: str) -> Any:
    """The class transformers' `auto_name` builds for this config's type, or None."""
    import transformers

    mapping = getattr(transformers, AUTO_MAPPINGS[auto_name])
    try:
        return mapping[type(config)]
    except (KeyError, ValueError):
        return None


def _available(config: Any) -> list[str]:
    """The --model-class names that build this config: its heads' classes and the base model's."""
    found = [_mapped(config, head) for head in heads_in_order(config)]
    return list(dict.fromkeys(cls.__name__ for cls in found if cls is not None)) or ["AutoModel"]
