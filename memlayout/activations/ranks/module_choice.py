"""What each wrapped module's `reshard_after_forward` is, from `--reshard-after-forward`'s entries.

Entries, read in order, the last that names a module deciding:
- `torchtitan`: every wrapped block but the last (torchtitan's `apply_fsdp`: "do not
  reshard after forward for the last transformer block since FSDP would prefetch it
  immediately"), the root as FSDP2 treats it;
- `lightning`: every wrapped module, Lightning's FSDPStrategy default (`FULL_SHARD`) and
  FSDP2's own;
- `PATTERN=true|false`, or a bare `true|false` for every wrapped module.
FSDP2 never reshards the root after forward, whatever it is told (its lazy init sets the
root's post-forward mesh to None), so the root keeps its value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memlayout.activations.model.module_patterns import named_modules
from memlayout.errors import UsageError


def reshard_after_forward(model: Any, wrapped: Sequence[str], default: bool,
                          entries: Sequence[str]) -> tuple[bool, ...]:
    """One value per wrapped module ("" the root): `default`, then each entry in order.

    Raises:
        UsageError: a pattern names no wrapped module.
    """
    values = dict.fromkeys(wrapped, default)
    order = {path: index for index, (path, _) in enumerate(model.named_modules())}
    blocks = sorted((path for path in wrapped if path), key=order.__getitem__)
    for entry in entries:
        if entry == "torchtitan":
            values.update({path: path != blocks[-1] for path in blocks})
        elif entry == "lightning":
            values.update(dict.fromkeys(wrapped, True))
        else:
            pattern, _, value = entry.rpartition("=")
            on = value.lower() == "true"
            if not pattern:
                values.update(dict.fromkeys(wrapped, on))
                continue
            named = [path for path in blocks if path in named_modules(model, pattern)]
            if not named:
                raise UsageError(f"`reshard_after_forward` {pattern!r} names no module FSDP2 wraps",
                                 f"name one of the wrapped modules ({', '.join(blocks[:3])}, ...), or their class")
            values.update(dict.fromkeys(named, on))
    return tuple(values[path] for path in wrapped)
