"""`memlayout activations --format json`: the report as JSON, never printed here.

The JSON keys are a contract, versioned by `schema` and published as
`memlayout/activations/schema_v1.json`; within a version keys are only added.
"""

from __future__ import annotations

import json
from typing import Any

from memlayout.activations.analysis import ActivationReport
from memlayout.activations.assumptions import ASSUMPTIONS
from memlayout.activations.fit.size_search import FitReport
from memlayout.activations.fit.sweep import SweepReport
from memlayout.activations.ranks.facts import RanksReport
from memlayout.activations.report.fit import fit_dict
from memlayout.activations.report.generate import generate_dict
from memlayout.activations.report.json_parts import (
    adaptation_dict,
    cuda_runtime_dict,
    head,
    plan_dict,
    summary_dict,
)
from memlayout.activations.report.ranks import ranks_report_dict
from memlayout.activations.report.sweep import sweep_json_parts
from memlayout.activations.report.weights import weights_report_dict
from memlayout.activations.weights import WeightsReport
from memlayout.output.interface import Formatter


def report_dict(report: ActivationReport) -> dict[str, Any]:
    """The report as plain JSON-ready data (schema 1)."""
    s = report.summary
    plan = report.plan
    return {
        **head(report),
        "autocast": report.autocast,
        "dtype": report.dtype,
        "optimizer_state_dtype": report.optimizer_state_dtype,
        "summary": summary_dict(s),
        "modules": [
            {
                "path": m.path,
                "class": m.class_name,
                "calls": m.calls,
                "saved_bytes": m.saved_bytes,
                "output_bytes": m.output_bytes,
                "input_bytes": m.input_bytes,
                "forward_flops": m.forward_flops,
                "uses_randomness": m.uses_randomness,
                "moves_device": m.moves_device,
                "reads_outside_state": m.reads_outside_state,
                "mutates_buffers": m.mutates_buffers,
                "mutates_inputs": m.mutates_inputs,
                "changes_state": m.changes_state,
            }
            for m in report.modules
        ],
        "plan": None if plan is None else plan_dict(plan),
        "fallbacks": [{"op": op, "count": count} for op, count in report.fallbacks],
        "data_dependent": [
            {"op": op, "kind": kind, "count": count, "assumption": ASSUMPTIONS[kind]}
            for op, kind, count in report.data_dependent
        ],
        "notes": list(report.notes),
        "predicted_peak_bytes": report.predicted_peak_bytes,
        **({"cuda_runtime": cuda_runtime_dict(report.cuda_capability)} if report.device.startswith("cuda") else {}),
        "step": report.step,
        **({"generate": generate_dict(report.generation)} if report.generation is not None else {}),
        **adaptation_dict(report),
    }


class ActivationsJson(Formatter["ActivationReport | RanksReport | FitReport | SweepReport | WeightsReport"]):
    """Every module, the summary and the plan (schema 1); across ranks, each rank and the sharding too; with
    --fit, the step at the size that fits and the `fit` object; with --sweep, the step at its smallest size and the
    `sweep` and `sweep_of` objects; without inputs, the weights report (`weights_schema_v1.json`)."""

    def render(self, report: ActivationReport | RanksReport | FitReport | SweepReport | WeightsReport) -> str:
        if isinstance(report, WeightsReport):
            return json.dumps(weights_report_dict(report), indent=2) + "\n"
        if isinstance(report, SweepReport):
            data = {**report_dict(report.report), **sweep_json_parts(report)}
        elif isinstance(report, FitReport):
            inner = report.report
            data = ranks_report_dict(inner) if isinstance(inner, RanksReport) else report_dict(inner)
            data["fit"] = fit_dict(report)
        else:
            data = ranks_report_dict(report) if isinstance(report, RanksReport) else report_dict(report)
        return json.dumps(data, indent=2) + "\n"
