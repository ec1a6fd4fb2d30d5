"""A rule's documentation, rendered from the registry: what `memlayout explain` prints,
SARIF's rule help, and the README's rule reference. The registry holds the only copy
of the texts; this module only lays them out.
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
    lines = [f"{rule.code} {rule.name}: {rule.summary}", f"(default severity {rule.severity.value}; {rule.family} rules)", ""]
    lines += [SECTIONS[0], _paragraphs(rule.detects), ""]
    lines += [SECTIONS[1], _paragraphs(rule.explanation), ""]
    if rule.example is not None:
        lines += [SECTIONS[2], textwrap.indent(rule.example.setup, "    "), "", f"  $ {rule.example.command}",
                  f"  reports {rule.code} {rule.name}", ""]
    lines += [SECTIONS[3], _paragraphs(_fix_sentence(rule))]
    if rule.example is not None:
        lines += ["", "  In the example:", "", textwrap.indent(rule.example.fixed, "    ")]
    return "\n".join(lines) + "\n"


def explain_markdown(rule: Rule) -> str:
    """The same documentation as Markdown: SARIF's `help.markdown` and the README's reference."""
    lines = [f"**{SECTIONS[0]}.** {rule.detects}", ""]
    why = [" ".join(p.split()) for p in rule.explanation.split("\n\n")]
    lines += [f"**{SECTIONS[1]}.** {why[0]}", ""]
    for paragraph in why[1:]:
        lines += [paragraph, ""]
    if rule.example is not None:
        lines += [f"**{SECTIONS[2]}.**", "", "```python", rule.example.setup, "```", "", "```console",
                  f"$ {rule.example.command}", f"# reports {rule.code} {rule.name}", "```", ""]
    lines += [f"**{SECTIONS[3]}.** {_fix_sentence(rule)}"]
    if rule.example is not None:
        lines += ["", "```python", rule.example.fixed, "```"]
    return "\n".join(lines) + "\n"


def rules_reference_markdown(rules: Iterable[Rule]) -> str:
    """Every rule's documentation for the README, one folded section per rule."""
    blocks = []
    for rule in rules:
        blocks.append(
            f"<details>\n<summary><b>{rule.code} {rule.name}</b> ({rule.severity.value}): {rule.summary}</summary>\n\n"
            f"{explain_markdown(rule)}\n</details>\n"
        )
    return "\n".join(blocks)
