"""`memlayout activations --fit`'s report: the table and the JSON of a `FitReport`. Never printed here.

The JSON is the activations report (schema 1) of the plain step at the size that
fits without checkpointing, with a `fit` object added.
"""

from __future__ import annotations

import textwrap
from typing import Any

from memlayout.activations.fit.size_search import FitAnswer, FitReport
from memlayout.activations.report.json_parts import model_text, plan_dict
from memlayout.activations.report.ranks import _plan_dict as ranks_plan_dict
from memlayout.activations.search import PlanResult
from memlayout.format_bytes import human_bytes


def seconds_text(seconds: float) -> str:
    """0.0123 -> "12.3 ms"."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns" if seconds else "0 s"


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
            "compared_bytes": a.compared_bytes if a.compared_bytes is not None else a.peak_bytes,
            "next_compared_bytes": a.next_compared_bytes if a.next_compared_bytes is not None else a.next_peak_bytes,
            "next_checks": a.next_checks,
            "next_cut_short": a.next_cut_short,
        }

    return {
        "axis": report.axis,
        "dims": [{"input": d.input, "dim": d.dim} for d in report.dims],
        "given_size": report.given_size,
        "budget_bytes": report.budget_bytes,
        "budget_from": report.budget_from,
        "compared": report.compared,
        "world_size": report.world_size,
        "without_plan": answer(report.without_plan),
        "with_plan": answer(report.with_plan),
        "limit": report.limit,
        "floor": None if report.floor is None else {"size": report.floor.size,
                                                     "compared_bytes": report.floor.compared_bytes},
        "probes": [
            {"size": p.size, "with_plan": p.with_plan, "peak_bytes": p.peak_bytes, "compared_bytes": p.judged_bytes,
             "fits": p.fits, "failure": p.failure, "checks": p.checks, "cut_short": p.cut_short,
             "evaluated": p.evaluated}
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
        f"  model       {model_text(report.report.model_class, report.report.class_chosen_by)}",
        f"  budget      {human_bytes(report.budget_bytes)} ({report.budget_from}){ranks}",
        f"  compared    {report.compared}",
        f"  scaled      {'; '.join(f'{d.input} dim {d.dim}' for d in report.dims)} (given {report.given_size})",
    ]

    def field(name: str, text: str) -> None:
        lines.append(textwrap.fill(text, width=width, initial_indent=f"  {name:<12}", subsequent_indent=" " * 14))

    generation = getattr(report.report, "generation", None)
    if generation is not None:
        scaled = "the prompt's length, before the new tokens" if axis == "seq" else "the number of sequences"
        field("step", f"generate, {generation.new_tokens} new tokens, {generation.cache} cache: {axis} is {scaled}")
    for name, text in _answer_fields(report):
        field(name, text)
    plain = sum(1 for probe in report.probes if not probe.with_plan)
    evaluated = sum(1 for probe in report.probes if probe.evaluated)
    # A size through the budget search traces the plain step there and each plan the search tries.
    aimed = "" if report.floor is None else (
        f"; first the lowest plan at {axis} {report.floor.size}, to aim the budget search "
        f"({human_bytes(report.floor.compared_bytes)})")
    shown = f", {evaluated} of them evaluated from its traces at other sizes" if evaluated else ""
    field("probes", f"{len(report.probes)} sizes traced ({plain} of the plain step{shown}, "
                    f"{len(report.probes) - plain} through the budget search){aimed}")
    if report.limit:
        field("limit", f"the search stops at {report.limit}")
    for note in report.report.notes:
        field("note", note)
    return "\n".join(lines) + "\n"


def _answer_fields(report: FitReport) -> list[tuple[str, str]]:
    """(field, text) for the answer without a plan, the one with, and the plan."""
    axis = report.axis
    w = report.without_plan
    figures = _shown(w.peak_bytes, w.compared_bytes)
    fields = [("no plan", f"{axis} {w.size}{', ' + figures if figures else ''}{_after(w, axis, False)}")]
    p = report.with_plan
    if p is None:
        fields.append(("with plan", "none: a forward-only step has no backward to checkpoint"
                       if getattr(report.report, "step", "train") != "generate"
                       else "none: generate has no backward to checkpoint"))
        return fields
    figures = _shown(p.peak_bytes, p.compared_bytes)
    fields.append(("with plan", f"{axis} {p.size}{', ' + figures if figures else ''}{_after(p, axis, True)}"))
    empty = p.plan is None or (p.plan.plan.empty if isinstance(p.plan, PlanResult) else p.plan.empty)
    if p.plan is not None and not empty:
        checkpoint = list(p.plan.plan.checkpoint) if isinstance(p.plan, PlanResult) else list(
            p.plan.sharding.checkpoint)
        if isinstance(p.plan, PlanResult):
            checkpoint += [f"{s.module or 'the model'} in {s.segments} segments" for s in p.plan.plan.sequential]
            checkpoint += [f"{s.module or 'the model'} children {s.first}-{s.last}" for s in p.plan.plan.segments]
        fields.append(("checkpoint", ", ".join(checkpoint) or "(see --format json)"))
        seconds = (f"{seconds_text(p.plan.recompute_seconds)}, " if isinstance(p.plan, PlanResult) else "")
        fields.append(("recompute", f"{seconds}{p.plan.recompute_flops:.3g} FLOP at {axis} {p.size}; --format json "
                                    f"has the plan, and --budget at that {axis} finds it"))
    return fields


def _shown(peak: int | None, compared: int | None) -> str:
    if peak is None:
        return ""
    text = f"peak {human_bytes(peak)}"
    return text if compared is None or compared == peak else f"{text}, compared {human_bytes(compared)}"


def _after(a: FitAnswer, axis: str, planned: bool) -> str:
    """What the size after the answer did: the step failed, it would peak over, or the search found no plan."""
    if a.next_failure:
        return f"; {axis} {a.size + 1}: {a.next_failure}"
    if a.next_peak_bytes is None:
        return ""
    figures = _shown(a.next_peak_bytes, a.next_compared_bytes)
    if not planned:
        return f"; {axis} {a.size + 1} would {figures.replace('peak ', 'peak at ', 1)}"
    tried = f"; {a.next_cut_short}" if a.next_cut_short else ""
    return (f"; at {axis} {a.size + 1} the budget search finds no plan ({a.next_checks} plans traced{tried}; "
            f"the lowest: {figures})")
