"""Every rule between a step's settings, in one table, checked once when a `StepRequest` is made.

A rule is a `Refusal`: the pipelines it applies to, what it looks for, and the one line
it refuses with. Its message and hint name settings in backquotes (`world_size`,
`step=generate`), which the command line writes as its flags; `{given}` is the setting
that set the rule off, and any other `{name}` the request's value of that setting. The
first rule that applies is the error, so the table's order is the order a user meets them.

The request is typed Any here: step_request.py, which defines it, checks it against
this table, and a module of this package must not import the one that imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, NamedTuple

from memlayout.activations.request.vocabulary import (
    AUTOCAST,
    CACHES,
    CLIP_IMPLS,
    FORWARDS,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PLOT_SUFFIXES,
    PRECISIONS,
    QUANTIZE_METHODS,
    RESHARD_PRESETS,
    SAC_PRESETS,
    SAC_SAVES,
    SHARDED_DTYPES,
    STEPS,
    Pipeline,
    fit_axis,
    sweep_spec,
)
from memlayout.errors import SettingError

ALL = frozenset(Pipeline)
ONE_STEP = frozenset({Pipeline.STEP, Pipeline.FIT, Pipeline.SWEEP})
SHARDED = frozenset({Pipeline.RANKS, Pipeline.FIT})
RANKS = frozenset({Pipeline.RANKS})
FIT = frozenset({Pipeline.FIT})
SIZES = frozenset({Pipeline.FIT, Pipeline.SWEEP})
"""The pipelines that scale the inputs' sizes: `fit`, and `sweep` (with or without `fit`)."""
SWEEP = frozenset({Pipeline.SWEEP})

STEP_SETTINGS = ("input", "inputs", "budget", "fit", "sweep", "world_size", "real", "step", "autocast", "dtype", "device",
                 "gpu", "gpu_memory", "lora", "lora_targets", "lora_dropout", "dora", "quantize")
"""The settings that ask for a step: without any of them, a request is for the weights alone."""
ADAPTER_SETTINGS = ("lora", "lora_targets", "lora_dropout", "dora", "quantize")
FSDP_SETTINGS = ("fsdp_modules", "no_reshard_after_forward", "param_dtype", "reduce_dtype", "allow_offload",
                 "reshard_after_forward")
DDP_SETTINGS = ("bucket_cap_mb", "gradient_as_bucket_view")
RANK_SETTINGS = ("fsdp", *FSDP_SETTINGS, "tp", "ddp", *DDP_SETTINGS)
"""The settings that shape ranks: each needs `world_size`."""
SERVING_HINT = "measure real ranks under torchrun (the CPU allocator's events, torch.profiler), and predict for `device=cpu`"
TRAINING_HINT = "measure real ranks under torchrun (FSDPMemTracker), and predict for `device=cpu` or cuda"

_DEFAULTS: dict[type, dict[str, Any]] = {}


def given(request: Any, name: str) -> bool:
    """Whether a setting differs from its default: what "the user gave it" means to a rule."""
    kind = type(request)
    if kind not in _DEFAULTS:
        _DEFAULTS[kind] = {f.name: f.default for f in fields(kind)}
    return bool(getattr(request, name) != _DEFAULTS[kind][name])


def first_given(request: Any, names: tuple[str, ...]) -> str | None:
    """The first of `names` the request gives; None when it gives none."""
    return next((name for name in names if given(request, name)), None)


class Refusal(NamedTuple):
    """One rule: where `when` names a setting (or says True) for a request of `pipelines`, the request is refused."""

    pipelines: frozenset[Pipeline]
    when: Callable[[Any], str | bool | None]
    message: str
    hint: str = ""


def _given(*names: str) -> Callable[[Any], str | None]:
    return lambda request: first_given(request, names)


def _with(setting: str, *others: str) -> Callable[[Any], str | None]:
    """The first of `others` given beside `setting`."""
    return lambda request: first_given(request, others) if given(request, setting) else None


def _outside(value: str, choices: tuple[str, ...] | Mapping[str, str]) -> Callable[[Any], bool]:
    return lambda request: getattr(request, value) is not None and getattr(request, value) not in choices


