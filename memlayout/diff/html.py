"""A diff as one self-contained HTML page: A's and B's storage maps side by side (`diff --html`).

The page is inspect's storage map (`memlayout.report.html`) with two sides, each
tensor coloured by the worst change about it, and the diff's change lines linked
to the tensors they name.
"""

from __future__ import annotations

from memlayout.diff.changes import DiffReport
from memlayout.diff.grouping import change_lines
from memlayout.diff.names import NameMap
from memlayout.output.interface import Formatter
from memlayout.report.html import MARK_ORDER, side_data, storage_map_page, tensor_indices

# How a diff colours a tensor: a change of each kind marks the tensors it names on
# the side(s) where they exist (MARK_ORDER says which mark wins).
_BROKEN = {"tie-lost", "declared-tie-broken", "data-lost"}
_CHANGED = {"dtype", "shape", "device", "contiguity", "stride", "values"}


def render_diff_html(diff: DiffReport) -> str:
    """A diff as a page: A and B side by side, their changes coloured and linked.

    Args:
        diff: What `memlayout.diff.run_diff` returned.

    Returns:
        The page's text.
    """
    names = NameMap(diff.strip_prefixes, diff.renames)
    marks_a: dict[str, str] = {}
    marks_b: dict[str, str] = {}
    for change in diff.changes:
        kind = change.kind.value
        if kind in _BROKEN:
            mark_a = mark_b = "broken"
        elif kind == "removed":
            mark_a, mark_b = "removed", ""
        elif kind == "added":
            mark_a, mark_b = "", "added"
        elif kind in _CHANGED:
            mark_a = mark_b = "changed"
        else:
            continue
        for key in change.tensors:
            for marks, mark in ((marks_a, mark_a), (marks_b, mark_b)):
                known = marks.get(key)
                if mark and (known is None or MARK_ORDER.index(mark) < MARK_ORDER.index(known)):
                    marks[key] = mark
    side_a = side_data(diff.a, "A", names.key_in_a, marks_a)
    side_b = side_data(diff.b, "B", names.key_in_b, marks_b)
    index_a = {t.name: i for i, t in enumerate(diff.a.facts.tensors)}
    index_b = {t.name: i for i, t in enumerate(diff.b.facts.tensors)}
    lines = [
        [
            line.severity.value, line.kind.value, line.text,
            tensor_indices(diff.a.facts, index_a, [n for c in line.changes for n in c.a_names]),
            tensor_indices(diff.b.facts, index_b, [n for c in line.changes for n in c.b_names]),
        ]
        for line in change_lines(diff.changes)
    ]
    title = f"memlayout diff: {diff.a.facts.source.path or '(object)'} -> {diff.b.facts.source.path or '(object)'}"
    return storage_map_page(title, [side_a, side_b], [diff.a, diff.b], lines)


class DiffHtml(Formatter[DiffReport]):
    """The diff's page (`diff --html FILE`, `--format html`)."""

    def render(self, diff: DiffReport) -> str:
        return render_diff_html(diff)
