"""`reserved` beside `allocated`: a traced step replayed through the CUDA caching allocator model, and the CUDA
runtime's context and workspaces stated on lines of their own."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema

from memlayout.activations.analysis import ActivationReport
from memlayout.activations.device.allocator_replay import allocator_peaks, step_events
from memlayout.activations.device.cuda_allocator import FREE, round_size
from memlayout.activations.device.cuda_runtime import (
    CUBLAS_WORKSPACE_DEFAULT,
    CUBLAS_WORKSPACE_HOPPER,
    CUBLASLT_WORKSPACE_DEFAULT,
    chosen_workspace_size,
    cublaslt_workspace_size,
    cuda_runtime,
)
from memlayout.activations.facts import Phase, StorageKind, StorageLife, Trace
from memlayout.activations.summary import live_curve, summarize
from memlayout.cli.formats import Command, OutputFormat, RenderOptions, supported, to_format
from tests.activations import models
from tests.activations.report.test_formats import fake_report

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "memlayout" / "activations" / "schema_v1.json").read_text())
MiB = 1 << 20


def storage(nbytes: int, kind: StorageKind, phase: Phase, born: int, died: int | None) -> StorageLife:
    return StorageLife(nbytes=nbytes, kind=kind, born=born, died=died, call=None, phase=phase, saved=False)


def hand_made_trace() -> Trace:
    """A 12 MiB parameter and its 12 MiB optimizer state; forward makes a 3 MiB activation, backward a 12 MiB
    gradient and then frees the activation."""
    storages = (
        storage(12 * MiB, StorageKind.PARAMETER, Phase.SETUP, 1, None),
        storage(12 * MiB, StorageKind.OPTIMIZER, Phase.SETUP, 2, None),
        storage(3 * MiB, StorageKind.STEP, Phase.FORWARD, 3, 5),
        storage(12 * MiB, StorageKind.GRADIENT, Phase.BACKWARD, 4, None),
    )
    return Trace(storages=storages, calls=(), modules=(), events=5, forward_end=3, loss="output.loss",
                 recompute_flops=0, device="cuda", mode="fake", notes=())


def test_two_steps_of_a_trace_keep_the_model_state_and_make_the_rest_again() -> None:
    events = step_events(hand_made_trace(), steps=2)
    count = 4
    assert events == [
        (0, 12 * MiB), (1, 12 * MiB), (2, 3 * MiB), (3, 12 * MiB), (2, FREE),
        (3, FREE),  # zero_grad(set_to_none=True) between the steps
        (count + 2, 3 * MiB), (count + 3, 12 * MiB), (count + 2, FREE),
    ]


def test_a_hand_made_trace_reserves_what_the_allocator_rules_give() -> None:
    # The parameter and the state take 12 MiB segments of their own (>= 10 MiB); the activation a 20 MiB segment
    # (1 to 10 MiB); the gradient fits the 17 MiB left of it. After zero_grad the 20 MiB block is whole again,
    # and the second step fits it the same way: nothing more is reserved.
    peaks = allocator_peaks(hand_made_trace())
    assert peaks.reserved_bytes == (12 + 12 + 20) * MiB
    assert peaks.allocated_bytes == (12 + 12 + 3 + 12) * MiB
    assert peaks.segments == 3


def test_a_traced_cpu_step_replays_through_the_allocator_model() -> None:
    """The library function works on any trace, a CPU target's too: that is how it is tested without CUDA."""
    import memlayout.activations as act

    args, kwargs = models.image_inputs(4, 16)
    report = act.analyze(models.flat_cnn(), list(args), kwargs=kwargs)
    trace = report.trace
    assert report.summary.allocator_peak_bytes is None and report.summary.reserved_peak_bytes is None
    peaks = act.allocator_peaks(trace)
    rounded = int(live_curve(dataclasses.replace(
        trace, storages=tuple(dataclasses.replace(s, nbytes=round_size(s.nbytes) if s.nbytes else 0)
                              for s in trace.storages))).max())
    assert peaks.allocated_bytes >= rounded >= report.summary.peak_bytes
    assert peaks.reserved_bytes >= peaks.allocated_bytes
    assert allocator_peaks(trace, steps=1).reserved_bytes <= peaks.reserved_bytes
    as_cuda = summarize(trace, cuda=True)
    assert (as_cuda.allocator_peak_bytes, as_cuda.reserved_peak_bytes) == (peaks.allocated_bytes, peaks.reserved_bytes)


def cuda_report() -> ActivationReport:
    report = fake_report(with_plan=False)
    summary = dataclasses.replace(report.summary, allocator_peak_bytes=97 * MiB, reserved_peak_bytes=118 * MiB)
    return dataclasses.replace(report, device="cuda", summary=summary)


def render(fmt: OutputFormat, report: ActivationReport) -> str:
    formatter = supported(to_format(fmt).activations, fmt, Command.ACTIVATIONS)(RenderOptions(width=160))
    return formatter.render(report)


