"""The sweep's runner (benchmarks/accuracy/zoo/run.py): a crash or a hang ends only its own architecture's record,
and docs/activations-zoo.md is what the results give."""

from __future__ import annotations

import faulthandler
import os
import time
from typing import Any

import pytest

from benchmarks.accuracy.zoo import render, run
from benchmarks.accuracy.zoo.catalog import Architecture, Built


def architecture(name: str, build: Any) -> Architecture:
    return Architecture(name=name, source="tests", family="test", build=build)


def finish(child: run.Child, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        record = run.finish_child(child, timeout)
        if record is not None:
            return record
    raise AssertionError("the child neither finished nor was stopped")


def crash() -> Built:
    faulthandler.disable()  # pytest's fault handler would print this expected abort's stack into the log
    os.abort()  # as a segfault in a kernel would end the process


def hang() -> Built:
    time.sleep(600)
    raise AssertionError("unreachable")


def refuse() -> Built:
    raise ValueError("no such size")


def tiny() -> Built:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16)).train()
    return Built(model, (torch.randn(32, 16, generator=torch.Generator().manual_seed(0)),), {}, "16-64-16")


def test_a_crash_ends_only_its_record() -> None:
    record = finish(run.start_child(architecture("crashes", crash)), timeout=60)
    assert record["architecture"] == "crashes"
    assert record["status"] == "unsupported"
    assert "ended during the build" in record["reason"]
    assert "exit status -6" in record["reason"]  # SIGABRT


def test_a_hang_is_stopped_at_the_timeout() -> None:
    started = time.monotonic()
    # A spawned child imports torch before it builds: seconds on an idle machine, over 30 s on a 2-core one
    # shared by a dozen processes.
    record = finish(run.start_child(architecture("hangs", hang)), timeout=60)
    assert time.monotonic() - started < 120
    assert record["reason"] == "timed out after 60 s during the build"


def test_a_model_that_does_not_build_is_unsupported_with_its_reason() -> None:
    record = finish(run.start_child(architecture("refuses", refuse)), timeout=60)
    assert record["status"] == "unsupported"
    assert "ValueError: no such size" in record["reason"]


def _nested_checkpoints(x: Any, depth: int) -> Any:
    from torch.utils.checkpoint import checkpoint

    if depth == 0:
        return x.sin()
    return checkpoint(_nested_checkpoints, x, depth - 1, use_reentrant=True)


def test_a_check_runs_after_the_parent_started_autograds_threads() -> None:
    """Backward through deeply nested re-entrant checkpoints starts autograd's worker threads (past torch's
    re-entrant depth of 60); a child forked after that fails its first backward with "Unable to handle
    autograd's threading in combination with fork-based multiprocessing" (issue 28). A pytest worker may have
    run such a test before this one."""
    import torch

    x = torch.randn(4, requires_grad=True)
    _nested_checkpoints(x, 80).sum().backward()
    record = finish(run.start_child(architecture("tiny", tiny)), timeout=120)
    assert record["status"] == "ok", record["reason"]


def test_a_check_that_runs_gives_the_full_record() -> None:
    record = finish(run.start_child(architecture("tiny", tiny)), timeout=120)
    assert record["status"] == "ok", record["reason"]
    assert record["measured_peak_bytes"] > 0
    assert record["within_2pct"], record
    assert record["plan"] in ("verified", "unreachable-verified"), record


