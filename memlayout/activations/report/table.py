"""`memlayout activations`' terminal report (rich): summary, modules, the plan. Never printed here."""

from __future__ import annotations

import io
import textwrap
from typing import Any

from memlayout.activations.analysis import ActivationReport
from memlayout.activations.assumptions import ASSUMPTIONS
from memlayout.activations.device.cuda_runtime import chosen_workspace_size, cuda_runtime
from memlayout.activations.fit.size_search import FitReport
from memlayout.activations.fit.sweep import SweepReport
from memlayout.activations.ranks.facts import RanksReport
from memlayout.activations.report.fit import render_fit_table, seconds_text
from memlayout.activations.report.generate import STEP_TEXT, add_generate_rows
from memlayout.activations.report.json_parts import model_text
from memlayout.activations.report.ranks import render_ranks_table
from memlayout.activations.report.sweep import render_sweep_table
from memlayout.activations.report.weights import render_weights_table
from memlayout.activations.weights import WeightsReport
from memlayout.format_bytes import human_bytes
from memlayout.output.interface import Formatter

DEFAULT_DEPTH = 3


def flops_text(count: int) -> str:
    """1.2e12 -> "1.20 TFLOP"."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count} FLOP"


def report_roofline(report: ActivationReport) -> str:
    return report.roofline or "the target"


def module_label(path: str | None) -> str:
    if path is None:
        return "outside the model"
    return path or "the model"


def render_table(report: ActivationReport, *, depth: int = DEFAULT_DEPTH, width: int = 120, color: bool = False) -> str:
    """The terminal report: summary, modules down to `depth`, and the plan."""
    from rich.console import Group

    from memlayout.output.terminal import text_console

    parts_out: list[Any] = [_summary_panel(report, width), _modules_table(report, depth)]
    if report.plan is not None:
        parts_out.append(_plan_text(report, width))
    parts_out.extend(_notes(report, width))
    buffer = io.StringIO()
    console = text_console(buffer, width, color, color_system="standard")
    console.print(Group(*parts_out))
    return buffer.getvalue()


def _summary_panel(report: ActivationReport, width: int = 120) -> Any:
    """The boxed summary: the model, the peak and what makes it up, the step as traced in the box's edges.

    rich cuts a subtitle wider than the box (`| optimizer: adamw | pa─╯` at 120 columns): one that does not fit
    `width` is the box's last line instead, wrapped there.
    """
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    s = report.summary
    live = ", ".join(f"{name.replace('_', ' ')} {human_bytes(v)}" for name, v in s.at_peak.items() if v)
    title = f"memlayout activations: {report.target or report.model_class}"
    precision = "".join((
        f" | autocast {report.autocast}" if report.autocast else "",
        f" | parameters {report.dtype}" if report.dtype else "",
    ))
    step = f" | step: {report.step}" if report.step != "train" else ""
    subtitle = (f"{', '.join(report.inputs)} | {report.mode} on {report.device} | loss: {report.loss} | "
                f"optimizer: {report.optimizer}{precision}{step}")
    lines = [Text.assemble(("model", "bold"), f"  {model_text(report.model_class, report.class_chosen_by)}"),
             _summary_grid(report), Text.assemble(("live at the peak", "bold"), f"  {live}")]
    fits = len(subtitle) + 8 <= width  # the corners, a rule on each side, and a space each side of the text
    if not fits:
        lines.append(Text.assemble(("traced", "bold"), f"  {subtitle}"))
    return Panel(Group(*lines), title=title, subtitle=subtitle if fits else None, title_align="left", expand=False)


def _summary_grid(report: ActivationReport) -> Any:
    from rich.table import Table

    s = report.summary
    grid = Table.grid(padding=(0, 2))
    for style in ("bold", "", "bold", ""):
        grid.add_column(style=style)
    at = s.peak_at
    where = module_label(at.module) + (f" ({at.class_name})" if at.class_name else "")
    grid.add_row("peak", human_bytes(s.peak_bytes), "at", f"{where}, {at.phase}")
    if s.peak_bytes_min is not None and s.peak_bytes_max is not None:
        grid.add_row("peak range", f"{human_bytes(s.peak_bytes_min)} - {human_bytes(s.peak_bytes_max)}", "over",
                     "the assumptions below, from one extreme to the other")
    if s.allocator_peak_bytes is not None:
        grid.add_row("peak in CUDA blocks", human_bytes(s.allocator_peak_bytes), "reserved",
                     "" if s.reserved_peak_bytes is None else
                     f"{human_bytes(s.reserved_peak_bytes)} (the caching allocator's segments, over two steps)")
    if report.device.startswith("cuda"):
        _cuda_runtime_rows(grid, s, report.cuda_capability)
    if report.predicted_peak_bytes is not None:
        grid.add_row("predicted", human_bytes(report.predicted_peak_bytes), "measured",
                     f"{human_bytes(s.peak_bytes)} (the peak, in the real step): "
                     f"{_difference(report.predicted_peak_bytes, s.peak_bytes)}")
    if report.generation is not None:
        add_generate_rows(grid, report.generation)
    grid.add_row("activations", human_bytes(s.activation_bytes), "saved for backward",
                 "each storage once, model state excluded")
    grid.add_row("parameters", human_bytes(s.parameter_bytes), "gradients", human_bytes(s.gradient_bytes))
    _adapter_rows(grid, report)
    grid.add_row("inputs", human_bytes(s.input_bytes), "forward", flops_text(s.forward_flops))
    optimizer = "none (forward and backward only)" if report.optimizer == "none" else report.optimizer
    if report.step == "inference":
        optimizer = "none (forward only, under torch.inference_mode, the model in eval mode: no gradients)"
    elif report.step == "generate":
        optimizer = STEP_TEXT
    # Its dtype is said where precision was asked for: torch keeps the state in the parameters' dtype.
    precise = report.optimizer_state_dtype and (report.autocast or report.dtype)
    state = human_bytes(s.optimizer_bytes) + (f" in {report.optimizer_state_dtype}" if precise else "")
    grid.add_row("optimizer", optimizer, "its state", state)
    return grid


def _modules_table(report: ActivationReport, depth: int) -> Any:
    """One row per module down to `depth`, indented under its parent."""
    from rich.table import Table

    table = Table(title=f"modules (depth <= {depth}; --depth N, or --format json for all)", title_justify="left")
    for name, justify in (("module", "left"), ("class", "left"), ("calls", "right"), ("saved", "right"),
                          ("output", "right"), ("forward", "right"), ("notes", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    shown = [m for m in report.modules if (m.path.count(".") + 1 if m.path else 0) <= depth]
    shown_paths = {m.path for m in shown}
    for m in shown:
        ancestors = sum(1 for p in shown_paths if p != m.path and (p == "" or m.path.startswith(p + ".")))
        notes = [name for flag, name in ((m.uses_randomness, "random"), (m.mutates_buffers, "updates buffers"),
                                         (m.reads_outside_state, "reads outside state"),
                                         (m.moves_device, "moves device"), (m.mutates_inputs, "writes its input"),
                                         (m.changes_state is not None, "changes its state")) if flag]
        table.add_row("  " * ancestors + module_label(m.path), m.class_name, str(m.calls), human_bytes(m.saved_bytes),
                      human_bytes(m.output_bytes), flops_text(m.forward_flops), ", ".join(notes))
    hidden = len(report.modules) - len(shown)
    if hidden:
        table.caption = f"{hidden} deeper modules not shown"
    return table


def _notes(report: ActivationReport, width: int) -> list[Any]:
    """The assumptions the trace made, the fake kernels' fallbacks, and the report's notes, one paragraph each."""
    from rich.text import Text

    texts = []
    for kind in dict.fromkeys(kind for _, kind, _ in report.data_dependent):
        ops = ", ".join(f"{op} ({count}x)" for op, k, count in report.data_dependent if k == kind)
        texts.append(f"assumed, as the weights have no values here: {ASSUMPTIONS[kind]} ({ops})")
    if report.fallbacks:
        ops = ", ".join(f"{op} ({count}x)" for op, count in report.fallbacks)
        texts.append(f"these ops' fake kernels refused them or needed values, and their real CPU kernels gave the "
                     f"outputs' shapes, run on zeros where the values came from the weights: {ops}")
    texts.extend(report.notes)
    return [Text(textwrap.fill(text, width=width, initial_indent="note: ", subsequent_indent="      "))
            for text in texts]


def _adapter_rows(grid: Any, report: ActivationReport) -> None:
    """Trainable against frozen parameters, where some are frozen; what --quantize and --lora made."""
    split, adapted = report.parameters, report.adapted
    if split is not None and split.frozen_count:
        state = (f", of which the quantization state {human_bytes(split.quantization_state_bytes)}"
                 if split.quantization_state_bytes else "")
        grid.add_row("trainable", f"{human_bytes(split.trainable_bytes)}", "frozen",
                     f"{human_bytes(split.frozen_bytes)} ({split.trainable_count:,} parameters train, "
                     f"{split.frozen_count:,} stored frozen{state})")
    if adapted is not None and adapted.quantized is not None:
        q = adapted.quantized
        kept = f"; kept whole: {', '.join(q.kept)}" if q.kept else ""
        grid.add_row("quantized", q.method, "layers", f"{q.layers} linear layers in bitsandbytes' layers{kept}")
    if adapted is not None and adapted.lora is not None:
        lora = adapted.lora
        grid.add_row("DoRA" if lora.dora else "LoRA", f"rank {lora.rank}", "on",
                     f"{', '.join(lora.targets)} ({lora.adapted_modules} layers; alpha {lora.alpha:g}, "
                     f"dropout {lora.dropout:g})")


def _workspace_source(capability: tuple[int, int] | None, per_handle: int) -> str:
    """Where cuBLAS's workspace per handle comes from (cuda_runtime.chosen_workspace_size): CUBLAS_WORKSPACE_CONFIG,
    or torch's default for the card, which is larger on sm 9.0 (Hopper) alone."""
    if per_handle != chosen_workspace_size(capability, {}):
        return "CUBLAS_WORKSPACE_CONFIG"
    if capability is None or capability == (9, 0):
        return "torch's default on Hopper"
    return f"torch's default on sm {capability[0]}.{capability[1]}"


