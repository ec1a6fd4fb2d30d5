"""Rules: read facts, return findings. Importing this package registers every family."""

from __future__ import annotations

from memlayout.rules import aliasing, dtype_device, layout, rnn, safety, waste  # noqa: F401  (registers rules)
from memlayout.rules.registry import (
    RULES,
    Finding,
    Rule,
    RuleConfig,
    RuleContext,
    Severity,
    is_selected,
)

__all__ = ["RULES", "Finding", "Rule", "RuleConfig", "RuleContext", "Severity", "is_selected"]
