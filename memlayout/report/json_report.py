"""The JSON report: schema 1 for one path, schema 2 for several (docs/schemas.md; schema_v1/v2.json).

One path gives exactly the schema-1 document. Several paths give a schema-2
document whose `reports[]` each hold one path's schema-1 report, or its load error.
Only additive changes are allowed within a schema version; removing or renaming a
key bumps `schema`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from memlayout.core.facts import Facts, alias_groups_with_ties
from memlayout.core.strides import MemoryFormat
from memlayout.load.records import TensorKind
from memlayout.output.interface import Formatter
from memlayout.pipeline.batch import BaselineOutcome, BatchReport
from memlayout.pipeline.inspection import Report
from memlayout.report.json_text import LazyArray, json_pieces
from memlayout.report.shards import ranks_entries, shard_entries
from memlayout.rules import Finding
from memlayout.rules.pickle_dangers import JudgedGlobal
from memlayout.version import __version__

SCHEMA_VERSION = 1
MULTI_PATH_SCHEMA_VERSION = 2


def report_document(report: Report) -> dict[str, Any]:
    """The report as JSON-ready data whose per-tensor arrays are `LazyArray`s, built as they are encoded."""
    facts = report.facts
    document = _document(report)
    if facts.shards:
        document["ranks"] = ranks_entries(facts)
        document["shards"] = shard_entries(facts)
    return document


def _contents(facts: Facts) -> dict[str, Any]:
    # Only a compressed stream or an archive has contents; other sources' documents are unchanged.
    if not facts.source.contents:
        return {}
    return {"contents": [
        {"member": m.member, "within": list(m.within), "format": m.format, "what": m.what}
        for m in facts.source.contents
    ]}


def _document(report: Report) -> dict[str, Any]:
    facts = report.facts
    return {
        "schema": SCHEMA_VERSION,
        "tool": {"name": "memlayout", "version": __version__},
        "source": {
            "path": facts.source.path,
            "format": facts.source.format,
            "legacy_format": facts.source.legacy_format,
            "notes": list(facts.source.notes),
            "formats": [facts.source.format, *facts.source.also_valid_as],
            **_contents(facts),
        },
        "summary": {
            "tensors": report.summary.tensors,
            "names": report.summary.names,
            "parameters": report.summary.parameters,
            "buffers": report.summary.buffers,
            "storages": report.summary.storages,
            "tensor_bytes": report.summary.tensor_bytes,
            "storage_bytes": report.summary.storage_bytes,
            "unique_bytes": report.summary.unique_bytes,
            "padding_bytes": report.summary.padding_bytes,
            "wasted_bytes": report.summary.wasted_bytes,
            "findings": dict(report.summary.findings),
        },
        "tensors": LazyArray(_tensor_entries(facts)),
        "storages": LazyArray(_storage_entries(facts)),
        "alias_groups": LazyArray(
            {
                "storage": g.storage,
                "tensors": list(g.tensors),
                "pairs": [{"first": p.first, "second": p.second, "relation": p.relation.value} for p in g.pairs],
            }
            for g in alias_groups_with_ties(facts)
        ),
        "modules": LazyArray(
            {
                "path": m.path,
                "class": m.class_name,
                "rnn": None
                if m.rnn is None
                else {"mode": m.rnn.mode, "weights": list(m.rnn.flat_weight_names),
                      "unregistered": list(m.rnn.unregistered)},
            }
            for m in facts.modules
        ),
        "findings": LazyArray(_finding_entry(f) for f in report.findings),
        "skipped_rules": [{"code": s.code, "name": s.name, "reason": s.reason} for s in report.skipped],
    }


def _finding_entry(f: Finding) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "code": f.code,
        "name": f.name,
        "severity": f.severity.value,
        "tensors": list(f.tensors),
        "message": f.message,
        "hint": f.hint,
        "storage": f.storage,
        "wasted_bytes": f.wasted_bytes,
        "fingerprint": f.fingerprint,
    }
    if f.pickle_globals:
        entry["globals"] = globals_entries(f.pickle_globals)
    return entry


def globals_entries(judged: Iterable[JudgedGlobal]) -> list[dict[str, str]]:
    """ML601's globals as JSON: module, name, danger class, why, and the member that names it."""
    return [
        {"module": g.module, "name": g.name, "danger": g.danger.value, "does": g.does, "member": g.member}
        for g in judged
    ]


