"""JUnit XML, for CI systems that show test results (GitLab, Jenkins, Azure Pipelines).

One testsuite per checkpoint and one testcase per selected rule. A testcase fails
when its rule has findings at or above `--fail-on`; findings below it are listed in
the testcase's output, and a rule that did not run (a `--deep` rule without --deep,
or one the source lacks the data for) is skipped with the reason. A checkpoint that failed to load is a testsuite with
one errored case.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from memlayout.output.interface import Formatter
from memlayout.pipeline.batch import BatchReport, PathReport
from memlayout.report.findings import findings_in_order
from memlayout.rules import RULES, Finding

# XML 1.0 cannot carry most control characters, even escaped; a tensor name from a
# hostile file may hold them.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def xml_text(text: str) -> str:
    """`text` with characters XML 1.0 cannot hold replaced by U+FFFD."""
    return _NOT_XML.sub("\ufffd", text)


def _finding_line(finding: Finding) -> str:
    return xml_text(f"{finding.code} {finding.severity.value} {finding.name}: {finding.message}\n    hint: "
                    f"{finding.hint}")


def _counts(suite: ET.Element, tests: int, failures: int, errors: int, skipped: int) -> None:
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", str(skipped))


def _failed_suite(path: PathReport) -> ET.Element:
    suite = ET.Element("testsuite", name=xml_text(path.path))
    _counts(suite, 1, 0, 1, 0)
    case = ET.SubElement(suite, "testcase", classname=xml_text(path.path), name="load")
    error = ET.SubElement(case, "error", message=xml_text(path.error_line), type="load-error")
    error.text = xml_text(path.error_line)
    return suite


def _data_suite(path: PathReport) -> ET.Element:
    # A file of a walked folder that holds no pickle and no checkpoint: read, nothing to check.
    suite = ET.Element("testsuite", name=xml_text(path.path))
    _counts(suite, 1, 0, 0, 1)
    case = ET.SubElement(suite, "testcase", classname=xml_text(path.path), name="read")
    ET.SubElement(case, "skipped", message=xml_text(f"data: {path.data}"))
    return suite


def _suite(path: PathReport, batch: BatchReport) -> ET.Element:
    assert path.report is not None
    by_code: dict[str, list[Finding]] = {}
    for finding in findings_in_order(path.report.findings):
        by_code.setdefault(finding.code, []).append(finding)
    not_run = {s.code: s.reason for s in path.report.skipped}
    suite = ET.Element("testsuite", name=xml_text(path.path))
    failures = skipped = 0
    for code in batch.rules:
        rule = RULES[code]
        case = ET.SubElement(suite, "testcase", classname=xml_text(path.path), name=f"{code} {rule.name}")
        if rule.deep_only and not batch.deep:
            ET.SubElement(case, "skipped", message="reads every value: runs with --deep only")
            skipped += 1
            continue
        if code in not_run:
            ET.SubElement(case, "skipped", message=xml_text(not_run[code]))
            skipped += 1
            continue
        failing: list[Finding] = []
        passing: list[Finding] = []
        for finding in by_code.get(code, []):
            (failing if batch.fail_on.fails(finding.severity) else passing).append(finding)
        if failing:
            failures += 1
            failure = ET.SubElement(
                case, "failure", type=code,
                message=f"{len(failing)} finding(s) at or above --fail-on {batch.fail_on.value}",
            )
            failure.text = "\n".join(_finding_line(f) for f in failing)
        if passing:
            ET.SubElement(case, "system-out").text = "\n".join(_finding_line(f) for f in passing)
    _counts(suite, len(batch.rules), failures, 0, skipped)
    return suite


class JunitReporter(Formatter[BatchReport]):
    """`<testsuites>` with a `<testsuite>` per path."""

    def render(self, batch: BatchReport) -> str:
        root = ET.Element("testsuites", name="memlayout")
        suites = [
            _suite(p, batch) if p.report is not None else _data_suite(p) if p.data is not None else _failed_suite(p)
            for p in batch.paths
        ]
        root.extend(suites)
        totals = {key: sum(int(s.get(key, "0")) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
        for key, value in totals.items():
            root.set(key, str(value))
        ET.indent(root)
        return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
