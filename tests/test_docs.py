"""The documentation site stays whole and true: every page is in the nav, the
generated pages follow the registry, and the commands and examples the pages show
run. `make docs` builds the site strictly; these checks run without the docs extra."""

from __future__ import annotations

import copy
import doctest
import importlib
import importlib.util
import re
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import yaml

from memlayout.report.rule_docs import SECTIONS, rule_page_markdown
from memlayout.rules import RULES
from tests.test_readme import run_command, runnable_commands

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md"))
MKDOCS = yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def load_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("memlayout_docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOKS = load_hooks()


def nav_pages(nav: list[Any]) -> list[str]:
    pages = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_is_in_the_nav_once() -> None:
    listed = nav_pages(MKDOCS["nav"])
    assert len(listed) == len(set(listed))
    # The command reference is generated at build time; every other page is a file.
    assert set(listed) == set(PAGES) | {HOOKS.COMMAND_REFERENCE}


def test_the_nav_gets_one_page_per_rule_after_the_rules_index() -> None:
    config = SimpleNamespace(nav=copy.deepcopy(MKDOCS["nav"]))
    HOOKS.on_config(config)
    HOOKS.on_config(config)  # mkdocs serve builds again with the same config: no page twice
    section = HOOKS._section_holding(config.nav, HOOKS.RULES_INDEX)
    pages = nav_pages(section)
    assert pages == [HOOKS.RULES_INDEX, *(f"rules/{code}.md" for code in sorted(RULES))]


@pytest.mark.parametrize("code", sorted(RULES))
def test_a_rule_page_has_the_four_sections_of_explain(code: str) -> None:
    rule = RULES[code]
    page = rule_page_markdown(rule)
    assert page.startswith(f"# {code} {rule.name}\n")
    positions = [page.index(f"\n## {title}\n") for title in SECTIONS]
    assert positions == sorted(positions)
    assert rule.example is not None and f"$ {rule.example.command}\n" in page
    assert rule.example.fixed in page


def test_the_rules_index_names_the_table_the_build_fills() -> None:
    assert next(m for m in HOOKS.MARKERS if "rules-table" in m) in (DOCS / "rules" / "index.md").read_text()


# Pages whose commands build on each other (a diff of the file a flatten before it wrote) run
# in order, from a scratch folder, in a test of their own: tests/docs/test_questions.py.
RUN_IN_ORDER = {"questions.md"}


def page_commands() -> list[tuple[str, str]]:
    return [(page, command) for page in PAGES if page not in RUN_IN_ORDER
            for command in runnable_commands((DOCS / page).read_text())]


@pytest.mark.parametrize(("page", "command"), page_commands(), ids=[f"{p}: {c[:50]}" for p, c in page_commands()])
def test_page_command_runs(
    page: str, command: str, repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_command(command, repo_root, tmp_path, monkeypatch)


def python_examples() -> list[tuple[str, str]]:
    """Self-contained examples: blocks that start with `import torch, memlayout`."""
    blocks = []
    for page in PAGES:
        for block in re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.DOTALL):
            if block.startswith("import torch, memlayout"):
                blocks.append((page, block))
    return blocks


def test_the_pages_have_python_examples() -> None:
    assert {page for page, _ in python_examples()} >= {"api.md", "flatten.md", "activations-budget.md", "ci.md"}


@pytest.mark.parametrize(("page", "block"), python_examples(), ids=[p for p, _ in python_examples()])
def test_page_python_example_runs(page: str, block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(block, page, "exec"), {})


@pytest.mark.parametrize("module", ["memlayout", "memlayout.testing", "memlayout.activations.plans.apply"])
def test_the_examples_in_the_api_reference_run(module: str) -> None:
    # The Python API page renders these docstrings, examples included.
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted and not result.failed


def test_every_included_file_and_section_exists() -> None:
    for page in PAGES:
        for target in re.findall(r'^\s*--8<-- "([^"]+)"$', (DOCS / page).read_text(), flags=re.MULTILINE):
            path, _, section = target.partition(":")
            text = (ROOT / path).read_text()
            if section:
                assert f"--8<-- [start:{section}]" in text and f"--8<-- [end:{section}]" in text, target


def test_the_build_reads_nothing_from_the_network() -> None:
    # The site builds offline: no web fonts, and only plugins that fetch nothing.
    assert MKDOCS["theme"]["font"] is False
    plugins = {next(iter(p)) if isinstance(p, dict) else p for p in MKDOCS["plugins"]}
    assert plugins <= {"search", "mkdocstrings"}
    assert "import" not in str(MKDOCS["plugins"])  # mkdocstrings' inventories are downloaded


def _prose(markdown: str) -> str:
    """The text outside fenced code blocks."""
    return re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)


@pytest.mark.parametrize("term", ["unique bytes", "wasted bytes"])
def test_a_page_that_shows_a_summary_figure_says_what_it_counts(term: str) -> None:
    """A reader meets "unique bytes" in an example's output: the same page says what it counts,
    in its prose, rather than only the schemas page."""
    shown = {"README.md": (ROOT / "README.md").read_text()} | {p: (DOCS / p).read_text() for p in PAGES}
    missing = [page for page, text in shown.items() if term in text and term not in _prose(text)]
    assert missing == []


