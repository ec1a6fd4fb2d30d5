"""The text `memlayout flatten --check` prints: one verdict a path, then a summary line."""

from __future__ import annotations

from collections import Counter

from memlayout.format_bytes import counted
from memlayout.pipeline.flatten_check import CheckBatch, CheckedPath, Verdict
from memlayout.rules import Finding
from memlayout.severity import FailOn


def _named(finding: Finding, checked: CheckedPath) -> str:
    held_in = checked.files.get(finding)
    return f"{finding.code} {finding.severity.value} {finding.name}" + (f" in {held_in}" if held_in else "")


def _why_passes(checked: CheckedPath, fail_on: FailOn) -> str:
    """Why flatten would still rewrite a path the check passes, in one clause."""
    assert checked.result is not None
    # The first change says what the rewrite is about (storages merged, tensors reordered);
    # the per-tensor moves that follow from it are --check's detail for a path that fails.
    first = checked.result.changes[0]
    if not checked.below:
        return f"{first}, which no finding asks for"
    codes = ", ".join(dict.fromkeys(f"{f.code} {f.name}" for f in checked.below))
    severities = "/".join(dict.fromkeys(f.severity.value for f in checked.below))
    threshold = "--fail-on never fails none" if fail_on is FailOn.NEVER else f"below --fail-on {fail_on.value}"
    return f"{first}, for {codes} ({severities}, {threshold})"


def _notes(checked: CheckedPath) -> list[str]:
    assert checked.result is not None
    lines = [f"  note: {note}" for note in checked.result.notes]
    lines += [
        f"  note: {_named(f, checked)}: {f.message}; flatten does not fix it here, `memlayout inspect` reports it"
        for f in checked.unfixed
    ]
    return lines


def render_verdict(checked: CheckedPath, fail_on: FailOn) -> str:
    """One path's verdict: a line, and for a path that would change, what fails it and what flatten changes.

    Args:
        checked: The path's verdict.
        fail_on: The --fail-on threshold it was judged at.

    Returns:
        Lines ending in a newline; empty for a path not checked (its error goes to stderr) and for a
        file read as data (the summary counts it).
    """
    result = checked.result
    if result is None:
        return ""
    if checked.verdict is Verdict.ALREADY_FLAT:
        lines = [f"{checked.path}: already flat ({counted(result.storages_before, 'storage')})"]
    elif checked.verdict is Verdict.PASSES:
        lines = [f"{checked.path}: passes ({result.format}); flatten would still rewrite it: "
                 f"{_why_passes(checked, fail_on)}"]
    else:
        lines = [f"{checked.path}: would change ({result.format}):"]
        lines += [f"  {_named(f, checked)}: {f.message}" for f in checked.failing]
        lines += [f"  {change}" for change in result.changes]
        # The count ML204 quotes ("flatten would use N"), so the two can be read side by side.
        lines.append(f"  storages  {result.storages_before} -> {result.storages_after}")
    return "\n".join(lines + _notes(checked)) + "\n"


def _data_clause(data: tuple[CheckedPath, ...]) -> str:
    """The files read as data, by what they are, most common first:
    "2 other files read as data, nothing to flatten: JSON text (2)"."""
    kinds = Counter(p.data or "" for p in data)
    listed = ", ".join(f"{what} ({count:,})" for what, count in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{counted(len(data), 'other file')} read as data, nothing to flatten: {listed}"


def render_summary(batch: CheckBatch) -> str:
    """The closing line over several paths: how many got each verdict, the threshold, and the files read as data."""
    counts = batch.counts()
    line = (
        f"{counted(len(batch.checked), 'path')} checked at --fail-on {batch.fail_on.value}: "
        f"{counts[Verdict.ALREADY_FLAT]} already flat, {counts[Verdict.PASSES]} pass as written, "
        f"{counts[Verdict.WOULD_CHANGE]} would change, {counts[Verdict.NOT_CHECKED]} not checked"
    )
    return line + (f"; {_data_clause(batch.data)}" if batch.data else "") + "\n"


def render_data_line(batch: CheckBatch) -> str:
    """For one model folder checked alone, the line that accounts for its other files read as data (as
    `inspect` words it); empty when there are none."""
    return f"and {_data_clause(batch.data)}\n" if batch.data else ""
