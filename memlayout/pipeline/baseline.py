"""Baselines: a file of the findings a project accepts, recorded by `--write-baseline`
and hidden from later runs by `--baseline`. The one path from the two flags to the
batch the reporters render is `apply_baseline_flags`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import replace
from pathlib import PurePath
from typing import Any

from memlayout.errors import UsageError
from memlayout.output.writer import write_output
from memlayout.pipeline.batch import (
    BaselineEntry,
    BaselineOutcome,
    BatchReport,
    PathReport,
    without_findings,
)
from memlayout.rules import Finding
from memlayout.rules.registry import FINGERPRINT_SCHEME


def apply_baseline_flags(batch: BatchReport, baseline: str | None, write_baseline: str | None) -> BatchReport:
    """Record the findings (--write-baseline) and hide the recorded ones (--baseline).

    Raises:
        UsageError: the two flags name different files, or a file is not a baseline.
        OutputError: --write-baseline's file cannot be written.
    """
    if baseline is not None and write_baseline is not None and baseline != write_baseline:
        raise UsageError(
            "--baseline and --write-baseline name different files",
            "to shrink a baseline, write the same file that --baseline reads",
        )
    if write_baseline is not None:
        entries = record_baseline(batch, write_baseline, previous_entries(write_baseline))
        write_output(baseline_text(entries), write_baseline)
        return apply_baseline(batch, entries, write_baseline, written=True)
    if baseline is not None:
        return apply_baseline(batch, read_baseline(baseline), baseline)
    return batch


BASELINE_VERSION = 2
"""2: each finding records its fingerprint's scheme (`FINGERPRINT_SCHEME`). Files of version 1,
whose fingerprints cover the rule and the tensors only, are still read."""
_READ_VERSIONS = (1, 2)
_KEY = "memlayout-baseline"


def baseline_path_key(path: str, baseline_file: str) -> str:
    """How the file names an inspected path: relative to the baseline's folder, with `/`.

    An import spec (no such file) is kept as given.
    """
    if not os.path.exists(path):
        return path
    folder = os.path.dirname(os.path.abspath(baseline_file))
    try:
        return PurePath(os.path.relpath(os.path.abspath(path), folder)).as_posix()
    except ValueError:  # another drive on Windows
        return PurePath(os.path.abspath(path)).as_posix()


def read_baseline(file: str) -> list[BaselineEntry]:
    """The entries of a baseline file.

    Raises:
        UsageError: the file is missing, not JSON, or not a memlayout baseline.
    """
    import json  # only a run with a baseline reads one

    try:
        with open(file, "rb") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise UsageError(f"--baseline {file}: no such file", f"create it with --write-baseline {file}") from None
    except OSError as exc:
        raise UsageError(f"--baseline {file}: cannot be read: {exc.strerror}") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{file} is not a memlayout baseline (not JSON: {exc})",
                         "write it with --write-baseline") from exc
    return _entries(data, file)


def _entries(data: Any, file: str) -> list[BaselineEntry]:
    if not isinstance(data, dict) or data.get(_KEY) not in _READ_VERSIONS or not isinstance(data.get("findings"), list):
        raise UsageError(
            f"{file} is not a memlayout baseline (version {' or '.join(map(str, _READ_VERSIONS))})",
            "write it with --write-baseline",
        )
    # A version-1 file's fingerprints are all of scheme 1; a version-2 file says each one's.
    default_scheme = 1 if data[_KEY] == 1 else FINGERPRINT_SCHEME
    entries = []
    for item in data["findings"]:
        try:
            entries.append(BaselineEntry(
                path=str(item["path"]), code=str(item["code"]), fingerprint=str(item["fingerprint"]),
                tensors=tuple(str(t) for t in item.get("tensors", ())),
                scheme=int(item.get("scheme", default_scheme)),
            ))
        except (TypeError, KeyError, ValueError) as exc:
            raise UsageError(f"{file}: a finding lacks {exc}", "write the file again with --write-baseline") from None
    return entries


def baseline_text(entries: Iterable[BaselineEntry]) -> str:
    """The file's text: sorted, so that rewriting an unchanged baseline changes no byte."""
    import json

    findings = [
        {"path": e.path, "code": e.code, "fingerprint": e.fingerprint, "scheme": e.scheme, "tensors": list(e.tensors)}
        for e in sorted(set(entries), key=lambda e: (e.path, e.code, e.fingerprint))
    ]
    return json.dumps({_KEY: BASELINE_VERSION, "findings": findings}, indent=2) + "\n"


