"""The planner's choices: one module checkpointed, a Sequential in N equal segments, or one segment of children.

Each option carries its effect on the baseline's live curve as gaps (plan.py reads them into a
matrix), its recompute cost, and what it checkpoints, so that two options that cannot go together
(one inside the other, or two segments sharing a child) are known to conflict.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gap:
    """One stretch of the step over which an option frees storages, and what it costs at its end."""

    end: int
    """Freed after this event..."""
    backward_start: int
    """...until this one."""
    freed: int
    kept_inputs: int
    """What checkpoint holds over the gap instead: the call's inputs, and the generator's state on the CPU."""
    rerun_overhead: int
    """What the rerun allocates at its peak, at `backward_start`, over the state before it."""
    reruns: bool = True
    """False for a call backward never reaches: checkpoint frees its saved storages and nothing reruns."""
    released: int | None = None
    """Where a run of calls holds its inputs past the rerun, the event they go (its first call's backward start),
    `kept_after` bytes of them; None where nothing is held past the rerun."""
    kept_after: int = 0


@dataclass(frozen=True)
class Option:
    """One choice: checkpoint a module, run a Sequential in N segments, or checkpoint one segment of children."""

    path: str
    segments: int | None
    """None for checkpoint(module) and for a segment; N for checkpoint_sequential."""
    flops: int
    """Forward FLOPs rerun in backward."""
    gaps: tuple[Gap, ...]
    seconds: float = 0.0
    """The roofline time of what reruns in backward, on the target."""
    span: tuple[int, int] | None = None
    """A segment: the first and the last child (indexes among `path`'s children) checkpointed as one."""
    covers: tuple[str, ...] = ()
    """A segment: the paths of the children it checkpoints."""

    def conflicts_with(self, other: Option) -> bool:
        """Two options that checkpoint one module, or a module and one inside it, do not go together; two segments
        of one container go together when they share no child."""
        if self.span is None and other.span is None:
            return _nested(self.path, other.path)
        if self.span is not None and other.span is not None:
            if self.path == other.path:
                return self.span[0] <= other.span[1] and other.span[0] <= self.span[1]
            return self._covers_inside(other.path) or other._covers_inside(self.path)
        segment, module = (self, other) if self.span is not None else (other, self)
        # A module conflicts with a segment when it is inside a child the segment checkpoints, or holds them all.
        return segment._covers_inside(module.path) or module.path == segment.path or _inside(segment.path, module.path)

    def _covers_inside(self, path: str) -> bool:
        """`path` is one of the children this segment checkpoints, or inside one."""
        prefix = self.path + "." if self.path else ""
        if path == self.path or not path.startswith(prefix):
            return False
        return prefix + path[len(prefix):].split(".", 1)[0] in self.covers


def _inside(path: str, ancestor: str) -> bool:
    return ancestor == "" or path.startswith(ancestor + ".")


def _nested(a: str, b: str) -> bool:
    return a == b or _inside(a, b) or _inside(b, a)
