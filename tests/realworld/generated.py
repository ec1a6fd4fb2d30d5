"""Checkpoints written during the run by other projects' own savers: transformers, DCP, torch.export.

The wheel corpus holds what projects shipped; these hold what current libraries
write today. Each is produced by the library's public API from a small model
with a fixed seed, so the files are the same on every run.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import torch


def _tiny_gpt2() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=128)
    return transformers.GPT2LMHeadModel(config).eval()


def transformers_safetensors(folder: Path) -> Path:
    path = folder / "gpt2-safetensors"
    _tiny_gpt2().save_pretrained(path, safe_serialization=True)
    return path


def transformers_bin(folder: Path) -> Path:
    # transformers 5 writes only safetensors; a `pytorch_model.bin` is what transformers 4's
    # save_pretrained(safe_serialization=False) wrote: torch.save of the state dict, ties
    # kept as one storage. transformers 5 still loads it (use_safetensors=False).
    path = folder / "gpt2-bin"
    model = _tiny_gpt2()
    model.save_pretrained(path)
    (path / "model.safetensors").unlink()
    torch.save(model.state_dict(), path / "pytorch_model.bin")
    return path


class _Tagger(torch.nn.Module):
    """A sequence tagger: embedding, 2-layer bidirectional LSTM, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)
        self.lstm = torch.nn.LSTM(16, 16, num_layers=2, bidirectional=True)
        self.head = torch.nn.Linear(32, 8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(tokens))
        return self.head(hidden)


def dcp_checkpoint(folder: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    path = folder / "tagger-dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(_Tagger().state_dict(), checkpoint_id=str(path))
    return path


def torch_export_program(folder: Path) -> Path:
    torch.manual_seed(0)
    path = folder / "tagger.pt2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(_Tagger().eval(), (torch.zeros(5, 2, dtype=torch.long),))
        torch.export.save(program, path)
    return path


GENERATED: dict[str, Callable[[Path], Path]] = {
    "transformers-gpt2-safetensors": transformers_safetensors,
    "transformers-gpt2-bin": transformers_bin,
    "dcp-lstm-tagger": dcp_checkpoint,
    "torch-export-lstm-tagger": torch_export_program,
}
"""Name -> builder writing the file (or folder) into a folder and returning its path."""