def _cuda_runtime_rows(grid: Any, s: Any, capability: tuple[int, int] | None) -> None:
    """The CUDA context and cuBLAS's workspaces: memory the step's process holds that no tensor of the step is."""
    runtime = cuda_runtime(capability)
    grid.add_row("CUDA context", human_bytes(runtime.context_bytes), "outside",
                 f"the allocator; measured on {runtime.context_measured_on}, and it varies with the driver")
    grid.add_row("cuBLAS itself", human_bytes(runtime.outside_allocator_bytes), "outside",
                 "the allocator: its kernels and handle, measured on the same GPU")
    grid.add_row("cuBLAS workspaces", human_bytes(runtime.workspace_bytes), "from",
                 f"the allocator, not in the peak: {runtime.cublas_handles} cuBLAS handles (forward's and backward's "
                 f"threads) x {human_bytes(runtime.cublas_workspace_bytes)} "
                 f"({_workspace_source(capability, runtime.cublas_workspace_bytes)}), "
                 f"and cuBLASLt's {human_bytes(runtime.cublaslt_workspace_bytes)}")
    if s.reserved_peak_bytes is not None:
        total = s.reserved_peak_bytes + runtime.beside_step_bytes
        grid.add_row("on the GPU", human_bytes(total), "is",
                     "reserved, the workspaces' segments, cuBLAS and the context together: what must fit the card")


