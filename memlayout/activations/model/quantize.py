"""A base quantized with bitsandbytes as transformers' `BitsAndBytesConfig` does it (`--quantize nf4|fp4|int8`).

`from_pretrained(..., quantization_config=BitsAndBytesConfig(...))` does two things,
and so does this module, with transformers' own quantizer:

1. before any weight is read, `HfQuantizer.preprocess_model` swaps every
   `nn.Linear` (and GPT-2's `Conv1D`) but those it keeps whole (the output
   embeddings, tied weights, a model's `_keep_in_fp32_modules`) for bitsandbytes'
   `Linear4bit` or `Linear8bitLt`, on the meta device;
2. each weight is then quantized as it is loaded (`Bnb4bitQuantize`:
   `Params4bit(weight, **meta_weight.__dict__).to(device)`): the packed 4-bit
   weight, two weights a byte, and its `QuantState` (a float32 absmax per block of
   64, the 16-value code); for 8 bits the int8 weight and a float32 scale per row.

Step 2 cannot run on fake tensors (a `Params4bit` cannot wrap a FakeTensor), and
its `.to(device)` quantizes only off the meta device. So each weight is quantized
on the meta device by bitsandbytes itself (`Params4bit._quantize`: its ops have
meta kernels, registered with `torch.library.register_fake`), then moved into the
step's world, its state with it (parameter_class.py). With `--real`, the real
weights are quantized by transformers' own op, as loading does.

The settings are BitsAndBytesConfig's defaults but the quant type: no double
quantization, float32 compute, uint8 storage, blocks of 64.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from memlayout.activations.request.vocabulary import QUANTIZE_METHODS
from memlayout.errors import SettingError, UsageError

LIBRARY_OPS_WITH_SCRATCH = (
    "bitsandbytes.gemm_4bit.default",
    "bitsandbytes.gemv_4bit.default",
)
"""bitsandbytes' ops whose real CPU kernel allocates what their fake kernel does not show: the 4-bit matmul
dequantizes the whole weight into a temporary of the input's dtype, multiplies, and frees it before it returns
(`_gemm_4bit_default_impl`; a 256 x 2048 layer: 2 MiB of float32 inside the op). The trace learns it from the
real kernel as it learns aten's (trace/kernel_storage.py); without it a quantized Llama's forward with wide MLPs
read 0.40 of the allocator's peak."""
INSTALL = "pip install 'memlayout[lora]'"


@dataclass(frozen=True)
class Quantized:
    """What `--quantize` did to the model."""

    method: str
    """nf4, fp4 or int8."""
    layers: int
    """How many linear layers bitsandbytes' layers replaced."""
    kept: tuple[str, ...]
    """The modules transformers keeps unquantized (the output embeddings, tied weights)."""


def require_bitsandbytes() -> Any:
    """bitsandbytes, imported.

    Raises:
        UsageError: it is not installed (one line with the install command).
    """
    try:
        with quiet_bitsandbytes():
            import bitsandbytes
    except ImportError:
        raise UsageError("`quantize` builds the base with bitsandbytes' layers, and bitsandbytes is not installed",
                         INSTALL) from None
    return bitsandbytes


@contextmanager
def quiet_bitsandbytes() -> Iterator[None]:
    """bitsandbytes' warnings held back while it is imported (by memlayout, or by peft, which imports it where it is
    installed).

    At import, bitsandbytes' CPU backend tries to fetch a kernel from the Hugging Face Hub and logs its failure as a
    warning ("Failed to load CPU gemm_4bit_forward from kernels-community"), which logging's last resort writes to
    stderr: a line of noise beside the command's one-line answer. Its fallback kernel is the one traced.
    """
    import logging

    log = logging.getLogger("bitsandbytes")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def bitsandbytes_config(method: str) -> Any:
    """transformers' BitsAndBytesConfig for `method`, every other setting its default."""
    import transformers

    if method == "int8":
        return transformers.BitsAndBytesConfig(load_in_8bit=True)  # type: ignore[no-untyped-call]
    return transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=method)  # type: ignore[no-untyped-call]


def quantize_model(model: Any, method: str, *, world: str, device: str,
                   move: Callable[[Any], Any], context: Callable[[], AbstractContextManager[Any]]) -> Quantized:
    """Quantize the model in place as `from_pretrained(quantization_config=...)` would.

    Args:
        model: a transformers model, built in the step's world.
        method: nf4, fp4 or int8.
        world: fake, meta or real.
        device: the step's device.
        move: puts a meta parameter into the step's world (TensorMover.move), its state along with it.
        context: the step's world, where a real weight is quantized.

    Raises:
        UsageError: an unknown method, a model that is not a transformers model, or bitsandbytes missing.
    """
    if method not in QUANTIZE_METHODS:
        raise SettingError(f"unknown `quantize` {method!r}", f"use {', '.join(QUANTIZE_METHODS)}")
    bnb = require_bitsandbytes()
    import torch
    import transformers
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.auto import AutoHfQuantizer

    if not isinstance(model, transformers.PreTrainedModel):
        raise UsageError(
            f"`quantize` quantizes as transformers' BitsAndBytesConfig does, which needs a transformers model, and "
            f"this target built a {type(model).__name__}",
            "build the model with bitsandbytes' layers in your factory and leave `quantize` out",
        )
    quantizer = AutoHfQuantizer.from_config(bitsandbytes_config(method), pre_quantized=False)
    originals = {path: (module.weight, module.bias) for path, module in model.named_modules()
                 if isinstance(module, (torch.nn.Linear, Conv1D))}
    # Out of the fake mode: bitsandbytes' layers are made on the meta device (their Params4bit wraps a meta tensor).
    quantizer.preprocess_model(model=model, device_map={"": device}, checkpoint_files=None, use_kernels=False)
    layers = 0
    for path, module in model.named_modules():
        if not isinstance(module, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)) or path not in originals:
            continue
        weight, bias = originals[path]
        if world == "real":
            converted = quantizer.get_quantize_ops().convert({f"{path}.weight": weight.detach()}, model=model,
                                                             full_layer_name=f"{path}.weight")
            module.weight = converted[f"{path}.weight"]
        else:
            module.weight = move(_quantized_on_meta(module, weight))
        if isinstance(module, bnb.nn.Linear4bit):
            module.quant_state = module.weight.quant_state
        if bias is not None:
            # The checkpoint's bias, frozen as transformers leaves every quantized layer (requires_grad_(False)).
            module.bias = torch.nn.Parameter(bias.detach(), requires_grad=False)
        layers += 1
    quantizer.postprocess_model(model)
    model.hf_quantizer = quantizer
    return Quantized(method=method, layers=layers, kept=tuple(sorted(quantizer.modules_to_not_convert)))


def _quantized_on_meta(module: Any, weight: Any) -> Any:
    """The layer's weight quantized by bitsandbytes on the meta device, as loading quantizes it on a real one."""
    import torch
    from transformers.pytorch_utils import Conv1D

    value = torch.empty(weight.shape, dtype=weight.dtype, device="meta")
    if issubclass(getattr(module, "source_cls", torch.nn.Linear), Conv1D):
        value = value.T  # Conv1D keeps its weight [in, out]; Bnb4bitQuantize transposes it the same way
    template = module.weight
    quantized = type(template)(value, requires_grad=False, **template.__dict__)
    quantized._quantize(torch.device("meta"))
    return quantized
