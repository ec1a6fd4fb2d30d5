"""The parts of the activations JSON that the one-device and the ranks reports share: its head and its summary.

The keys are a contract (schema 1, `schema_v1.json`); within a version they are only added.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memlayout.activations.device.cuda_runtime import cuda_runtime
from memlayout.activations.summary import Summary
from memlayout.version import __version__

if TYPE_CHECKING:
    from memlayout.activations.analysis import ActivationReport
    from memlayout.activations.ranks.facts import RanksReport
    from memlayout.activations.search import PlanResult

SCHEMA_VERSION = 1


def head(report: ActivationReport | RanksReport) -> dict[str, Any]:
    """The keys before `summary`: what was traced, and how (ranks are traced on fake tensors)."""
    return {
        "schema": SCHEMA_VERSION,
        "report": "activations",
        "tool": {"name": "memlayout", "version": __version__},
        "target": {"spec": report.target, "kind": report.target_kind, "class": report.model_class,
                   "class_chosen_by": report.class_chosen_by},
        "inputs": list(report.inputs),
        "device": report.device,
        "mode": getattr(report, "mode", "fake"),
        "loss": report.loss,
        "optimizer": report.optimizer,
    }


def model_text(class_name: str, chosen_by: str) -> str:
    """The class built and why, as the tables say it: "T5ForConditionalGeneration (architectures in config.json)"."""
    return f"{class_name} ({chosen_by})" if chosen_by else class_name


def summary_dict(s: Summary) -> dict[str, Any]:
    """`summary`: the step's totals; `reserved_peak_bytes` only where the allocator was modelled (CUDA)."""
    reserved = {} if s.reserved_peak_bytes is None else {"reserved_peak_bytes": s.reserved_peak_bytes}
    return {
        "peak_bytes": s.peak_bytes,
        "allocator_peak_bytes": s.allocator_peak_bytes,
        "activation_bytes": s.activation_bytes,
        "parameter_bytes": s.parameter_bytes,
        "buffer_bytes": s.buffer_bytes,
        "gradient_bytes": s.gradient_bytes,
        "input_bytes": s.input_bytes,
        "optimizer_bytes": s.optimizer_bytes,
        "peak_bytes_min": s.peak_bytes_min,
        "peak_bytes_max": s.peak_bytes_max,
        "peak_at": {"module": s.peak_at.module, "class": s.peak_at.class_name, "phase": s.peak_at.phase},
        "at_peak": dict(s.at_peak),
        "forward_flops": s.forward_flops,
        **reserved,
    }


def cuda_runtime_dict(capability: tuple[int, int] | None) -> dict[str, Any]:
    """`cuda_runtime`: the CUDA context and cuBLAS's workspaces, which no trace holds (device/cuda_runtime.py)."""
    runtime = cuda_runtime(capability)
    return {
        "context_bytes": runtime.context_bytes,
        "context_measured_on": runtime.context_measured_on,
        "outside_allocator_bytes": runtime.outside_allocator_bytes,
        "cublas_workspace_bytes": runtime.cublas_workspace_bytes,
        "cublas_handles": runtime.cublas_handles,
        "cublaslt_workspace_bytes": runtime.cublaslt_workspace_bytes,
        "workspace_bytes": runtime.workspace_bytes,
        "workspace_reserved_bytes": runtime.workspace_reserved_bytes,
        "beside_step_bytes": runtime.beside_step_bytes,
    }


def plan_dict(plan: PlanResult) -> dict[str, Any]:
    """`plan`: a plan for a budget, and what tracing it measured."""
    return {
        "budget_bytes": plan.budget_bytes,
        **plan.plan.to_dict(),
        "peak_bytes": plan.peak_bytes,
        "allocator_peak_bytes": plan.allocator_peak_bytes,
        "estimated_peak_bytes": plan.estimated_peak_bytes,
        "recompute_flops": plan.recompute_flops,
        "recompute_seconds": plan.recompute_seconds,
        "compared": plan.compared,
        "compared_bytes": plan.judged_bytes,
        "checks": plan.checks,
        "cut_short": plan.cut_short,
        "pitfalls": list(plan.pitfalls),
        "excluded": [{"module": path, "reason": reason} for path, reason in plan.excluded],
    }


def adaptation_dict(report: ActivationReport) -> dict[str, Any]:
    """`parameters` (trainable against frozen), `lora` and `quantization`: what --lora and --quantize made."""
    split, adapted = report.parameters, report.adapted
    lora = adapted.lora if adapted is not None else None
    quantized = adapted.quantized if adapted is not None else None
    return {
        "parameters": None if split is None else {
            "trainable_count": split.trainable_count, "trainable_bytes": split.trainable_bytes,
            "frozen_count": split.frozen_count, "frozen_bytes": split.frozen_bytes,
            "quantization_state_bytes": split.quantization_state_bytes,
        },
        "lora": None if lora is None else {
            "rank": lora.rank, "alpha": lora.alpha, "dropout": lora.dropout, "targets": list(lora.targets),
            "dora": lora.dora, "adapted_modules": lora.adapted_modules,
        },
        "quantization": None if quantized is None else {
            "method": quantized.method, "layers": quantized.layers, "kept": list(quantized.kept),
        },
    }
