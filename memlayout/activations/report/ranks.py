"""Reporters for `memlayout activations --world-size N`: a `RanksReport` as JSON data or a table; never prints.

The JSON is the activations report (schema 1, `schema_v1.json`) with its
`summary` taken from the largest rank, plus `distributed` (how the model is laid
out; under DDP, with its gradient buckets) and `ranks` (each traced rank layout's
peak and what makes it up).
"""

from __future__ import annotations

import io
import textwrap
from typing import Any

from memlayout.activations.ranks.card import NCCL_NOTE
from memlayout.activations.ranks.ddp import DdpLayout
from memlayout.activations.ranks.facts import RankPeak, RanksCard, RanksPlan, RanksReport
from memlayout.activations.ranks.parallel import Sharding
from memlayout.activations.report.json_parts import head, model_text, summary_dict
from memlayout.format_bytes import counted, human_bytes


def _rank_dict(rank: RankPeak) -> dict[str, Any]:
    return {
        "rank": rank.rank,
        "same_layout": [list(pair) for pair in rank.same_layout],
        "peak_bytes": rank.peak_bytes,
        "parameter_bytes": rank.parameter_bytes,
        "gradient_bytes": rank.gradient_bytes,
        "optimizer_bytes": rank.optimizer_bytes,
        "activation_bytes": rank.activation_bytes,
        "communication_bytes": rank.communication_bytes,
        "temporary_bytes": rank.temporary_bytes,
        "buffer_bytes": rank.buffer_bytes,
        "input_bytes": rank.input_bytes,
        "shard_bytes": rank.shard_bytes,
        "peak_at": {"module": rank.peak_at.module, "class": rank.peak_at.class_name, "phase": rank.peak_at.phase},
        "tracker": dict(rank.tracker),
        "forward_flops": rank.forward_flops,
        **_reserved_dict(rank),
    }


def _reserved_dict(rank: RankPeak) -> dict[str, Any]:
    """On CUDA: the caching allocator's model fed by the rank's allocations, and the figure its card compares."""
    if rank.reserved is None:
        return {}
    return {
        "allocator_peak_bytes": rank.reserved.allocated_bytes,
        "reserved_peak_bytes": rank.reserved.reserved_bytes,
        "reserved_by_stream": dict(rank.reserved.reserved_by_stream),
        "compared_bytes": rank.compared_bytes,
    }


def _card_dict(card: RanksCard) -> dict[str, Any]:
    runtime = card.runtime
    return {
        "gpu": card.gpu.key, "device_name": card.gpu.device_name, "total_memory": card.gpu.total_memory,
        "memory_source": card.gpu.memory_source, "context_bytes": runtime.context_bytes,
        "outside_allocator_bytes": runtime.outside_allocator_bytes,
        "workspace_reserved_bytes": runtime.workspace_reserved_bytes, "beside_step_bytes": runtime.beside_step_bytes,
        "expandable_segments": card.expandable_segments, "unmodelled_allocator_settings": list(card.unmodelled),
        "nccl": NCCL_NOTE,
    }


def _distributed_dict(sharding: Sharding, layouts: int, ddp: DdpLayout | None) -> dict[str, Any]:
    distributed = {
        "world_size": sharding.world_size,
        "fsdp": sharding.ddp is None and not sharding.serving,
        "tp": sharding.tp,
        "data_parallel": sharding.data_parallel,
        "wrapped_modules": list(sharding.wrapped),
        "reshard_after_forward": sharding.resharded(),
        "mixed_precision": {"param_dtype": sharding.param_dtype, "reduce_dtype": sharding.reduce_dtype},
        "offload": sharding.offload,
        "tensor_parallel": [{"module": s.module, "style": s.style} for s in sharding.tp_plan],
        "layouts": layouts,
        "code": sharding.code(),
    }
    if sharding.ddp is not None and ddp is not None:
        distributed["ddp"] = {
            "bucket_cap_mb": sharding.ddp.bucket_cap_mb,
            "gradient_as_bucket_view": sharding.ddp.gradient_as_bucket_view,
            "first_bucket_cap_bytes": ddp.first_cap_bytes,
            "bucket_cap_bytes": ddp.cap_bytes,
            "bucket_bytes": ddp.nbytes,
            "buckets": [{"index": b.order, "bytes": b.nbytes, "parameters": b.parameters, "dtype": b.dtype}
                        for b in ddp.buckets],
        }
    return distributed