def _weights_given(adapter: bool) -> Callable[[Any], str | None]:
    """The first step setting given beside `weights`, if it is (or is not) an adapter's."""

    def when(request: Any) -> str | None:
        name = first_given(request, STEP_SETTINGS) if request.weights else None
        return name if name is not None and (name in ADAPTER_SETTINGS) == adapter else None

    return when


def _fit_axis(request: Any) -> bool:
    if request.fit is not None:
        fit_axis(request.fit)  # raises the rule's own error, with the axes' rule as its hint
    return False


def _sweep_spec(request: Any) -> bool:
    if request.sweep is not None:
        sweep_spec(request.sweep)  # raises the rule's own error, with the sweep's rule as its hint
    return False


def _sweep_axis_differs(request: Any) -> str | None:
    """`fit`'s axis where it is not the sweep's: the plot marks its answers on the sweep's axis."""
    if request.sweep is None or request.fit is None:
        return None
    return request.fit if fit_axis(request.fit) != fit_axis(sweep_spec(request.sweep).fit_text) else None


def _plot_suffix(request: Any) -> bool:
    return request.plot is not None and not str(request.plot).lower().endswith(PLOT_SUFFIXES)


def _rank_without_world_size(request: Any) -> str | None:
    return first_given(request, RANK_SETTINGS) if request.world_size is None else None


def _adapted(request: Any) -> str | None:
    if request.world_size is None:
        return None
    return "quantize" if request.quantize else "lora" if request.lora or request.dora else None


def _reshard_entry(request: Any) -> str | None:
    """The first `reshard_after_forward` entry that is neither a preset nor [PATTERN=]true|false."""
    for entry in request.reshard_after_forward:
        value = entry.rpartition("=")[2]
        if entry not in RESHARD_PRESETS and value.lower() not in ("true", "false"):
            return str(entry)
    return None


def _sac_words(request: Any) -> str | None:
    """The first word of a built-in `selective_ac` that names nothing it saves; None for a valid one."""
    text = request.selective_ac
    if text is None or ":" in text:  # pkg.module:policy, resolved where the step is built
        return None
    words = [word.strip() for word in text.split(",")]
    return next((word for word in words if word not in SAC_SAVES and word not in SAC_PRESETS), None)


RECIPE_SETTINGS = ("optimizer_impl", "clip_grad_norm", "clip_grad_impl", "selective_ac", "ac_modules")
"""The training loop's choices (besides the ranks' `reshard_after_forward`): each shapes a training step."""


def _card(request: Any) -> bool:
    """Whether the request names a card whose memory a budget's share can be of."""
    return request.gpu is not None or request.gpu_memory is not None


def _sharded(request: Any) -> bool:
    return request.world_size is not None


def _serving(request: Any) -> bool:
    return bool(request.serving)


def _training_ranks(request: Any) -> bool:
    return request.world_size is not None and not request.serving


