"""Every `--format`: golden files on the demo checkpoint and on a checkpoint with one
finding of each severity, and each format checked by its own consumer's rules (the
SARIF 2.1.0 schema, an XML parser, the workflow-command grammar, Markdown tables).

What a format does with a report is tested on reports built in memory (tests/report/fakes.py);
the golden files, one end-to-end run per format, and what depends on where a file is stay on
real checkpoints.

`sarif-schema-2.1.0.json` is the OASIS SARIF 2.1.0 (errata 01) schema, vendored
unchanged from the oasis-tcs/sarif-spec repository (`sarif-2.1/schema/`).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
import torch
from referencing import Registry, Resource
from typer.testing import CliRunner

import memlayout
from memlayout.cli.app import app
from memlayout.cli.formats import Command, OutputFormat, formats_for
from memlayout.output.interface import Formatter
from memlayout.pipeline.batch import BatchReport
from memlayout.report.rule_docs import explain_markdown, explain_text
from memlayout.rules import RULES
from tests import models
from tests.report import fakes
from tests.report.rendering import inspect_formatter, render

HERE = Path(__file__).resolve().parent
GOLDEN = HERE.parent / "golden" / "formats"
SARIF_SCHEMA = json.loads((HERE / "sarif-schema-2.1.0.json").read_text())
REPORT_SCHEMAS = Path(memlayout.__file__).parent / "report"
SCHEMA_V1 = json.loads((REPORT_SCHEMAS / "schema_v1.json").read_text())
SCHEMA_V2 = json.loads((REPORT_SCHEMAS / "schema_v2.json").read_text())
SUFFIX = {
    OutputFormat.TABLE: "txt", OutputFormat.JSON: "json", OutputFormat.SARIF: "sarif",
    OutputFormat.GITHUB: "github.txt", OutputFormat.MARKDOWN: "md", OutputFormat.JUNIT: "xml",
    OutputFormat.JSONL: "jsonl",
}

runner = CliRunner()


def validate_sarif(text: str) -> dict[str, object]:
    log = json.loads(text)
    jsonschema.Draft4Validator(SARIF_SCHEMA, format_checker=jsonschema.FormatChecker()).validate(log)
    return log  # type: ignore[no-any-return]


def validate_multi_path_json(data: dict[str, object]) -> None:
    registry = Registry().with_resource(SCHEMA_V1["$id"], Resource.from_contents(SCHEMA_V1))
    jsonschema.Draft202012Validator(SCHEMA_V2, registry=registry).validate(data)


@pytest.fixture
def one_of_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A torch.save file with one ML101 (error), one ML201 (warning) and one ML203 (info), by relative path."""
    monkeypatch.chdir(tmp_path)
    torch.save(models.one_finding_of_each_severity_state(), "one_of_each.pt")
    return "one_of_each.pt"


@pytest.fixture
def demo(repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(repo_root)
    return "fixtures/demo_checkpoint.pt"


def test_every_format_has_exactly_one_reporter() -> None:
    batch = fakes.batch(("x.pt", fakes.one_of_each_report("x.pt")))
    for fmt in formats_for(Command.INSPECT):
        reporter = inspect_formatter(fmt)
        assert isinstance(reporter, Formatter)
        assert reporter.render(batch).endswith("</html>" if fmt is OutputFormat.HTML else "\n")
        assert "".join(reporter.render_pieces(batch)) == reporter.render(batch)
    assert {fmt.value for fmt in formats_for(Command.INSPECT)} == {
        "table", "json", "sarif", "github", "markdown", "junit", "html", "jsonl",
    }


def test_every_text_format_has_golden_files() -> None:
    # The html page has its own tests in a browser (test_html_map.py).
    assert set(SUFFIX) == set(formats_for(Command.INSPECT)) - {OutputFormat.HTML}


def test_render_of_one_library_report_is_what_the_cli_prints(demo: str) -> None:
    cli = runner.invoke(app, ["inspect", demo, "--format", "markdown"]).stdout
    assert render(memlayout.inspect(demo), OutputFormat.MARKDOWN) == cli


@pytest.mark.parametrize("fmt", list(SUFFIX), ids=lambda f: f.value)
@pytest.mark.parametrize("case", ["demo", "one_of_each"])
def test_golden_files(case: str, fmt: OutputFormat, request: pytest.FixtureRequest, overwrite_golden: bool) -> None:
    path = request.getfixturevalue(case)
    result = runner.invoke(app, ["inspect", path, "--format", fmt.value])
    assert result.exit_code == 1, result.stderr
    text = result.stdout
    if fmt is OutputFormat.SARIF:
        # The rule descriptors are the registry's texts, checked against it in
        # test_sarif_validates_and_carries_the_registry; a rule's wording changing
        # is no change of the SARIF output's shape.
        log = json.loads(text)
        for descriptor in log["runs"][0]["tool"]["driver"]["rules"]:
            for key in ("shortDescription", "fullDescription", "help"):
                descriptor[key] = "(from the registry)"
        text = json.dumps(log, indent=2) + "\n"
    golden = GOLDEN / f"{case}.{SUFFIX[fmt]}"
    if overwrite_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), "rerun with --overwrite if the change is intended"


