"""Every rule setting of `[tool.memlayout]` reaches every command that runs the rules (issue 30).

`diff` once kept its own copy of three of the rule settings and lacked the fourth,
`min-shard-padding-bytes`, so a project's file changed what `inspect` reported and
not what `diff` did. Both now hand the rules one `RuleConfig`; this test sets every
field of it to a value other than its default in a settings file and reads what
each command passed on.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

import memlayout.diff
import memlayout.pipeline.batch
import memlayout.pipeline.flatten_check
from memlayout.cli.app import main
from memlayout.pipeline.config import KEYS
from memlayout.rules import RuleConfig

# The file's spelling and a value other than the default, for each RuleConfig field a file sets.
FILE_VALUES: dict[str, Any] = {
    "min-bloat-bytes": 7,
    "min-duplicate-bytes": 9,
    "fragmented-min-storages": 11,
    "min-shard-padding-bytes": 13,
    "ties": [["head.weight", "embed.weight"]],
    "alignment": 32,
}


def test_the_file_values_cover_every_rule_setting() -> None:
    # A new RuleConfig field that the file can set must be added above, or this fails.
    settable = {field for field, _ in KEYS.values()}
    rule_fields = {f.name for f in dataclasses.fields(RuleConfig)} & settable
    assert {KEYS[key][0] for key in FILE_VALUES} == rule_fields


@pytest.fixture
def project(tmp_path: Path) -> Path:
    lines = ["[tool.memlayout]"]
    for key, value in FILE_VALUES.items():
        text = str(value).replace("'", '"')
        lines.append(f"{key} = {text}")
    (tmp_path / "pyproject.toml").write_text("\n".join(lines) + "\n")
    torch.save({"embed.weight": torch.zeros(4), "head.weight": torch.zeros(4)}, tmp_path / "a.pt")
    return tmp_path


def expected() -> dict[str, Any]:
    return {KEYS[key][0]: (tuple(tuple(pair) for pair in value) if isinstance(value, list) else value)
            for key, value in FILE_VALUES.items()}


def test_inspect_diff_and_flatten_check_pass_every_file_setting_to_the_rules(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, RuleConfig] = {}

    class Handed(BaseException):
        """Ends the command once the stand-in has what the rules were handed (no error line, no exit code)."""

    def inspect_paths(paths: Any, *, config: RuleConfig, **_: Any) -> Any:
        seen["inspect"] = config
        raise Handed

    def run_diff(a: Any, b: Any, options: Any, **_: Any) -> Any:
        seen["diff"] = options.rules
        raise Handed

    def iter_path_reports(paths: Any, config: RuleConfig, *_: Any, **__: Any) -> Any:
        seen["flatten --check"] = config
        raise Handed

    # The commands import these when they run, from where they live.
    monkeypatch.setattr(memlayout.pipeline.batch, "inspect_paths", inspect_paths)
    monkeypatch.setattr(memlayout.diff, "run_diff", run_diff)
    monkeypatch.setattr(memlayout.pipeline.flatten_check, "iter_path_reports", iter_path_reports)
    monkeypatch.chdir(project)
    for argv in (["inspect", "a.pt"], ["diff", "a.pt", "a.pt"], ["flatten", "--check", "a.pt"]):
        with pytest.raises(Handed):
            main(argv)
    for command in ("inspect", "diff", "flatten --check"):
        got = {name: getattr(seen[command], name) for name in expected()}
        assert got == expected(), command


def test_settings_hand_every_rule_setting_to_the_rules() -> None:
    # Settings still holds each rule setting as a field of its own (the file's keys map to
    # them), so its copy into RuleConfig is where one could be dropped: every field must cross.
    from memlayout.pipeline.config import Settings, settings_from_table

    assert Settings().rule_config() == RuleConfig()  # the same defaults
    settings = settings_from_table(FILE_VALUES, "pyproject.toml")
    config = settings.rule_config(deep=True)
    assert {name: getattr(config, name) for name in expected()} == expected()
    assert config.deep is True
