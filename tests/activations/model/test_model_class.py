"""Which class a config.json builds (model/hf_class.py): --model-class, the config's architectures, else the model
type's first head with a loss, in the documented order, each with the reason the reports give."""

from __future__ import annotations

from typing import Any

import pytest

from memlayout.activations.model.hf_class import choose_class
from memlayout.errors import UsageError

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("config", "built", "head"),
    [
        (lambda: transformers.T5Config(), "T5ForConditionalGeneration", "AutoModelForSeq2SeqLM"),  # no causal head
        (lambda: transformers.BartConfig(), "BartForConditionalGeneration", "AutoModelForSeq2SeqLM"),  # has both
        (lambda: transformers.WhisperConfig(), "WhisperForConditionalGeneration", "AutoModelForSpeechSeq2Seq"),
        (lambda: transformers.GPT2Config(), "GPT2LMHeadModel", "AutoModelForCausalLM"),
        (lambda: transformers.LlamaConfig(), "LlamaForCausalLM", "AutoModelForCausalLM"),
        (lambda: transformers.BertConfig(), "BertForMaskedLM", "AutoModelForMaskedLM"),  # an encoder
        (lambda: transformers.BertConfig(is_decoder=True), "BertLMHeadModel", "AutoModelForCausalLM"),
        (lambda: transformers.ViTConfig(), "ViTForImageClassification", "AutoModelForImageClassification"),
    ],
)
def test_without_architectures_the_first_head_with_a_loss_in_order(config: Any, built: str, head: str) -> None:
    chosen = choose_class(config(), None, "config.json")
    assert chosen.cls.__name__ == built
    assert chosen.chosen_by.startswith("config.json names no architectures: the first head with a loss")
    assert f"({head})" in chosen.chosen_by


def test_the_configs_architectures_win_and_model_class_wins_over_them() -> None:
    config = transformers.T5Config(architectures=["T5EncoderModel"])
    chosen = choose_class(config, None, "config.json")
    assert (chosen.cls.__name__, chosen.chosen_by) == ("T5EncoderModel", "architectures in config.json")
    chosen = choose_class(config, "T5Model", "config.json")
    assert (chosen.cls.__name__, chosen.chosen_by) == ("T5Model", "--model-class")
    chosen = choose_class(config, "AutoModel", "config.json")
    assert (chosen.cls.__name__, chosen.chosen_by) == ("T5Model", "--model-class AutoModel")


@pytest.mark.parametrize(
    ("requested", "message"),
    [
        ("NoSuchModel", "transformers has no model class of that name"),
        ("GPT2LMHeadModel", "is built from a GPT2Config, and config.json is a T5Config"),
        ("AutoModelForCausalLM", "transformers has no AutoModelForCausalLM class for model type t5"),
    ],
)
def test_a_class_that_cannot_build_the_config_is_refused_with_the_ones_that_can(requested: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        choose_class(transformers.T5Config(), requested, "config.json")
    assert message in caught.value.message
    assert caught.value.hint is not None and "T5ForConditionalGeneration" in caught.value.hint
