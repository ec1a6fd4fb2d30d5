"""The ties a Hugging Face config declares, read from the config alone.

`tie_word_embeddings` missing from a config is taken as true: transformers 4.x
saved configs as a diff against `PretrainedConfig`'s defaults, where it is true,
so it was left out exactly when it was true (transformers 5 writes it explicitly,
false for Llama and friends). With a tie declared, every output head found by a
well-known name is declared tied to the input embedding, and ML103 compares them.

Both a model directory's config.json and a pickled model's config state are read
here, so nothing from transformers is imported.
"""

from __future__ import annotations

from typing import Any

from memlayout.load.records import DeclaredTie

# Output heads that transformers ties to the input embedding (`_tied_weights_keys`
# of the *ForCausalLM / *ForMaskedLM / *ForConditionalGeneration classes).
OUTPUT_HEAD_SUFFIXES = (
    "lm_head.weight",
    "lm_head.decoder.weight",
    "cls.predictions.decoder.weight",
    "predictions.decoder.weight",
    "generator_lm_head.weight",
    "pred_layer.proj.weight",
    "embed_out.weight",
)
# Input embeddings, most specific first: encoder-decoder models share `shared`.
INPUT_EMBEDDING_SUFFIXES = (
    "shared.weight",
    "embed_tokens.weight",
    "transformer.wte.weight",
    "wte.weight",
    "word_embeddings.weight",
    "tok_embeddings.weight",
    "embed_in.weight",
    "embeddings.weight",
)


# What `from_pretrained` does with a directory whose config ties the head to the
# embedding while its file stores both with different values, checked by
# tests/load/test_hf_ties.py against the installed transformers (and by hand on
# 4.40.2, 4.57.3 and 5.24.0): transformers 4 ties them without a word and keeps one
# file tensor's values for both (4.40 the head's, 4.57 the embedding's);
# transformers 5 logs "... so we will NOT tie them" and keeps both as the file
# holds them, untied.
FROM_PRETRAINED_WITH_DIFFERENT_VALUES = (
    "transformers 5's from_pretrained warns and leaves them untied (two copies that train apart), "
    "while transformers 4 ties them silently, keeping one file tensor's values and dropping the other's"
)


def is_config_tie(declared_by: str) -> bool:
    """Whether a tie comes from a Hugging Face config's `tie_word_embeddings` (what `from_pretrained` acts on)."""
    return declared_by.endswith("tie_word_embeddings")


def _first_by_suffix(names: list[str], suffixes: tuple[str, ...]) -> str | None:
    for suffix in suffixes:
        matches = [n for n in names if n == suffix or n.endswith("." + suffix)]
        if matches:
            return min(matches, key=len)
    return None


def declared_ties(
    config: dict[str, Any], names: list[str], declared_by: str = "config.json", stored: list[str] | None = None
) -> list[DeclaredTie]:
    """Ties a Hugging Face config declares, for the tensors present.

    Args:
        config: The parsed config.json (or a pickled model's config state).
        names: Every tensor name in the checkpoint.
        declared_by: Where the config came from, for messages.
        stored: The names the checkpoint itself stores, when `names` also holds
            another checkpoint's: the input embedding a head is restored from is
            one of these (a GPT-2 config restores lm_head.weight from its own
            transformer.wte.weight, never from a Llama's model.embed_tokens.weight).

    Returns:
        Output head -> input embedding ties when `tie_word_embeddings` holds
        (absent counts as true, see the module docstring), and decoder -> encoder
        ties for matching names when `tie_encoder_decoder` is true.
    """
    ties: list[DeclaredTie] = []
    text_config = config.get("text_config")
    tie_words = config.get("tie_word_embeddings")
    if tie_words is None and isinstance(text_config, dict):
        tie_words = text_config.get("tie_word_embeddings")
    if tie_words is None or bool(tie_words):
        embedding = _first_by_suffix(names if stored is None else stored, INPUT_EMBEDDING_SUFFIXES)
        if embedding is not None:
            for name in names:
                if name != embedding and any(
                    name == suffix or name.endswith("." + suffix) for suffix in OUTPUT_HEAD_SUFFIXES
                ):
                    ties.append(DeclaredTie(name, embedding, f"{declared_by} tie_word_embeddings"))
    if config.get("tie_encoder_decoder"):
        present = set(names)
        for name in names if stored is None else stored:
            head, sep, rest = name.partition("encoder.")
            if sep and (head == "" or head.endswith(".")):
                partner = f"{head}decoder.{rest}"
                if partner in present:
                    ties.append(DeclaredTie(partner, name, f"{declared_by} tie_encoder_decoder"))
    return ties
