"""Module paths as Python list expressions, for the code a report prints: a run of blocks folded into one range."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence


def _runs(paths: Sequence[str]) -> list[str]:
    """Python expressions for the paths, a run of `prefix.0` ... `prefix.N` as one list comprehension's star."""
    parts: list[str] = []
    index = 0
    while index < len(paths):
        prefix, _, last = paths[index].rpartition(".")
        end = index
        if last.isdigit():
            while (end + 1 < len(paths) and paths[end + 1].rpartition(".")[0] == prefix
                   and paths[end + 1].rpartition(".")[2] == str(int(last) + end + 1 - index)):
                end += 1
        if end - index >= 2:
            start, stop = int(last), int(last) + end - index + 1
            span = f"range({stop})" if start == 0 else f"range({start}, {stop})"
            parts.append(f"*(f{prefix + '.{i}'!r} for i in {span})")
        else:
            parts.extend(repr(p) for p in paths[index:end + 1])
        index = end + 1
    return parts


def python_list(paths: Sequence[str], indent: str) -> str:
    """A list of module paths as Python, consecutive blocks folded (`*(f"model.layers.{i}" for i in range(32))`)."""
    parts = _runs(paths)
    if len(parts) == 1 and parts[0].startswith("*("):
        return "[" + parts[0][2:-1] + "]"  # one run: a list comprehension
    text = "[" + ", ".join(parts) + "]"
    if len(text) + len(indent) <= 100:
        return text
    body = textwrap.fill(", ".join(parts), 96 - len(indent), initial_indent=indent + "    ",
                         subsequent_indent=indent + "    ", break_long_words=False, break_on_hyphens=False)
    return "[\n" + body + ",\n" + indent + "]"