def test_a_check_without_plans_is_judged_by_the_allocator_events(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.accuracy.zoo.check import PLANS_VARIABLE

    monkeypatch.setenv(PLANS_VARIABLE, "0")  # the spawned child reads it, as run.py --no-plans sets it
    record = finish(run.start_child(architecture("tiny", tiny)), timeout=120)
    assert record["status"] == "ok", record["reason"]
    assert record["plan"] == "not run"
    assert record["measured_by"] == "allocator events"
    assert record["measured_peak_bytes"] >= record["storage_counter_peak_bytes"] > 0
    assert record["within_2pct"], record


def test_a_large_sweep_writes_files_of_its_own() -> None:
    assert run.results_paths("small", plans=True) == (run.RESULTS, run.SWEEP)
    records, sweep = run.results_paths("large", plans=False)
    assert records.name == "activations_zoo_large_peaks.json"
    assert sweep.name == "activations_zoo_large_peaks_sweep.json"


@pytest.mark.parametrize(("record", "rerun"), [
    ({"status": "ok", "within_2pct": True, "plan": "not run"}, False),
    ({"status": "ok", "within_2pct": False, "plan": "not run"}, True),
    (None, True),
    ({"status": "ok", "within_2pct": True, "plan": "verified"}, False),
    ({"status": "ok", "within_2pct": True, "plan": "unreachable-verified"}, False),
    ({"status": "ok", "within_2pct": False, "plan": "verified"}, True),
    ({"status": "failed", "within_2pct": True, "plan": "failed"}, True),
    ({"status": "unsupported", "within_2pct": None, "plan": "none"}, True),
])
def test_rerun_failed_selects_the_records_not_ok_within_2_percent(record: Any, rerun: bool) -> None:
    assert run.needs_rerun(record) is rerun


def test_rerun_missing_takes_only_the_never_checked_and_a_sample_shuffles_them_all() -> None:
    class Entry:
        def __init__(self, name: str) -> None:
            self.name, self.family = name, "f"

    catalog = [Entry(name) for name in "abcdefgh"]
    records = {"a": {"status": "ok", "within_2pct": True, "plan": "not run"},
               "b": {"status": "ok", "within_2pct": False, "plan": "not run"},
               "c": {"status": "unsupported", "within_2pct": None, "plan": "none"}}
    missing = [entry.name for entry in run.select(catalog, records, [], [], "missing", None, 0)]
    assert missing == list("defgh")
    failed = [entry.name for entry in run.select(catalog, records, [], [], "failed", None, 0)]
    assert failed == list("bcdefgh")
    shuffled = [entry.name for entry in run.select(catalog, records, [], [], "missing", 500, 3)]
    assert sorted(shuffled) == list("defgh")
    assert shuffled == [entry.name for entry in run.select(catalog, records, [], [], "missing", 500, 3)]
    assert any(shuffled != [entry.name for entry in run.select(catalog, records, [], [], "missing", 500, seed)]
               for seed in range(4, 10))


def test_figures_count_what_the_goals_name() -> None:
    def record(status: str, within: bool | None, plan: str, reason: str = "") -> dict[str, Any]:
        return {"architecture": f"a{status}{within}{plan}{reason}", "family": "f", "status": status,
                "within_2pct": within, "plan": plan, "reason": reason}

    found = render.figures([
        record("ok", True, "verified"),
        record("ok", True, "unreachable-verified"),
        record("ok", False, "verified", "predicted 1.1 MiB against 1.0 MiB measured"),
        record("failed", None, "none", "no prediction: unexpected RuntimeError: boom"),
        record("unsupported", None, "none", "the real CPU step fails: x"),
    ])
    assert (found.architectures, found.supported, found.within_2pct, found.plans_checked) == (5, 4, 2, 3)
    assert found.tracebacks == 1
    assert found.within_share == 0.5


def test_a_range_miss_is_stated_in_the_bytes_it_misses_by() -> None:
    # an older record said it in MiB, where a peak 8 B above a one-value range read as inside it
    record = {"reason": "followed the hint --real: x; the measured peak 3.05 MiB is outside the predicted range "
              "3.05 MiB to 3.05 MiB", "measured_peak_bytes": 3197656, "peak_bytes_min": 3197648,
              "peak_bytes_max": 3197648, "measured_in_range": False}
    assert render.reason(record) == ("followed the hint --real: x; the measured peak 3,197,656 B is 8 B above the "
                                     "predicted range 3,197,648 to 3,197,648 B")
    below = dict(record, measured_peak_bytes=3197000, peak_bytes_max=3197700, reason="")
    assert render.reason(below) == ""  # a record that states no range miss is not given one
    assert render.reason(dict(record, measured_in_range=True)) == record["reason"]


def test_the_docs_page_is_what_the_results_give() -> None:
    if not render.RESULTS.exists():
        pytest.fail(f"{render.RESULTS} is missing: run make zoo")
    assert render.DOCS.read_text() == render.current(), "run python -m benchmarks.accuracy.zoo.render"


def test_the_catalog_lists_every_model_class_of_the_registries_once() -> None:
    from transformers.models.auto import modeling_auto

    from benchmarks.accuracy.zoo.catalog import DIFFUSERS, FAMILIES, TORCH_MODELS, architectures

    entries = architectures()
    names = [entry.name for entry in entries]
    assert len(names) == len(set(names))
    for _, registry, _ in FAMILIES:
        for classes in getattr(modeling_auto, registry).values():
            assert (classes[0] if isinstance(classes, tuple) else classes) in names, registry
    assert set(DIFFUSERS) <= set(names)
    assert {f"torch.nn.{name}" for name in TORCH_MODELS} <= set(names)


def test_the_real_hint_is_found_past_the_cut_a_record_makes() -> None:
    """IBertForMaskedLM's message names a long path, and the record's 400-character cut fell inside "pass --real";
    the sweep then failed a step a user would have run with --real."""
    from benchmarks.accuracy.zoo.check import REAL_HINT, memlayout_error
    from memlayout.errors import UsageError

    error = UsageError("the step reads a value at " + "/long/path" * 60, hint=f"{REAL_HINT} to run it")
    assert REAL_HINT not in memlayout_error(error)
    assert REAL_HINT in memlayout_error(error, limit=None)
