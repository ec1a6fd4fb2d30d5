"""`FailOn` is the one judge of whether a result fails a run (issue 30 §4).

`"never"` was once special-cased in five modules and the thresholds listed in three;
these tests pin the one decision and check that every place that names the
thresholds names exactly `FailOn`'s.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

import memlayout.report
from memlayout.cli import options
from memlayout.errors import UsageError
from memlayout.pipeline.config import settings_from_table
from memlayout.severity import FailOn, Severity

# Lowest first: a threshold fails its own severity and every one above it.
ORDER = [Severity.INFO, Severity.WARNING, Severity.ERROR]


@pytest.mark.parametrize("threshold", [FailOn.INFO, FailOn.WARNING, FailOn.ERROR])
@pytest.mark.parametrize("severity", ORDER)
def test_a_threshold_fails_its_severity_and_those_above_only(threshold: FailOn, severity: Severity) -> None:
    at_or_above = ORDER.index(severity) >= ORDER.index(Severity(threshold.value))
    assert threshold.fails(severity) is at_or_above


@pytest.mark.parametrize("severity", ORDER)
def test_never_fails_nothing(severity: Severity) -> None:
    assert FailOn.NEVER.fails(severity) is False


def test_the_thresholds_are_the_severities_and_never() -> None:
    assert [t.value for t in FailOn] == [s.value for s in Severity] + ["never"]


def test_the_json_schema_lists_the_same_thresholds() -> None:
    schema = json.loads((Path(memlayout.report.__file__).parent / "schema_v2.json").read_text())
    assert schema["properties"]["fail_on"]["enum"] == [t.value for t in FailOn]


def test_the_cli_option_takes_the_one_enum() -> None:
    for alias in (options.InspectFailOnOption, options.DiffFailOnOption):
        assert typing.get_args(typing.get_args(alias)[0]) == (FailOn, type(None))


def test_a_config_file_threshold_is_the_enum_and_a_wrong_one_names_them_all() -> None:
    assert settings_from_table({"fail-on": "info"}, "pyproject.toml").fail_on is FailOn.INFO
    with pytest.raises(UsageError, match="must be one of error, warning, info, never, not 'fatal'"):
        settings_from_table({"fail-on": "fatal"}, "pyproject.toml")
    with pytest.raises(UsageError, match="must be one of"):  # a TOML list is not hashable: still one clean line
        settings_from_table({"fail-on": ["error"]}, "pyproject.toml")