def _plan_text(report: ActivationReport, width: int) -> Any:
    from rich.text import Text

    plan = report.plan
    assert plan is not None
    lines = [f"plan for a budget of {human_bytes(plan.budget_bytes)}"]

    def field(name: str, text: str) -> None:
        lines.append(textwrap.fill(text, width=width, initial_indent=f"  {name:<11}", subsequent_indent=" " * 13))

    compared = ("the peak" if plan.compared == "peak"
                else "the reserved peak plus the CUDA context, cuBLAS and its workspaces")
    if plan.plan.empty:
        field("fits", f"nothing to checkpoint: {compared}, {human_bytes(plan.judged_bytes)}, is within the budget")
        return Text("\n".join(lines))
    if plan.plan.checkpoint:
        field("checkpoint", ", ".join(module_label(p) for p in plan.plan.checkpoint))
    for item in plan.plan.sequential:
        field("sequential", f"{module_label(item.module)} in {item.segments} segments (checkpoint_sequential)")
    runs: dict[str, list[str]] = {}
    for segment in plan.plan.segments:
        runs.setdefault(segment.module, []).append(f"{segment.first}-{segment.last}")
    for module, spans in runs.items():
        listed = spans[0] if len(spans) == 1 else f"{', '.join(spans[:-1])} and {spans[-1]}, each"
        field("segments", f"{module_label(module)}: children {listed} as one segment")
    share = plan.recompute_seconds / report.summary.forward_seconds if report.summary.forward_seconds else 0.0
    plural = "" if plan.checks == 1 else "s"
    field("peak", f"{human_bytes(plan.peak_bytes)}, traced with the plan applied (estimated "
                  f"{human_bytes(plan.estimated_peak_bytes)}; {plan.checks} plan{plural} traced)")
    if plan.compared != "peak":
        field("compared", f"{compared}: {human_bytes(plan.judged_bytes)}, within the budget")
    field("recompute", f"{flops_text(plan.recompute_flops)}, {seconds_text(plan.recompute_seconds)} "
                       f"({share:.0%} of the forward's time)")
    field("priced at", f"the roofline of {report_roofline(report)}")
    if plan.cut_short:
        field("search", plan.cut_short)
    field("apply it", "memlayout.activations.apply_plan(model, plan) with report.plan.plan in Python, or the "
                      "\"plan\" object of --format json")
    for pitfall in plan.pitfalls:
        field("pitfall", pitfall)
    for path, reason in plan.excluded:
        field("excluded", f"{module_label(path)}: {reason}")
    return Text("\n".join(lines))


