"""Hugging Face model directories: shards, indexes and tie intent from config.json."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from memlayout.errors import CorruptCheckpointError
from memlayout.load import load_path
from memlayout.load.hf_ties import declared_ties
from memlayout.pipeline.inspection import run_inspection
from tests.load.conftest import assert_one_line_error, run_cli


@pytest.fixture(scope="module")
def sharded_gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 written by transformers' save_pretrained in several shards."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=32, n_positions=16, bos_token_id=0,
                                     eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    directory = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(directory, max_shard_size="2KB")
    return directory


def write_config(directory: Path, **config: object) -> None:
    (directory / "config.json").write_text(json.dumps(config))


def test_sharded_safetensors_dir_lists_every_tensor_once(sharded_gpt2: Path) -> None:
    index = json.loads((sharded_gpt2 / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1, "the fixture should be sharded"
    source = load_path(str(sharded_gpt2))
    assert sorted(t.name for t in source.tensors) == sorted(index["weight_map"])
    # Names are state-dict keys, never shard-qualified.
    assert all(".safetensors" not in t.name for t in source.tensors)


def test_sharded_reader_reads_each_shard(sharded_gpt2: Path) -> None:
    transformers = pytest.importorskip("transformers")
    model = transformers.GPT2LMHeadModel.from_pretrained(sharded_gpt2)
    expected = model.state_dict()["transformer.ln_f.weight"].numpy().tobytes()
    source = load_path(str(sharded_gpt2))
    try:
        assert source.reader is not None
        record = next(t for t in source.tensors if t.name == "transformer.ln_f.weight")
        start = record.offset * 4
        assert bytes(source.reader.read(record.storage_key, start, len(expected))) == expected
    finally:
        source.close()


def test_save_pretrained_output_has_no_broken_tie(sharded_gpt2: Path) -> None:
    # save_pretrained drops the tied lm_head, so there is nothing to compare.
    codes = {f.code for f in run_inspection(str(sharded_gpt2)).findings}
    assert "ML103" not in codes


def test_untied_head_with_tie_declared_is_ml103(tmp_path: Path) -> None:
    torch.manual_seed(0)
    save_file(
        {"transformer.wte.weight": torch.randn(32, 8), "lm_head.weight": torch.randn(32, 8)},
        str(tmp_path / "model.safetensors"),
    )
    write_config(tmp_path, model_type="gpt2", tie_word_embeddings=True)
    findings = [f for f in run_inspection(str(tmp_path)).findings if f.code == "ML103"]
    assert len(findings) == 1
    assert set(findings[0].tensors) == {"lm_head.weight", "transformer.wte.weight"}
    assert "config.json tie_word_embeddings" in findings[0].message
    assert "contents differ" in findings[0].message


def test_tie_disabled_in_config_is_quiet(tmp_path: Path) -> None:
    save_file(
        {"model.embed_tokens.weight": torch.randn(32, 8), "lm_head.weight": torch.randn(32, 8)},
        str(tmp_path / "model.safetensors"),
    )
    write_config(tmp_path, model_type="llama", tie_word_embeddings=False)
    assert "ML103" not in {f.code for f in run_inspection(str(tmp_path)).findings}


def test_missing_tie_key_counts_as_tied() -> None:
    ties = declared_ties({"model_type": "bert"}, ["bert.embeddings.word_embeddings.weight",
                                                  "cls.predictions.decoder.weight"])
    assert [(t.target, t.source) for t in ties] == [("cls.predictions.decoder.weight",
                                                     "bert.embeddings.word_embeddings.weight")]


def test_shared_embedding_is_preferred_for_encoder_decoder_models() -> None:
    names = ["shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"]
    assert [(t.target, t.source) for t in declared_ties({}, names)] == [("lm_head.weight", "shared.weight")]


def test_tie_encoder_decoder_pairs_matching_names() -> None:
    names = ["encoder.layer.0.w", "decoder.layer.0.w", "encoder.only", "text_encoder.x", "text_decoder.x"]
    ties = declared_ties({"tie_encoder_decoder": True, "tie_word_embeddings": False}, names)
    assert [(t.target, t.source, t.declared_by) for t in ties] == [
        ("decoder.layer.0.w", "encoder.layer.0.w", "config.json tie_encoder_decoder")
    ]


def _save_bin_shards(directory: Path, shards: dict[str, dict[str, torch.Tensor]]) -> None:
    weight_map = {name: shard for shard, tensors in shards.items() for name in tensors}
    for shard, tensors in shards.items():
        torch.save(tensors, directory / shard)
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_sharded_pytorch_bin_dir_keeps_shards_apart(tmp_path: Path) -> None:
    torch.manual_seed(0)
    _save_bin_shards(
        tmp_path,
        {
            "pytorch_model-00001-of-00002.bin": {"model.embed_tokens.weight": torch.randn(16, 4)},
            "pytorch_model-00002-of-00002.bin": {"lm_head.weight": torch.randn(16, 4)},
        },
    )
    write_config(tmp_path, tie_word_embeddings=True)
    source = load_path(str(tmp_path))
    assert source.format == "hf-pytorch"
    # Both shards name their only storage "0"; they must stay two storages.
    assert len(source.storages) == 2
    assert {f.code for f in run_inspection(str(tmp_path)).findings} >= {"ML103"}


def test_single_pytorch_bin_with_a_kept_tie_is_quiet(tmp_path: Path) -> None:
    embed = torch.randn(16, 4)
    torch.save({"transformer.wte.weight": embed, "lm_head.weight": embed}, tmp_path / "pytorch_model.bin")
    write_config(tmp_path, tie_word_embeddings=True)
    source = load_path(str(tmp_path))
    assert len(source.storages) == 1
    assert "ML103" not in {f.code for f in run_inspection(str(tmp_path)).findings}


def test_index_naming_a_missing_shard_is_a_one_line_cli_error(sharded_gpt2: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in sharded_gpt2.iterdir():
        (broken / item.name).write_bytes(item.read_bytes())
    missing = sorted(broken.glob("model-*.safetensors"))[0]
    missing.unlink()
    with pytest.raises(CorruptCheckpointError):
        load_path(str(broken))
    assert_one_line_error(run_cli("inspect", str(broken)), missing.name, "missing")


def test_index_pointing_outside_the_directory_is_refused(tmp_path: Path) -> None:
    save_file({"w": torch.zeros(2)}, str(tmp_path / "outside.safetensors"))
    inner = tmp_path / "model"
    inner.mkdir()
    (inner / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../outside.safetensors"}}))
    assert_one_line_error(run_cli("inspect", str(inner)), "outside the model directory")


def test_damaged_config_is_a_one_line_cli_error(tmp_path: Path) -> None:
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{not json")
    assert_one_line_error(run_cli("inspect", str(tmp_path)), "config.json")


def test_directory_without_weights_is_unrecognized(tmp_path: Path) -> None:
    write_config(tmp_path, model_type="gpt2")
    assert_one_line_error(run_cli("inspect", str(tmp_path)), "directory")


def test_damaged_bin_shard_is_named_in_the_error(tmp_path: Path) -> None:
    # In a sharded directory the user must learn which shard is damaged.
    torch.manual_seed(0)
    second = "pytorch_model-00002-of-00002.bin"
    _save_bin_shards(
        tmp_path,
        {
            "pytorch_model-00001-of-00002.bin": {"model.embed_tokens.weight": torch.randn(16, 4)},
            second: {"lm_head.weight": torch.randn(16, 4)},
        },
    )
    write_config(tmp_path)
    shard = tmp_path / second
    with zipfile.ZipFile(shard) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("/data.pkl"))
    data = bytearray(shard.read_bytes())
    name_length, extra_length = struct.unpack_from("<HH", data, info.header_offset + 26)
    data[info.header_offset + 30 + name_length + extra_length + info.file_size // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = run_cli("inspect", str(tmp_path))
    # The folder's model cannot be read, naming the shard; the walk then reads each file on its
    # own, and the damaged shard is an entry of its own: nothing else of the folder is lost.
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    folder, alone = result.stderr.strip().splitlines()
    assert str(shard) in folder and "checksum" in folder
    assert alone.startswith(f"memlayout: error: {shard}") and "checksum" in alone
    assert "pytorch_model-00001-of-00002.bin" in result.stdout and "config.json" not in result.stderr
