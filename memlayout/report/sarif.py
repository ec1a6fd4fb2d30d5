"""SARIF 2.1.0, for code-scanning dashboards (GitHub code scanning, Azure DevOps, IDEs).

One run for the whole call: the rule descriptors come from the rule registry, and
each finding is a result in the artifact of its checkpoint (in a model folder, the
weight file that holds it). A path that failed to
load, and a rule a source lacks the data for, are notifications of the invocation. Nothing in the output
depends on the machine or the time: paths are relative to the working directory,
and each result's `partialFingerprints` hash the rule, the tensor names and what else
the finding is about (ML601's globals), never the path, so a dashboard recognizes
the same finding across runs, machines and file moves, and a pickle that gains a
global as a new one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path, PurePath
from typing import Any
from urllib.parse import quote

from memlayout.output.interface import Formatter
from memlayout.pipeline.batch import BatchReport, PathReport
from memlayout.report.findings import finding_file, findings_in_order
from memlayout.report.json_text import LazyArray, StreamedList, StreamedObject, json_pieces
from memlayout.report.rule_docs import explain_markdown, explain_text
from memlayout.rules import RULES, Finding, Rule, Severity
from memlayout.version import __version__

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_VERSION = "2.1.0"
FINGERPRINT_KEY = "memlayoutFinding/v1"
"""The `partialFingerprints` key; its value is `Finding.fingerprint`."""


def sarif_level(severity: Severity) -> str:
    """SARIF's name for a severity: error, warning, note."""
    return {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}[severity]


def artifact_uri(path: str) -> str | None:
    """A URI reference for a checkpoint on disk: relative to the working directory when it
    lies inside it, else a file: URI; None for what is no file (an import spec, an object)."""
    if not os.path.exists(path):
        return None
    given = Path(path)
    if given.is_absolute():
        try:
            relative = PurePath(os.path.relpath(given, Path.cwd()))
        except ValueError:  # another drive on Windows
            return given.as_uri()
        if relative.parts and relative.parts[0] == "..":
            return given.as_uri()
        return quote(relative.as_posix())
    return quote(PurePath(os.path.normpath(path)).as_posix())


def rule_descriptor(rule: Rule) -> dict[str, Any]:
    """A `reportingDescriptor` built from the registry entry, the only source of a rule's texts."""
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": rule.full_description},
        "help": {"text": explain_text(rule), "markdown": explain_markdown(rule)},
        "defaultConfiguration": {"level": sarif_level(rule.severity)},
        "properties": {"tags": list(rule.tags)},
    }


def _location(path: PathReport, file: str | None = None) -> dict[str, Any]:
    where = file or path.path
    uri = artifact_uri(where)
    if uri is None:
        return {"logicalLocations": [{"fullyQualifiedName": where, "kind": "module"}]}
    return {"physicalLocation": {"artifactLocation": {"uri": uri}}}


def _finding_locations(path: PathReport) -> Callable[[Finding], dict[str, Any]]:
    """Each finding's location: the path's own, asked of the file system once, or in a model
    folder the weight file (shard) that holds the finding, once per file."""
    assert path.report is not None
    facts = path.report.facts
    if not facts.source.files:
        location = _location(path)
        return lambda finding: location
    by_file: dict[str, dict[str, Any]] = {}

    def locate(finding: Finding) -> dict[str, Any]:
        file = finding_file(path.path, facts, finding)
        if file not in by_file:
            by_file[file] = _location(path, file)
        return by_file[file]

    return locate


def result_message(finding: Finding) -> str:
    """The finding's message naming every tensor involved, then the fix."""
    unnamed = [name for name in finding.tensors if name not in finding.message]
    tensors = f" (tensors: {', '.join(unnamed)})" if unnamed else ""
    return f"{finding.message}{tensors}. Fix: {finding.hint}"


def _result(finding: Finding, location: dict[str, Any], rule_index: dict[str, int]) -> dict[str, Any]:
    result: dict[str, Any] = {
        "ruleId": finding.code,
        "ruleIndex": rule_index[finding.code],
        "level": sarif_level(finding.severity),
        "message": {"text": result_message(finding)},
        "locations": [location],
        "partialFingerprints": {FINGERPRINT_KEY: finding.fingerprint},
        "properties": {
            "tensors": list(finding.tensors),
            "storage": finding.storage,
            "wastedBytes": finding.wasted_bytes,
        },
    }
    if finding.pickle_globals:
        # ML601: each global with its danger class, for a dashboard to sort and filter on.
        result["properties"]["globals"] = [
            {"module": g.module, "name": g.name, "danger": g.danger.value, "does": g.does, "member": g.member}
            for g in finding.pickle_globals
        ]
    return result