def _plan_dict(plan: RanksPlan) -> dict[str, Any]:
    return {
        "budget_bytes": plan.budget_bytes,
        "checkpoint": list(plan.sharding.checkpoint),
        "sequential": [{"module": m, "segments": s} for m, s in plan.sharding.sequential],
        "peak_bytes": plan.peak_bytes,
        "allocator_peak_bytes": max((r.reserved.allocated_bytes for r in plan.ranks if r.reserved is not None),
                                    default=None),
        "compared_bytes": plan.judged_bytes,
        "estimated_peak_bytes": plan.estimated_peak_bytes if plan.estimated_peak_bytes is not None else plan.peak_bytes,
        "recompute_flops": plan.recompute_flops,
        "checks": plan.checks,
        "pitfalls": list(plan.pitfalls),
        "reshard_after_forward": list(plan.resharded),
        "offload": plan.offload,
        "ranks": [_rank_dict(r) for r in plan.ranks],
        "code": plan.sharding.code(),
        "excluded": [{"module": path, "reason": reason} for path, reason in plan.excluded],
    }


def ranks_report_dict(report: RanksReport) -> dict[str, Any]:
    """The report as plain JSON-ready data (activations schema 1, with `distributed` and `ranks`)."""
    return {
        **head(report),
        "autocast": report.autocast,
        "dtype": report.dtype,
        "optimizer_state_dtype": report.optimizer_state_dtype,
        "summary": {**summary_dict(report.summary), "rank": report.largest.rank},
        "modules": [],
        "plan": None if report.plan is None else _plan_dict(report.plan),
        "fallbacks": [],
        "data_dependent": [],
        "notes": list(report.notes),
        "distributed": _distributed_dict(report.sharding, report.layouts, report.ddp),
        "ranks": [_rank_dict(r) for r in report.ranks],
        "step": report.step,
        "recipe": list(report.recipe),
        **({"card": _card_dict(report.card)} if report.card is not None else {}),
    }


def _ranges(rank: RankPeak) -> str:
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in rank.same_layout)


def _where(rank: RankPeak, with_class: bool = True) -> str:
    at = rank.peak_at
    if at.module is None:
        return at.phase
    name = at.module or "the model"
    return f"{name} ({at.class_name}), {at.phase}" if with_class else f"{name}, {at.phase}"


def _ranks_table(title: str, ranks: tuple[RankPeak, ...], ddp: bool = False, serving: bool = False) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    reserved = any(r.reserved is not None for r in ranks)
    columns = ("ranks", "peak", *(("reserved",) if reserved else ()), "params", "grads", "optimizer", "activations",
               "temps", "inputs", "comms", "peak at")
    for name in columns:
        table.add_column(name, justify="left" if name in ("ranks", "peak at") else "right")
    for r in ranks:
        table.add_row(
            _ranges(r), human_bytes(r.peak_bytes),
            *((human_bytes(r.reserved.reserved_bytes) if r.reserved is not None else "",) if reserved else ()),
            human_bytes(r.parameter_bytes + r.buffer_bytes),
            human_bytes(r.gradient_bytes), human_bytes(r.optimizer_bytes), human_bytes(r.activation_bytes),
            human_bytes(r.temporary_bytes), human_bytes(r.input_bytes), human_bytes(r.communication_bytes),
            _where(r, with_class=False),
        )
    table.caption = ("params: each rank's shards; activations and temps: the forward's, alive at the peak; comms: "
                     "the all-reduces' outputs" if serving else
                     "params: the whole model on every rank; temps: made in backward; comms: DDP's gradient buckets"
                     if ddp else "params: shards and gathered blocks; temps: made in backward; comms: all-gather and "
                     "reduce-scatter buffers")
    return table


def _serving_lines(sharding: Sharding) -> list[str]:
    lines = [f"tensor parallel over {sharding.tp} ranks, to serve: no FSDP2; each rank holds its shards of the "
             "projections and the rest of the model whole"]
    for style in ("colwise", "rowwise"):
        members = [s.module for s in sharding.tp_plan if s.style == style]
        lines.append(f"{style}: {_span(members)} ({counted(len(members), 'module')})")
    return lines


def _step_text(report: RanksReport) -> str:
    """What each rank runs, as the single-device report says it."""
    if report.step == "inference":
        return f"forward only, eval mode, torch.inference_mode; fake tensors on {report.device}"
    if report.step == "generate":
        return f"model.generate, eval mode, torch.inference_mode; fake tensors on {report.device}"
    return f"forward, backward, optimizer {report.optimizer}; fake tensors on {report.device}"