RULES: tuple[Refusal, ...] = (
    # Each value alone.
    Refusal(ALL, _outside("step", STEPS), "unknown `step` {step!r}", "use train, inference or generate"),
    Refusal(ALL, _outside("optimizer", OPTIMIZERS), "unknown optimizer {optimizer!r}",
            f"use one of {', '.join(OPTIMIZERS)}"),
    Refusal(ALL, _outside("autocast", AUTOCAST), "unknown `autocast` {autocast!r}", "use bf16 or fp16"),
    Refusal(ALL, _outside("dtype", PRECISIONS), "unknown precision {dtype!r}", "use bf16, fp16 or fp32"),
    Refusal(ALL, _outside("quantize", QUANTIZE_METHODS), "unknown `quantize` {quantize!r}",
            f"use {', '.join(QUANTIZE_METHODS)}"),
    Refusal(SIZES, _fit_axis, ""),
    Refusal(SWEEP, _sweep_spec, ""),
    Refusal(ALL, _plot_suffix, "`plot` {plot!r} is not a file it can draw", "name a .svg, .png or .html file"),
    # The inputs.
    Refusal(ALL, _with("inputs", "input"), "give `inputs` or `input`, not both"),
    # The weights alone: every setting of a step is refused rather than ignored.
    Refusal(frozenset({Pipeline.WEIGHTS}), _weights_given(adapter=True),
            "`weights=True` counts every parameter as trainable, and `{given}` adapts the model",
            "give `input` to trace the step with `{given}`: its report splits trainable and frozen"),
    Refusal(frozenset({Pipeline.WEIGHTS}), _weights_given(adapter=False),
            "`weights=True` answers without tracing a step, and `{given}` is for a step",
            "drop `weights` to trace the step, or drop `{given}`"),
    # A function that answers one question (analyze, analyze_ranks) is not asked another.
    Refusal(frozenset({Pipeline.STEP}), _given("world_size", "fit"),
            "`{given}` asks for another prediction than one step on one device",
            "call predict, or analyze_ranks for `world_size` and fit for `fit`"),
    Refusal(RANKS, lambda r: r.world_size is None, "ranks are predicted for `world_size` N of them",
            "e.g. `world_size=8` `fsdp=True`"),
    Refusal(FIT, _with("allow_offload", "fit"), "`fit` does not search offload plans yet",
            "leave `allow_offload` out"),
    # A sweep: one device, its sizes from `input` specs; what it draws and writes.
    Refusal(SWEEP, _given("world_size"), "`sweep` is not traced with `world_size` yet",
            "sweep one device, or predict ranks at one size without `sweep`"),
    Refusal(SWEEP, _given("allow_offload"), "`sweep` does not search offload plans", "leave `allow_offload` out"),
    Refusal(SWEEP, _sweep_axis_differs, "`fit` {fit} is not the axis `sweep` {sweep} scales",
            "give `fit` the sweep's axis, or leave it out"),
    Refusal(ALL, lambda r: r.plot is not None and r.sweep is None, "`plot` draws the curve of a `sweep`",
            "add e.g. `sweep=batch=1,2,4,8`"),
    Refusal(frozenset(Pipeline) - {Pipeline.STEP}, _given("snapshot"),
            "`snapshot` writes one step on one device, and {pipeline_words}",
            "predict one step (give `input`, without `sweep`, `fit` or `world_size`)"),
    # Ranks: what shapes them needs them, and FSDP2's and DDP's settings do not mix.
    Refusal(ALL, _rank_without_world_size, "`{given}` needs `world_size` N", "e.g. `world_size=8` `{rank_example}=True`"),
    Refusal(SHARDED, lambda r: _sharded(r) and _with("ddp", *FSDP_SETTINGS)(r),
            "`{given}` is FSDP2's, and the ranks are DistributedDataParallel's",
            "leave `{given}` out, or give `fsdp` instead"),
    Refusal(SHARDED, lambda r: first_given(r, DDP_SETTINGS) if _sharded(r) and r.fsdp and not r.ddp else None,
            "`{given}` is DDP's, and the ranks are FSDP2's", "leave `{given}` out, or give `ddp` instead"),
    # A generate step and its settings go together.
    Refusal(ALL, lambda r: first_given(r, ("new_tokens", "cache")) if r.step != "generate" else None,
            "`{given}` applies to `step=generate` only", "add `step=generate`, or leave it out"),
    Refusal(ALL, lambda r: r.step == "generate" and r.new_tokens is None,
            "`step=generate` needs `new_tokens` N: how many tokens to generate", "e.g. `step=generate` `new_tokens=256`"),
    Refusal(ALL, lambda r: r.new_tokens is not None and r.new_tokens < 1, "`new_tokens` {new_tokens} generates nothing",
            "give 1 or more"),
    Refusal(ALL, _outside("cache", CACHES), "unknown `cache` {cache!r}", "use dynamic or static"),
    # Adapters.
    Refusal(ALL, lambda r: first_given(r, ("lora_targets", "lora_dropout")) if r.lora is None and not r.dora else None,
            "`{given}` shapes LoRA adapters, and `lora` R asks for them", "e.g. `lora=16`"),
    Refusal(ALL, lambda r: (r.lora is not None or r.dora) and r.lora_targets == (), "`lora_targets` names no module",
            "e.g. `lora_targets=q_proj,v_proj`, or all-linear"),
    Refusal(SHARDED, _adapted, "`{given}` is not traced with `world_size` yet", "predict one device without `world_size`"),
    Refusal(SHARDED, lambda r: first_given(r, ("gpu", "gpu_memory")) if _sharded(r) and (r.ddp or r.serving) else None,
            "`{given}` traces FSDP2's ranks for a GPU, and {gpu_ranks}", "drop `{given}`, and predict `device=cpu`"),
    # The size search, and the sweep.
    Refusal(SIZES, _given("real"), "{sizes_search} on fake traces; `real` does not apply",
            "check its answer with `real` at the batch it reports"),
    Refusal(SIZES, _given("inputs"), "`{sizes}` scales the inputs' sizes, so it needs them as `input` specs, not "
            "`inputs`", "give each input as `input` DTYPE[SHAPE], e.g. `input='int64[1,4096]<32000'`"),
    # The step's kind.
    Refusal(ONE_STEP, lambda r: r.step != "train" and r.optimizer not in (None, "none"),
            "`optimizer` {optimizer} does not apply to `step` {step}: it has no backward and no optimizer step",
            "leave `optimizer` out"),
    Refusal(frozenset({Pipeline.STEP}), lambda r: r.step != "train" and r.budget is not None,
            "`budget` plans checkpoints for backward, and `step` {step} has none",
            "give `fit` with `budget` for the largest batch whose {forward} fits"),
    Refusal(FIT, lambda r: _sharded(r) and r.step != "train", "`fit` with `step` {step} is not searched across ranks yet",
            "predict one size across ranks without `fit`, or `fit` one device's {forward} without `world_size`"),
    Refusal(FIT, lambda r: _sharded(r) and first_given(r, ("autocast", "dtype")),
            "`{given}` is not traced with `world_size` yet"),
    Refusal(FIT, lambda r: _sharded(r) and (r.budget is None or (r.budget.bytes is None and not _card(r))),
            "`fit` with `world_size` needs `budget` as a size, or a share of the memory of the `gpu` it names: each "
            "rank is compared with it", "e.g. `budget=78GiB`, or `gpu=h100` `budget=0.9`"),
    Refusal(RANKS, lambda r: r.budget is not None and r.budget.bytes is None and not _card(r),
            "`budget` {budget_share} with `world_size` is a share of a GPU's memory, and no `gpu` is named",
            "give it in bytes (e.g. `budget=78GiB`), or name the card: `gpu=h100` (or `gpu_memory=SIZE`)"),
    Refusal(RANKS, lambda r: "real" if r.real else "device=meta" if r.device == "meta" else None,
            "`world_size` predicts ranks on fake tensors; `{given}` does not apply", "{ranks_measured}"),
    # The ranks' layout.
    Refusal(SHARDED, lambda r: _sharded(r) and r.world_size < 1, "`world_size` {world_size} is not a number of ranks",
            "give 1 or more"),
    Refusal(RANKS, lambda r: _serving(r) and ("ddp" if r.ddp else "fsdp" if r.fsdp else None),
            "`step={step}` with `world_size` is traced as tensor-parallel serving, and `{given}` shards a training step",
            "give `world_size={world_size}` `tp={world_size}` alone"),
    Refusal(RANKS, lambda r: _serving(r) and r.tp != r.world_size,
            "`step={step}` with `world_size={world_size}` needs `tp={world_size}`: the ranks are one tensor-parallel "
            "group (each replica of a server is a group of its own)", "{serving_tp}"),
    Refusal(RANKS, lambda r: _serving(r) and first_given(r, ("param_dtype", "reduce_dtype")),
            "`{given}` is FSDP2's, and `step={step}` ranks run no FSDP2", "leave `{given}` out; `dtype` casts the model"),
    Refusal(SHARDED, lambda r: _training_ranks(r) and r.ddp and r.bucket_cap_mb is not None and not r.bucket_cap_mb > 0,
            "`bucket_cap_mb` {bucket_cap_mb:g} is not a bucket size",
            "give a size in MiB above 0, e.g. 25 (DDP's default) or 0.5"),
    Refusal(SHARDED, lambda r: _training_ranks(r) and r.ddp and ("fsdp" if r.fsdp else "tp" if r.tp > 1 else None),
            "`ddp` replicates the model on every rank, and `{given}` shards it", "give `ddp` alone, or `fsdp` (with `tp` K)"),
    Refusal(SHARDED, lambda r: _training_ranks(r) and not r.ddp and not r.fsdp,
            "`world_size` needs `fsdp` or `ddp`: FSDP2 and DistributedDataParallel are what memlayout predicts",
            "add `fsdp` (and `tp` K for tensor parallel inside it), or `ddp`"),
    Refusal(SHARDED, lambda r: _sharded(r) and r.tp < 1, "`tp` {tp} is not a tensor-parallel degree",
            "give 2 or more, or leave `tp` out"),
    Refusal(SHARDED, lambda r: _sharded(r) and r.tp >= 1 and r.world_size % r.tp,
            "`tp` {tp} does not divide `world_size` {world_size}",
            "the ranks form a (data parallel x tensor parallel) grid: pick a world size that is a multiple of `tp`"),
    Refusal(SHARDED, lambda r: next((name for name in ("param_dtype", "reduce_dtype") if getattr(r, name) is not None
                                     and getattr(r, name) not in PRECISIONS), None) if _sharded(r) else None,
            "`{given}` {value!r} is not a dtype FSDP2 computes in", f"use one of {', '.join(SHARDED_DTYPES)}"),
    # What serving ranks and DDP's ranks are traced for.
    Refusal(RANKS, lambda r: _serving(r) and r.budget is not None,
            "`budget` plans checkpoints for a training step, and `step` {step} runs no backward to recompute in",
            "leave `budget` out"),
    Refusal(RANKS, lambda r: _serving(r) and r.autocast is not None,
            "`autocast` is not traced for `step` {step} across ranks yet", "`dtype={autocast}` casts the model, as servers load it"),
    Refusal(RANKS, lambda r: _serving(r) and r.device != "cpu",
            "`step` {step} across ranks is traced for `device=cpu`, not {device}, yet: the fake CUDA step does not run "
            "DTensor's device mesh",
            "predict `device=cpu` (the same shards and ops), or one device's forward on `device=cuda`"),
    Refusal(SHARDED, lambda r: _training_ranks(r) and r.ddp and r.allow_offload,
            "`allow_offload` is FSDP2's CPU offload, and under `ddp` every rank keeps its whole model",
            "leave `allow_offload` out, or predict `fsdp`"),
    Refusal(SHARDED, lambda r: _training_ranks(r) and r.ddp and r.device != "cpu",
            "`ddp` is traced for `device=cpu`, not {device}: DDP's Reducer reduces in hooks that torch's autograd engine "
            "runs, and the engine runs no fake CUDA step without a GPU",
            "predict `device=cpu` (the same buckets), or `fsdp` for a GPU"),
    # The training recipe: the optimizer's implementation, clipping, op-level checkpointing, resharding.
    Refusal(ALL, _outside("optimizer_impl", OPTIMIZER_IMPLS), "unknown `optimizer_impl` {optimizer_impl!r}",
            f"use {', '.join(OPTIMIZER_IMPLS)}"),
    Refusal(ALL, _outside("clip_grad_impl", CLIP_IMPLS), "unknown `clip_grad_impl` {clip_grad_impl!r}",
            f"use {' or '.join(CLIP_IMPLS)}"),
    Refusal(ALL, _sac_words, "`selective_ac` {selective_ac!r} names nothing to save ({value_word!r})",
            f"save any of {', '.join(SAC_SAVES)} (comma-separated), or {', '.join(SAC_PRESETS)}; or give a policy "
            "as pkg.module:policy"),
    Refusal(ALL, _reshard_entry, "`reshard_after_forward` {reshard_word!r} is neither a preset nor [PATTERN=]true|false",
            f"use {' or '.join(RESHARD_PRESETS)}, or e.g. `reshard_after_forward=model.layers.31=false`"),
    Refusal(frozenset({Pipeline.WEIGHTS}), _given(*RECIPE_SETTINGS),
            "`{given}` shapes a traced training step, and without `input` no step is traced",
            "give `input` SPEC for the step"),
    Refusal(ALL, lambda r: first_given(r, RECIPE_SETTINGS) if r.step != "train" else None,
            "`{given}` is part of a training step, and `step` {step} runs no backward", "leave `{given}` out"),
    Refusal(ALL, lambda r: r.optimizer_impl is not None and r.step_optimizer == "none",
            "`optimizer_impl` chooses how the optimizer steps, and `optimizer` is none", "leave `optimizer_impl` out"),
    Refusal(ALL, lambda r: r.clip_grad_impl is not None and r.clip_grad_norm is None,
            "`clip_grad_impl` says how clip_grad_norm_ runs, and `clip_grad_norm` MAX asks for it",
            "e.g. `clip_grad_norm=1.0` `clip_grad_impl=foreach`"),
    Refusal(ALL, lambda r: r.clip_grad_norm is not None and not r.clip_grad_norm > 0,
            "`clip_grad_norm` {clip_grad_norm:g} is not a norm to clip to", "give a max norm above 0, e.g. 1.0"),
    Refusal(SHARDED, lambda r: _sharded(r) and r.no_reshard_after_forward and bool(r.reshard_after_forward),
            "`no_reshard_after_forward` and `reshard_after_forward` both say what FSDP2 reshards",
            "give one: `reshard_after_forward=false` for none"),
    Refusal(ALL, lambda r: r.gpu_memory is not None and r.gpu_memory <= 0, "`gpu_memory` {gpu_memory} is no memory",
            "give the card's memory, e.g. `gpu_memory=96GiB`"),
    Refusal(ALL, lambda r: r.gpu_memory is not None and r.gpu is None and not r.device.startswith("cuda")
            and r.device != "cpu",
            "`gpu_memory` is a GPU's, and `device` is {device}", "drop `device`, or `gpu_memory`"),
)


