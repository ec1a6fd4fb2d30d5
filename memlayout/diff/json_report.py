"""The diff as JSON, schema version 1 (published as `memlayout/diff/schema_v1.json`).

Within a schema version keys are only ever added; a change of shape publishes
`schema_v2.json` beside it and bumps `schema`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from memlayout.diff.changes import DiffReport
from memlayout.output.interface import Formatter
from memlayout.pipeline.inspection import Report
from memlayout.version import __version__

SCHEMA_VERSION = 1


def _side(report: Report) -> dict[str, Any]:
    source = report.facts.source
    return {
        "path": source.path,
        "format": source.format,
        "summary": dataclasses.asdict(report.summary),
    }


def diff_dict(diff: DiffReport) -> dict[str, Any]:
    """The diff as plain JSON-ready data."""
    return {
        "schema": SCHEMA_VERSION,
        "report": "diff",
        "tool": {"name": "memlayout", "version": __version__},
        "a": _side(diff.a),
        "b": _side(diff.b),
        "options": {
            "strip_prefixes": list(diff.strip_prefixes),
            "maps": [{"old": old, "new": new} for old, new in diff.renames],
            "deep": diff.deep,
        },
        "matched": diff.matched,
        "counts": diff.counts(),
        "changes": [
            {
                "kind": c.kind.value,
                "severity": c.severity.value,
                "tensors": list(c.tensors),
                "a_names": list(c.a_names),
                "b_names": list(c.b_names),
                "message": c.message,
                "before": c.before,
                "after": c.after,
            }
            for c in diff.changes
        ],
    }


def render_diff_json(diff: DiffReport) -> str:
    """The diff as indented JSON text, ending with a newline."""
    return json.dumps(diff_dict(diff), indent=2) + "\n"


class DiffJson(Formatter[DiffReport]):
    """The diff as JSON (schema_v1.json beside this module)."""

    def render(self, diff: DiffReport) -> str:
        return render_diff_json(diff)