def test_one_of_each_has_one_finding_per_severity_as_its_fake_does(one_of_each: str) -> None:
    # The fake is what inspect makes of the checkpoint, less what no format prints the same way
    # twice (addresses, hint wording): the format tests on the fake test what users get.
    report, fake = memlayout.inspect(one_of_each), fakes.one_of_each_report()
    assert sorted((f.severity.value, f.code) for f in report.findings) == [
        ("error", "ML101"), ("info", "ML203"), ("warning", "ML201"),
    ]
    assert [(f.code, f.severity, f.tensors, f.message, f.storage) for f in report.findings] == [
        (f.code, f.severity, f.tensors, f.message, f.storage) for f in fake.findings
    ]
    assert [t._replace(data_address=None, pinned=None, shared_memory=None) for t in report.facts.tensors] == list(
        fake.facts.tensors
    )
    assert [s._replace(key="", base_address=None) for s in report.facts.storages] == [
        s._replace(key="") for s in fake.facts.storages
    ]
    assert report.facts.alias_groups == fake.facts.alias_groups and report.summary == fake.summary


def test_sarif_validates_and_carries_the_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two paths in one call: one run, results in two artifacts. An artifact is a file
    # that exists, named as given when relative, as a file:// URI when absolute.
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    (tmp_path / "work" / "one_of_each.pt").write_bytes(b"")
    demo = str(tmp_path / "demo_checkpoint.pt")
    Path(demo).write_bytes(b"")
    two = fakes.batch((demo, fakes.one_of_each_report(demo)), ("one_of_each.pt", fakes.one_of_each_report()))
    log = validate_sarif(inspect_formatter(OutputFormat.SARIF).render(two))
    (run,) = log["runs"]  # type: ignore[index]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == sorted(RULES)
    for descriptor in rules:
        rule = RULES[descriptor["id"]]
        assert descriptor["name"] == rule.name
        assert descriptor["shortDescription"]["text"] == rule.summary
        assert descriptor["help"]["text"] == explain_text(rule)
        assert descriptor["help"]["markdown"] == explain_markdown(rule)
    assert {a["location"]["uri"] for a in run["artifacts"]} == {"one_of_each.pt", Path(demo).resolve().as_uri()}
    levels = {r["ruleId"]: r["level"] for r in run["results"]}
    assert levels["ML101"] == "error" and levels["ML201"] == "warning" and levels["ML203"] == "note"
    for sarif_result in run["results"]:
        assert run["tool"]["driver"]["rules"][sarif_result["ruleIndex"]]["id"] == sarif_result["ruleId"]
        assert all(name in sarif_result["message"]["text"] for name in sarif_result["properties"]["tensors"])


def test_sarif_fingerprints_do_not_depend_on_where_the_file_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fingerprints = []
    for folder in ("first", "second/nested"):
        (tmp_path / folder).mkdir(parents=True)
        monkeypatch.chdir(tmp_path / folder)
        torch.save(models.one_finding_of_each_severity_state(), "model.pt")
        log = validate_sarif(runner.invoke(app, ["inspect", "model.pt", "-f", "sarif"]).stdout)
        fingerprints.append(sorted(
            (r["ruleId"], r["partialFingerprints"]["memlayoutFinding/v1"]) for r in log["runs"][0]["results"]  # type: ignore[index]
        ))
        assert str(tmp_path) not in json.dumps(log)
    assert fingerprints[0] == fingerprints[1] and len(fingerprints[0]) == 3


def test_sarif_of_a_live_object_has_a_logical_location() -> None:
    text = render(fakes.one_of_each_report(path=None), OutputFormat.SARIF)
    result = validate_sarif(text)["runs"][0]["results"][0]  # type: ignore[index]
    assert result["locations"] == [{"logicalLocations": [{"fullyQualifiedName": "(object)", "kind": "module"}]}]


def test_junit_has_a_suite_per_checkpoint_and_a_case_per_rule(one_of_each: str) -> None:
    result = runner.invoke(app, ["inspect", one_of_each, "missing.pt", "-f", "junit", "--fail-on", "error"])
    root = ET.fromstring(result.stdout)
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["one_of_each.pt", "missing.pt"]
    cases = {c.get("name"): c for c in suites[0].findall("testcase")}
    assert len(cases) == len(RULES)
    # At --fail-on error only ML101 fails; ML201 and ML203 pass with their findings as output.
    assert [name for name, c in cases.items() if c.find("failure") is not None] == ["ML101 partial-overlap"]
    assert "proj.weight" in cases["ML201 non-contiguous"].findtext("system-out", "")
    assert cases["ML503 non-finite"].find("skipped") is not None
    assert suites[0].get("failures") == "1" and suites[0].get("skipped") == "1"
    assert suites[1].find("testcase/error") is not None and root.get("errors") == "1"


