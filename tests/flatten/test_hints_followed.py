"""A hint that says `memlayout flatten` works when followed, on every format; where flatten refuses, no hint says it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from memlayout.cli.app import main
from memlayout.core.flatten_support import FORMAT_SUPPORT, flatten_hint, flatten_route
from memlayout.flatten import writers
from memlayout.load import FORMATS
from memlayout.pipeline.inspection import run_inspection
from tests.flatten.sources import BUILDERS

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

# What flatten changes; a hint for these that names flatten promises they go away.
FIXED_BY_FLATTEN = {"ML201", "ML203", "ML204", "ML301"}
COMMAND = re.compile(r"`(memlayout flatten[^`]*)`")


def test_every_format_a_loader_produces_has_a_flatten_entry() -> None:
    produced = {fmt.name for fmt in FORMATS} | {"live-module", "state-dict", "hf-safetensors", "hf-pytorch"}
    assert produced - {"hf-dir"} <= FORMAT_SUPPORT.keys()


def test_flatten_writes_exactly_the_formats_the_table_calls_supported() -> None:
    supported = {name for name, support in FORMAT_SUPPORT.items() if not support.refusal}
    registered = {name for writer in writers.registry().writers if writer.target is None for name in writer.formats}
    # A Hugging Face directory is flattened file by file, by the writers of its files.
    assert registered == supported - {"hf-safetensors", "hf-pytorch"}


@pytest.mark.parametrize("kind", BUILDERS)
def test_each_flatten_hint_works_when_followed(kind: str, tmp_path: Path) -> None:
    source = BUILDERS[kind](tmp_path)
    report = run_inspection(str(source))
    route = flatten_route(report.facts.source)
    followed = 0
    for finding in report.findings:
        commands = COMMAND.findall(finding.hint)
        if route.refusal:
            assert not commands, f"{finding.code} suggests flatten, which refuses {kind}: {finding.hint}"
            continue
        for command in commands:
            out = tmp_path / f"followed{followed}{source.suffix}"
            followed += 1
            argv = [*shlex.split(command)[1:], str(source), "-o", str(out), "--device", "cpu"]
            assert main(argv) == 0, f"{finding.code}'s hint `{command}` failed on {kind}"
            after = {f.code for f in run_inspection(str(out)).findings}
            if finding.code in FIXED_BY_FLATTEN:
                assert finding.code not in after, f"{finding.code} survives its hint `{command}` on {kind}"


@pytest.mark.parametrize("kind", BUILDERS)
def test_the_hint_names_trust_exactly_where_flatten_needs_it(kind: str, tmp_path: Path) -> None:
    source = BUILDERS[kind](tmp_path)
    facts = run_inspection(str(source)).facts
    hint = flatten_hint(facts.source)
    route = flatten_route(facts.source)
    assert ("--trust" in hint) == bool(route.trust_reason)
    assert ("`memlayout flatten" in hint) == (not route.refusal)
