"""Which modules of a model a pattern names: a dotted path where `*` stands for one name, or a class name.

`--fsdp-modules`, `--ac-modules` and `--reshard-after-forward` name modules this way
(`model.layers.*`, `LlamaDecoderLayer`); without a pattern, the blocks of the model's main
nn.ModuleList (`main_blocks`) are what FSDP2 wraps and op-level checkpointing applies to.
"""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Any

from memlayout.errors import UsageError


def segment_match(pattern: str, path: str) -> bool:
    """A dotted-path glob where `*` stands for one name: `model.layers.*` matches the blocks, not inside them."""
    parts, names = pattern.split("."), path.split(".")
    return len(parts) == len(names) and all(fnmatchcase(n, p) for p, n in zip(parts, names, strict=True))


def named_modules(model: Any, pattern: str) -> list[str]:
    """The paths of the model's modules a pattern names (the root excluded), in definition order."""
    return [path for path, module in model.named_modules()
            if path and (segment_match(pattern, path) or type(module).__name__ == pattern)]


def modules_of(model: Any, patterns: Sequence[str], setting: str) -> tuple[str, ...]:
    """Every module the patterns name, in definition order.

    Raises:
        UsageError: a pattern names no module (the message names `setting`).
    """
    found: dict[str, None] = {}
    for pattern in patterns:
        matched = named_modules(model, pattern)
        if not matched:
            raise UsageError(
                f"`{setting}` {pattern!r} matches no module of {type(model).__name__}",
                "give a dotted path where * stands for one name (model.layers.*) or a class name (LlamaDecoderLayer)",
            )
        found.update(dict.fromkeys(matched))
    order = {path: index for index, (path, _) in enumerate(model.named_modules())}
    return tuple(sorted(found, key=order.__getitem__))



def main_blocks(model: Any) -> tuple[str, ...]:
    """The children of the nn.ModuleList that holds the most parameters (a transformer's layers)."""
    import torch

    best: tuple[int, str] | None = None
    for path, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or not len(module):
            continue
        count = sum(p.numel() for p in module.parameters())
        if count and (best is None or count > best[0]):
            best = (count, path)
    if best is None:
        return ()
    path = best[1]
    module = model.get_submodule(path)
    return tuple(f"{path}.{name}" if path else name for name, _ in module.named_children())