_PIPELINE_WORDS = {
    Pipeline.WEIGHTS: "without `input` there is no step to write",
    Pipeline.RANKS: "`world_size` predicts several ranks",
    Pipeline.FIT: "`fit` predicts several sizes",
    Pipeline.SWEEP: "`sweep` predicts several sizes",
}


class _Words(Mapping[str, Any]):
    """What a rule's text may name: the setting that set it off, the request's settings, and a few phrases."""

    def __init__(self, request: Any, found: str | bool | None) -> None:
        self.request = request
        self.found = found if isinstance(found, str) else None

    def __getitem__(self, key: str) -> Any:
        request = self.request
        phrases: dict[str, Callable[[], Any]] = {
            "given": lambda: self.found,
            "value": lambda: getattr(request, self.found or ""),
            "forward": lambda: FORWARDS.get(request.step, "forward"),
            "rank_example": lambda: "ddp" if self.found in ("ddp", *DDP_SETTINGS) else "fsdp",
            "gpu_ranks": lambda: "`ddp`'s ranks are traced for the CPU: DDP's Reducer reduces in hooks that only "
            "torch's autograd engine runs, and the engine runs no fake CUDA step without a GPU" if request.ddp
            else f"`step={request.step}` ranks are traced for the CPU (the same shards and ops)",
            "ranks_measured": lambda: SERVING_HINT if request.ddp or request.step != "train" else TRAINING_HINT,
            "sizes": lambda: "sweep" if request.sweep is not None else "fit",
            "sizes_search": lambda: "`sweep` predicts" if request.sweep is not None else "`fit` searches",
            "pipeline_words": lambda: _PIPELINE_WORDS[request.pipeline],
            "serving_tp": lambda: f"give `tp={request.world_size}`, or `world_size={request.tp}` for groups of "
            f"{request.tp}" if request.tp > 1 else f"give `tp={request.world_size}`",
            "value_word": lambda: _sac_words(request),
            "budget_share": lambda: f"{request.budget.fraction:g}" if request.budget is not None else "",
            "reshard_word": lambda: _reshard_entry(request),
        }
        return phrases[key]() if key in phrases else getattr(request, key)

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0


def check(request: Any) -> None:
    """Raises SettingError for the first rule the request breaks, for its pipeline.

    Raises:
        SettingError: one line, naming the settings as the library names them.
    """
    for rule in RULES:
        if request.pipeline not in rule.pipelines:
            continue
        found = rule.when(request)
        if found:
            words = _Words(request, found)
            raise SettingError(rule.message.format_map(words), rule.hint.format_map(words))