def _inspected(batch: BatchReport, file: str) -> dict[str, PathReport]:
    return {baseline_path_key(p.path, file): p for p in batch.paths if p.report is not None}


def record_baseline(batch: BatchReport, file: str, previous: Iterable[BaselineEntry] = ()) -> list[BaselineEntry]:
    """Every current finding of the inspected paths, plus the `previous` entries of paths
    this run did not inspect (so that writing a baseline for some paths keeps the rest)."""
    inspected = _inspected(batch, file)
    entries = [e for e in previous if e.path not in inspected]
    for key, path in inspected.items():
        assert path.report is not None
        for finding in (*path.report.findings, *path.suppressed):
            entries.append(BaselineEntry(key, finding.code, finding.fingerprint, tuple(sorted(finding.tensors))))
    return entries


def apply_baseline(
    batch: BatchReport, entries: Iterable[BaselineEntry], file: str, written: bool = False
) -> BatchReport:
    """`batch` with the recorded findings moved out of each report into `suppressed`, and the
    recorded findings of inspected paths that no longer occur listed as fixed.

    An entry of fingerprint scheme 1 (rule and tensors only) still hides a finding whose
    fingerprint is the same under both schemes; one whose fingerprint now covers more
    (ML601's globals) is shown and listed as rekeyed: the old key would hide a pickle
    that gained `os.system` as readily as the one that was accepted.
    """
    entries = list(entries)
    recorded = {(e.path, e.fingerprint) for e in entries if e.scheme == FINGERPRINT_SCHEME}
    recorded_v1 = {(e.path, e.fingerprint) for e in entries if e.scheme == 1}
    inspected = _inspected(batch, file)
    paths: list[PathReport] = []
    seen: set[tuple[str, str]] = set()
    rekeyed: list[BaselineEntry] = []
    suppressed_total = 0
    for path in batch.paths:
        if path.report is None:
            paths.append(path)
            continue
        key = baseline_path_key(path.path, file)
        known: list[Finding] = []
        for finding in path.report.findings:
            if (key, finding.fingerprint) in recorded:
                known.append(finding)
            elif (key, finding.fingerprint_v1) in recorded_v1:
                if finding.fingerprint == finding.fingerprint_v1:
                    known.append(finding)
                else:
                    rekeyed.append(BaselineEntry(path.path, finding.code, finding.fingerprint,
                                                 tuple(sorted(finding.tensors))))
        for finding in (*path.report.findings, *path.suppressed):
            seen.update(((key, finding.fingerprint), (key, finding.fingerprint_v1)))
        suppressed_total += len(known)
        paths.append(replace(
            path, report=without_findings(path.report, known) if known else path.report,
            suppressed=(*path.suppressed, *known),
        ))
    fixed = tuple(
        replace(e, path=inspected[e.path].path)  # named as this run named the path
        for e in sorted(set(entries), key=lambda e: (e.path, e.code, e.fingerprint))
        if e.path in inspected and (e.path, e.fingerprint) not in seen
    )
    outcome = BaselineOutcome(file=file, suppressed=suppressed_total, fixed=fixed, written=written,
                              rekeyed=tuple(rekeyed))
    return replace(batch, paths=tuple(paths), baseline=outcome)


def previous_entries(file: str) -> list[BaselineEntry]:
    """The entries already in `file` (none for a new file), before `--write-baseline` rewrites it.

    Raises:
        UsageError: `file` exists and is no memlayout baseline: it is not ours to overwrite.
    """
    if not os.path.lexists(file):
        return []
    try:
        return read_baseline(file)
    except UsageError:
        raise UsageError(
            f"--write-baseline {file}: the file exists and is not a memlayout baseline; not overwriting it",
            "name a new file, or remove this one first",
        ) from None
