"""How bad a finding or a change is, and the `--fail-on` threshold that judges it.

The one home of both: rules give findings a `Severity`, diff gives changes one, and
every place that decides whether a run fails asks `FailOn.fails`. It sits in the
base layer, beside `errors`, so that the CLI's options can name `FailOn` without
importing the rules.
"""

from __future__ import annotations

import enum


class Severity(str, enum.Enum):
    """How bad a finding is; `--fail-on` compares against this order."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {Severity.ERROR: 3, Severity.WARNING: 2, Severity.INFO: 1}[self]


class FailOn(str, enum.Enum):
    """The `--fail-on` threshold: the lowest severity that fails a run, or never."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"
    NEVER = "never"

    def fails(self, severity: Severity) -> bool:
        """Whether a result of `severity` fails a run at this threshold (a load error counts as ERROR)."""
        return self is not FailOn.NEVER and severity.rank >= Severity(self.value).rank
