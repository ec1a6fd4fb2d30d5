"""A compact Markdown report for a pull-request comment: a summary line, then the
findings in one table per severity, worst first.

Tensor names come from the checkpoint, which may be anyone's: in the text they put
into a table, Markdown's punctuation is backslash-escaped, so a name cannot close a
cell, open a link or inject HTML into the comment.
"""

from __future__ import annotations

import re

from memlayout.output.interface import Formatter
from memlayout.pipeline.batch import BatchReport, PathReport
from memlayout.report.findings import count_phrase, finding_file, findings_in_order
from memlayout.rules import Finding, Severity
from memlayout.rules.pickle_dangers import Danger

SECTION_TITLES = {Severity.ERROR: "Errors", Severity.WARNING: "Warnings", Severity.INFO: "Info"}
_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_{}\[\]<>#+!|~&:])")


def escape_text(text: str) -> str:
    """Untrusted text for a table cell: punctuation escaped, on one line."""
    return " ".join(_MARKDOWN_PUNCTUATION.sub(r"\\\1", text).split())


def escape_cell(text: str) -> str:
    """Our own Markdown (a hint with `code`) for a table cell: only `|` and newlines."""
    return " ".join(text.replace("|", "\\|").split())


def _code(path: str) -> str:
    # A code span cannot hold its own backtick count; a path with backticks is escaped text instead.
    return f"`{path}`" if "`" not in path and "\n" not in path else escape_text(path)


def _summary(batch: BatchReport) -> str:
    outcome = "fails" if batch.exit_code() else "passes"
    counts = count_phrase(batch.findings_by_severity())
    single = batch.single
    where = _code(single.path) if single is not None else f"{len(batch.paths)} paths"
    line = f"**memlayout {outcome}** (`--fail-on {batch.fail_on.value}`): {counts} in {where}"
    if batch.failures:
        line += f"; {len(batch.failures)} failed to load"
    if batch.data:
        line += f"; {len(batch.data)} recognized as data"
    if batch.baseline is not None:
        line += f"; {batch.baseline.suppressed} known from the baseline"
    return line


def _globals(finding: Finding) -> str:
    # ML601: each global with its danger class, worst first, on the finding's own line of the table.
    order = {Danger.RUNS_CODE: 0, Danger.CONSTRUCTS_OBJECT: 1, Danger.ALLOW_LISTED: 2}
    listed = sorted(finding.pickle_globals, key=lambda g: (order[g.danger], g.module, g.name))
    return "<br>".join(
        f"{escape_text(g.module + '.' + g.name)}: **{g.danger.value}**"
        + (f" ({escape_text(g.does)})" if g.danger is Danger.RUNS_CODE else "")
        + (f" in {_code(g.member)}" if g.member else "")
        for g in listed
    )


def _row(finding: Finding, path: PathReport, with_path: bool) -> str:
    cells = [f"{finding.code} {finding.name}"]
    if with_path:
        # In a model folder, the weight file (the shard) that holds the finding.
        assert path.report is not None
        cells.append(_code(finding_file(path.path, path.report.facts, finding)))
    message = escape_text(finding.message)
    if finding.pickle_globals:
        message += "<br>" + _globals(finding)
    cells += [message, escape_cell(finding.hint)]
    return "| " + " | ".join(cells) + " |"


class MarkdownReporter(Formatter[BatchReport]):
    """Summary line, then a table per severity; the checkpoint column appears with several paths."""

    def render(self, batch: BatchReport) -> str:
        # One checkpoint needs no column, unless it is a folder of weight files: then each
        # finding names the file it is in.
        with_path = batch.single is None or any(p.report.facts.source.files for p in batch.paths if p.report)
        lines = [_summary(batch)]
        for severity in Severity:
            rows = [
                _row(finding, path, with_path)
                for path in batch.paths
                if path.report is not None
                for finding in findings_in_order(path.report.findings)
                if finding.severity is severity
            ]
            if not rows:
                continue
            header = ["rule", *(["checkpoint"] if with_path else []), "finding", "fix"]
            lines += ["", f"#### {SECTION_TITLES[severity]} ({len(rows)})", "",
                      "| " + " | ".join(header) + " |", "|" + "---|" * len(header), *rows]
        skipped = [(p, s) for p in batch.paths if p.report is not None for s in p.report.skipped]
        if skipped:
            lines += ["", f"#### Rules not run ({len(skipped)})", ""]
            lines += [f"- {s.code} {s.name}" + (f" on {_code(p.path)}" if with_path else "")
                      + f": {escape_text(s.reason)}"
                      for p, s in skipped]
        if batch.failures:
            lines += ["", f"#### Could not load ({len(batch.failures)})", ""]
            lines += [f"- {escape_text(p.error_line)}" for p in batch.failures]
        if batch.data:
            counts: dict[str, int] = {}
            for path in batch.data:
                counts[path.data or ""] = counts.get(path.data or "", 0) + 1
            lines += ["", f"#### Recognized as data ({len(batch.data)})", ""]
            lines += [f"- {escape_text(what)}: {count:,}"
                      for what, count in sorted(counts.items(), key=lambda kv: -kv[1])]
        if batch.baseline is not None and batch.baseline.rekeyed:
            lines += ["", f"#### Shown although in the baseline ({len(batch.baseline.rekeyed)})", "",
                      "The baseline keyed these on their rule and tensors only; their fingerprints now cover what "
                      "they are about (a pickle's globals), so they are shown until the baseline is written again.", ""]
            lines += [f"- {e.code} in {_code(e.path)}" for e in batch.baseline.rekeyed]
        if batch.baseline is not None and batch.baseline.fixed:
            lines += ["", f"#### Fixed since the baseline ({len(batch.baseline.fixed)})", ""]
            lines += [f"- {e.code} in {_code(e.path)}: {escape_text(', '.join(e.tensors) or 'the checkpoint')}"
                      for e in batch.baseline.fixed]
            lines += ["", f"Re-run with `--write-baseline {batch.baseline.file}` to drop them from the baseline."]
        return "\n".join(lines) + "\n"
