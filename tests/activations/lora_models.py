"""Real LoRA, DoRA and QLoRA models, made with peft, transformers and bitsandbytes as a user makes them.

The predictions under test apply peft (and transformers' bitsandbytes quantizer) themselves, on
fake tensors; these are the real steps they are judged against, built without memlayout.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tests.activations import models
from tests.activations.measure import allocator_peak_step


def wide_llama() -> torch.nn.Module:
    """A Llama whose MLP dwarfs its activations: a 4-bit matmul's dequantized weight (256 x 2048 float32, 2 MiB)
    is the largest thing its forward allocates."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, intermediate_size=2048, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)
    return LlamaForCausalLM(config).train()


BUILDERS: dict[str, Callable[[], torch.nn.Module]] = {
    "llama": models.llama, "gpt2": models.gpt2, "bert": models.bert, "wide-llama": wide_llama,
}


def saved(name: str, folder: Path) -> Path:
    """The model's Hugging Face directory (config.json and its weights), written by transformers."""
    directory = folder / name
    if not (directory / "config.json").exists():
        BUILDERS[name]().save_pretrained(directory)  # type: ignore[operator]
    return directory


def with_lora(model: torch.nn.Module, **config: Any) -> Any:
    """peft's LoRA on the model, every setting not given its LoraConfig default."""
    import peft

    return peft.get_peft_model(model, peft.LoraConfig(**config))  # type: ignore[arg-type]


def quantized_from(directory: Path, method: str = "nf4") -> Any:
    """The directory loaded as a QLoRA recipe loads it: from_pretrained with a BitsAndBytesConfig, on the CPU."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    config = BitsAndBytesConfig(load_in_8bit=True) if method == "int8" else \
        BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=method)
    return AutoModelForCausalLM.from_pretrained(directory, quantization_config=config)


def quantization_state(model: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors bitsandbytes keeps beside each quantized layer's packed weight, as its QuantState lists them."""
    import bitsandbytes as bnb

    found = []
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            state = module.weight.quant_state.as_dict(packed=False)
            found += [value for value in state.values() if isinstance(value, torch.Tensor)]
        elif isinstance(module, bnb.nn.Linear8bitLt) and module.weight.SCB is not None:
            found.append(module.weight.SCB)
    return found


def quantized_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The packed (or int8) weights of the quantized layers."""
    import bitsandbytes as bnb

    return [module.weight for module in model.modules() if isinstance(module, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt))]


def real_peak(model: torch.nn.Module, batch: int = 4, length: int = 32, vocab: int = 500) -> int:
    """A real steady-state AdamW step of the model, by the CPU allocator's events, its quantization state counted
    as the model's (it lives beside the weights from the start)."""
    args, kwargs = models.token_inputs(batch, length, vocab)
    return allocator_peak_step(model, args, kwargs, other_state=tuple(quantization_state(model))).peak_bytes


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages among the tensors."""
    seen = {(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in tensors}
    return sum(size for _, size in seen)
