"""Many like changes as one line, for the reports people read (table, markdown).

A cast to bfloat16 changes the dtype of every tensor; a reader wants one line
"300 tensors: float32 -> bfloat16", not 300. JSON keeps every change.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from memlayout.diff.changes import Change, ChangeKind
from memlayout.rules import Severity

# Per-tensor kinds whose message is "<tensor label>: <what changed>".
_LABELLED = {ChangeKind.DTYPE, ChangeKind.DEVICE, ChangeKind.SHAPE, ChangeKind.STRIDE, ChangeKind.VALUES}
_MEMBERSHIP = {ChangeKind.ADDED: "only in B", ChangeKind.REMOVED: "only in A"}
SHOWN_NAMES = 3


@dataclass(frozen=True)
class ChangeLine:
    """One line of a human report: a change, or several alike."""

    kind: ChangeKind
    severity: Severity
    text: str
    changes: tuple[Change, ...]


def _what(change: Change) -> str | None:
    if change.kind in _LABELLED:
        _, sep, what = change.message.partition(": ")
        return what if sep else None
    if change.kind in _MEMBERSHIP:
        return _MEMBERSHIP[change.kind]
    return None


def _names(changes: tuple[Change, ...]) -> str:
    keys = [key for change in changes for key in change.tensors[:1]]
    shown = ", ".join(keys[:SHOWN_NAMES])
    return shown + (f" +{len(keys) - SHOWN_NAMES} more" if len(keys) > SHOWN_NAMES else "")


def change_lines(changes: Iterable[Change], fold_over: int = 3) -> list[ChangeLine]:
    """Changes in order, with runs of more than `fold_over` alike changes folded into one line.

    Args:
        changes: Most severe first, as a `DiffReport` holds them.
        fold_over: How many alike changes stay separate lines.

    Returns:
        Lines in the order of each group's first change.
    """
    groups: dict[tuple[object, ...], list[Change]] = {}
    for index, change in enumerate(changes):
        what = _what(change)
        key: tuple[object, ...] = (change.kind, change.severity, what) if what is not None else (index,)
        groups.setdefault(key, []).append(change)
    lines = []
    for key, members in groups.items():
        group = tuple(members)
        if len(group) <= fold_over or len(key) == 1:
            lines += [ChangeLine(c.kind, c.severity, c.message, (c,)) for c in group]
        else:
            lines.append(ChangeLine(group[0].kind, group[0].severity,
                                    f"{len(group)} tensors: {key[2]} ({_names(group)})", group))
    return lines