def test_the_readme_says_how_to_run_the_cli_after_make_demo() -> None:
    readme = (ROOT / "README.md").read_text()
    after = readme[readme.index("make demo"):readme.index("## Quick start")]
    assert ".venv/bin/memlayout" in after and "source .venv/bin/activate" in after


def test_the_pre_commit_example_names_no_placeholder_and_matches_the_hooks() -> None:
    """The CI page's pre-commit config is one a user can paste: no OWNER placeholder URL (the
    project has no published URL), and the local hooks run what .pre-commit-hooks.yaml runs."""
    page = (DOCS / "ci.md").read_text()
    assert "OWNER" not in page
    block = re.search(r"```yaml\n(# \.pre-commit-config\.yaml\n.*?)```", page, re.S)
    assert block is not None
    config = yaml.safe_load(block.group(1))
    manifest = {hook["id"]: hook for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    (repo,) = config["repos"]
    assert repo["repo"] == "local"
    for hook in repo["hooks"]:
        assert hook["entry"] == manifest[hook["id"]]["entry"] and hook["files"] == manifest[hook["id"]]["files"]
    assert {hook["id"] for hook in repo["hooks"]} == set(manifest)


def test_the_pre_commit_section_names_what_the_hooks_environment_gets() -> None:
    """pre-commit installs the repository without extras: the base dependencies, never torch
    (tests/test_pre_commit_hooks.py checks the real environment); the page said "torch included"."""
    import tomllib

    page = (DOCS / "ci.md").read_text()
    section = page[page.index("## pre-commit") : page.index("\n## ", page.index("## pre-commit"))]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = [re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0] for requirement in project["dependencies"]
            if "python_version" not in requirement]
    assert all(name in section for name in base), base
    assert "torch" not in base and "torch" in project["optional-dependencies"]
    assert "torch included" not in section and "torch is no dependency" in section


def test_the_activations_synopsis_is_generated_from_the_cli() -> None:
    """The page's synopsis lacked --dtype, --autocast, --gpu, --world-size and --fsdp, options added
    after it was written; the build now renders it from the command, as it does the reference."""
    from typer.testing import CliRunner

    from memlayout.cli.app import app

    marker = "<!-- memlayout:synopsis activations -->"
    page = (DOCS / "activations-reference.md").read_text()
    assert marker in page and "`memlayout activations TARGET" not in page
    synopsis = HOOKS.MARKERS[marker]()
    assert synopsis.startswith("`memlayout activations TARGET [")
    shown = CliRunner().invoke(app, ["activations", "--help"], env={"COLUMNS": "300"}).stdout
    # Each option's row of --help starts with its names; its text may name other commands' options. The options
    # are in groups, the first of them the target's.
    rows = shown[shown.index("\nTarget:") :]
    options = set(re.findall(r"^  (?:-\w, )?(--[a-z][a-z0-9-]+)", rows, re.M)) - {"--help", "--debug"}
    assert {"--dtype", "--autocast", "--gpu", "--world-size", "--fsdp"} <= options
    assert options == set(re.findall(r"\[(--[a-z][a-z0-9-]+)", synopsis))


def test_the_fit_decisions_page_quotes_its_results_and_every_decision_held() -> None:
    """docs/evidence-fit.md's GPU answers come from benchmarks/accuracy/fit_decisions.py's results: each row names its
    GPU and its command, and each was checked as a user acts on it (--budget at s found a plan, at s + 1 none)."""
    import json

    marker = "<!-- memlayout:fit-decisions -->"
    assert marker in (DOCS / "evidence-fit.md").read_text()
    records = json.loads((ROOT / "benchmarks" / "results" / "fit_decisions.json").read_text())["records"]
    table = HOOKS.MARKERS[marker]()
    assert records
    for record in records:
        assert record.get("decision_holds") is True, record["fit_command"]
        assert f"`{record['fit_command']}`" in table
        target = record["target"]
        assert target == "cpu" or f"--gpu {target}" in record["fit_command"]
        if "nothing_fits" in record:  # and --budget at batch 1 found no plan either
            assert record["fit_exit"] in (1, 2) and record["next_exit"] == 1 and "--budget" in record["next_command"]
            assert f"| {target} | {record['precision']} | 0 | 0 | " in table
            continue
        row = next(line for line in table.splitlines() if line.startswith("|") and f"| {target} | "
                   f"{record['precision']} | {record['without_plan']} | {record['with_plan']} |" in line)
        assert f"{record['compared_bytes'] / 2**30:.2f} / {record['budget_bytes'] / 2**30:.2f} GiB" in row


def test_results_shown_to_users_read_as_written_for_them() -> None:
    """Benchmark labels end up in the site's tables: no "(the issue's)" from the tracker."""
    texts = [p.read_text() for p in (ROOT / "benchmarks" / "results").glob("*.json")]
    assert not [t for t in texts if "the issue" in t]


def test_every_results_file_is_a_harness_table_or_has_a_page_of_its_own() -> None:
    """The site renders every results file the harness wrote as a table; a sweep's file, which has no harness
    rows, must be named in PAGES_OF_THEIR_OWN, or the site's build fails on it (fit_sweep.json did)."""
    rendered = HOOKS._benchmark_results()
    shown = [p.stem for p in (ROOT / "benchmarks" / "results").glob("*.json")
             if not p.stem.endswith("-quick") and p.stem not in HOOKS.PAGES_OF_THEIR_OWN]
    assert shown and all(f"benchmarks/results/{stem}.json" in rendered for stem in shown)
