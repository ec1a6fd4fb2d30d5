"""`diff` of checkpoints whose names do not line up (issue 26, defect 4).

Two different models, one model under a wrapper prefix, and one rule reported on
both sides for other tensors.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from memlayout.cli.app import app
from memlayout.diff import run_diff
from memlayout.diff.changes import ChangeKind

transformers = pytest.importorskip("transformers")


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["diff", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def gpt2_and_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tied GPT-2 and an untied Llama, each written by save_pretrained."""
    root = tmp_path_factory.mktemp("two_models")
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50,
                                                                n_positions=32))
    gpt2.save_pretrained(root / "gpt2")
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=50, tie_word_embeddings=False,
    ))
    llama.save_pretrained(root / "llama")
    return root / "gpt2", root / "llama"


def test_a_config_never_ties_names_only_the_other_model_has(gpt2_and_llama: tuple[Path, Path]) -> None:
    gpt2, llama = gpt2_and_llama
    changes = run_diff(str(gpt2), str(llama)).changes
    tie_kinds = {ChangeKind.DECLARED_TIE_BROKEN, ChangeKind.TIE_LOST, ChangeKind.TIE_RESTORED}
    assert [c.message for c in changes if c.kind in tie_kinds] == []
    assert not any("model.embed_tokens.weight" in c.message and "A's config" in c.message for c in changes)


def test_different_models_get_a_hint_that_no_name_matches(gpt2_and_llama: tuple[Path, Path]) -> None:
    gpt2, llama = gpt2_and_llama
    _, _, stderr = invoke(str(gpt2), str(llama))
    assert "memlayout: hint: no tensor name of A matches one of B" in stderr
    assert "--strip-prefix" not in stderr  # no prefix would help, so none is suggested


def test_a_rule_on_both_sides_is_new_or_resolved_never_both(tmp_path: Path) -> None:
    # ML203 is one finding naming every misaligned tensor of a file.
    data = torch.randn(1001)
    torch.save({"x": data[1:]}, tmp_path / "a.pt")
    torch.save({"x": data[1:], "y": torch.randn(1001)[1:]}, tmp_path / "b.pt")
    changes = [c for c in run_diff(str(tmp_path / "a.pt"), str(tmp_path / "b.pt")).changes if "ML203" in c.message]
    assert [c.kind for c in changes] == [ChangeKind.FINDING_NEW]  # y is new; x is misaligned on both sides


def test_a_rule_on_tensors_of_different_models_is_not_resolved(tmp_path: Path) -> None:
    torch.save({"a.weight": torch.randn(1001)[1:]}, tmp_path / "a.pt")
    torch.save({"b.weight": torch.randn(1001)[1:]}, tmp_path / "b.pt")
    kinds = [c.kind for c in run_diff(str(tmp_path / "a.pt"), str(tmp_path / "b.pt")).changes if "ML203" in c.message]
    assert kinds == [ChangeKind.FINDING_NEW]


def test_a_resolved_finding_on_a_tensor_both_sides_keep_is_resolved(tmp_path: Path) -> None:
    data = torch.randn(1001)
    torch.save({"x": data[1:], "y": torch.randn(1001)[1:]}, tmp_path / "a.pt")
    torch.save({"x": data[1:], "y": torch.randn(1000)}, tmp_path / "b.pt")
    kinds = [c.kind for c in run_diff(str(tmp_path / "a.pt"), str(tmp_path / "b.pt")).changes if "ML203" in c.message]
    assert kinds == [ChangeKind.FINDING_RESOLVED]


def _suggested_flags(stderr: str) -> list[str]:
    match = re.search(r"rerun with (.+?) to match (\d+)", stderr)
    assert match is not None, stderr
    return shlex.split(match.group(1))


@pytest.mark.parametrize(
    ("a_prefix", "b_prefix"),
    [("module.", ""), ("", "_orig_mod."), ("_orig_mod.", "module."), ("module.model.", "model.")],
)
def test_the_suggested_strip_prefix_matches_every_name_when_followed(
    tmp_path: Path, a_prefix: str, b_prefix: str
) -> None:
    state = {"embed.weight": torch.randn(8, 4), "layers.0.weight": torch.randn(4, 4), "layers.0.bias": torch.randn(4)}
    torch.save({a_prefix + k: v for k, v in state.items()}, tmp_path / "a.pt")
    torch.save({b_prefix + k: v.clone() for k, v in state.items()}, tmp_path / "b.pt")
    a, b = str(tmp_path / "a.pt"), str(tmp_path / "b.pt")
    _, first, stderr = invoke(a, b)
    assert "0 names matched" in first
    flags = _suggested_flags(stderr)
    assert flags[0] == "--strip-prefix"
    code, followed, stderr_after = invoke(a, b, *flags, "--fail-on", "warning")
    assert code == 0, followed
    assert f"{len(state)} names matched" in followed
    assert "hint" not in stderr_after


def test_names_that_already_match_get_no_hint(tmp_path: Path) -> None:
    torch.save({"w": torch.randn(4)}, tmp_path / "a.pt")
    torch.save({"w": torch.randn(4).half()}, tmp_path / "b.pt")
    _, _, stderr = invoke(str(tmp_path / "a.pt"), str(tmp_path / "b.pt"))
    assert stderr == ""
