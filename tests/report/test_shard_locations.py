"""A finding in a sharded model folder is located in its shard, in every format a reviewer clicks through.

SARIF's artifact, the GitHub annotation's `file=` and the markdown comment's
checkpoint column name the weight file that holds the finding (the one to fix),
not the folder; a finding that counts the folder's files together (ML204) stays
on the folder.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest

from memlayout.pipeline.batch import BatchReport, inspect_paths
from memlayout.report.github import GithubReporter
from memlayout.report.markdown import MarkdownReporter
from memlayout.report.sarif import SarifReporter
from memlayout.rules import RuleConfig
from tests.checkpoints_as_written import bloated_shard, gpt2_save_pretrained

SHARD = "sharded/pytorch_model-00002-of-00002.bin"


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("shards")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bloated_shard(folder)
    return folder


def _batch(folder: Path, monkeypatch: pytest.MonkeyPatch, config: RuleConfig | None = None) -> BatchReport:
    monkeypatch.chdir(folder)
    return inspect_paths(["sharded" if (folder / "sharded").exists() else "gpt2"], config=config)


def test_sarif_locates_each_finding_in_its_shard(sharded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = json.loads(SarifReporter().render(_batch(sharded, monkeypatch)))
    located = {r["ruleId"]: r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
               for r in log["runs"][0]["results"]}
    assert located == {"ML301": SHARD, "ML204": "sharded"}
    assert {"location": {"uri": SHARD}} in log["runs"][0]["artifacts"]


def test_github_annotates_the_shard(sharded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = GithubReporter().render(_batch(sharded, monkeypatch))
    assert re.search(rf"^::warning file={re.escape(SHARD)},title=ML301 storage-bloat::", text, re.M), text
    assert re.search(r"^::notice file=sharded,title=ML204 fragmented::", text, re.M), text


def test_markdown_names_the_shard_even_for_one_folder(sharded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = MarkdownReporter().render(_batch(sharded, monkeypatch))
    assert "| rule | checkpoint | finding | fix |" in text
    assert f"| ML301 storage-bloat | `{SHARD}` |" in text


def test_ml203_gives_each_shard_its_own_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (tmp_path / "one").mkdir()
        folder = tmp_path / "gpt2"
        model = transformers.GPT2LMHeadModel.from_pretrained(gpt2_save_pretrained(tmp_path / "one"))
        model.save_pretrained(folder, max_shard_size="40KB")
    shards = sorted(p.name for p in folder.glob("model-*.safetensors"))
    assert len(shards) > 1
    batch = _batch(tmp_path, monkeypatch, RuleConfig(alignment=64))
    text = GithubReporter().render(batch)
    annotated = re.findall(r"^::notice file=gpt2/([^,]+),title=ML203 misaligned::", text, re.M)
    assert annotated and set(annotated) <= set(shards) and len(annotated) == len(set(annotated)), text
