"""How every inspect format lists findings: worst first, counted by severity, and in the file that holds them."""

from __future__ import annotations

import os
from collections.abc import Iterable

from memlayout.core.facts import Facts
from memlayout.rules import Finding, Severity
from memlayout.rules.location import file_of


def findings_in_order(findings: Iterable[Finding]) -> list[Finding]:
    """Worst first, then by code and tensors: the order every reporter lists findings in."""
    return sorted(findings, key=lambda f: (-f.severity.rank, f.code, f.tensors))


def count_phrase(counts: dict[str, int]) -> str:
    """`{"error": 0, "warning": 4, "info": 1}` -> "0 error, 4 warning, 1 info", as the table's summary says it."""
    return ", ".join(f"{counts.get(severity.value, 0)} {severity.value}" for severity in Severity)


def finding_file(path: str, facts: Facts, finding: Finding) -> str:
    """The file to fix for a finding: in a model folder, the weight file (a shard) that holds it
    (`memlayout.rules.location.file_of`); otherwise the path inspected.

    Args:
        path: The path inspected, as the report names it.
        facts: Its facts.
        finding: One of its findings.

    Returns:
        `path` joined with the shard's name, or `path` itself.
    """
    held_in = file_of(finding, facts)
    return os.path.join(path, held_in) if held_in else path