def _sharding_lines(sharding: Sharding) -> list[str]:
    blocks = [p for p in sharding.wrapped if p]
    held = [p for p, on in sharding.resharded().items() if p and not on]
    lines = [
        f"FSDP2 over {sharding.data_parallel} ranks: fully_shard on {len(blocks)} module"
        f"{'' if len(blocks) == 1 else 's'}{' (' + _span(blocks) + ')' if blocks else ''}, then the root",
        "reshard after forward: " + ("every wrapped module" if not held else
                                     "none" if len(held) == len(blocks) else f"all but {_span(held)}"),
    ]
    if sharding.param_dtype or sharding.reduce_dtype:
        lines.append(f"mixed precision: parameters in {sharding.param_dtype or 'their dtype'}, gradients reduced in "
                     f"{sharding.reduce_dtype or 'the compute dtype'}")
    if sharding.offload:
        lines.append("CPU offload: parameters, gradients and optimizer state on the host")
    if sharding.tp > 1:
        for style in ("colwise", "rowwise"):
            members = [s.module for s in sharding.tp_plan if s.style == style]
            lines.append(f"tensor parallel over {sharding.tp}, {style}: {_span(members)} ({counted(len(members), 'module')})")
    return lines


def _ddp_lines(sharding: Sharding, layout: DdpLayout) -> list[str]:
    """DDP's replicas, its buckets and where the gradients live."""
    assert sharding.ddp is not None
    sizes = ", ".join(human_bytes(b.nbytes) for b in layout.buckets[:6]) + (", ..." if len(layout.buckets) > 6 else "")
    cap = (f"{human_bytes(layout.cap_bytes)} each, the first {human_bytes(layout.first_cap_bytes)} (DDP's defaults)"
           if sharding.ddp.bucket_cap_mb is None else
           f"{human_bytes(layout.cap_bytes)} each (bucket_cap_mb={sharding.ddp.bucket_cap_mb:g})")
    return [
        f"DDP over {sharding.world_size} ranks: every rank holds the whole model, its gradients and its optimizer's "
        "state",
        f"gradient buckets: {counted(len(layout.buckets), 'bucket')}, {human_bytes(layout.nbytes)} in all ({sizes}), "
        "reduced in this order as backward makes their gradients",
        f"bucket cap: {cap}; a bucket closes once it reaches the cap",
        "gradients: views of the buckets (gradient_as_bucket_view=True)" if layout.gradient_as_bucket_view else
        "gradients: tensors of their own beside the buckets, copied back after each allreduce (DDP's default; "
        "--gradient-as-bucket-view makes them views of the buckets)",
    ]


def _precision_lines(report: RanksReport) -> list[str]:
    """What the step computes in: --autocast, --dtype, and the dtype torch's optimizer keeps its state in."""
    lines = []
    if report.autocast:
        lines.append(f"autocast: forward and loss under torch.autocast({report.device.split(':')[0]!r}, "
                     f"{report.autocast})")
    if report.dtype:
        lines.append(f"parameters: {report.dtype}, cast before sharding")
    asked = report.autocast or report.dtype or report.sharding.param_dtype
    if report.optimizer_state_dtype and asked:
        lines.append(f"optimizer state: {report.optimizer_state_dtype}, as torch's {report.optimizer} keeps it (its "
                     "parameters' dtype; no float32 copy)")
    return lines


def _span(paths: list[str]) -> str:
    """A few paths, or the first and the last of many."""
    if len(paths) <= 3:
        return ", ".join(paths)
    return f"{paths[0]} ... {paths[-1]}"


