"""A config that ties the head to the embedding, and a file that stores both apart (issue 26, defect 3).

ML103 and diff's tie messages must not contradict themselves ("separate memory
(storages s0 and s0)": a safetensors file is one storage), and what ML103 says
`from_pretrained` does is checked against transformers itself, not against
memlayout's reading.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from memlayout.diff import run_diff
from memlayout.load.hf_ties import FROM_PRETRAINED_WITH_DIFFERENT_VALUES
from memlayout.pipeline.inspection import run_inspection

# Where other transformers releases are installed (`pip install --no-deps --target DIR
# transformers==4.57.3 huggingface_hub==0.36.0 tokenizers==0.22.1`), separated by
# os.pathsep: the claim about each release is then checked against that release too.
OTHER_TRANSFORMERS = "MEMLAYOUT_OTHER_TRANSFORMERS"

# Loads the directory with from_pretrained and prints what happened to the two weights.
_LOAD = """
import json, sys, torch, transformers
from safetensors.torch import load_file
directory = sys.argv[1]
stored = load_file(directory + "/model.safetensors")
model = transformers.AutoModelForCausalLM.from_pretrained(directory)
head, embed = model.lm_head.weight, model.model.embed_tokens.weight
print(json.dumps({
    "version": transformers.__version__,
    "tied": head.data_ptr() == embed.data_ptr(),
    "head_is_files_head": torch.equal(head, stored["lm_head.weight"]),
    "head_is_files_embedding": torch.equal(head, stored["model.embed_tokens.weight"]),
    "embedding_is_files_embedding": torch.equal(embed, stored["model.embed_tokens.weight"]),
    "embedding_is_files_head": torch.equal(embed, stored["lm_head.weight"]),
}))
"""


@pytest.fixture(scope="module")
def untied_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama whose config.json ties the head, saved with a head of its own values."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=50, tie_word_embeddings=True,
    )
    model = transformers.LlamaForCausalLM(config)
    directory = tmp_path_factory.mktemp("untied_llama")
    model.config.save_pretrained(directory)
    weights = {name: tensor.detach().clone().contiguous() for name, tensor in model.state_dict().items()}
    weights["lm_head.weight"] = torch.randn_like(weights["model.embed_tokens.weight"])
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def _broken_tie(directory: Path) -> str:
    findings = [f for f in run_inspection(str(directory)).findings if f.code == "ML103"]
    assert len(findings) == 1, findings
    return findings[0].message


def test_one_file_untied_head_names_its_bytes_not_one_storage_twice(untied_llama: Path) -> None:
    message = _broken_tie(untied_llama)
    assert "storages s0 and s0" not in message
    stored = load_file(str(untied_llama / "model.safetensors"))
    nbytes = stored["lm_head.weight"].numel() * 4
    # safetensors orders entries by name within a dtype: the head's bytes come first.
    assert f"bytes 0..{nbytes:,} and {nbytes:,}..{2 * nbytes:,} of storage s0" in message


def test_diff_tie_lost_in_one_file_names_its_bytes(untied_llama: Path, tmp_path: Path) -> None:
    tied = tmp_path / "tied"
    tied.mkdir()
    (tied / "config.json").write_text((untied_llama / "config.json").read_text())
    weights = load_file(str(untied_llama / "model.safetensors"))
    del weights["lm_head.weight"]  # what save_pretrained writes for a tied model
    save_file(weights, str(tied / "model.safetensors"), metadata={"format": "pt"})
    messages = [c.message for c in run_diff(str(tied), str(untied_llama)).changes if c.kind.value == "tie-lost"]
    assert messages, "the tie A restores and B breaks is a tie-lost change"
    assert all("storages s0 and s0" not in m and "of storage s0" in m for m in messages), messages


def test_sharded_untied_head_names_two_storages(tmp_path: Path) -> None:
    # Storage ids are unique across the shards of one report.
    torch.manual_seed(0)
    save_file({"model.embed_tokens.weight": torch.randn(16, 4)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"lm_head.weight": torch.randn(16, 4)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    weight_map = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                  "lm_head.weight": "model-00002-of-00002.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    message = _broken_tie(tmp_path)
    assert "(storages s0 and s1)" in message or "(storages s1 and s0)" in message, message


def _from_pretrained_here(directory: Path) -> dict[str, object]:
    """The installed transformers, in this process: a subprocess would spend most of its time importing it."""
    import transformers

    stored = load_file(str(directory / "model.safetensors"))
    # Another test module may have quietened transformers' logger; its warning is part of the claim.
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_warning()
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    library_logger = logging.getLogger("transformers")
    library_logger.addHandler(handler)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(directory)
    finally:
        library_logger.removeHandler(handler)
        transformers.logging.set_verbosity(verbosity)
    logged = "\n".join(record.getMessage() for record in records)
    head, embed = model.lm_head.weight, model.model.embed_tokens.weight
    return {
        "version": transformers.__version__,
        "tied": head.data_ptr() == embed.data_ptr(),
        "head_is_files_head": torch.equal(head, stored["lm_head.weight"]),
        "head_is_files_embedding": torch.equal(head, stored["model.embed_tokens.weight"]),
        "embedding_is_files_embedding": torch.equal(embed, stored["model.embed_tokens.weight"]),
        "embedding_is_files_head": torch.equal(embed, stored["lm_head.weight"]),
        "warned": "NOT tie" in logged,
    }


def _from_pretrained(directory: Path, transformers_dir: str) -> dict[str, object]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (transformers_dir, env.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-c", _LOAD, str(directory)], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    outcome: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    outcome["warned"] = "NOT tie" in done.stderr
    return outcome


@pytest.mark.parametrize(
    "transformers_dir", [None, *filter(None, os.environ.get(OTHER_TRANSFORMERS, "").split(os.pathsep))]
)
def test_from_pretrained_does_what_ml103_says(untied_llama: Path, transformers_dir: str | None) -> None:
    pytest.importorskip("transformers")
    message = _broken_tie(untied_llama)
    assert FROM_PRETRAINED_WITH_DIFFERENT_VALUES in message
    if transformers_dir is None:
        outcome = _from_pretrained_here(untied_llama)
    else:
        outcome = _from_pretrained(untied_llama, transformers_dir)
    major = int(str(outcome["version"]).split(".")[0])
    if major >= 5:
        # "transformers 5's from_pretrained warns and leaves them untied (two copies that train apart)"
        assert outcome["warned"], outcome
        assert not outcome["tied"], outcome
        assert outcome["head_is_files_head"] and outcome["embedding_is_files_embedding"], outcome
    else:
        # "transformers 4 ties them silently, keeping one file tensor's values and dropping the other's"
        assert not outcome["warned"], outcome
        assert outcome["tied"], outcome
        assert outcome["head_is_files_head"] != outcome["head_is_files_embedding"], outcome
        assert outcome["embedding_is_files_head"] != outcome["embedding_is_files_embedding"], outcome
