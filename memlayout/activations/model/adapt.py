"""What is done to the model between building it and tracing its step: `--quantize`, then `--lora`/`--dora`.

In the order a QLoRA recipe runs them: the base is quantized as it is loaded
(`from_pretrained(quantization_config=...)`), then peft adds the adapters
(`get_peft_model`), in the world the model was built in. A `--dtype` cast comes
first, as `from_pretrained(dtype=...)` loads the weights in that dtype before
quantizing them; peft then keeps the adapters in float32 (its
`autocast_adapter_dtype`), as it does for a real model.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from memlayout.activations.model.adapters import AppliedLora, LoraOptions, apply_lora
from memlayout.activations.model.quantize import Quantized, quantize_model, quiet_bitsandbytes
from memlayout.activations.request.step_request import StepRequest


@dataclass(frozen=True)
class Adaptation:
    """What `--quantize`, `--lora` and `--dora` ask for."""

    lora: LoraOptions | None = None
    quantize: str | None = None
    """nf4, fp4 or int8; None: the base as built."""

    @property
    def empty(self) -> bool:
        return self.lora is None and self.quantize is None


def adaptation_of(request: StepRequest) -> Adaptation:
    """What a request's `quantize`, `lora`, `lora_targets`, `lora_dropout` and `dora` ask for (empty: neither)."""
    lora = None
    if request.lora is not None or request.dora:
        lora = LoraOptions(rank=request.lora, targets=request.lora_targets, dropout=request.lora_dropout,
                           dora=request.dora)
    return Adaptation(lora=lora, quantize=request.quantize)


@dataclass(frozen=True)
class Adapted:
    """What was done: the quantization and the adapters, as transformers and peft made them."""

    quantized: Quantized | None = None
    lora: AppliedLora | None = None


def adapt_model(model: Any, adaptation: Adaptation, *, world: str, device: str, move: Callable[[Any], Any],
                context: Callable[[], AbstractContextManager[Any]]) -> tuple[Any, Adapted]:
    """The model quantized and given its adapters; a new object where peft wrapped it.

    Args:
        model: the model in the step's world.
        adaptation: what to do.
        world: fake, meta or real.
        device: the step's device.
        move: puts a meta parameter into the step's world with its state (build.TensorMover.move).
        context: the step's world.

    Raises:
        UsageError: peft or bitsandbytes missing, a model they cannot take, or an unknown setting.
    """
    quantized = None
    lora = None
    with quiet_bitsandbytes():
        if adaptation.quantize is not None:
            quantized = quantize_model(model, adaptation.quantize, world=world, device=device, move=move,
                                       context=context)
        if adaptation.lora is not None:
            model, lora = apply_lora(model, adaptation.lora, context)
    return model, Adapted(quantized=quantized, lora=lora)