def render_ranks_table(report: RanksReport, *, width: int = 120, color: bool = False) -> str:
    """The terminal report: the largest rank, each traced layout's breakdown, the sharding, the plan and its code."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.syntax import Syntax
    from rich.text import Text

    from memlayout.output.terminal import text_console

    ddp = report.sharding.ddp is not None and report.ddp is not None
    serving = report.sharding.serving
    title = f"memlayout activations: {report.target or report.model_class} on {report.sharding.world_size} ranks"
    parts: list[Any] = [Panel(_ranks_grid(report), title=title, title_align="left", expand=False)]
    parts.append(_ranks_table("each rank at its peak (memlayout's trace of the DDP step; every rank alike)" if ddp else
                              "each rank at its peak (memlayout's trace of the tensor-parallel step; every rank alike)"
                              if serving else
                              "each rank at its peak (FSDPMemTracker's accounting; one row per shard layout)",
                              report.ranks, ddp, serving))
    plan = report.plan
    if plan is not None:
        parts.append(Text("\n".join(_plan_lines(plan, width))))
        if not plan.empty:
            parts.append(_ranks_table("each rank with the plan applied", plan.ranks, ddp))
    code = (plan.sharding if plan is not None else report.sharding).code()
    parts.append(Text("the code that wraps the model as traced (plain torch; on every rank, train the module "
                      "wrap(model) returns):" if ddp else
                      "the code that lays the model out as traced (plain torch; call shard(model) on every rank):"))
    parts.append(Syntax(code, "python", theme="ansi_dark", background_color="default") if color else Text(code))
    notes = [*(f"recipe: {', '.join(report.recipe)}",) * bool(report.recipe), *report.notes,
             *((NCCL_NOTE,) if report.card is not None else ())]
    if report.card is not None and report.card.unmodelled:
        notes.append(f"PYTORCH_CUDA_ALLOC_CONF's {', '.join(report.card.unmodelled)} not modelled: the reserved "
                     "figures are the allocator's without them")
    for note in notes:
        parts.append(Text(textwrap.fill(note, width=width, initial_indent="note: ", subsequent_indent="      ")))
    buffer = io.StringIO()
    console = text_console(buffer, width, color, color_system="standard")
    console.print(Group(*parts))
    return buffer.getvalue()


def _ranks_grid(report: RanksReport) -> Any:
    """The boxed summary: the model, the largest rank's peak, the layout of the ranks, the batch, step and precision."""
    from rich.table import Table

    largest = report.largest
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("model", model_text(report.model_class, report.class_chosen_by))
    grid.add_row("peak per rank", f"{human_bytes(largest.peak_bytes)} ({largest.peak_bytes:,} bytes) on the largest "
                                  f"rank, {largest.rank}, at {_where(largest)}")
    for name, text in _card_rows(report):
        grid.add_row(name, text)
    layout_lines = (_ddp_lines(report.sharding, report.ddp) if report.ddp is not None else
                    _serving_lines(report.sharding) if report.sharding.serving else _sharding_lines(report.sharding))
    for line in layout_lines:
        head, _, rest = line.partition(": ")
        grid.add_row(head, rest)
    grid.add_row("each rank's batch", ", ".join(report.inputs))
    grid.add_row("step", _step_text(report))
    for line in _precision_lines(report):
        head, _, rest = line.partition(": ")
        grid.add_row(head, rest)
    return grid


def _card_rows(report: RanksReport) -> list[tuple[str, str]]:
    """On CUDA: the largest rank's reserved peak by stream, and the card's memory against it and the runtime."""
    card, largest = report.card, report.largest
    if card is None or largest.reserved is None or largest.compared_bytes is None:
        return []
    streams = ", ".join(f"{name} {human_bytes(size)}" for name, size in largest.reserved.reserved_by_stream)
    how = "expandable segments" if card.expandable_segments else "the default settings"
    runtime = card.runtime.beside_step_bytes
    headroom = card.gpu.total_memory - largest.compared_bytes
    return [
        ("reserved per rank", f"{human_bytes(largest.reserved.reserved_bytes)} (the caching allocator's segments, "
                              f"{how}, fed by the rank's own allocations: {streams})"),
        ("on the card", f"{human_bytes(largest.compared_bytes)} = reserved + {human_bytes(runtime)} of CUDA context, "
                        f"cuBLAS and its workspaces; {card.gpu.device_name} has {human_bytes(card.gpu.total_memory)} "
                        f"({card.gpu.memory_source}): "
                        + (f"{human_bytes(headroom)} to spare" if headroom >= 0 else
                           f"{human_bytes(-headroom)} over")),
    ]


def _plan_lines(plan: RanksPlan, width: int) -> list[str]:
    """The plan for the budget, one field a line: what it reshards, checkpoints and offloads, and its peak."""
    lines = [f"plan for a budget of {human_bytes(plan.budget_bytes)} per rank"]

    def field(name: str, text: str) -> None:
        lines.append(textwrap.fill(text, width=width, initial_indent=f"  {name:<11}", subsequent_indent=" " * 13))

    if plan.empty:
        field("fits", f"nothing to change: the largest rank's peak {human_bytes(plan.peak_bytes)} is within the budget")
    if plan.resharded:
        field("reshard", f"reshard_after_forward=True on {_span(list(plan.resharded))} "
                         f"({counted(len(plan.resharded), 'module')}): one more all-gather each in backward")
    if plan.sharding.checkpoint:
        field("checkpoint", ", ".join(plan.sharding.checkpoint))
    for module, segments in plan.sharding.sequential:
        field("sequential", f"{module} in {segments} segments (checkpoint_sequential)")
    if plan.offload:
        field("offload", "CPUOffloadPolicy on every wrapped module")
    if not plan.empty:
        plural = "" if plan.checks == 1 else "s"
        compared = ("" if plan.judged_bytes == plan.peak_bytes else
                    f"; {human_bytes(plan.judged_bytes)} reserved with the CUDA runtime, compared with the budget")
        field("peak", f"{human_bytes(plan.peak_bytes)} on the largest rank, traced with the plan applied "
                      f"({plan.checks} plan{plural} traced){compared}")
        for pitfall in plan.pitfalls:
            field("pitfall", pitfall)
    return lines