def test_junit_select_limits_the_cases(one_of_each: str) -> None:
    root = ET.fromstring(runner.invoke(app, ["inspect", one_of_each, "-f", "junit", "--select", "ML2"]).stdout)
    assert [c.get("name") for c in root.iter("testcase")] == [
        "ML201 non-contiguous", "ML202 mixed-memory-format", "ML203 misaligned", "ML204 fragmented",
    ]


def test_github_commands_follow_severity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "one_of_each.pt").write_bytes(b"")  # a file that exists is named by file=
    out = inspect_formatter(OutputFormat.GITHUB).render(fakes.batch(("one_of_each.pt", fakes.one_of_each_report())))
    lines = out.splitlines()
    assert lines[0].startswith("::error file=one_of_each.pt,title=ML101 partial-overlap::")
    assert lines[1].startswith("::warning file=one_of_each.pt,title=ML201 non-contiguous::")
    assert lines[2].startswith("::notice file=one_of_each.pt,title=ML203 misaligned::")
    assert lines[3] == "memlayout: 1 path(s), 0 failed to load; findings: 1 error, 1 warning, 1 info"


def test_markdown_groups_findings_by_severity() -> None:
    out = inspect_formatter(OutputFormat.MARKDOWN).render(fakes.batch(("one_of_each.pt", fakes.one_of_each_report())))
    assert out.splitlines()[0] == (
        "**memlayout fails** (`--fail-on warning`): 1 error, 1 warning, 1 info in `one_of_each.pt`"
    )
    titles = [line for line in out.splitlines() if line.startswith("#### ")]
    assert titles == ["#### Errors (1)", "#### Warnings (1)", "#### Info (1)"]


HOSTILE = "evil|name`[x](http://a.b)<script>%0A,:\x01\nnext"


def hostile_batch() -> BatchReport:
    """A checkpoint whose tensor name tries to break each format's syntax."""
    return fakes.batch(("dir,with:odd%chars.pt", fakes.one_of_each_report(left=HOSTILE, path=None)))


def test_a_hostile_tensor_name_cannot_break_any_format() -> None:
    batch = hostile_batch()
    sarif = validate_sarif(inspect_formatter(OutputFormat.SARIF).render(batch))
    assert HOSTILE in sarif["runs"][0]["results"][0]["properties"]["tensors"]  # type: ignore[index]
    assert HOSTILE in json.loads(inspect_formatter(OutputFormat.JSON).render(batch))["findings"][0]["tensors"]
    junit = ET.fromstring(inspect_formatter(OutputFormat.JUNIT).render(batch))
    assert "evil|name" in "".join(junit.itertext())
    github = inspect_formatter(OutputFormat.GITHUB).render(batch).splitlines()
    # One command per finding: the name's newline and "%0A" stay inside the message.
    assert len(github) == 4 and github[0].startswith("::error title=ML101 partial-overlap::")
    assert "%250A" in github[0] and "\x01" in github[0]
    markdown = inspect_formatter(OutputFormat.MARKDOWN).render(batch)
    row = next(line for line in markdown.splitlines() if line.startswith("| ML101"))
    assert row.count(" | ") == 2  # rule | finding | fix: the name's "|" did not open a cell
    assert "<script>" not in markdown and "\\[x\\](http" in markdown


def test_github_property_values_are_escaped() -> None:
    from memlayout.report.github import escape_property

    assert escape_property("a,b:c%d\ne") == "a%2Cb%3Ac%25d%0Ae"


def test_every_format_says_which_rules_did_not_run_and_why() -> None:
    from memlayout.rules import SkippedRule

    reason = "the source records no tensor bytes"
    batch = fakes.batch(("x.pt", fakes.one_of_each_report("x.pt")),
                        skipped=(SkippedRule("ML102", "duplicate-weights", reason),))
    junit = ET.fromstring(inspect_formatter(OutputFormat.JUNIT).render(batch))
    case = next(c for c in junit.iter("testcase") if c.get("name") == "ML102 duplicate-weights")
    assert case.find("skipped").get("message") == reason  # type: ignore[union-attr]
    sarif = validate_sarif(inspect_formatter(OutputFormat.SARIF).render(batch))
    (note,) = sarif["runs"][0]["invocations"][0]["toolExecutionNotifications"]  # type: ignore[index]
    assert note["associatedRule"]["id"] == "ML102" and reason in note["message"]["text"]
    assert ("- ML102 duplicate-weights: the source records no tensor bytes"
            in inspect_formatter(OutputFormat.MARKDOWN).render(batch))
    assert f"ML102 duplicate-weights not run on x.pt: {reason}" in inspect_formatter(OutputFormat.GITHUB).render(batch)
    assert json.loads(inspect_formatter(OutputFormat.JSON).render(batch))["skipped_rules"][0]["reason"] == reason
