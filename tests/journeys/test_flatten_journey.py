"""flatten -> diff -> inspect -> load, as a user runs it (issue 26).

Each test is the whole journey on files the user made with torch or transformers,
through the real command (`python -m memlayout`): flatten writes OUT, `diff IN OUT
--fail-on warning` exits 0, `inspect OUT` shows no waste and nothing that sends
the user back to flatten, and the library that wrote IN loads OUT with every value
and every tie bitwise as IN has them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from memlayout.flatten.apply import as_bits

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")

MAP_DATA = re.compile(r'<script type="application/json" id="memlayout-data">(.*?)</script>', re.S)


def memlayout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memlayout", *args], capture_output=True, text=True, timeout=300)


def _training_checkpoint(path: Path) -> torch.nn.Module:
    """A small model's training checkpoint: 16 tensors, a tie, and an int64 buffer alone in its group."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 10)
    )
    model[3].weight = model[0].weight  # tied output projection
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.tensor([1, 2, 3])).sum().backward()
    optimizer.step()
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 1}
    assert len(checkpoint["model"]) + len(checkpoint["optimizer"]["state"]) == 16
    torch.save(checkpoint, path)
    return model


def _flatten_diff_inspect(source: Path, out: Path) -> dict[str, Any]:
    """The commands a user runs after the fix memlayout recommends; returns inspect's JSON of OUT."""
    flattened = memlayout("flatten", str(source), "-o", str(out))
    assert flattened.returncode == 0, flattened.stderr
    diffed = memlayout("diff", str(source), str(out), "--fail-on", "warning")
    assert diffed.returncode == 0, diffed.stdout + diffed.stderr
    assert "wasted-bytes" not in diffed.stdout
    table = memlayout("inspect", str(out), "--fail-on", "warning")
    assert table.returncode == 0, table.stdout + table.stderr
    assert re.search(r"wasted bytes +0 B", table.stdout), table.stdout
    inspected = memlayout("inspect", str(out), "--format", "json", "--fail-on", "never")
    report: dict[str, Any] = json.loads(inspected.stdout)
    assert report["summary"]["wasted_bytes"] == 0
    assert [s["id"] for s in report["storages"] if s["unused_bytes"]] == []
    assert [f["code"] for f in report["findings"] if "memlayout flatten" in f["hint"]] == []
    sarif = json.loads(memlayout("inspect", str(out), "--format", "sarif", "--fail-on", "never").stdout)
    assert [r["ruleId"] for run in sarif["runs"] for r in run["results"] if r["level"] != "note"] == []
    # The HTML map draws each gap as padding or as waste from the same facts.
    page = out.parent / "map.html"
    assert memlayout("inspect", str(out), "--format", "html", "-o", str(page), "--fail-on", "never").returncode == 0
    data = json.loads(MAP_DATA.search(page.read_text()).group(1))  # type: ignore[union-attr]
    rows = data["sides"][0]["storages"]
    assert [(row[0], gap) for row in rows for gap in row[6] if not gap[2]] == []
    assert sum(row[4] for row in rows) == report["summary"]["padding_bytes"]
    return report


def _leaves(tree: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in _leaves(value, f"{prefix}{key}.").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, value in enumerate(tree) for k, v in _leaves(value, f"{prefix}{i}.").items()}
    return {}


def _shared(tensors: dict[str, torch.Tensor]) -> set[frozenset[str]]:
    """Names that view the same bytes (storage and offset), as ties."""
    by_place: dict[tuple[int, int], set[str]] = {}
    for name, tensor in tensors.items():
        if tensor.numel():
            by_place.setdefault((tensor.untyped_storage().data_ptr(), tensor.data_ptr()), set()).add(name)
    return {frozenset(names) for names in by_place.values() if len(names) > 1}


def test_a_flattened_training_checkpoint_diffs_clean_inspects_clean_and_loads_bitwise(tmp_path: Path) -> None:
    source, out = tmp_path / "ckpt.pt", tmp_path / "flat.pt"
    model = _training_checkpoint(source)
    report = _flatten_diff_inspect(source, out)
    assert report["summary"]["padding_bytes"] > 0  # flatten did align, and called it padding
    before = _leaves(torch.load(source, weights_only=True))
    after = _leaves(torch.load(out, weights_only=True))
    assert before.keys() == after.keys()
    for name, tensor in before.items():
        assert (after[name].dtype, after[name].shape) == (tensor.dtype, tensor.shape), name
        assert torch.equal(as_bits(after[name]), as_bits(tensor)), name
    assert _shared(after) == _shared(before) != set()
    loaded = torch.load(out, weights_only=True)
    model.load_state_dict(loaded["model"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer.load_state_dict(loaded["optimizer"])


@pytest.fixture(scope="module")
def tiny_gpt2() -> Any:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=1, n_embd=8, n_head=2, vocab_size=50, n_positions=16, bos_token_id=0, eos_token_id=0,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return transformers, transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_a_flattened_hugging_face_directory_loads_in_transformers_with_values_and_tie(
    weights: str, tiny_gpt2: Any, tmp_path: Path
) -> None:
    transformers, model = tiny_gpt2
    source, out = tmp_path / "model", tmp_path / "flat"
    model.save_pretrained(source)
    if weights == "pytorch_model.bin":
        # What older releases (and safe_serialization=False) wrote: a torch.save state dict.
        (source / "model.safetensors").unlink()
        torch.save(model.state_dict(), source / weights)
    assert (source / weights).exists()
    _flatten_diff_inspect(source, out)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert reloaded.lm_head.weight.data_ptr() == reloaded.transformer.wte.weight.data_ptr()
    original = model.state_dict()
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(as_bits(tensor), as_bits(original[name])), name
