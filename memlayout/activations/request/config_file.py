"""`[tool.memlayout.activations]`: the settings a project keeps for `memlayout activations`.

A training setup (`world-size = 8`, `fsdp = true`, `dtype = "bf16"`, `gpu = "h100"`) is
written once in the project's pyproject.toml rather than retyped on every run:

    [tool.memlayout.activations]
    world-size = 8
    fsdp = true
    dtype = "bf16"
    input = ["input_ids=int64[1,4096]<32000", "labels=int64[1,4096]<32000"]

The keys are the command's long options in kebab-case, as `[tool.memlayout]`'s are
inspect's, and mean what the option means; a flag given on the command line replaces
the file's value. The file is the nearest pyproject.toml with such a table, from the
working directory up (as `[tool.memlayout]` is found), or the one `--config FILE` names:
a pyproject.toml, or a TOML file with the table or with the settings at its top level.
Every key is checked: a typo is one error line that names it, never a setting ignored.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import tomllib

from memlayout.activations.request.step_request import SETTINGS, StepRequest
from memlayout.errors import UsageError

PYPROJECT = "pyproject.toml"
TABLE = "[tool.memlayout.activations]"


def _kinds() -> dict[str, tuple[tuple[type, ...], str]]:
    """Each setting's key -> the TOML types its value may have, and how the error says them."""
    kinds: dict[str, tuple[tuple[type, ...], str]] = {}
    annotations = {f.name: str(f.type) for f in fields(StepRequest)}
    for name in SETTINGS:
        text = annotations[name]
        if text == "bool":
            kind: tuple[tuple[type, ...], str] = ((bool,), "true or false")
        elif text.startswith("tuple"):
            kind = ((list, str), "a list of strings")
        elif name == "budget":
            kind = ((str, int, float), "a size or a share, such as \"78GiB\" or 0.9")
        elif text.startswith("int"):
            kind = ((int,), "a whole number")
        elif text.startswith("float"):
            kind = ((int, float), "a number")
        else:
            kind = ((str,), "a string")
        kinds[name.replace("_", "-")] = kind
    return kinds


KEYS = _kinds()
"""The table's keys, in the order of the request's fields."""


def config_settings(table: Mapping[str, Any], file: str) -> dict[str, Any]:
    """The settings of a parsed `[tool.memlayout.activations]` table, by their names (`world_size`), each value
    as the file gives it.

    Raises:
        UsageError: an unknown key, or a value of the wrong type, naming the file and the key.
    """
    settings: dict[str, Any] = {}
    for key, value in table.items():
        if key not in KEYS:
            raise UsageError(f"{file}: {TABLE} has no setting {key!r}",
                             f"the settings are the long options of memlayout activations: {', '.join(KEYS)}")
        types, said = KEYS[key]
        wrong = isinstance(value, bool) and bool not in types
        if list in types and isinstance(value, list):
            wrong = not all(isinstance(item, str) for item in value)
        if wrong or not isinstance(value, types):
            raise UsageError(f"{file}: {key} must be {said}, not {value!r}", f"e.g. {_example(key)}")
        settings[key.replace("-", "_")] = [value] if list in types and isinstance(value, str) else value
    return settings


def _example(key: str) -> str:
    types, _ = KEYS[key]
    if bool in types:
        return f"{key} = true"
    if list in types:
        return f'{key} = ["..."]'
    return f"{key} = 8" if int in types and str not in types else f'{key} = "..."'


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read: {exc.strerror}", "check the --config path") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}", "fix the file, or pass --isolated to ignore it") from exc


def _activations_table(document: Mapping[str, Any], path: Path) -> Mapping[str, Any] | None:
    tool = document.get("tool")
    memlayout = tool.get("memlayout") if isinstance(tool, Mapping) else None
    table = memlayout.get("activations") if isinstance(memlayout, Mapping) else None
    if table is not None and not isinstance(table, Mapping):
        raise UsageError(f"{path}: tool.memlayout.activations must be a table", f"write it as {TABLE}")
    return table


def find_config(start: Path | None = None) -> Path | None:
    """The first pyproject.toml with a `[tool.memlayout.activations]` table, from `start` (the working directory)
    up to the filesystem root; None when there is none."""
    folder = (start or Path.cwd()).resolve()
    for candidate in (folder, *folder.parents):
        path = candidate / PYPROJECT
        try:
            # Most projects' pyproject.toml never mentions memlayout: those are skipped unparsed, so that an
            # unrelated file up the tree (broken or not) cannot get in the way.
            if not path.is_file() or b"memlayout" not in path.read_bytes():
                continue
        except OSError:
            continue
        if _activations_table(_read_toml(path), path) is not None:
            return path
    return None


def load_config(path: Path) -> dict[str, Any]:
    """The settings one file holds: its `[tool.memlayout.activations]`, or, in a file other than a pyproject.toml
    without that table, its top level (for `--config activations.toml`)."""
    document = _read_toml(path)
    table = _activations_table(document, path)
    if table is None:
        if path.name == PYPROJECT:
            raise UsageError(f"{path} has no {TABLE} table", "add one, or name another file with --config")
        table = document
    return config_settings(table, _shown(path))


def resolve_config(config: str | None = None, isolated: bool = False, start: Path | None = None) -> dict[str, Any]:
    """The settings of the file named (`--config`), else of the one found; none with `isolated`.

    Raises:
        UsageError: both `config` and `isolated`, no such file, or what `load_config` raises.
    """
    if config is not None and isolated:
        raise UsageError("--config and --isolated contradict each other", "pass one of them")
    if isolated:
        return {}
    if config is not None:
        path = Path(config)
        if not path.is_file():
            raise UsageError(f"--config {config}: no such file", "name a pyproject.toml or a TOML settings file")
        return load_config(path)
    found = find_config(start)
    return load_config(found) if found is not None else {}


def _shown(path: Path) -> str:
    # Relative to the working directory when below it: what a user recognizes in an error.
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)
