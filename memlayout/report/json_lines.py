"""JSON Lines: one line per inspected path, written as each path finishes (`--format jsonl`).

Each line is one compact JSON object (`schema_jsonl_v1.json`): `jsonl`, the
line's version (1), the path, its schema-1 report (or null), its load error (or
null), and how many findings a baseline hid. A run over thousands of paths writes each line when its path is done and
keeps none of them, so a report of 10,000 paths is never held whole, and a run
stopped halfway leaves every line it wrote whole and parseable. The lines of
several runs (the shards of `--shard K/N`) concatenate into one report.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson

from memlayout.output.interface import Formatter
from memlayout.pipeline.batch import BatchReport, PathReport
from memlayout.report.json_report import globals_entries, report_dict

SCHEMA_VERSION = 1


def path_line(path: PathReport) -> str:
    """One path's line, ending with a newline."""
    entry = {
        "jsonl": SCHEMA_VERSION,
        "path": path.path,
        "report": None if path.report is None else report_dict(path.report),
        "error": path.error_line if path.failed else None,
        "data": path.data,
        "suppressed": len(path.suppressed),
    }
    if path.pickle_globals:
        entry["globals"] = globals_entries(path.pickle_globals)
    return orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE).decode()


class JsonLinesReporter(Formatter[BatchReport]):
    """A line per path of a batch held whole; the CLI writes the same lines as the paths finish."""

    def render(self, batch: BatchReport) -> str:
        return "".join(self.render_pieces(batch))

    def render_pieces(self, batch: BatchReport) -> Iterator[str]:
        for path in batch.paths:
            yield path_line(path)
