"""`assert_layout`: memlayout's checks as an assertion in a project's own pytest suite.

```python
import torch, memlayout.testing

def test_model_layout():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    memlayout.testing.assert_layout(model, ignore=["ML204"], fail_on="warning")
```
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from memlayout.pipeline.inspection import Report, run_inspection
from memlayout.report.findings import findings_in_order
from memlayout.severity import FailOn

if TYPE_CHECKING:
    from memlayout.rules import Finding, RuleConfig


def _codes(value: str | Iterable[str], where: str) -> tuple[str, ...]:
    from memlayout.pipeline.config import check_codes

    items = [value] if isinstance(value, str) else list(value)
    return check_codes([code for item in items for code in item.split(",") if code.strip()], where)


def _finding_lines(findings: Iterable[Finding]) -> list[str]:
    lines = []
    for finding in findings_in_order(findings):
        lines.append(f"{finding.code} {finding.severity.value} {finding.name}: {finding.message}")
        lines.append(f"    hint: {finding.hint}")
    return lines


def assert_layout(
    model_or_path: Any,
    *,
    select: str | Iterable[str] = (),
    ignore: str | Iterable[str] = (),
    fail_on: FailOn | str = "warning",
    config: RuleConfig | None = None,
) -> Report:
    """Fail the calling test when memlayout finds a layout problem at or above `fail_on`.

    Args:
        model_or_path: An nn.Module, a state dict, a nested training checkpoint, a
            checkpoint path or model directory, or "pkg.module:callable".
        select: Rule codes or prefixes to run (all when empty), e.g. ["ML1", "ML201"] or "ML1,ML201".
        ignore: Rule codes or prefixes to skip.
        fail_on: "error", "warning" (the default, as the CLI), "info" or "never".
        config: Rule knobs (thresholds, declared ties, --deep); see `memlayout.rules.RuleConfig`.

    Returns:
        The `Report`, for further assertions of the test's own.

    Raises:
        AssertionError: the findings at or above `fail_on`, one per line with its hint,
            as `memlayout inspect` prints them.
        ValueError: `fail_on` is not one of the four thresholds.
        memlayout.errors.UsageError: an unknown rule code in `select` or `ignore`.

    Examples:
        >>> import torch, memlayout.testing
        >>> lin = torch.nn.Linear(4, 4)
        >>> _ = memlayout.testing.assert_layout(lin)
        >>> lin.weight = torch.nn.Parameter(lin.weight.t())
        >>> memlayout.testing.assert_layout(lin)
        Traceback (most recent call last):
        ...
        AssertionError: memlayout found 1 layout problem at or above warning in Linear:
        ML201 warning non-contiguous: weight (shape [4, 4], stride [1, 4]) is not contiguous
            hint: store it contiguous (`p.data = p.data.contiguous()`), or call `memlayout.flatten(model)`
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this helper's
    if fail_on not in [threshold.value for threshold in FailOn]:
        raise ValueError(f"fail_on must be one of {', '.join(t.value for t in FailOn)}, not {fail_on!r}")
    threshold = FailOn(fail_on)
    report = run_inspection(model_or_path, config=config, select=_codes(select, "select"),
                            ignore=_codes(ignore, "ignore"))
    failing = [f for f in report.findings if threshold.fails(f.severity)]
    if failing:
        target = model_or_path if isinstance(model_or_path, str) else type(model_or_path).__name__
        noun = "problem" if len(failing) == 1 else "problems"
        raise AssertionError(
            "\n".join([f"memlayout found {len(failing)} layout {noun} at or above {threshold.value} in {target}:",
                       *_finding_lines(failing)])
        )
    return report
