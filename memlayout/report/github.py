"""GitHub Actions workflow commands: each finding becomes an annotation on its checkpoint.

`::error file=PATH,title=ML101 partial-overlap::message` (and `::warning`, `::notice`
by severity) is what the runner turns into an annotation on the pull request. Values
are escaped as the runner decodes them, so a tensor name holding `%`, `,`, `:` or a
newline cannot end the command early or forge another.
"""

from __future__ import annotations

from memlayout.output.interface import Formatter
from memlayout.pipeline.batch import BatchReport, PathReport
from memlayout.report.findings import count_phrase, finding_file, findings_in_order
from memlayout.report.sarif import artifact_uri
from memlayout.rules import Finding, Severity

COMMANDS = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def escape_data(text: str) -> str:
    """The message part: `%`, CR and LF are percent-encoded (the runner decodes them)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A property value (`file=`, `title=`): additionally `:` and `,`, which delimit properties."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _command(kind: str, path: PathReport, title: str, message: str, file: str | None = None) -> str:
    properties = []
    # `file=` is a path in the repository; an import spec or a live object has none.
    where = file or path.path
    if artifact_uri(where) is not None:
        properties.append(f"file={escape_property(where)}")
    properties.append(f"title={escape_property(title)}")
    return f"::{kind} {','.join(properties)}::{escape_data(message)}\n"


def _annotation(finding: Finding, path: PathReport) -> str:
    # In a model folder, the annotation goes on the weight file (the shard) that holds the finding.
    assert path.report is not None
    return _command(
        COMMANDS[finding.severity], path, f"{finding.code} {finding.name}", f"{finding.message}\nhint: {finding.hint}",
        finding_file(path.path, path.report.facts, finding),
    )


class GithubReporter(Formatter[BatchReport]):
    """One workflow command per finding and per load error, then a plain summary line."""

    def render(self, batch: BatchReport) -> str:
        lines: list[str] = []
        for path in batch.paths:
            if path.report is None:
                if path.failed:
                    lines.append(_command("error", path, "memlayout: load error", path.error_line))
                continue
            lines += [_annotation(finding, path) for finding in findings_in_order(path.report.findings)]
        if batch.baseline is not None:
            for entry in batch.baseline.fixed:
                lines.append(_command(
                    "notice", PathReport(entry.path), f"{entry.code} fixed",
                    f"{entry.code} on {', '.join(entry.tensors) or 'this checkpoint'} no longer occurs; "
                    f"re-run with --write-baseline {batch.baseline.file} to drop it from the baseline",
                ))
        # Plain lines are log output, not annotations: a rule that could not run is no finding.
        lines += [
            f"memlayout: {skipped.code} {skipped.name} not run on {path.path}: {skipped.reason}\n"
            for path in batch.paths
            if path.report is not None
            for skipped in path.report.skipped
        ]
        failed = len(batch.failures)
        summary = f"memlayout: {len(batch.paths)} path(s), {failed} failed to load; findings: " + count_phrase(
            batch.findings_by_severity()
        )
        if batch.baseline is not None:
            summary += f"; {batch.baseline.suppressed} known from the baseline"
        return "".join(lines) + summary + "\n"
