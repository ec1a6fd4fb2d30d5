"""Rules: read facts, return findings. Importing this package registers every family."""

from __future__ import annotations

from memlayout.rules import aliasing, chunks, dtype_device, layout, rnn, safety, waste  # noqa: F401  (registers rules)
from memlayout.rules.registry import (
    RULES,
    Finding,
    Requirement,
    Rule,
    RuleConfig,
    RuleContext,
    SkippedRule,
    is_ignored_for_its_tensors,
    is_selected,
)
from memlayout.severity import Severity

__all__ = [
    "RULES", "Finding", "Requirement", "Rule", "RuleConfig", "RuleContext", "Severity", "SkippedRule",
    "is_ignored_for_its_tensors", "is_selected",
]
