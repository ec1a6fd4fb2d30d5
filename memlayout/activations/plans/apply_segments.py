"""Apply segment plans: runs of a container's children, each checkpointed as one (plans/segments.py finds them).

- An nn.Sequential runs its children through a forward of its own: each run goes through
  `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` and the children between runs run as
  they are. `checkpoint_sequential`'s split is the case of equal runs with the last child's run left out.
- Any other container (an nn.ModuleList the model iterates in its own loop) keeps that loop: each run
  is one checkpoint region, opened in its first child's forward pre-hook and closed in its last child's
  forward hook, as torch's composable `checkpoint(module)` does for one module (`_torch.checkpoint_region`).
  Forward runs as without the plan, hooks and all; in backward the region reruns its children one after
  another, each fed the output of the one before in the place the loop fed it, with the other arguments
  the loop gave it in forward. Each child past the first checks, as forward reaches it, that the loop
  fed it the output of the one before (the planner offered the run only where the trace showed that,
  and nothing allocated between them); a loop that does otherwise fails the step with `SegmentBroken`
  rather than train on a rerun that replays something else.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from memlayout import _torch
from memlayout.errors import SegmentBroken

ContextFn = Callable[[], tuple[Any, Any]]
"""checkpoint's `context_fn`: the contexts forward and its rerun run under."""


def sequential_forward(spans: Sequence[tuple[int, int]], context_fn: ContextFn) -> Callable[..., Any]:
    """The maker of an nn.Sequential's forward (for apply.py's `_wrap`) that checkpoints children
    first..last of each span as one, and runs the others as they are."""
    runs = dict(spans)

    def make(module: Any, original: Any, preserve_rng_state: bool) -> Any:
        import torch
        from torch.utils.checkpoint import checkpoint

        def forward(input: Any) -> Any:
            if not torch.is_grad_enabled():
                return original(input)
            children = list(module)
            index = 0
            while index < len(children):
                last = runs.get(index)
                if last is None:
                    input = children[index](input)
                    index += 1
                    continue
                input = checkpoint(run_children(children[index:last + 1]), input, use_reentrant=False,
                                   preserve_rng_state=preserve_rng_state, context_fn=context_fn)
                index = last + 1
            return input

        return forward

    return make


def run_children(children: list[Any]) -> Callable[[Any], Any]:
    def run(input: Any) -> Any:
        for child in children:
            input = child(input)
        return input

    return run


def checkpoint_regions(label: str, children: Sequence[Any], preserve_rng_state: bool,
                       context_fn: ContextFn) -> Callable[[], None]:
    """Make children (one run of an iterated container) one checkpoint region; returns what takes it off."""
    region = _Region(label, list(children), preserve_rng_state, context_fn)
    handles = []
    for position, child in enumerate(children):
        handles.append(child.register_forward_pre_hook(functools.partial(region.before, position), with_kwargs=True))
        handles.append(child.register_forward_hook(functools.partial(region.after, position), prepend=True,
                                                   always_call=position == len(children) - 1))

    def remove() -> None:
        for handle in handles:
            handle.remove()
        region.close()

    return remove


class _Region:
    """One run's checkpoint region: opened at its first child, closed at its last, rerun as a chain."""

    def __init__(self, label: str, children: list[Any], preserve_rng_state: bool, context_fn: ContextFn) -> None:
        self.label = label
        self.children = children
        self.preserve_rng_state = preserve_rng_state
        self.context_fn = context_fn
        self.opened: Iterator[None] | None = None
        self.position = -1
        self.fed: list[tuple[str | int, tuple[Any, ...], dict[str, Any]]] = []
        self.output: Any = None
        self.replaying = False

    def before(self, position: int, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.replaying:
            return
        if position == 0:
            if self.opened is not None:
                self.close()
                raise SegmentBroken(f"{self.label}: its first child ran again before its last one returned")
            self.fed = []
            self.position = 0
            self.opened = _torch.checkpoint_region(functools.partial(self._replay, self.fed), self.preserve_rng_state,
                                                   self._contexts, *args, **kwargs)
            next(self.opened)
            return
        if self.opened is None or self.position != position - 1:
            self.close()
            raise SegmentBroken(f"{self.label}: child {position} of the run ran out of order")
        where = _where(args, kwargs, _stream(self.output))
        if where is None:
            self.close()
            raise SegmentBroken(f"{self.label}: child {position} of the run was not fed the output of the one before")
        self.fed.append((where, *_without(args, kwargs, where)))
        self.output = None
        self.position = position

    def after(self, position: int, module: Any, args: tuple[Any, ...], output: Any) -> None:
        if self.replaying or self.opened is None:
            return
        if position < len(self.children) - 1:
            self.output = output
            return
        opened, self.opened, self.output = self.opened, None, None
        try:
            next(opened)
        except StopIteration:
            return
        raise SegmentBroken(f"{self.label}: checkpoint's region did not close")

    def close(self) -> None:
        """Drop a region left open (the step failed inside it)."""
        opened, self.opened, self.output = self.opened, None, None
        if opened is not None:
            opened.close()  # type: ignore[attr-defined]

    def _contexts(self) -> tuple[Any, Any]:
        forward, rerun = self.context_fn()
        return forward, self._replaying(rerun)

    @contextlib.contextmanager
    def _replaying(self, inner: Any) -> Iterator[None]:
        self.replaying = True
        try:
            with inner:
                yield
        finally:
            self.replaying = False

    def _replay(self, fed: list[tuple[str | int, tuple[Any, ...], dict[str, Any]]], *args: Any, **kwargs: Any) -> None:
        output = self.children[0](*args, **kwargs)
        for child, (where, rest, named) in zip(self.children[1:], fed, strict=False):
            args, kwargs = _fed_at(rest, named, where, _stream(output))
            output = child(*args, **kwargs)


def _stream(output: Any) -> Any:
    """What a child passes on to the next: its output, or the first item of a tuple (a Hugging Face layer's)."""
    if isinstance(output, (tuple, list)) and output:
        return output[0]
    return output


def _where(args: tuple[Any, ...], kwargs: Mapping[str, Any], value: Any) -> str | int | None:
    """The position or the keyword at which `value` itself was passed; None where it was not."""
    if value is None:
        return None
    for position, arg in enumerate(args):
        if arg is value:
            return position
    return next((name for name, arg in kwargs.items() if arg is value), None)


def _without(args: tuple[Any, ...], kwargs: Mapping[str, Any],
             where: str | int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments less the one fed from the child before (not kept: the rerun makes it again)."""
    if isinstance(where, int):
        return (*args[:where], None, *args[where + 1:]), dict(kwargs)
    return args, {name: None if name == where else arg for name, arg in kwargs.items()}


def _fed_at(args: tuple[Any, ...], kwargs: dict[str, Any], where: str | int,
            value: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(where, int):
        return (*args[:where], value, *args[where + 1:]), kwargs
    return args, {**kwargs, where: value}
