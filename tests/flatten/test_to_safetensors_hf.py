"""`flatten --to safetensors` on Hugging Face directories of .bin shards: transformers loads OUT and computes the
same."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from memlayout.cli.app import main
from tests.flatten.conftest import bits

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")


def tiny_gpt2() -> torch.nn.Module:
    """GPT-2 with its head tied to the token embedding (tie_word_embeddings)."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config).eval()


def tiny_llama() -> torch.nn.Module:
    """A Llama whose head is not tied."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=32, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
    )
    return transformers.LlamaForCausalLM(config).eval()


def tiny_bert() -> torch.nn.Module:
    """BERT for masked LM: the decoder tied to the word embedding, and its bias to the head's."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, vocab_size=128,
        max_position_embeddings=32,
    )
    return transformers.BertForMaskedLM(config).eval()


def bin_name(safetensors_name: str) -> str:
    return "pytorch_model" + safetensors_name[len("model") : -len(".safetensors")] + ".bin"


def save_bin(model: torch.nn.Module, directory: Path, shard: str | None) -> Path:
    """A directory of torch.save weights as transformers 4 wrote it (transformers 5 writes only safetensors).

    Unsharded: `torch.save(model.state_dict())`, a tie kept as one storage under both
    names. Sharded: transformers' own shards (`save_pretrained(max_shard_size=...)`),
    each re-saved with torch.save, and the index renamed to pytorch_model.bin.index.json.
    """
    staging = directory.with_name(directory.name + "-as-transformers-saves-it")
    model.save_pretrained(staging, **({"max_shard_size": shard} if shard else {}))
    directory.mkdir()
    for other in staging.iterdir():
        if other.suffix == ".json" and "index" not in other.name:
            shutil.copyfile(other, directory / other.name)
    if shard is None:
        torch.save(model.state_dict(), directory / "pytorch_model.bin")
        return staging
    index = json.loads((staging / "model.safetensors.index.json").read_text())
    for file in sorted(set(index["weight_map"].values())):
        torch.save(load_file(str(staging / file)), directory / bin_name(file))
    index["weight_map"] = {name: bin_name(file) for name, file in index["weight_map"].items()}
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    return staging


def tensors_in(directory: Path) -> dict[str, torch.Tensor]:
    found: dict[str, torch.Tensor] = {}
    for file in sorted(directory.iterdir()):
        if file.suffix == ".bin":
            found.update(torch.load(file, weights_only=True))
        elif file.suffix == ".safetensors":
            found.update(load_file(str(file)))
    return found


def logits(directory: Path) -> torch.Tensor:
    masked = json.loads((directory / "config.json").read_text())["model_type"] == "bert"
    auto = transformers.AutoModelForMaskedLM if masked else transformers.AutoModelForCausalLM
    model = auto.from_pretrained(directory).eval()
    with torch.no_grad():
        return model(torch.arange(16).reshape(2, 8)).logits


@pytest.mark.parametrize(
    ("build", "shard"),
    [(tiny_gpt2, None), (tiny_gpt2, "60KB"), (tiny_llama, "60KB"), (tiny_bert, None)],
    ids=["gpt2", "gpt2-sharded", "llama-sharded", "bert"],
)
def test_a_bin_directory_becomes_the_directory_transformers_writes(build, shard: str | None, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = build()
    source, out = tmp_path / "model", tmp_path / "converted"
    theirs = save_bin(model, source, shard)
    assert main(["flatten", str(source), "-o", str(out), "--to", "safetensors"]) == 0
    # The same files as save_pretrained writes: config copied, .bin files and their index gone.
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in theirs.iterdir())
    assert (out / "config.json").read_text() == (source / "config.json").read_text()
    if shard:
        ours_index = json.loads((out / "model.safetensors.index.json").read_text())
        theirs_index = json.loads((theirs / "model.safetensors.index.json").read_text())
        assert ours_index["weight_map"] == theirs_index["weight_map"]
        assert ours_index["metadata"]["total_size"] == theirs_index["metadata"]["total_size"]
    for file in theirs.glob("*.safetensors"):
        with safe_open(str(file), "pt") as handle, safe_open(str(out / file.name), "pt") as converted:
            assert handle.metadata() == {"format": "pt"}
            # Beside "format", only save_model's record of a tie: a dropped name -> a stored one.
            ties = dict(converted.metadata())
            assert ties.pop("format") == "pt"
            assert set(ties.values()) <= set(converted.keys()) and not set(ties) & set(converted.keys())
    # Every tensor as torch.load reads it from IN; a tie stored once, as transformers stores it.
    before, after = tensors_in(source), tensors_in(out)
    assert set(after) == set(tensors_in(theirs))
    for name, tensor in after.items():
        assert torch.equal(bits(tensor), bits(before[name])), name
    # transformers loads OUT and computes exactly what the model and IN compute.
    with torch.no_grad():
        expected = model(torch.arange(16).reshape(2, 8)).logits
    assert torch.equal(logits(out), expected)
    assert torch.equal(logits(source), expected)


def test_a_lost_tie_is_reported_and_kept_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tiny_gpt2()
    source, out = tmp_path / "model", tmp_path / "converted"
    source.mkdir()
    model.config.save_pretrained(source)
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}  # the tie is lost: two copies
    torch.save(state, source / "pytorch_model.bin")
    assert main(["flatten", str(source), "-o", str(out), "--to", "safetensors"]) == 0
    summary = capsys.readouterr().out
    assert "lost tie: lm_head.weight is declared tied to transformer.wte.weight" in summary
    written = load_file(str(out / "model.safetensors"))
    assert {"lm_head.weight", "transformer.wte.weight"} <= set(written)
    assert written["lm_head.weight"].data_ptr() != written["transformer.wte.weight"].data_ptr()


def test_check_on_a_directory_writes_nothing_and_says_what_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "model"
    save_bin(tiny_gpt2(), source, None)
    listing = sorted(p.name for p in source.iterdir())
    assert main(["flatten", str(source), "--check", "--to", "safetensors"]) == 1
    assert "safetensors" in capsys.readouterr().out
    assert sorted(p.name for p in source.iterdir()) == listing
