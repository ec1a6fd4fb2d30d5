"""ML601's globals, each with its danger class, in every machine-read format; data files and rekeyed baselines too.

Fake reports built in memory (tests/report/fakes.py): what a format must carry is
checked against the format's own schema (SARIF 2.1.0, memlayout's JSON schemas).
"""

from __future__ import annotations

import json
from dataclasses import replace

from memlayout.cli.formats import OutputFormat
from memlayout.core.facts import Facts, SourceFact
from memlayout.load.records import MemberRecord, PickleGlobal
from memlayout.pipeline.batch import BaselineEntry, BaselineOutcome, BatchReport, PathReport
from memlayout.pipeline.inspection import Report, summarize
from memlayout.rules import RULES, RuleConfig, RuleContext, Severity
from memlayout.rules.pickle_dangers import Danger, judge
from tests.report.rendering import inspect_formatter
from tests.report.test_formats import SCHEMA_V1, validate_multi_path_json, validate_sarif

_GLOBALS = (
    PickleGlobal("posix", "system", False, "bundle/hook.pkl"),
    PickleGlobal("numpy._core.multiarray", "scalar", False),
    PickleGlobal("torch._utils", "_rebuild_tensor_v2", True),
)


def _report(path: str = "bundle.tar.gz") -> Report:
    source = SourceFact(path=path, format="gzip", pickle_globals=_GLOBALS, contents=(
        MemberRecord("bundle/hook.pkl", ("gzip", "tar"), "pickle"),
        MemberRecord("bundle/README", ("gzip", "tar"), "data", "text"),
    ))
    facts = Facts(source=source, tensors=(), storages=(), alias_groups=(), modules=(), declared_ties=())
    findings = tuple(RULES["ML601"].check(RuleContext(facts, RuleConfig())))
    return Report(facts, findings, summarize(facts, findings))


def _batch(*extra: PathReport, baseline: BaselineOutcome | None = None) -> BatchReport:
    """The report as a folder's walk gives it: several paths."""
    return BatchReport((PathReport("bundle.tar.gz", report=_report()), *extra), baseline=baseline, given=("folder",))


def test_ml601_is_an_error_listing_each_global_with_its_class() -> None:
    (finding,) = _report().findings
    assert finding.severity is Severity.ERROR
    assert [(g.module, g.danger) for g in finding.pickle_globals] == [
        ("posix", Danger.RUNS_CODE), ("numpy._core.multiarray", Danger.CONSTRUCTS_OBJECT),
        ("torch._utils", Danger.ALLOW_LISTED),
    ]
    assert finding.pickle_globals[0].member == "bundle/hook.pkl"
    assert "unpacking it and loading them" in finding.message  # a container's pickles: whatever unpacks them


def test_json_carries_the_globals_and_the_contents_and_validates() -> None:
    data = json.loads(inspect_formatter(OutputFormat.JSON).render(_batch(PathReport("a.txt", data="text"))))
    validate_multi_path_json(data)
    report = data["reports"][0]["report"]
    (finding,) = report["findings"]
    assert {(g["module"], g["danger"], g["member"]) for g in finding["globals"]} == {
        ("posix", "runs-code", "bundle/hook.pkl"), ("numpy._core.multiarray", "constructs-object", ""),
        ("torch._utils", "allow-listed", ""),
    }
    assert report["source"]["contents"][1] == {"member": "bundle/README", "within": ["gzip", "tar"],
                                               "format": "data", "what": "text"}
    assert data["reports"][1] == {"path": "a.txt", "report": None, "error": None, "data": "text", "suppressed": 0}
    assert data["summary"]["data"] == 1 and data["summary"]["inspected"] == 1


def test_sarif_carries_the_globals_in_the_results_properties() -> None:
    log = validate_sarif(inspect_formatter(OutputFormat.SARIF).render(_batch()))
    (result,) = log["runs"][0]["results"]  # type: ignore[index]
    assert result["level"] == "error"
    assert {g["danger"] for g in result["properties"]["globals"]} == {"runs-code", "constructs-object", "allow-listed"}


def test_markdown_lists_each_global_with_its_class_worst_first() -> None:
    text = inspect_formatter(OutputFormat.MARKDOWN).render(_batch())
    row = next(line for line in text.splitlines() if line.startswith("| ML601"))
    assert row.index("posix.system: **runs-code**") < row.index("numpy.\\_core.multiarray.scalar: "
                                                                "**constructs-object**")
    assert "in `bundle/hook.pkl`" in row


def test_a_failed_path_that_named_globals_before_breaking_carries_them() -> None:
    failed = PathReport("broken.pkl", error="broken.pkl: the pickle could not be read",
                        pickle_globals=(judge("builtins", "exec", False),))
    data = json.loads(inspect_formatter(OutputFormat.JSON).render(_batch(failed)))
    validate_multi_path_json(data)
    assert data["reports"][1]["globals"][0]["danger"] == "runs-code"
    line = json.loads(inspect_formatter(OutputFormat.JSONL).render(BatchReport((failed,))).splitlines()[0])
    assert line["globals"][0]["name"] == "exec" and line["error"]


def test_a_rekeyed_finding_is_shown_and_said_to_be_so_in_every_format() -> None:
    (finding,) = _report().findings
    entry = BaselineEntry("bundle.tar.gz", "ML601", finding.fingerprint, ())
    batch = _batch(baseline=BaselineOutcome("base.json", 0, (), rekeyed=(entry,)))
    single = replace(batch, given=("bundle.tar.gz",))  # one path: schema 1, with the baseline's outcome
    data = json.loads(inspect_formatter(OutputFormat.JSON).render(single))
    assert data["baseline"]["rekeyed"] == [{"path": "bundle.tar.gz", "code": "ML601",
                                            "fingerprint": finding.fingerprint, "tensors": []}]
    import jsonschema

    jsonschema.Draft202012Validator(SCHEMA_V1).validate(data)
    sarif = validate_sarif(inspect_formatter(OutputFormat.SARIF).render(batch))
    assert [r["baselineState"] for r in sarif["runs"][0]["results"]] == ["updated"]  # type: ignore[index]
    assert "shown although recorded" in inspect_formatter(OutputFormat.TABLE).render(batch)
    assert "#### Shown although in the baseline (1)" in inspect_formatter(OutputFormat.MARKDOWN).render(batch)


def test_the_fingerprint_covers_the_globals_and_their_classes() -> None:
    (finding,) = _report().findings
    fewer = replace(_report().facts.source, pickle_globals=_GLOBALS[1:])
    facts = replace(_report().facts, source=fewer)
    (without_system,) = RULES["ML601"].check(RuleContext(facts, RuleConfig()))
    assert without_system.severity is Severity.WARNING  # only an object is built
    assert finding.fingerprint != without_system.fingerprint
    assert finding.fingerprint_v1 == without_system.fingerprint_v1  # what scheme 1 could not tell apart
    moved = finding._replace(subject=tuple(s.replace("runs-code", "constructs-object") for s in finding.subject))
    assert moved.fingerprint != finding.fingerprint  # a global that changes class is a new finding
