"""`memlayout activations`' formats on a report built in memory: each renders what the report holds."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from memlayout.activations.analysis import ActivationReport
from memlayout.activations.facts import Trace
from memlayout.activations.plans.plan import Plan, SequentialSegments
from memlayout.activations.search import PlanResult
from memlayout.activations.summary import ModuleFacts, PeakAt, Summary
from memlayout.cli.formats import (
    Command,
    OutputFormat,
    RenderOptions,
    formats_for,
    supported,
    to_format,
)
from memlayout.output.interface import Formatter

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "memlayout" / "activations" / "schema_v1.json").read_text())
MIB = 1 << 20


def module(path: str, class_name: str, saved: int, **flags: bool) -> ModuleFacts:
    return ModuleFacts(
        path=path, class_name=class_name, calls=1, saved_bytes=saved, output_bytes=saved // 2, input_bytes=saved // 4,
        forward_flops=3 * saved, uses_randomness=flags.get("random", False), moves_device=False,
        reads_outside_state=False, mutates_buffers=flags.get("buffers", False),
    )


def fake_report(with_plan: bool) -> ActivationReport:
    """A two-block model's report, as `analyze` would return it, without tracing anything."""
    summary = Summary(
        peak_bytes=96 * MIB, allocator_peak_bytes=None, activation_bytes=64 * MIB, parameter_bytes=16 * MIB,
        buffer_bytes=0, gradient_bytes=16 * MIB, input_bytes=MIB, optimizer_bytes=32 * MIB,
        peak_at=PeakAt("blocks.1", "Block", "backward"),
        at_peak={"parameters": 16 * MIB, "buffers": 0, "inputs": MIB, "gradients": 0, "optimizer_state": 32 * MIB,
                 "saved_activations": 64 * MIB, "other": 15 * MIB}, forward_flops=2_500_000_000,
        recompute_flops=0, forward_seconds=0.008, peak_bytes_min=90 * MIB, peak_bytes_max=100 * MIB,
    )
    modules = (
        module("", "Net", 64 * MIB),
        module("blocks", "Sequential", 60 * MIB),
        module("blocks.0", "Block", 30 * MIB, random=True),
        module("blocks.0.mlp", "MLP", 20 * MIB),
        module("blocks.0.mlp.act", "GELU", 8 * MIB),
        module("blocks.1", "Block", 30 * MIB, buffers=True),
    )
    plan = PlanResult(
        budget_bytes=64 * MIB, plan=Plan(checkpoint=("blocks.0",), sequential=(SequentialSegments("blocks", 2),)),
        peak_bytes=60 * MIB, allocator_peak_bytes=None, estimated_peak_bytes=58 * MIB,
        recompute_flops=1_250_000_000, recompute_seconds=0.002, checks=2,
        pitfalls=("blocks.0 uses randomness: keep the RNG state",),
        excluded=(("blocks.1", "writes in place into a tensor it received"),),
    ) if with_plan else None
    trace = Trace(storages=(), calls=(), modules=(), events=0, forward_end=0, loss="sum of floating outputs",
                  recompute_flops=0, device="cpu", mode="fake", notes=(),
                  fallbacks=(("aten._grouped_mm.default", 4),), assumptions=(("aten.topk.default", "routing", 2),))
    return ActivationReport(
        target="pkg.models:net", target_kind="import-spec", model_class="Net", inputs=("float32[8,3,32,32]",),
        device="cpu", mode="fake", loss="sum of floating outputs", optimizer="adamw", summary=summary, modules=modules,
        plan=plan,
        notes=("a note about the step",), trace=trace,
    )


def formatter(fmt: OutputFormat, **options: int) -> Formatter[ActivationReport]:
    return supported(to_format(fmt).activations, fmt, Command.ACTIVATIONS)(RenderOptions(**options))


@pytest.mark.parametrize("with_plan", [False, True])
def test_json_holds_the_report_and_follows_its_schema(with_plan: bool) -> None:
    text = formatter(OutputFormat.JSON).render(fake_report(with_plan))
    assert text.endswith("}\n")
    data = json.loads(text)
    jsonschema.validate(data, SCHEMA)
    assert data["summary"]["peak_bytes"] == 96 * MIB
    assert data["summary"]["peak_at"] == {"module": "blocks.1", "class": "Block", "phase": "backward"}
    assert [m["path"] for m in data["modules"]] == ["", "blocks", "blocks.0", "blocks.0.mlp", "blocks.0.mlp.act",
                                                   "blocks.1"]
    assert data["notes"] == ["a note about the step"]
    assert data["optimizer"] == "adamw" and data["summary"]["optimizer_bytes"] == 32 * MIB
    assert (data["summary"]["peak_bytes_min"], data["summary"]["peak_bytes_max"]) == (90 * MIB, 100 * MIB)
    assert data["fallbacks"] == [{"op": "aten._grouped_mm.default", "count": 4}]
    assert [(d["op"], d["kind"], d["count"]) for d in data["data_dependent"]] == [("aten.topk.default", "routing", 2)]
    if with_plan:
        assert data["plan"]["excluded"] == [{"module": "blocks.1",
                                             "reason": "writes in place into a tensor it received"}]
        assert data["plan"]["checkpoint"] == ["blocks.0"]
        assert data["plan"]["sequential"] == [{"module": "blocks", "segments": 2}]
        assert data["plan"]["recompute_flops"] == 1_250_000_000
    else:
        assert data["plan"] is None


def test_the_table_shows_the_peak_the_modules_to_its_depth_and_the_plan() -> None:
    text = formatter(OutputFormat.TABLE, depth=3).render(fake_report(with_plan=True))
    assert "memlayout activations: pkg.models:net" in text
    assert "96.0 MiB" in text and "blocks.1 (Block), backward" in text
    assert "modules (depth <= 3;" in text
    assert "blocks.0.mlp " in text and "blocks.0.mlp.act" not in text and "1 deeper modules not shown" in text
    assert ("live at the peak  parameters 16.0 MiB, inputs 1.0 MiB, optimizer state 32.0 MiB, "
            "saved activations 64.0 MiB"
            in " ".join(text.split()).replace("peak parameters", "peak  parameters"))
    assert "random" in text and "updates buffers" in text
    assert "plan for a budget of 64.0 MiB" in text and "blocks in 2 segments (checkpoint_sequential)" in text
    assert "1.25 GFLOP, 2 ms (25% of the forward's time)" in text
    assert "note: a note about the step" in text and "\x1b[" not in text
    flat = " ".join(text.split())
    assert "optimizer adamw its state 32.0 MiB" in flat and "peak range 90.0 MiB - 100.0 MiB" in flat
    assert "aten._grouped_mm.default (4x)" in flat and "balanced routing" in flat
    assert "excluded blocks.1: writes in place into a tensor it received" in flat
    deeper = formatter(OutputFormat.TABLE, depth=4).render(fake_report(with_plan=True))
    assert "blocks.0.mlp.act" in deeper and "deeper modules not shown" not in deeper
    assert "\x1b[" in supported(to_format(OutputFormat.TABLE).activations, OutputFormat.TABLE, Command.ACTIVATIONS)(
        RenderOptions(color=True)).render(fake_report(with_plan=False))


def test_activations_writes_table_and_json_only() -> None:
    assert formats_for(Command.ACTIVATIONS) == (OutputFormat.TABLE, OutputFormat.JSON)
