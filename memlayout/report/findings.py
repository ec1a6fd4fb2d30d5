"""How every inspect format lists findings: worst first, and counted by severity."""

from __future__ import annotations

from collections.abc import Iterable

from memlayout.rules import Finding, Severity


def findings_in_order(findings: Iterable[Finding]) -> list[Finding]:
    """Worst first, then by code and tensors: the order every reporter lists findings in."""
    return sorted(findings, key=lambda f: (-f.severity.rank, f.code, f.tensors))


def count_phrase(counts: dict[str, int]) -> str:
    """`{"error": 0, "warning": 4, "info": 1}` -> "0 error, 4 warning, 1 info", as the table's summary says it."""
    return ", ".join(f"{counts.get(severity.value, 0)} {severity.value}" for severity in Severity)