class ActivationsTable(Formatter["ActivationReport | RanksReport | FitReport | SweepReport | WeightsReport"]):
    """The terminal report, modules down to `depth`; across ranks, each rank's breakdown and the sharding code;
    without inputs, the weights in each dtype."""

    def __init__(self, depth: int = DEFAULT_DEPTH, width: int = 120, color: bool = False) -> None:
        self.depth = depth
        self.width = width
        self.color = color

    def render(self, report: ActivationReport | RanksReport | FitReport | SweepReport | WeightsReport) -> str:
        if isinstance(report, WeightsReport):
            return render_weights_table(report, width=self.width, color=self.color)
        if isinstance(report, FitReport):
            return render_fit_table(report, width=self.width)
        if isinstance(report, SweepReport):
            return render_sweep_table(report, width=self.width, color=self.color)
        if isinstance(report, RanksReport):
            return render_ranks_table(report, width=self.width, color=self.color)
        return render_table(report, depth=self.depth, width=self.width, color=self.color)


def _difference(predicted: int, measured: int) -> str:
    """"the same", or "predicted 1.2% high (+1.5 KiB)": how far the fake-tensor prediction was off."""
    if predicted == measured:
        return "the same, to the byte"
    off = predicted - measured
    share = abs(off) / measured if measured else 1.0
    return f"predicted {share:.1%} {'high' if off > 0 else 'low'} ({'+' if off > 0 else '-'}{human_bytes(abs(off))})"
