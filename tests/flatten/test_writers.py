"""The flatten writer registry: each source format reaches its writer, and only through it.

Writers are found, not listed: a module of `memlayout.flatten.writers` declaring
`WRITER`, or an entry point of the `memlayout.flatten_writers` group.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from memlayout.cli.app import main
from memlayout.errors import FlattenError
from memlayout.flatten import writers
from memlayout.flatten.files import FlattenOptions, flatten_path
from memlayout.flatten.writers import (
    ENTRY_POINT_GROUP,
    FlattenJob,
    FlattenWriter,
    Registry,
    Written,
    writer_for,
)
from memlayout.load import FORMATS
from memlayout.load.records import LoadedSource
from tests.flatten.models import LstmLM

LIVE_FORMATS = {"live-module", "state-dict"}


def _rewriters() -> list[FlattenWriter]:
    return [w for w in writers.registry().writers if w.target is None]


@pytest.fixture
def fresh_registry() -> Iterator[None]:
    """Writers found anew in the test, and again after it, without what the test added."""
    writers.registry.cache_clear()
    yield
    writers.registry.cache_clear()


def test_every_writer_is_found_under_each_format_it_names() -> None:
    for writer in _rewriters():
        assert writer.formats, type(writer).__name__
        for name in writer.formats:
            assert writer_for(name) is writer


def test_registered_formats_are_formats_some_loader_produces() -> None:
    produced = {fmt.name for fmt in FORMATS} | LIVE_FORMATS
    registered = {name for writer in _rewriters() for name in writer.formats}
    assert registered <= produced, registered - produced
    assert len(registered) == sum(len(w.formats) for w in _rewriters()), "two writers claim one format"


def test_every_module_of_the_package_that_declares_a_writer_is_registered() -> None:
    import importlib
    import pkgutil

    declared = []
    for module in pkgutil.iter_modules(writers.__path__):
        found = getattr(importlib.import_module(f"memlayout.flatten.writers.{module.name}"), "WRITER", None)
        if found is not None:
            declared.append(found)
    assert declared and set(map(id, declared)) == {id(w) for w in writers.registry().writers}


def test_importing_the_registry_loads_no_writer_module() -> None:
    import subprocess

    code = "import sys, memlayout.flatten.writers; print(sorted(m for m in sys.modules if '.writers.' in m))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "['memlayout.flatten.writers.interface']"


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
    others = tuple(w for w in writers.registry().writers if "torch-zip" not in w.formats or w.target)
    monkeypatch.setattr(writers, "registry", lambda: Registry((*others, recording)))
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
    others = tuple(w for w in writers.registry().writers if "torch-zip" not in w.formats or w.target)
    monkeypatch.setattr(writers, "registry", lambda: Registry(others))
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

    code = ("import sys, memlayout.flatten.plan; "
            "print(sorted(m for m in sys.modules if m.startswith('memlayout.rules')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# A writer as a third party would write one: it lists the tensors it was handed, in plan order.
TOY_WRITER = '''
from pathlib import Path

from memlayout.flatten.writers.interface import FlattenJob, FlattenWriter, Written


class ToyWriter(FlattenWriter):
    """Writes the names of IN's tensors, one a line, in the order the plan lays them out."""

    formats = ("torch-zip",)
    target = "{target}"

    def label(self, source):
        return "torch.save zip -> {target}"

    def write(self, job: FlattenJob) -> Written:
        names = [n for flat in job.plan.buffers for slot in flat.slots for view in slot.views for n in view.names]
        text = "\\n".join(names) + "\\n"
        Path(job.out).write_text(text)
        return Written(len(text), False)


WRITER = ToyWriter()
'''


def _planned_names(src: Path) -> list[str]:
    from memlayout.core.fact_builder import build_facts
    from memlayout.flatten.plan import plan_flatten
    from memlayout.load import load_path

    with load_path(str(src)) as source:
        plan = plan_flatten(build_facts(source), device="cpu")
    return [n for flat in plan.buffers for slot in flat.slots for view in slot.views for n in view.names]


def _fake_distribution(folder: Path, module: str, target: str, entry_point: str) -> None:
    """A distribution installed in `folder` as pip installs one: its module and its dist-info's entry points."""
    folder.mkdir()
    (folder / f"{module}.py").write_text(TOY_WRITER.replace("{target}", target))
    info = folder / "toy_writer-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-writer\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\ntoy = {entry_point}\n")


def test_a_writer_a_distribution_registers_through_its_entry_point_is_used_by_flatten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fresh_registry: None
) -> None:
    _fake_distribution(tmp_path / "site", "toy_flatten_writer", "toy", "toy_flatten_writer:WRITER")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "toy_flatten_writer", raising=False)
    src, out = tmp_path / "in.pt", tmp_path / "out.toy"
    torch.save(LstmLM().state_dict(), src)

    assert main(["flatten", str(src), "--to", "toy", "-o", str(out)]) == 0
    assert out.read_text().splitlines() == _planned_names(src)
    assert "torch.save zip -> toy" in capsys.readouterr().out
    # The built-in writers are all still there beside it.
    assert writers.registry().targets == ("safetensors", "toy")
    assert writer_for("torch-zip") is not None and type(writer_for("torch-zip")).__name__ == "TorchZipWriter"


def test_a_plug_in_that_claims_a_format_a_writer_already_rewrites_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fresh_registry: None
) -> None:
    _fake_distribution(tmp_path / "site", "toy_clashing_writer", "", "toy_clashing_writer:ToyWriter")
    (tmp_path / "site" / "toy_clashing_writer.py").write_text(
        (tmp_path / "site" / "toy_clashing_writer.py").read_text().replace('target = ""', "target = None")
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "toy_clashing_writer", raising=False)
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(LstmLM().state_dict(), src)

    assert main(["flatten", str(src), "-o", str(out), "--device", "cpu"]) == 2
    error = capsys.readouterr().err.strip()
    assert "rewriting torch-zip sources is claimed by 2 flatten writers" in error and "ToyWriter" in error
    assert len(error.splitlines()) == 1 and not out.exists()


def test_a_writer_module_dropped_into_the_package_is_found_without_being_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_registry: None
) -> None:
    # The package's folder is shared with the other tests, so the new module goes in a
    # second folder of the package's __path__, where Python's import finds it just the same.
    dropped = tmp_path / "more_writers"
    dropped.mkdir()
    (dropped / "toy_format.py").write_text(TOY_WRITER.replace("{target}", "toy-dropped"))
    monkeypatch.setattr(writers, "__path__", [*writers.__path__, str(dropped)])
    monkeypatch.delitem(sys.modules, "memlayout.flatten.writers.toy_format", raising=False)
    src, out = tmp_path / "in.pt", tmp_path / "out.toy"
    torch.save(LstmLM().state_dict(), src)

    result = flatten_path(str(src), FlattenOptions(out=str(out), to="toy-dropped"))
    assert result.format == "torch.save zip -> toy-dropped"
    assert out.read_text().splitlines() == _planned_names(src)


def test_a_plug_in_that_cannot_be_loaded_is_named_in_one_line_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fresh_registry: None
) -> None:
    _fake_distribution(tmp_path / "site", "toy_broken_writer", "toy", "toy_missing_module:WRITER")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(LstmLM().state_dict(), src)

    assert main(["flatten", str(src), "-o", str(out), "--device", "cpu"]) == 2
    error = capsys.readouterr().err.strip()
    assert "the flatten writer plug-in toy (toy_missing_module:WRITER) cannot be loaded" in error
    assert len(error.splitlines()) == 1 and not out.exists()
