"""Which ranks differ: ranks grouped by the shapes of their FSDP2 shards, and which of those groups are traced.

FSDP2 splits dimension 0 of each parameter into `torch.chunk` pieces, so with uneven
shapes the first ranks hold one row more than the last; ranks whose pieces all have the
same shapes have the same step, and one rank of each such layout is traced.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memlayout.activations.ranks.facts import RankLayout
from memlayout.activations.ranks.parallel import COLWISE, Sharding

MAX_TRACED_LAYOUTS = 4
"""Distinct rank layouts traced at most: the largest, the smallest and two between."""


def _local_rows(rows: int, parts: int, index: int) -> int:
    """Rows of dimension 0 that `torch.chunk(rows, parts)` gives piece `index` (FSDP2's split)."""
    size = -(-rows // parts) if rows else 0
    return max(0, min(size, rows - index * size))


def rank_layouts(model: Any, sharding: Sharding) -> list[RankLayout]:
    """Ranks grouped by the shapes of their shards, the group of the largest shards first.

    Every parameter is sharded by FSDP2 on dimension 0 across the data-parallel
    ranks, after the tensor-parallel plan has split it across the tensor-parallel
    ones. Tensor-parallel splits are even (the plan refuses a degree that does not
    divide), so ranks differ only by their data-parallel index.
    """
    styles = {s.module: s.style for s in sharding.tp_plan}
    tp, dp = sharding.tp, sharding.data_parallel
    shapes: list[tuple[int, int]] = []  # (rows on dimension 0, bytes per row)
    for module_path, module in model.named_modules():
        style = styles.get(module_path)
        for name, parameter in module.named_parameters(recurse=False):
            shape = list(parameter.shape)
            if style == COLWISE and shape:
                shape[0] //= tp
            elif style is not None and name == "weight" and len(shape) > 1:
                shape[1] //= tp
            rows = shape[0] if shape else 1
            row_bytes = parameter.element_size()
            for dimension in shape[1:]:
                row_bytes *= dimension
            shapes.append((rows, row_bytes))
    groups: dict[tuple[int, ...], list[int]] = {}
    for index in range(dp):
        key = tuple(_local_rows(rows, dp, index) for rows, _ in shapes)
        groups.setdefault(key, []).append(index)
    layouts = [
        RankLayout(
            ranks=tuple(index * tp + t for index in indexes for t in range(tp)),
            shard_bytes=sum(rows * row_bytes for rows, (_, row_bytes) in zip(key, shapes, strict=True)),
        )
        for key, indexes in groups.items()
    ]
    return sorted(layouts, key=lambda layout: (-layout.shard_bytes, layout.ranks[0]))


def traced_layouts(layouts: Sequence[RankLayout]) -> list[RankLayout]:
    """The layouts worth a trace: all of them when few, else the largest, the smallest and two between."""
    if len(layouts) <= MAX_TRACED_LAYOUTS:
        return list(layouts)
    last = len(layouts) - 1
    picks = sorted({0, last // 3, 2 * last // 3, last})
    return [layouts[i] for i in picks]


def rank_ranges(ranks: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """[0, 1, 2, 5] -> ((0, 2), (5, 5))."""
    ranges: list[tuple[int, int]] = []
    for rank in sorted(ranks):
        if ranges and ranges[-1][1] == rank - 1:
            ranges[-1] = (ranges[-1][0], rank)
        else:
            ranges.append((rank, rank))
    return tuple(ranges)
