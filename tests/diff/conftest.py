"""Checkpoints built with the real libraries for the diff tests: torch.save, safetensors, transformers."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from tests.models import tiny_gpt2

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)


@pytest.fixture(scope="session")
def gpt2_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The checkpoints the golden cases compare, written once per session."""
    from safetensors.torch import save_file, save_model

    root = tmp_path_factory.mktemp("gpt2")
    model = tiny_gpt2()
    state = model.state_dict()
    files = {
        "state": root / "gpt2.pt",
        "clone": root / "gpt2_clone.pt",
        "bf16": root / "gpt2_bf16.pt",
        "saved": root / "saved",
        "resaved": root / "resaved",
        "save_model": root / "gpt2_save_model.safetensors",
        "dropped": root / "gpt2_dropped.safetensors",
    }
    torch.save(state, files["state"])
    torch.save({name: tensor.clone() for name, tensor in state.items()}, files["clone"])
    # A cast the way people cast: the module, so its tie stays one Parameter.
    torch.save(tiny_gpt2().to(torch.bfloat16).state_dict(), files["bf16"])
    model.save_pretrained(files["saved"])
    transformers.GPT2LMHeadModel.from_pretrained(files["saved"]).save_pretrained(files["resaved"])
    save_model(model, str(files["save_model"]))
    # What a hand-written conversion does to get past "Some tensors share memory":
    # drop the second name, and record nowhere that it was a tie.
    save_file({k: v.contiguous() for k, v in state.items() if k != "lm_head.weight"}, str(files["dropped"]))
    return files
