"""`memlayout activations --fit`'s report: the table and the JSON of a `FitReport`. Never printed here.

The JSON is the activations report (schema 1) of the plain step at the size that
fits without checkpointing, with a `fit` object added.
"""

from __future__ import annotations

import textwrap
from typing import Any

from memlayout.activations.fit.size_search import FitAnswer, FitReport
from memlayout.activations.report.json_parts import plan_dict
from memlayout.activations.report.ranks import _plan_dict as ranks_plan_dict
from memlayout.activations.search import PlanResult
from memlayout.format_bytes import human_bytes


def fit_dict(report: FitReport) -> dict[str, Any]:
    """The `fit` object of the JSON report."""

    def answer(a: FitAnswer | None) -> dict[str, Any] | None:
        if a is None:
            return None
        return {
            "size": a.size,
            "peak_bytes": a.peak_bytes,
            "next_peak_bytes": a.next_peak_bytes,
            "next_failure": a.next_failure,
            "plan": None if a.plan is None else _plan_dict(a.plan),
        }

    return {
        "axis": report.axis,
        "dims": [{"input": d.input, "dim": d.dim} for d in report.dims],
        "given_size": report.given_size,
        "budget_bytes": report.budget_bytes,
        "budget_from": report.budget_from,
        "world_size": report.world_size,
        "without_plan": answer(report.without_plan),
        "with_plan": answer(report.with_plan),
        "limit": report.limit,
        "probes": [
            {"size": p.size, "with_plan": p.with_plan, "peak_bytes": p.peak_bytes, "fits": p.fits, "failure": p.failure}
            for p in report.probes
        ],
    }


def _plan_dict(plan: Any) -> dict[str, Any]:
    if isinstance(plan, PlanResult):
        return plan_dict(plan)
    return ranks_plan_dict(plan)


def render_fit_table(report: FitReport, *, width: int = 120) -> str:
    """The terminal report: both answers, the step after each, and the plan."""
    axis = report.axis
    ranks = f", each of {report.world_size} ranks" if report.world_size else ""
    lines = [
        f"memlayout activations --fit {axis}: {report.report.target or report.report.model_class}",
        f"  budget      {human_bytes(report.budget_bytes)} ({report.budget_from}){ranks}",
        f"  scaled      {'; '.join(f'{d.input} dim {d.dim}' for d in report.dims)} (given {report.given_size})",
    ]

    def field(name: str, text: str) -> None:
        lines.append(textwrap.fill(text, width=width, initial_indent=f"  {name:<12}", subsequent_indent=" " * 14))

    def after(a: FitAnswer) -> str:
        if a.next_failure:
            return f"; {axis} {a.size + 1}: {a.next_failure}"
        if a.next_peak_bytes is not None:
            return f"; {axis} {a.size + 1} would peak at {human_bytes(a.next_peak_bytes)}"
        return ""

    generation = getattr(report.report, "generation", None)
    if generation is not None:
        scaled = "the prompt's length, before the new tokens" if axis == "seq" else "the number of sequences"
        field("step", f"generate, {generation.new_tokens} new tokens, {generation.cache} cache: {axis} is {scaled}")
    w = report.without_plan
    peak = f", peak {human_bytes(w.peak_bytes)}" if w.peak_bytes is not None else ""
    field("no plan", f"{axis} {w.size}{peak}{after(w)}")
    p = report.with_plan
    if p is None:
        field("with plan", "none: a forward-only step has no backward to checkpoint" if getattr(report.report, "step", "train") != "generate"
              else "none: generate has no backward to checkpoint")
    else:
        peak = f", peak {human_bytes(p.peak_bytes)}" if p.peak_bytes is not None else ""
        field("with plan", f"{axis} {p.size}{peak}{after(p)}")
        empty = p.plan is None or (p.plan.plan.empty if isinstance(p.plan, PlanResult) else p.plan.empty)
        if p.plan is not None and not empty:
            checkpoint = list(p.plan.plan.checkpoint) if isinstance(p.plan, PlanResult) else list(
                p.plan.sharding.checkpoint)
            field("checkpoint", ", ".join(checkpoint) or "(see --format json)")
            field("recompute", f"{p.plan.recompute_flops:.3g} FLOP at {axis} {p.size}; --format json has the plan, "
                               f"and --budget at that {axis} applies it")
    plain = sum(1 for probe in report.probes if not probe.with_plan)
    field("probes", f"{len(report.probes)} fake traces ({plain} of the plain step, {len(report.probes) - plain} "
                    "with a plan)")
    if report.limit:
        field("limit", f"the search stops at {report.limit}")
    for note in report.report.notes:
        field("note", note)
    return "\n".join(lines) + "\n"