def _tensor_entries(facts: Facts) -> Iterator[dict[str, Any]]:
    # Once per tensor: enum values by dict lookup rather than through the enum's
    # descriptor.
    kinds = {kind: kind.value for kind in TensorKind}
    formats = {fmt: fmt.value for fmt in MemoryFormat}
    for t in facts.tensors:
        yield {
            "name": t.name,
            "names": list(t.names),
            "kind": kinds[t.kind],
            "section": t.section,
            "dtype": t.dtype,
            "device": t.device,
            "shape": list(t.shape),
            "stride": list(t.stride),
            "storage": t.storage,
            "offset": t.offset,
            "byte_offset": t.offset * t.itemsize,
            "nbytes": t.nbytes,
            "contiguous": t.contiguous,
            "memory_format": formats[t.memory_format],
            "self_overlapping": t.self_overlapping,
            "requires_grad": t.requires_grad,
            "optimizer_state": t.optimizer_state,
            "pinned": t.pinned,
            "shared_memory": t.shared_memory,
        }


def _storage_entries(facts: Facts) -> Iterator[dict[str, Any]]:
    # Each view's range is made in one pass over the tensors: most storages hold
    # one view, so a storage's list is made when its first view is met. The span is
    # read in one look (ByteSet.span), not through .start and .end.
    ranges: dict[str, list[dict[str, Any]]] = {}
    for t in facts.tensors:
        start, end = t.bytes_used.span
        entry = {"tensor": t.name, "start": start, "end": end}
        same_storage = ranges.get(t.storage)
        if same_storage is None:
            ranges[t.storage] = [entry]
        else:
            same_storage.append(entry)
    for s in facts.storages:
        yield {
            "id": s.id,
            "device": s.device,
            "nbytes": s.nbytes,
            "tensors": list(s.tensors),
            "ranges": ranges.get(s.id, []),
            "used_bytes": s.used_bytes,
            "padding_bytes": s.padding_bytes,
            "unused_bytes": s.unused_bytes,
        }


def report_dict(report: Report) -> dict[str, Any]:
    """The report as plain JSON-ready data (lists and dicts), as `--format json` writes it."""
    return {key: list(value) if isinstance(value, LazyArray) else value
            for key, value in report_document(report).items()}


def baseline_dict(baseline: BaselineOutcome) -> dict[str, Any]:
    """What the baseline did: `file`, `written`, `suppressed` (a count) and `fixed[]`."""
    return {
        "file": baseline.file,
        "written": baseline.written,
        "suppressed": baseline.suppressed,
        "fixed": [
            {"path": e.path, "code": e.code, "fingerprint": e.fingerprint, "tensors": list(e.tensors)}
            for e in baseline.fixed
        ],
        "rekeyed": [
            {"path": e.path, "code": e.code, "fingerprint": e.fingerprint, "tensors": list(e.tensors)}
            for e in baseline.rekeyed
        ],
    }


def batch_dict(batch: BatchReport) -> dict[str, Any]:
    """Several paths as plain JSON-ready data (schema 2); each `report` is a schema-1 document."""
    failed = len(batch.failures)
    return {
        "schema": MULTI_PATH_SCHEMA_VERSION,
        "tool": {"name": "memlayout", "version": __version__},
        "fail_on": batch.fail_on.value,
        "exit_code": batch.exit_code(),
        "summary": {
            "paths": len(batch.paths),
            "inspected": len(batch.reports),
            "failed": failed,
            "data": len(batch.data),
            "findings": batch.findings_by_severity(),
        },
        "reports": [
            {
                "path": p.path,
                "report": None if p.report is None else report_dict(p.report),
                "error": p.error,
                "data": p.data,
                "suppressed": len(p.suppressed),
                **({"globals": globals_entries(p.pickle_globals)} if p.pickle_globals else {}),
            }
            for p in batch.paths
        ],
        "baseline": None if batch.baseline is None else baseline_dict(batch.baseline),
    }


def render_json(report: Report) -> str:
    """One report as indented JSON text (schema 1), ending with a newline."""
    return "".join(json_pieces(report_document(report))) + "\n"


class JsonReporter(Formatter[BatchReport]):
    """Schema 1 for one inspected path (plus `baseline` when one is used), schema 2 for several."""

    def render(self, batch: BatchReport) -> str:
        return "".join(self.render_pieces(batch))

    def render_pieces(self, batch: BatchReport) -> Iterator[str]:
        # One path's tensors and storages are encoded a batch at a time (json_text),
        # so a report of 100,000 tensors is written out without being held whole.
        single = batch.single
        if single is not None and single.report is not None:
            data = report_document(single.report)
            if batch.data:
                # A model folder's other files, each read and found to be data (added within schema 1).
                data["data_files"] = [{"path": p.path, "data": p.data} for p in batch.data]
            if batch.baseline is not None:
                data["baseline"] = baseline_dict(batch.baseline)
        else:
            data = batch_dict(batch)
        yield from json_pieces(data)
        yield "\n"
