"""Functions stay short and take few parameters; a step's setting travels in its request, not in every signature.

A function over 60 lines does several jobs, and one of more than 8 parameters passes by hand what
an object should carry. The package holds at most 15 of the first and, outside the CLI (whose
commands declare one parameter per option), 6 of the second; a setting of a step such as
`model_class` is a field of `StepRequest` and appears in at most 4 signatures. Lines count from
`def` to the last line, docstring included.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

import memlayout

MAX_LINES = 60
MAX_LONG = 15
MAX_PARAMETERS = 8
MAX_WIDE = 6
MAX_SIGNATURES = 4
STEP_SETTINGS = ("model_class",)
MIRRORS = {
    "_torch.py:cudnn_rnn_flatten_weight": "torch._cudnn_rnn_flatten_weight's own arguments, one for one: "
                                          "tests/test_private_torch_apis.py holds the two equal",
}
"""Functions whose parameters are another API's, with the reason; not counted as wide."""


class Function(NamedTuple):
    where: str
    """`path:name`, the path relative to the package."""
    lines: int
    parameters: tuple[str, ...]


def functions(package: Path) -> list[Function]:
    """Every function and method of the package, with its length and its parameters (less self and cls)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                arguments = node.args
                names = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
                names += [a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None]
                assert node.end_lineno is not None
                found.append(Function(f"{path.relative_to(package)}:{node.name}", node.end_lineno - node.lineno + 1,
                                      tuple(name for name in names if name not in ("self", "cls"))))
    return found


def long_functions(found: list[Function]) -> list[str]:
    return [f"{f.where}: {f.lines} lines" for f in found if f.lines > MAX_LINES]


def wide_functions(found: list[Function]) -> list[str]:
    return [f"{f.where}: {len(f.parameters)} parameters" for f in found
            if len(f.parameters) > MAX_PARAMETERS and not f.where.startswith("cli/") and f.where not in MIRRORS]


def signatures_with(found: list[Function], setting: str) -> list[str]:
    return [f.where for f in found if setting in f.parameters]


def test_few_functions_are_long_and_few_outside_the_cli_take_many_parameters() -> None:
    found = functions(Path(memlayout.__file__).parent)
    assert len(long_functions(found)) <= MAX_LONG, long_functions(found)
    assert len(wide_functions(found)) <= MAX_WIDE, wide_functions(found)


def test_a_step_setting_travels_in_the_request() -> None:
    found = functions(Path(memlayout.__file__).parent)
    for setting in STEP_SETTINGS:
        assert len(signatures_with(found, setting)) <= MAX_SIGNATURES, signatures_with(found, setting)


def test_the_checker_counts_lines_parameters_and_signatures(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "cli").mkdir(parents=True)
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES - 1))
    (package / "a.py").write_text(f"def at_the_limit():\n{body}\n\ndef over():\n{body}\n    x = 0\n\n"
                                  "class C:\n    def wide(self, a, b, c, d, e, f, g, h, i): ...\n"
                                  "    def narrow(self, a, b, c, d, e, f, g, h): ...\n"
                                  "def step(model_class, *args, **kwargs): ...\n")
    (package / "cli" / "command.py").write_text("def command(a, b, c, d, e, f, g, h, i): ...\n")
    found = functions(package)
    assert long_functions(found) == [f"a.py:over: {MAX_LINES + 1} lines"]  # `def` and 59 lines are 60: not over
    assert wide_functions(found) == ["a.py:wide: 9 parameters"]  # self is no parameter; the CLI is not counted
    assert signatures_with(found, "model_class") == ["a.py:step"]
    assert next(f for f in found if f.where == "a.py:step").parameters == ("model_class", "args", "kwargs")