def _baseline_results(batch: BatchReport, rule_index: dict[str, int]) -> list[dict[str, Any]]:
    # SARIF's own baseline vocabulary: a finding the baseline records is "unchanged"
    # and carries an external suppression (viewers hide it); one it lacks is "new";
    # a recorded finding that no longer occurs is an "absent" pass.
    assert batch.baseline is not None
    justification = f"recorded in the baseline {batch.baseline.file}"
    # A finding the baseline recorded under an older fingerprint scheme is shown as "updated":
    # in the baseline, but its key no longer tells whether what it warns about changed.
    rekeyed = {(e.path, e.fingerprint) for e in batch.baseline.rekeyed}
    results: list[dict[str, Any]] = []
    for path in batch.paths:
        if path.report is None:
            continue
        locate = _finding_locations(path)
        for finding in findings_in_order(path.report.findings):
            state = "updated" if (path.path, finding.fingerprint) in rekeyed else "new"
            results.append({**_result(finding, locate(finding), rule_index), "baselineState": state})
        for finding in findings_in_order(path.suppressed):
            results.append({
                **_result(finding, locate(finding), rule_index),
                "baselineState": "unchanged",
                "suppressions": [{"kind": "external", "status": "accepted", "justification": justification}],
            })
    paths = {p.path: p for p in batch.paths}
    for entry in batch.baseline.fixed:
        path = paths.get(entry.path, PathReport(entry.path))
        results.append({
            "ruleId": entry.code,
            "ruleIndex": rule_index[entry.code],
            "kind": "pass",
            "level": "none",
            "message": {"text": f"{entry.code} on {', '.join(entry.tensors) or 'this checkpoint'} no longer occurs"},
            "locations": [_location(path)],
            "partialFingerprints": {FINGERPRINT_KEY: entry.fingerprint},
            "baselineState": "absent",
            "properties": {"tensors": list(entry.tensors)},
        })
    return results


def _load_error(path: PathReport) -> dict[str, Any]:
    return {
        "level": "error",
        "message": {"text": path.error_line},
        "locations": [_location(path)],
        "descriptor": {"id": "load-error"},
    }


def _skipped_rule(code: str, reason: str, path: PathReport, rule_index: dict[str, int]) -> dict[str, Any]:
    # A rule the source cannot feed is a note about the run, not a result.
    return {
        "level": "note",
        "message": {"text": f"{code} {RULES[code].name} was not run on {path.path}: {reason}"},
        "locations": [_location(path)],
        "descriptor": {"id": "rule-skipped"},
        "associatedRule": {"id": code, "index": rule_index[code]},
    }


def sarif_log(batch: BatchReport, streamed: bool = False) -> dict[str, Any]:
    """The SARIF log as plain JSON-ready data.

    Args:
        batch: The inspected paths.
        streamed: Make the results as they are written (json_text.json_pieces)
            rather than as one list: one result per finding, and a checkpoint can
            have 40,000.
    """
    codes = sorted(RULES)
    rule_index = {code: index for index, code in enumerate(codes)}
    artifacts: list[dict[str, Any]] = []
    for path in batch.paths:
        # A model folder's weight files too: its findings are located in them.
        files = path.report.facts.source.files if path.report is not None else ()
        for file in (path.path, *(os.path.join(path.path, name) for name in files)):
            uri = artifact_uri(file)
            if uri is not None and all(a["location"]["uri"] != uri for a in artifacts):
                artifacts.append({"location": {"uri": uri}})
    results: list[dict[str, Any]] | LazyArray
    if batch.baseline is not None:
        results = _baseline_results(batch, rule_index)
    else:
        # Each path's location once: artifact_uri asks the file system, and one
        # checkpoint can have 40,000 findings.
        made = (
            _result(finding, locate(finding), rule_index)
            for path in batch.paths
            if path.report is not None
            for locate in (_finding_locations(path),)
            for finding in findings_in_order(path.report.findings)
        )
        results = LazyArray(made) if streamed else list(made)
    invocation: dict[str, Any] = {"executionSuccessful": not batch.failures}
    notifications = [_load_error(path) for path in batch.failures] + [
        _skipped_rule(skipped.code, skipped.reason, path, rule_index)
        for path in batch.paths
        if path.report is not None
        for skipped in path.report.skipped
    ]
    if notifications:
        invocation["toolExecutionNotifications"] = notifications
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "memlayout",
                "version": __version__,
                "semanticVersion": __version__,
                "rules": [rule_descriptor(RULES[code]) for code in codes],
            }
        },
        "invocations": [invocation],
        "artifacts": artifacts,
        "results": results,
    }
    if streamed:
        return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": StreamedList([StreamedObject(run)])}
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}


class SarifReporter(Formatter[BatchReport]):
    """One SARIF run holding every path's results."""

    def render(self, batch: BatchReport) -> str:
        return "".join(self.render_pieces(batch))

    def render_pieces(self, batch: BatchReport) -> Iterator[str]:
        # One result per finding, made as it is written: orjson writes the standard
        # library's exact text, a batch of results at a time.
        yield from json_pieces(sarif_log(batch, streamed=True))
        yield "\n"
