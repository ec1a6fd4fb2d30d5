"""Checkpoints as their libraries write them, and checkpoints with a real problem, for the CI gate's tests.

`AS_WRITTEN` are what a project commits: each file is written by its library's own
saver, from a small model built from a config (no download), with a fixed seed.
`flatten --check` and `inspect` must pass all of them. `PROBLEMS` each hold a real
problem a user reported (a saved slice of a large storage, a lost tie, a
non-contiguous weight), which the hooks must fail, naming the file.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from tests import models


def gpt2_save_pretrained(folder: Path) -> Path:
    """transformers' `save_pretrained` of a GPT-2 (its head tied to the embedding, stored once)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=128,
                                     bos_token_id=0, eos_token_id=0)
    path = folder / "gpt2"
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    return path


def bert_save_pretrained(folder: Path) -> Path:
    """transformers' `save_pretrained` of a BERT encoder."""
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32,
                                     intermediate_size=64, vocab_size=128, max_position_embeddings=64)
    path = folder / "bert"
    transformers.BertModel(config).save_pretrained(path)
    return path


def diffusers_unet(folder: Path) -> Path:
    """diffusers' `save_pretrained` of a UNet2DModel (config.json and diffusion_pytorch_model.safetensors)."""
    import diffusers

    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(
        sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"), norm_num_groups=4,
    )
    path = folder / "unet"
    unet.save_pretrained(path)
    return path


def safetensors_save_file(folder: Path) -> Path:
    """`safetensors.torch.save_file` of mixed dtypes, as a project saves an encoder's weights."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    path = folder / "encoder.safetensors"
    save_file({"proj.weight": torch.randn(16, 8), "proj.bias": torch.randn(16), "scale": torch.randn(3).half(),
               "ids": torch.arange(5)}, path)
    return path


def torch_save_state_dict(folder: Path) -> Path:
    """`torch.save(model.state_dict())` of a small MLP: one storage per tensor, as torch writes it."""
    torch.manual_seed(0)
    path = folder / "mlp.pt"
    torch.save(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).state_dict(), path)
    return path


def lightning_checkpoint(folder: Path) -> Path:
    """`Trainer.save_checkpoint` after an epoch: the state dict, Adam's state, loops, callbacks, hyper-parameters."""
    import pytorch_lightning as pl

    class Regressor(pl.LightningModule):
        """A two-layer regressor that saves its hyper-parameters, as Lightning's templates do."""

        def __init__(self, hidden: int = 16) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 2))

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
            inputs, targets = batch
            return nn.functional.mse_loss(self.net(inputs), targets)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 8), torch.randn(16, 2)),
                                       batch_size=8)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=folder, accelerator="cpu", devices=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Regressor(), data)
    path = folder / "last.ckpt"
    trainer.save_checkpoint(path)
    return path


AS_WRITTEN: dict[str, Callable[[Path], Path]] = {
    "transformers GPT-2": gpt2_save_pretrained,
    "transformers BERT": bert_save_pretrained,
    "diffusers UNet": diffusers_unet,
    "safetensors save_file": safetensors_save_file,
    "torch.save state dict": torch_save_state_dict,
    "Lightning checkpoint": lightning_checkpoint,
}
"""What each builder writes, by the library that writes it."""


def saved_slice(folder: Path) -> Path:
    """A 10-element slice of a 10,000-element tensor: torch.save writes all 40 KB (ML301)."""
    path = folder / "bloated.pt"
    torch.save(models.sliced_bloat_state(), path)
    return path


def lost_tie(folder: Path) -> Path:
    """A language model whose head is a copy of the embedding, not the embedding (ML102)."""
    torch.manual_seed(0)
    path = folder / "lost_tie.pt"
    torch.save(models.LostTieLM().state_dict(), path)
    return path


def non_contiguous(folder: Path) -> Path:
    """A Linear whose weight was saved transposed (ML201)."""
    torch.manual_seed(0)
    path = folder / "transposed.pt"
    torch.save(models.TransposedWeightLinear().state_dict(), path)
    return path


def bloated_shard(folder: Path) -> Path:
    """A GPT-2 in two .bin shards, as transformers 4 saved them, whose second shard holds one weight as a
    slice of a larger storage (ML301 in that shard, not the other)."""
    import json

    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=128,
                                     bos_token_id=0, eos_token_id=0)
    state = transformers.GPT2LMHeadModel(config).state_dict()
    names = [name for name in state if name != "lm_head.weight"]  # tied: saved once, as transformers saves it
    path = folder / "sharded"
    path.mkdir()
    config.save_pretrained(path)
    weight_map = {}
    for number, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :]), 1):
        shard = f"pytorch_model-{number:05d}-of-00002.bin"
        tensors = {name: state[name].clone() for name in part}
        if number == 2:
            weight = tensors["transformer.ln_f.weight"]
            tensors["transformer.ln_f.weight"] = torch.cat([weight, torch.zeros(10_000)])[: weight.numel()]
        torch.save(tensors, path / shard)
        weight_map.update(dict.fromkeys(part, shard))
    (path / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path / "pytorch_model-00002-of-00002.bin"


PROBLEMS: dict[str, Callable[[Path], Path]] = {
    "saved slice of a large storage": saved_slice,
    "lost tie": lost_tie,
    "non-contiguous weight": non_contiguous,
    "bloated shard of a sharded model": bloated_shard,
}
"""Checkpoints with a real problem, which the hooks must fail naming the file."""


def write_all(folder: Path, builders: dict[str, Callable[[Path], Path]]) -> dict[str, Path]:
    """Every builder's file or folder written into `folder`, by name."""
    folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: build(folder) for name, build in builders.items()}
