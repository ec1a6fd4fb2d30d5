"""mkdocs hooks: the pages and tables the site renders from the code at build time.

Nothing here is copied into docs/, so nothing can drift: each rule's page comes
from the rule registry (`memlayout explain` prints the same texts), the command
reference from the CLI's own commands and options, and the benchmark tables from
benchmarks/results/*.json. mkdocs loads this file through `hooks:` in mkdocs.yml.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

# mkdocs is imported only where a hook needs it, so the tests can read this module
# without the docs extra installed.
if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent.parent
RULES_INDEX = "rules/index.md"
COMMAND_REFERENCE = "cli.md"


def _rules() -> list[Any]:
    from memlayout.rules import RULES

    return [RULES[code] for code in sorted(RULES)]


def _section_holding(nav: list[Any], page: str) -> list[Any] | None:
    """The nav list that names `page` as one of its entries, searched depth first."""
    for entry in nav:
        values = entry.values() if isinstance(entry, dict) else [entry]
        if page in values:
            return nav
        for value in values:
            if isinstance(value, list) and (found := _section_holding(value, page)) is not None:
                return found
    return None


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    # The rules section of the nav names its index page; one page per rule follows it.
    section = _section_holding(config.nav or [], RULES_INDEX)
    if section is None:
        raise ValueError(f"mkdocs.yml's nav must list {RULES_INDEX}: the rule pages are added after it")
    listed = {value for entry in section if isinstance(entry, dict) for value in entry.values()}
    section.extend(
        {f"{rule.code} {rule.name}": f"rules/{rule.code}.md"}
        for rule in _rules()
        if f"rules/{rule.code}.md" not in listed
    )
    return config


def _command_reference() -> str:
    """Every command and option, as `memlayout COMMAND --help` states them."""
    import typer
    from typer.cli import get_docs_for_click

    from memlayout.cli.app import app

    command = typer.main.get_command(app)
    reference = get_docs_for_click(obj=command, ctx=typer.Context(command), name="memlayout", title="Commands")
    intro = (
        "Every command and option, generated from the CLI itself when the site is built; "
        "`memlayout COMMAND --help` prints the same. [Usage](usage.md) explains them.\n"
    )
    title, _, rest = reference.partition("\n")
    return f"{title}\n\n{intro}{rest}"


COMMON_OPTIONS = ("--help", "--debug")
"""Options every command takes, which a synopsis leaves out."""


def _synopsis(name: str) -> str:
    """`memlayout NAME ARGUMENT [--option VALUE] ...`: every argument and option of the command, from the CLI itself.

    A hand-written synopsis fell behind the options added since (--dtype, --autocast,
    --gpu, --world-size and --fsdp were missing from the activations page's).
    """
    import typer

    from memlayout.cli.app import app

    group = typer.main.get_command(app)
    parent = typer.Context(group)
    command = group.get_command(parent, name)  # type: ignore[attr-defined]
    # typer carries a click of its own, so parameters are told apart by kind, not by class.
    context = type(parent)(command, info_name=name, parent=parent)
    words = [f"memlayout {name}"]
    for param in command.get_params(context):
        if param.param_type_name == "argument":
            argument = param.metavar or (param.name or "").upper()
            words.append(f"{argument}..." if param.nargs == -1 and not argument.endswith("...") else argument)
            continue
        if param.hidden or set(param.opts) & set(COMMON_OPTIONS):
            continue
        option = max(param.opts, key=len)
        # What --help shows after the option's names: its metavar, or its choices.
        shown = param.get_help_record(context)[0].split(option, 1)[1].strip().strip("<>[]")
        if shown in ("int", "int range", "integer", "integer range", "float", "float range"):
            shown = "N"  # a number with no metavar of its own
        value = f" {shown}" if shown else ""
        words.append(f"[{option}{value}{' ...' if param.multiple else ''}]")
    return f"`{' '.join(words)}`"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    from mkdocs.structure.files import File

    from memlayout.report.rule_docs import rule_page_markdown

    for rule in _rules():
        files.append(File.generated(config, f"rules/{rule.code}.md", content=rule_page_markdown(rule)))
    files.append(File.generated(config, COMMAND_REFERENCE, content=_command_reference()))
    return files


def _rules_table() -> str:
    from memlayout.report.rule_docs import rules_table_markdown

    return rules_table_markdown(_rules(), page_links=True)


PAGES_OF_THEIR_OWN = {
    "will_it_fit", "activations_zoo", "activations_zoo_sweep",
    "activations_zoo_small_peaks", "activations_zoo_small_peaks_sweep",
    "activations_zoo_large_peaks", "activations_zoo_large_peaks_sweep",
    "kernel_storage_probe", "inference_sweep", "generate_sweep", "fit_decisions", "lora_sweep", "tp_serving_sweep",
    "fit_sweep", "tp_generate_sweep", "compile_difference", "segments_cnn", "segments_brute_force",
    "segments_brute_force_large", "segments_sweep", "segments_sweep_cnns",
}
"""Results files another page renders whole or names (evidence-fit.md, activations-weights.md, activations-zoo.md
and the other activations pages), not harness runs."""


def _benchmark_results() -> str:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.harness import RESULTS, read_results, results_markdown

    sections = []
    for path in sorted(RESULTS.glob("*.json")):
        if path.stem.endswith("-quick") or path.stem in PAGES_OF_THEIR_OWN:
            continue
        results = read_results(path.stem)
        body = results_markdown(results).replace("\n", "\n    ")
        sections.append(f'??? note "benchmarks/results/{path.name}"\n\n    {body}')
    return "\n".join(sections)


def _will_it_fit() -> str:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.accuracy.will_it_fit import table_markdown

    return table_markdown()


def _fit_decisions() -> str:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.accuracy.fit_decisions import table_markdown

    return table_markdown()


def _weights_vs_accelerate() -> str:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.accuracy.weights_table import table_markdown

    return table_markdown()


def _anchors() -> str:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.accuracy.anchors_table import table_markdown

    return table_markdown()


# A page names a table it wants by an HTML comment, which stays invisible on GitHub.
MARKERS: dict[str, Callable[[], str]] = {
    "<!-- memlayout:rules-table -->": _rules_table,
    "<!-- memlayout:benchmark-results -->": _benchmark_results,
    "<!-- memlayout:will-it-fit -->": _will_it_fit,
    "<!-- memlayout:weights-vs-accelerate -->": _weights_vs_accelerate,
    "<!-- memlayout:anchors -->": _anchors,
    "<!-- memlayout:fit-decisions -->": _fit_decisions,
    "<!-- memlayout:synopsis activations -->": lambda: _synopsis("activations"),
}


ROOT_RELATIVE = re.compile(r'((?:href|src)=")/(?!/)')
"""A link mkdocs writes from the site's root ("/flatten.html")."""


def on_post_template(output_content: str, template_name: str, config: MkDocsConfig) -> str:
    # mkdocs renders 404.html with links from "/" (a server may show it at any path,
    # and no site_url says where the site lives), so opened from disk every link and
    # the stylesheet pointed at the filesystem's root. The page sits at the site's
    # root: relative to it, each link names the file, as every other page's do.
    if template_name != "404.html":
        return output_content
    output_content = ROOT_RELATIVE.sub(r"\1", output_content)
    return output_content.replace('"base": "/"', '"base": "."')


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    for marker, render in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown
