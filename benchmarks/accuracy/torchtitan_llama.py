"""torchtitan's own Llama 3 and its selective activation checkpointing, imported from the torchtitan package.

What `memlayout activations` is given to reproduce torchtitan's published Table 1
(benchmarks/accuracy/bench_torchtitan.py): `torchtitan_llama:llama3_8b` builds torchtitan's
`Transformer` for its "8B" flavor (Llama 3.1 8B: torchtitan's tokenizer has 128,256
tokens, `update_from_config` sets `vocab_size` from it and `max_seq_len` from the
training sequence, 8,192), applies torchtitan's own `apply_ac` with
`mode="selective", selective_ac_option="op"` (its save list and every-other-`mm`
policy), and returns it wrapped with torchtitan's loss
(`torchtitan.components.loss.cross_entropy_loss`: the logits cast to float32, then
cross-entropy), as its train step computes `loss_fn(model(input_ids), labels)` and
drops the logits before backward.

FSDP2 is memlayout's to apply (`--fsdp-modules 'model.layers.*'`, `--reshard-after-forward
torchtitan`, `--param-dtype bf16 --reduce-dtype fp32`): the code it prints is torchtitan's
`apply_fsdp`, block by block and then the root.

torchtitan 0.1.0 is the release nearest the Table 1 commit (9dec370, 2024-12-26); where
they differ for this step is listed in docs/ranks-gpu.md.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

VOCAB = 128_256
"""torchtitan's Llama 3 tokenizer (`tiktoken`, 128,000 tokens and 256 special ones): the model's `vocab_size`."""
SEQ_LEN = 8_192


class WithLoss(nn.Module):
    """torchtitan's model and its loss in one forward: `{"loss": cross_entropy_loss(model(tokens), labels)}`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        from torchtitan.components.loss import cross_entropy_loss

        return {"loss": cross_entropy_loss(self.model(tokens), labels)}


def _build(flavor: str, vocab: int, seq_len: int, checkpointed: bool) -> nn.Module:
    from torchtitan.config_manager import ActivationCheckpoint
    from torchtitan.models.llama3 import Transformer, llama3_configs
    from torchtitan.models.llama3.infra.parallelize import apply_ac

    args = copy.deepcopy(llama3_configs[flavor])
    args.vocab_size, args.max_seq_len = vocab, seq_len
    model = Transformer(args)
    if checkpointed:
        apply_ac(model, ActivationCheckpoint(mode="selective", selective_ac_option="op"))
    return WithLoss(model)


def llama3_8b() -> Any:
    """Llama 3.1 8B as torchtitan's Table 1 trains it: its selective op-level checkpointing applied."""
    return _build("8B", VOCAB, SEQ_LEN, checkpointed=True)


def llama3_8b_plain() -> Any:
    """The same model without torchtitan's checkpointing (memlayout's `--selective-ac torchtitan` applies its own)."""
    return _build("8B", VOCAB, SEQ_LEN, checkpointed=False)


def debug_model() -> Any:
    """torchtitan's "debugmodel" flavor (6 layers, width 256), its selective op-level checkpointing applied."""
    torch.manual_seed(0)
    return _build("debugmodel", 1000, 256, checkpointed=True)


def debug_model_plain() -> Any:
    """The "debugmodel" flavor without torchtitan's checkpointing."""
    torch.manual_seed(0)
    return _build("debugmodel", 1000, 256, checkpointed=False)
