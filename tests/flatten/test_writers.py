"""The flatten writer registry: each source format reaches its writer, and only through it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memlayout.errors import FlattenError
from memlayout.flatten import writers
from memlayout.flatten.files import FlattenOptions, flatten_path
from memlayout.flatten.writers import FlattenJob, FlattenWriter, Written, writer_for
from memlayout.load import FORMATS
from memlayout.load.records import LoadedSource
from tests.flatten.models import LstmLM

LIVE_FORMATS = {"live-module", "state-dict"}


def test_every_writer_is_found_under_each_format_it_names() -> None:
    for writer in writers.WRITERS:
        assert writer.formats, type(writer).__name__
        for name in writer.formats:
            assert writer_for(name) is writer


def test_registered_formats_are_formats_some_loader_produces() -> None:
    produced = {fmt.name for fmt in FORMATS} | LIVE_FORMATS
    registered = {name for writer in writers.WRITERS for name in writer.formats}
    assert registered <= produced, registered - produced
    assert len(registered) == sum(len(w.formats) for w in writers.WRITERS), "two writers claim one format"


class _Recording(FlattenWriter):
    formats = ("torch-zip",)

    def __init__(self) -> None:
        self.jobs: list[FlattenJob] = []

    def label(self, source: LoadedSource) -> str:
        return "recorded"

    def write(self, job: FlattenJob) -> Written:
        self.jobs.append(job)
        Path(job.out).write_bytes(b"flat")
        return Written(bytes_copied=123, verified=False)


def test_flatten_hands_the_job_to_the_writer_registered_for_the_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(LstmLM().state_dict(), src)
    recording = _Recording()
    monkeypatch.setitem(writers._BY_FORMAT, "torch-zip", recording)
    result = flatten_path(str(src), FlattenOptions(out=str(out), device="cpu"))
    (job,) = recording.jobs
    assert job.out == str(out) and job.source.format == "torch-zip"
    assert job.plan.buffers and job.facts.tensors
    assert (result.format, result.bytes_copied, result.verified) == ("recorded", 123, False)
    assert out.read_bytes() == b"flat"


def test_a_format_without_writer_is_refused_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(LstmLM().state_dict(), src)
    monkeypatch.delitem(writers._BY_FORMAT, "torch-zip")
    with pytest.raises(FlattenError, match="no writer for torch-zip sources") as refused:
        flatten_path(str(src), FlattenOptions(out=str(out), device="cpu"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.pt"]
    # --check refuses the same way: it never promises a change flatten would not make.
    with pytest.raises(FlattenError) as checked:
        flatten_path(str(src), FlattenOptions(out=None, check=True))
    assert checked.value.one_line() == refused.value.one_line()


def test_the_planner_imports_no_rule_module() -> None:
    # What the planner shares with the rules (flat groups, cuDNN's layout) lives in
    # modules both import, so neither side reaches into the other.
    import subprocess
    import sys

    code = "import sys, memlayout.flatten.plan; print(sorted(m for m in sys.modules if m.startswith('memlayout.rules')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
