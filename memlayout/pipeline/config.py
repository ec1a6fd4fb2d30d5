"""`[tool.memlayout]` in pyproject.toml: the settings a project keeps for `memlayout inspect`.

The file is found by walking up from the working directory to the first
`pyproject.toml` with a `[tool.memlayout]` table (as ruff finds `[tool.ruff]`), or
named with `--config FILE`; `--isolated` reads none. Command-line flags then replace
the file's value of each setting they give. Every key and every rule code is checked:
a typo is an error that names it, never a setting silently ignored.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from memlayout.errors import UsageError
from memlayout.rules import RULES, RuleConfig
from memlayout.severity import FailOn

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PYPROJECT = "pyproject.toml"
# The rule knobs a settings file or a flag may set; `deep` is a flag of its own per command.
_RULE_FIELDS = frozenset(f.name for f in fields(RuleConfig)) - {"deep"}
_CODE = re.compile(r"^ML\d{0,3}$")


@dataclass(frozen=True)
class Settings:
    """What one `memlayout inspect` run is configured with, from the file and then the flags."""

    select: tuple[str, ...] = ()
    """Rule codes or prefixes to run; empty means all."""
    ignore: tuple[str, ...] = ()
    """Rule codes or prefixes to skip."""
    fail_on: FailOn = FailOn.WARNING
    """The severity that fails the run: error, warning, info or never."""
    per_tensor_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(glob, codes) pairs: a finding all of whose tensors match a glob listing its code is dropped."""
    rules: RuleConfig = field(default_factory=RuleConfig)
    """The knobs the rules read (thresholds, declared ties): RuleConfig is their one home."""
    file: str | None = None
    """The configuration file these came from; None when none was read."""

    def rule_config(self, deep: bool = False) -> RuleConfig:
        """The knobs the rules read, with `--deep` as given."""
        return replace(self.rules, deep=deep)

    def overridden(self, **flags: Any) -> Settings:
        """These settings with each flag that was given (not None) replacing the file's value.

        A flag named as a RuleConfig field (min_bloat_bytes, ties, ...) replaces that rule knob.
        """
        given = {name: value for name, value in flags.items() if value is not None}
        rule_knobs = {name: given.pop(name) for name in list(given) if name in _RULE_FIELDS}
        unknown = set(given) - {f.name for f in fields(self)}
        if unknown:
            raise TypeError(f"no setting {sorted(unknown)}")
        return replace(self, **given, rules=replace(self.rules, **rule_knobs))


def check_codes(codes: Iterable[str], where: str) -> tuple[str, ...]:
    """Upper-cased codes or prefixes, each matching at least one rule.

    Raises:
        UsageError: naming the first code no rule has.
    """
    checked = []
    for code in codes:
        upper = code.strip().upper()
        if not _CODE.match(upper) or not any(known.startswith(upper) for known in RULES):
            raise UsageError(f"{where}: unknown rule code {code!r}", "`memlayout rules` lists them")
        checked.append(upper)
    return tuple(checked)


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise UsageError(f"{where} must be a list of strings", f'e.g. {where.rsplit(" ", 1)[-1]} = ["ML2", "ML301"]')
    return value


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(f"{where} must be a whole number of 0 or more, not {value!r}")
    return value


