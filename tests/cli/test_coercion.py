"""Command-line values coerced without pydantic, exactly as typer's own coercion does it.

memlayout.cli.coercion replaces typer's pydantic adapters for memlayout's option
types. Each parameter of each command is compared with typer's own coercion on
valid and invalid values: the same value back, or the same error message.
"""

from __future__ import annotations

import enum
from typing import Any

import pytest
import typer

from memlayout.cli.app import COMMANDS, build_command
from memlayout.cli.coercion import coercer_for

STRINGS = ["model.pt", "", " spaced out ", "ünï", "-x", "\x1b[31m"]
INTEGERS = [
    "12", " 12 ", "+5", "-1", "0", "-0", "1_000", "1__0", "_1", "1.0", "7.00", "1.", "1.5", "0x10", "1e3", "", "abc",
    "\u0663", "\xa01", "99999999999999999999999", 64, 0, -3, True, 1.5,
]
FLOATS = ["0.05", " 0.1 ", "5%", "0", "1", "1.5", "-0.1", "nan", "abc", "", 0.25, 2]
LISTS: list[Any] = [("a", "b"), ["x"], (), "single"]


def _values(annotation: Any) -> list[Any]:
    base = annotation.__args__[0] if getattr(annotation, "__origin__", None) is list else annotation
    if base is str:
        scalars: list[Any] = list(STRINGS)
    elif base is int:
        scalars = list(INTEGERS)
    elif base is float:
        scalars = list(FLOATS)
    elif isinstance(base, type) and issubclass(base, enum.Enum):
        members = list(base)
        scalars = [*members, *(m.value for m in members), *(str(m.value).upper() for m in members), "nope", "", 3]
    elif base is bool:
        scalars = [True, False, "true", "no", 1]
    else:
        raise AssertionError(f"a parameter of type {base!r}: add values for it")
    if base is not annotation:
        return [*LISTS, *([item] for item in scalars), tuple(scalars[:3]), None]
    return [*scalars, None]


def _outcome(coercer: Any, value: Any, param: Any, ctx: Any) -> tuple[str, Any]:
    try:
        result = coercer.coerce(value, param=param, ctx=ctx)
    except typer.BadParameter as exc:
        return "error", exc.format_message()
    return "value", (type(result), result)


def _typer_coercion(param: Any) -> Any:
    ours = param._runtime_param
    param._runtime_param = None
    try:
        return param.get_runtime_param()
    finally:
        param._runtime_param = ours


def _parameters() -> list[tuple[str, Any, Any]]:
    found = []
    for name in COMMANDS:
        command = build_command(name)
        ctx = typer.Context(command)
        found += [(name, param, ctx) for param in command.params]
    return found


PARAMETERS = _parameters()


def test_every_parameter_of_every_command_coerces_without_pydantic() -> None:
    assert PARAMETERS, "no parameters found"
    for name, param, _ in PARAMETERS:
        if not hasattr(param, "_runtime_param"):
            pytest.fail(f"typer {typer.__version__} has no _runtime_param slot on its parameters any more: "
                        "memlayout.cli.coercion must follow it (until then typer coerces through pydantic)")
        assert coercer_for(param) is not None, f"memlayout {name} {param.name}: a type memlayout.cli.coercion lacks"
        assert param._runtime_param is not None, f"memlayout {name} {param.name}: no coercer installed"


@pytest.mark.parametrize(("command", "param", "ctx"), PARAMETERS, ids=[f"{c}-{p.name}" for c, p, _ in PARAMETERS])
def test_each_parameter_coerces_as_typer_does(command: str, param: Any, ctx: Any) -> None:
    ours, theirs = param._runtime_param, _typer_coercion(param)
    for value in _values(param.type_descriptor.annotation):
        expected = _outcome(theirs, value, param, ctx)
        assert _outcome(ours, value, param, ctx) == expected, f"{command} {param.name} given {value!r}"