def test_a_cuda_report_states_reserved_the_context_and_the_workspaces_apart() -> None:
    runtime = cuda_runtime()
    data = json.loads(render(OutputFormat.JSON, cuda_report()))
    jsonschema.validate(data, SCHEMA)
    assert data["summary"]["allocator_peak_bytes"] == 97 * MiB
    assert data["summary"]["reserved_peak_bytes"] == 118 * MiB
    assert data["cuda_runtime"]["context_bytes"] == runtime.context_bytes
    assert data["cuda_runtime"]["workspace_bytes"] == runtime.workspace_bytes
    flat = " ".join(render(OutputFormat.TABLE, cuda_report()).split())
    assert "peak in CUDA blocks 97.0 MiB reserved 118.0 MiB" in flat
    assert "CUDA context 526.8 MiB outside the allocator; measured on an NVIDIA H200, driver 580.159.04" in flat
    assert "cuBLAS workspaces 65.0 MiB from the allocator, not in the peak" in flat
    outside = runtime.outside_allocator_bytes / MiB
    assert f"cuBLAS itself {outside:.1f} MiB outside the allocator" in flat
    # Reserved, the workspaces' two 32 MiB segments rounded up to whole segments, cuBLAS and the context.
    assert f"on the GPU {(118 + 66 + outside + 526.8):.1f} MiB" in flat


def test_a_cpu_report_has_no_cuda_lines() -> None:
    report = fake_report(with_plan=False)
    data = json.loads(render(OutputFormat.JSON, report))
    assert "reserved_peak_bytes" not in data["summary"] and "cuda_runtime" not in data
    table = render(OutputFormat.TABLE, report)
    assert "reserved" not in table and "CUDA context" not in table and "cuBLAS" not in table


def test_cublas_workspace_sizes_follow_torch_defaults_and_settings() -> None:
    """parseChosenWorkspaceSize and parseCUDABlasLtWorkspaceSize (CublasHandlePool.cpp); on a GPU,
    test_reserved_gpu.py checks them against what torch allocates."""
    assert chosen_workspace_size((9, 0), {}) == CUBLAS_WORKSPACE_HOPPER == 32 * MiB
    assert chosen_workspace_size((8, 0), {}) == CUBLAS_WORKSPACE_DEFAULT == 8 * MiB + 128 * 1024
    assert chosen_workspace_size((8, 0), {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}) == 32 * MiB
    assert chosen_workspace_size((9, 0), {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}) == 128 * 1024
    assert chosen_workspace_size((8, 0), {"CUBLAS_WORKSPACE_CONFIG": "nonsense"}) == CUBLAS_WORKSPACE_DEFAULT
    assert cublaslt_workspace_size({}) == CUBLASLT_WORKSPACE_DEFAULT == MiB
    assert cublaslt_workspace_size({"CUBLASLT_WORKSPACE_SIZE": "4096"}) == 4 * MiB
    assert cublaslt_workspace_size({"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "1"}) == 0
    assert cublaslt_workspace_size({"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "true"}) == MiB  # check_env ignores it
    hopper = cuda_runtime((9, 0), {})
    assert hopper.workspace_bytes == 65 * MiB  # what the H200 measured (docs/gpu.md)
    assert hopper.workspace_reserved_bytes == (32 + 32 + 2) * MiB  # the 1 MiB one takes a small-pool segment


def test_device_cuda_reports_reserved_on_the_command_line() -> None:
    from tests.activations.test_cli import SCHEMA as CLI_SCHEMA
    from tests.activations.test_cli import run

    code, out, err = run(["activations", "tests.activations.models:residual_stack", "--input", "float32[4,256]",
                          "--device", "cuda", "--format", "json"])
    assert code == 0, err
    report = json.loads(out)
    jsonschema.validate(report, CLI_SCHEMA)
    summary = report["summary"]
    assert summary["reserved_peak_bytes"] >= summary["allocator_peak_bytes"] >= summary["peak_bytes"]
    assert report["cuda_runtime"]["context_bytes"] > 0
    code, table, err = run(["activations", "tests.activations.models:residual_stack", "--input", "float32[4,256]",
                            "--device", "cuda"])
    assert code == 0, err
    assert "reserved" in table and "CUDA context" in table


def test_the_panel_names_where_cublas_workspace_size_comes_from() -> None:
    # It said "Hopper's default" for every card; torch's default is larger on sm 9.0 alone.
    from memlayout.activations.device.cuda_runtime import chosen_workspace_size
    from memlayout.activations.report.table import _workspace_source

    assert _workspace_source((9, 0), chosen_workspace_size((9, 0), {})) == "torch's default on Hopper"
    assert _workspace_source((8, 9), chosen_workspace_size((8, 9), {})) == "torch's default on sm 8.9"
    assert _workspace_source((8, 9), 4096 * 1024) == "CUBLAS_WORKSPACE_CONFIG"