def _alignment(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
        raise UsageError(f"{where} must be a power of two, in bytes, not {value!r}", "e.g. alignment = 64")
    return value


def _select(value: Any, where: str) -> tuple[str, ...]:
    return check_codes(_strings(value, where), where)


def _fail_on(value: Any, where: str) -> FailOn:
    if value not in [threshold.value for threshold in FailOn]:
        raise UsageError(f"{where} must be one of {', '.join(t.value for t in FailOn)}, not {value!r}")
    return FailOn(value)


def _per_tensor_ignores(value: Any, where: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if not isinstance(value, Mapping):
        raise UsageError(f"{where} must be a table of glob = [codes]", 'e.g. {"*.running_mean" = ["ML203"]}')
    return tuple((glob, check_codes(_strings(codes, f"{where}.{glob!r}"), f"{where}.{glob!r}"))
                 for glob, codes in value.items())


def _ties(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    pairs = value if isinstance(value, list) else None
    if pairs is None or not all(
        isinstance(pair, list) and len(pair) == 2 and all(isinstance(n, str) and n.strip() for n in pair)
        for pair in pairs
    ):
        raise UsageError(
            f"{where} must be a list of [target, source] name pairs",
            'e.g. ties = [["lm_head.weight", "model.embed_tokens.weight"]]',
        )
    return tuple((target.strip(), source.strip()) for target, source in pairs)


# The file's keys (kebab-case, as in pyproject tables), each with its field and its check.
KEYS = {
    "select": ("select", _select),
    "ignore": ("ignore", _select),
    "fail-on": ("fail_on", _fail_on),
    "per-tensor-ignores": ("per_tensor_ignores", _per_tensor_ignores),
    "min-bloat-bytes": ("min_bloat_bytes", _count),
    "min-duplicate-bytes": ("min_duplicate_bytes", _count),
    "fragmented-min-storages": ("fragmented_min_storages", _count),
    "min-shard-padding-bytes": ("min_shard_padding_bytes", _count),
    "ties": ("ties", _ties),
    "alignment": ("alignment", _alignment),
}


SUBTABLES = frozenset({"activations"})
"""Tables inside `[tool.memlayout]` that belong to another command: `[tool.memlayout.activations]`
(memlayout/activations/request/config_file.py)."""


def settings_from_table(table: Mapping[str, Any], file: str) -> Settings:
    """Settings from a parsed `[tool.memlayout]` table.

    Raises:
        UsageError: an unknown key, a value of the wrong type, or an unknown rule code.
    """
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key in SUBTABLES and isinstance(value, Mapping):
            continue  # another command's settings, which that command reads and checks
        if key not in KEYS:
            raise UsageError(
                f"{file}: [tool.memlayout] has no setting {key!r}", f"the settings are {', '.join(KEYS)}"
            )
        name, check = KEYS[key]
        values[name] = check(value, f"{file}: {key}")
    return Settings(file=file).overridden(**values)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read: {exc.strerror}", "check the --config path") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}", "fix the file, or pass --isolated to ignore it") from exc


def _memlayout_table(document: Mapping[str, Any], path: Path) -> Mapping[str, Any] | None:
    tool = document.get("tool")
    table = tool.get("memlayout") if isinstance(tool, Mapping) else None
    if table is not None and not isinstance(table, Mapping):
        raise UsageError(f"{path}: tool.memlayout must be a table", "write it as [tool.memlayout]")
    return table


def find_config(start: Path | None = None) -> Path | None:
    """The first `pyproject.toml` with a `[tool.memlayout]` table, from `start` (the working
    directory) up to the filesystem root; None when there is none."""
    folder = (start or Path.cwd()).resolve()
    for candidate in (folder, *folder.parents):
        path = candidate / PYPROJECT
        if not path.is_file():
            continue
        # Most projects' pyproject.toml never mentions memlayout: skip those unparsed,
        # so an unrelated file up the tree (broken or not) cannot get in the way.
        try:
            if b"memlayout" not in path.read_bytes():
                continue
        except OSError:
            continue
        if _memlayout_table(_read_toml(path), path) is not None:
            return path
    return None


def load_config(path: Path) -> Settings:
    """Settings from one file: a pyproject.toml's `[tool.memlayout]`, or a TOML file holding
    the settings at its top level (for `--config memlayout.toml`)."""
    document = _read_toml(path)
    table = _memlayout_table(document, path)
    if table is None:
        if path.name == PYPROJECT:
            raise UsageError(f"{path} has no [tool.memlayout] table", "add one, or name another file with --config")
        table = document
    return settings_from_table(table, _shown(path))


def _shown(path: Path) -> str:
    # Relative to the working directory when below it: what a user recognizes in an error.
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)


def resolve_settings(config: str | None = None, isolated: bool = False, start: Path | None = None) -> Settings:
    """The settings file's settings: the one named, the one found, or none.

    Args:
        config: `--config FILE`, or None to search.
        isolated: `--isolated`: read no file.
        start: Where the search starts (the working directory by default).

    Returns:
        The file's `Settings`, or the defaults when no file applies.
    """
    if config is not None and isolated:
        raise UsageError("--config and --isolated contradict each other", "pass one of them")
    if isolated:
        return Settings()
    if config is not None:
        path = Path(config)
        if not path.is_file():
            raise UsageError(f"--config {config}: no such file", "name a pyproject.toml or a TOML settings file")
        return load_config(path)
    found = find_config(start)
    return load_config(found) if found is not None else Settings()
