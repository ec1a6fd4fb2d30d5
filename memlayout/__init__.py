"""memlayout: memory-layout diagnostics for PyTorch models and checkpoints.

The public API is `inspect` (layout facts and findings); torch is imported only
when a live object or a real load needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from memlayout.inspection import Report
    from memlayout.rules import RuleConfig


def inspect(
    target: Any,
    *,
    config: RuleConfig | None = None,
    select: tuple[str, ...] = (),
    ignore: tuple[str, ...] = (),
    trust: bool = False,
) -> Report:
    """Inspect a model or checkpoint's memory layout.

    Args:
        target: An nn.Module, a state dict, a nested training checkpoint, a path
            to a checkpoint or model directory, or "pkg.module:callable".
        config: Rule knobs; see `memlayout.rules.RuleConfig`.
        select: Rule codes or prefixes to run (all when empty), e.g. ("ML1",).
        ignore: Rule codes or prefixes to skip.
        trust: Allow real unpickling of files that need it.

    Returns:
        A `Report` with `facts`, `findings` and `summary`.

    Example:
        >>> import torch, memlayout
        >>> lin = torch.nn.Linear(4, 4)
        >>> lin.weight = torch.nn.Parameter(lin.weight.t())
        >>> [f.code for f in memlayout.inspect(lin).findings]
        ['ML201']
    """
    from memlayout.inspection import run_inspection

    return run_inspection(target, config=config, select=select, ignore=ignore, trust=trust)


__all__ = ["__version__", "inspect"]
