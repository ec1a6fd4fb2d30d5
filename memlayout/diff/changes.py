"""What `memlayout diff` reports: flat, frozen change records, and the diff's result.

A change is like a finding: a kind with a fixed default severity, the tensors it
is about, and a message. Severities reuse the rules' scale, so `--fail-on` means
the same for `inspect` and `diff`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from memlayout.pipeline.inspection import Report
from memlayout.severity import FailOn, Severity


class ChangeKind(str, enum.Enum):
    """Every kind of change; the values are a contract (JSON, markdown, --fail-on)."""

    TIE_LOST = "tie-lost"
    """Names that were one memory in A are separate in B, or one was dropped and nothing restores it."""
    DECLARED_TIE_BROKEN = "declared-tie-broken"
    """A tie a config, model class, metadata or --tie declares is not kept by B."""
    DATA_LOST = "data-lost"
    """A tensor that had data in A has none in B (meta device)."""
    REMOVED = "removed"
    DTYPE = "dtype"
    SHAPE = "shape"
    DEVICE = "device"
    CONTIGUITY = "contiguity"
    """Contiguous in one and not in the other (strides changed with it)."""
    STRIDE = "stride"
    """Strides changed, contiguity did not."""
    VALUES = "values"
    """Contents differ (--deep)."""
    WASTED_BYTES = "wasted-bytes"
    """Unused storage bytes plus duplicated contents grew or shrank."""
    FINDING_NEW = "finding-new"
    """A finding B has and A had not (same rule, same tensors)."""
    ADDED = "added"
    TIE_RESTORED = "tie-restored"
    """B stores one name of a tie and its config or metadata restores the other."""
    SHARING_GAINED = "sharing-gained"
    SHARING_LOST = "sharing-lost"
    """Two views overlapped in A (a flat buffer and its slot) and do not in B."""
    STORAGE_BYTES = "storage-bytes"
    FINDING_RESOLVED = "finding-resolved"


@dataclass(frozen=True)
class Change:
    """One difference between A and B."""

    kind: ChangeKind
    severity: Severity
    tensors: tuple[str, ...]
    """The matched keys (names after --strip-prefix/--map) it is about."""
    message: str
    a_names: tuple[str, ...] = ()
    """The same tensors by their names in A (empty for added tensors)."""
    b_names: tuple[str, ...] = ()
    """The same tensors by their names in B (empty for removed tensors)."""
    before: str | None = None
    """The value in A, as text ("float32", "[4, 4]"); None when not one value."""
    after: str | None = None
    """The value in B, as text."""


@dataclass(frozen=True)
class DiffReport:
    """The result of comparing A with B."""

    a: Report
    b: Report
    changes: tuple[Change, ...]
    """Most severe first."""
    matched: int
    """Keys present in both."""
    strip_prefixes: tuple[str, ...] = ()
    renames: tuple[tuple[str, str], ...] = ()
    deep: bool = False
    name_hint: str | None = None
    """When few names match: the --strip-prefix that would match them, or that none would."""

    def counts(self) -> dict[str, int]:
        """Change counts by severity."""
        return {sev.value: sum(1 for c in self.changes if c.severity is sev) for sev in Severity}

    def fails(self, fail_on: FailOn | str) -> bool:
        """Whether any change is at or above `fail_on` (error, warning, info, never)."""
        threshold = FailOn(fail_on)
        return any(threshold.fails(c.severity) for c in self.changes)
