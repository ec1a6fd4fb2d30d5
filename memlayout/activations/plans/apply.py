"""Apply a checkpoint plan to a live model, and take it off again.

Each module in `plan.checkpoint` gets an instance-level `forward` that runs the
class's forward through `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`;
each nn.Sequential in `plan.sequential` runs its children through
`checkpoint_sequential(..., use_reentrant=False)`'s split; each run of children in
`plan.segments` is checkpointed as one (plans/apply_segments.py: an nn.Sequential
through a forward of its own, a container the model iterates through a checkpoint
region from its first child's call to its last's return). The module's own hooks run
once, as before; only what autograd saves changes.

A module in `plan.selective` is checkpointed with an op-level policy's contexts
(`_selective_forward`, plans/op_policies.py): the outputs of the ops it saves are kept.

Why non-reentrant: the reentrant variant does not work with
`torch.autograd.grad` (only `.backward()`), ignores inputs that do not require
grad, and cannot take keyword arguments.

A rerun runs under the autocast forward ran under: checkpoint restores it with
`torch.autocast(device_type, ...)`, which for CUDA switches itself off where no CUDA
device is present (a fake CUDA step traced without a GPU). There the checkpoint's
`context_fn` (`_rerun_under_forwards_autocast`) enables CUDA's autocast again inside
the rerun, so a planned bf16 step reruns in bf16 as it would on the GPU. That is why
the segments of `plan.sequential` are checkpointed here, as `checkpoint_sequential`
splits them (it takes no `context_fn`).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memlayout import _torch
from memlayout.activations.plans import rerun
from memlayout.activations.plans.apply_segments import checkpoint_regions, sequential_forward
from memlayout.activations.plans.op_policies import OpPolicy, context_fn, parse_policy
from memlayout.activations.plans.plan import Plan
from memlayout.errors import UsageError

_MISSING = object()


@dataclass
class AppliedPlan:
    """A plan applied to a model; `remove()` restores the model exactly."""

    plan: Plan
    notes: list[str] = field(default_factory=list)
    """What apply_plan changed besides the wrapping (e.g. `config.use_cache`)."""
    _restore: list[Any] = field(default_factory=list, repr=False)

    def remove(self) -> None:
        """Undo every change, last first."""
        while self._restore:
            self._restore.pop()()

    def __enter__(self) -> AppliedPlan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def apply_plan(model: Any, plan: Plan | Mapping[str, Any], *, preserve_rng_state: bool = True) -> AppliedPlan:
    """Checkpoint the modules a plan names, in place.

    Args:
        model: The nn.Module the plan was made for.
        plan: A `Plan`, `report.plan.plan`, or the `plan` object of a JSON report.
        preserve_rng_state: Stash and restore the RNG state so that dropout masks
            match on recompute (torch's default). False saves that time in modules
            that use no randomness.

    Returns:
        An `AppliedPlan`; call `remove()` (or use it as a context manager) to undo.

    Raises:
        UsageError: a path is not a module of `model`, a `sequential` entry is not an nn.Sequential, or a
            `segments` entry names children the container does not have.

    Examples:
        >>> import torch, memlayout.activations as act
        >>> model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(4)])
        >>> applied = act.apply_plan(model, {"checkpoint": ["1", "2"], "sequential": []})
        >>> model(torch.randn(2, 8, requires_grad=True)).sum().backward()
        >>> applied.remove()
    """
    import torch

    plan = Plan.coerce(plan)
    applied = AppliedPlan(plan=plan)
    try:
        for path in plan.checkpoint:
            _wrap(applied, _module(model, path), _checkpointed_forward, preserve_rng_state)
        for path, policy in plan.selective:
            _wrap(applied, _module(model, path), _selective_forward(parse_policy(policy)), preserve_rng_state)
        for item in plan.sequential:
            module = _module(model, item.module)
            if not isinstance(module, torch.nn.Sequential):
                raise UsageError(
                    f"plan.sequential names {item.module!r}, a {type(module).__name__}, not an nn.Sequential"
                )
            if not 1 <= item.segments <= len(module):
                raise UsageError(f"{item.module!r} has {len(module)} children; {item.segments} segments do not fit")
            size = len(module) // item.segments
            spans = [(first, first + size - 1) for first in range(0, size * (item.segments - 1), size)]
            _wrap(applied, module, sequential_forward(spans, _rerun_under_forwards_autocast), preserve_rng_state)
        _apply_segments(applied, model, plan, preserve_rng_state)
        if not plan.empty:
            _disable_cache(model, applied)
    except BaseException:
        applied.remove()
        raise
    return applied


def _module(model: Any, path: str) -> Any:
    try:
        return model.get_submodule(path)
    except AttributeError:
        raise UsageError(f"the plan names {path!r}, which is not a module of this model") from None


def _wrap(applied: AppliedPlan, module: Any, make: Any, preserve_rng_state: bool) -> None:
    previous = module.__dict__.get("forward", _MISSING)
    original = module.forward
    module.forward = make(module, original, preserve_rng_state)

    def restore() -> None:
        if previous is _MISSING:
            module.__dict__.pop("forward", None)
        else:
            module.forward = previous

    applied._restore.append(restore)


def _checkpointed_forward(module: Any, original: Any, preserve_rng_state: bool) -> Any:
    import torch
    from torch.utils.checkpoint import checkpoint

    def run(*args: Any, **kwargs: Any) -> Any:
        with rerun.announced(module):
            return original(*args, **kwargs)

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
        return checkpoint(run, *args, use_reentrant=False, preserve_rng_state=preserve_rng_state,
                          context_fn=_rerun_under_forwards_autocast, **kwargs)

    return forward


def _selective_forward(policy: OpPolicy) -> Any:
    """A module checkpointed by an op-level policy: its contexts, and the rerun's autocast as forward's had it."""
    contexts = context_fn(policy)

    def both() -> tuple[Any, Any]:
        forward, recompute = contexts()
        _, autocast = _rerun_under_forwards_autocast()

        @contextlib.contextmanager
        def rerun_in_both() -> Any:
            with autocast, recompute:
                yield

        return forward, rerun_in_both()

    def make(module: Any, original: Any, preserve_rng_state: bool) -> Any:
        import torch
        from torch.utils.checkpoint import checkpoint

        def run(*args: Any, **kwargs: Any) -> Any:
            with rerun.announced(module):
                return original(*args, **kwargs)

        def forward(*args: Any, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return original(*args, **kwargs)
            return checkpoint(run, *args, use_reentrant=False, preserve_rng_state=preserve_rng_state,
                              context_fn=both, **kwargs)

        return forward

    return make


def _apply_segments(applied: AppliedPlan, model: Any, plan: Plan, preserve_rng_state: bool) -> None:
    """Each container's runs (plans/apply_segments.py): an nn.Sequential's through a forward of its own, another
    container's as checkpoint regions around the model's own loop."""
    import torch

    spans: dict[str, list[tuple[int, int]]] = {}
    for item in plan.segments:
        spans.setdefault(item.module, []).append((item.first, item.last))
    taken = {item.module for item in plan.sequential}
    for path, runs in spans.items():
        container = _module(model, path)
        children = [child for _, child in container.named_children()]
        runs.sort()
        if any(not 0 <= first <= last < len(children) for first, last in runs):
            raise UsageError(f"{path!r} has {len(children)} children; the plan's segments {runs} do not fit")
        if any(a[1] >= b[0] for a, b in itertools.pairwise(runs)):
            raise UsageError(f"the plan's segments of {path!r} overlap: {runs}")
        if isinstance(container, torch.nn.Sequential):
            if path in taken:
                raise UsageError(f"the plan runs {path!r} both through checkpoint_sequential and in its own segments")
            _wrap(applied, container, sequential_forward(runs, _rerun_under_forwards_autocast), preserve_rng_state)
            continue
        for first, last in runs:
            label = f"segment {first}..{last} of {path or 'the model'}"
            applied._restore.append(checkpoint_regions(label, children[first:last + 1], preserve_rng_state,
                                                       _rerun_under_forwards_autocast))


def _rerun_under_forwards_autocast() -> tuple[Any, Any]:
    """checkpoint's `context_fn`, called in forward: a rerun context that enables CUDA's autocast as forward had it,
    where checkpoint's own `torch.autocast("cuda", ...)` switches itself off for want of a device."""
    import torch

    if torch.cuda.is_available() or not torch.is_autocast_enabled("cuda"):
        return contextlib.nullcontext(), contextlib.nullcontext()
    return contextlib.nullcontext(), _torch.cuda_autocast_without_device(torch.get_autocast_dtype("cuda"))


def _disable_cache(model: Any, applied: AppliedPlan) -> None:
    """Hugging Face models must not build a key/value cache under checkpoint.

    A checkpointed layer that appends to a cache appends again when it reruns in
    backward, and the cache keeps the activations checkpoint meant to free.
    transformers' own `gradient_checkpointing_enable()` turns `use_cache` off for
    the same reason.
    """
    config = getattr(model, "config", None)
    if config is None or not getattr(config, "use_cache", False):
        return
    config.use_cache = False
    applied.notes.append("set model.config.use_cache = False (a key/value cache does not work under checkpoint)")

    def restore() -> None:
        config.use_cache = True

    applied._restore.append(restore)
