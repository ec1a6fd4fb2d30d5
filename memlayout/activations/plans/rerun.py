"""How a checkpointed module tells a running trace that its forward reruns.

`torch.utils.checkpoint` reruns the wrapped function during backward, not the
module's `__call__`, so module hooks do not see it; the wrappers made by
`apply_plan` announce it here instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Listener = Callable[[Any, bool], None]
_LISTENERS: list[Listener] = []


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Call `listener(module, entering)` around every checkpointed forward while inside."""
    _LISTENERS.append(listener)
    try:
        yield
    finally:
        _LISTENERS.remove(listener)


@contextmanager
def announced(module: Any) -> Iterator[None]:
    """Wrap one run of a checkpointed module's forward."""
    for listener in tuple(_LISTENERS):
        listener(module, True)
    try:
        yield
    finally:
        for listener in tuple(_LISTENERS):
            listener(module, False)
