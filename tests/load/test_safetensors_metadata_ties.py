"""A safetensors file's metadata that restores dropped tie names becomes declared ties."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_model, save_file, save_model

import memlayout
from memlayout.load import load_path
from tests import models


def test_save_model_records_the_dropped_name_and_load_model_restores_it(tmp_path: Path) -> None:
    path = tmp_path / "tied.safetensors"
    save_model(models.TiedEmbeddingLM(), str(path))
    source = load_path(str(path))
    try:
        stored = {t.name for t in source.tensors}
        ((dropped, kept, declared_by),) = [(t.target, t.source, t.declared_by) for t in source.declared_ties]
    finally:
        assert source.close is not None
        source.close()
    assert dropped not in stored and kept in stored and "save_model" in declared_by
    # The library itself brings the dropped name back as the same tensor.
    fresh = models.TiedEmbeddingLM()
    load_model(fresh, str(path))
    assert fresh.head.weight is fresh.embed.weight
    # ML103 has nothing to compare for a name the file does not store.
    assert "ML103" not in {f.code for f in memlayout.inspect(str(path)).findings}


def test_memlayout_aliases_of_whole_tensors_are_ties_and_strided_views_are_not(tmp_path: Path) -> None:
    path = tmp_path / "flat.safetensors"
    aliases = {
        "head.weight": {"of": "embed.weight", "offset": 0, "shape": [4, 2], "stride": [2, 1], "dtype": "float32"},
        "embed_t": {"of": "embed.weight", "offset": 0, "shape": [2, 4], "stride": [1, 2], "dtype": "float32"},
    }
    save_file({"embed.weight": torch.randn(4, 2)}, str(path), metadata={"memlayout.aliases": json.dumps(aliases)})
    source = load_path(str(path))
    try:
        assert [(t.target, t.source) for t in source.declared_ties] == [("head.weight", "embed.weight")]
    finally:
        assert source.close is not None
        source.close()


def test_other_metadata_is_not_a_tie(tmp_path: Path) -> None:
    path = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2), "v": torch.zeros(2)}, str(path),
              metadata={"format": "pt", "w": "v", "memlayout.aliases": "not json"})
    source = load_path(str(path))
    try:
        assert source.declared_ties == []  # "w" is stored itself, so it restores nothing
    finally:
        assert source.close is not None
        source.close()
