"""A rule's documentation, rendered from the registry: what `memlayout explain` prints,
SARIF's rule help, the site's page for each rule and the rules table. The registry
holds the only copy of the texts; this module only lays them out.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

from memlayout.rules import Rule

SECTIONS = ("What it detects", "Why it matters", "Example", "How to fix")


def _paragraphs(text: str, indent: str = "  ") -> str:
    # The registry's texts are wrapped for the source file; re-wrap each paragraph.
    paragraphs = [" ".join(p.split()) for p in text.strip().split("\n\n")]
    return "\n\n".join(textwrap.fill(p, 88, initial_indent=indent, subsequent_indent=indent) for p in paragraphs)


def _fix_sentence(rule: Rule) -> str:
    hint = rule.hint[0].upper() + rule.hint[1:]
    return hint if hint.endswith(".") else hint + "."


def explain_text(rule: Rule) -> str:
    """The rule's whole documentation as plain text, four sections under a title line."""
    lines = [f"{rule.code} {rule.name}: {rule.summary}",
             f"(default severity {rule.severity.value}; {rule.family} rules)", ""]
    lines += [SECTIONS[0], _paragraphs(rule.detects), ""]
    lines += [SECTIONS[1], _paragraphs(rule.explanation), ""]
    if rule.example is not None:
        lines += [SECTIONS[2], textwrap.indent(rule.example.setup, "    "), "", f"  $ {rule.example.command}",
                  f"  reports {rule.code} {rule.name}", ""]
    lines += [SECTIONS[3], _paragraphs(_fix_sentence(rule))]
    if rule.example is not None:
        lines += ["", "  In the example:", "", textwrap.indent(rule.example.fixed, "    ")]
    return "\n".join(lines) + "\n"


def _markdown_sections(rule: Rule) -> list[tuple[str, list[str]]]:
    """The four sections as Markdown blocks, in `SECTIONS` order."""
    why = [" ".join(p.split()) for p in rule.explanation.split("\n\n")]
    sections: list[tuple[str, list[str]]] = [(SECTIONS[0], [rule.detects]), (SECTIONS[1], why)]
    if rule.example is not None:
        sections.append((SECTIONS[2], [
            f"```python\n{rule.example.setup}\n```",
            f"```console\n$ {rule.example.command}\n# reports {rule.code} {rule.name}\n```",
        ]))
    fix = [_fix_sentence(rule)]
    if rule.example is not None:
        fix.append(f"```python\n{rule.example.fixed}\n```")
    sections.append((SECTIONS[3], fix))
    return sections


def explain_markdown(rule: Rule) -> str:
    """The same documentation as Markdown, each section a bold lead-in: SARIF's `help.markdown`."""
    blocks = []
    for title, body in _markdown_sections(rule):
        if body[0].startswith("```"):
            blocks += [f"**{title}.**", *body]
        else:
            blocks += [f"**{title}.** {body[0]}", *body[1:]]
    return "\n\n".join(blocks) + "\n"


def rule_page_markdown(rule: Rule) -> str:
    """The rule's page on the documentation site: a title, its contract fields, the four sections."""
    facts = [f"default severity **{rule.severity.value}**", f"{rule.family} rules"]
    if rule.deep_only:
        facts.append("runs with `--deep` only")
    blocks = [f"# {rule.code} {rule.name}", f"{rule.summary[0].upper()}{rule.summary[1:]}.", "; ".join(facts) + "."]
    for title, body in _markdown_sections(rule):
        blocks += [f"## {title}", *body]
    blocks.append(f"`memlayout explain {rule.code}` prints this page in the terminal.")
    return "\n\n".join(blocks) + "\n"


def rules_table_markdown(rules: Iterable[Rule], *, page_links: bool = False) -> str:
    """One row per rule: code, name, default severity, when it fires; codes link to their pages if asked."""
    lines = ["| code | name | default | fires when |", "|---|---|---|---|"]
    for rule in rules:
        code = f"[{rule.code}]({rule.code}.md)" if page_links else rule.code
        lines.append(f"| {code} | {rule.name} | {rule.severity.value} | {rule.summary} |")
    return "\n".join(lines) + "\n"
