"""Command-line values coerced as typer coerces them, without importing pydantic.

typer 0.2x coerces every option value through a pydantic `TypeAdapter` that it
builds on first use, flags excepted: importing pydantic and building the adapters
took 50-70 ms, more than `import typer` itself, in a command whose budget is twice
that (benchmarks/README.md). memlayout's options are strings, bounded integers,
enums, flags, values an option parses itself (`parser=`) and lists of these;
`coerce_without_pydantic` gives each such parameter of a command a coercer that
does what typer's adapter does, with typer's messages. It goes in typer's
per-parameter slot for its coercer,
`_runtime_param`, the one private typer name memlayout touches:
tests/cli/test_coercion.py compares every parameter's coercion with typer's own on
valid and invalid values, and fails if typer drops the slot. A parameter of any
other type keeps typer's coercion, and so does every parameter where typer has no
such slot.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Sequence
from typing import Any, get_args, get_origin

import typer

_INTEGER = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*(?:\.0+)?")
"""What pydantic's lax integer accepts from a string, once stripped: "1_000", "+5", "7.00"."""
_NOT_AN_INTEGER = "Input should be a valid integer, unable to parse string as an integer"


class _TyperCoerces(Exception):
    """A value of a kind the fast path does not handle: typer's own coercion takes it."""


Convert = Callable[[Any, Any], Any]


def _string(value: Any, ctx: Any) -> Any:
    if isinstance(value, str):
        return value
    raise _TyperCoerces


def _flag(value: Any, ctx: Any) -> Any:
    if isinstance(value, bool):
        return value
    raise _TyperCoerces


def _integer(minimum: int | None, maximum: int | None) -> Convert:
    def convert(value: Any, ctx: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise _TyperCoerces
        number = value
        if isinstance(number, str):
            text = number.strip()
            if not _INTEGER.fullmatch(text):
                raise ValueError(_NOT_AN_INTEGER)
            number = int(text.partition(".")[0])
        if minimum is not None and number < minimum:
            raise ValueError(f"Input should be greater than or equal to {minimum}")
        if maximum is not None and number > maximum:
            raise ValueError(f"Input should be less than or equal to {maximum}")
        return number

    return convert


def _choice(choices: Sequence[enum.Enum], case_sensitive: bool) -> Convert:
    def normalized(choice: Any, ctx: Any) -> str:
        text = str(choice.value) if isinstance(choice, enum.Enum) else str(choice)
        if ctx is not None and ctx.token_normalize_func is not None:
            text = ctx.token_normalize_func(text)
        return text if case_sensitive else text.casefold()

    def convert(value: Any, ctx: Any) -> Any:
        if any(value is choice for choice in choices):
            return value
        wanted = normalized(value, ctx)
        names = {choice: normalized(choice, ctx) for choice in choices}
        for choice, name in names.items():
            if name == wanted:
                return choice
        raise ValueError(f"Value error, {value!r} is not one of {', '.join(map(repr, names.values()))}.")

    return convert


def _parsed(parser: Callable[[Any], Any]) -> Convert:
    # typer runs an option's own parser as pydantic validates: a ValueError or an
    # AssertionError is the invalid value's message, any other exception escapes.
    def convert(value: Any, ctx: Any) -> Any:
        try:
            return parser(value)
        except ValueError as exc:
            raise ValueError(f"Value error, {exc}") from None
        except AssertionError as exc:
            raise ValueError(f"Assertion failed, {exc}") from None

    return convert


def _converter(annotation: Any, info: Any) -> Convert | None:
    parser = getattr(info, "parser", None)
    if parser is not None:
        return _parsed(parser)
    if getattr(info, "clamp", False):
        return None
    if annotation is str:
        return _string
    if annotation is bool:
        return _flag
    if annotation is int:
        bounds = (getattr(info, "min", None), getattr(info, "max", None))
        if all(bound is None or (isinstance(bound, int) and not isinstance(bound, bool)) for bound in bounds):
            return _integer(*bounds)
        return None
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return _choice(tuple(annotation), bool(getattr(info, "case_sensitive", True)))
    return None


class _Coercer:
    """What typer asks of a parameter's coercer: `coerce(value, param=, ctx=)`."""

    def __init__(self, convert: Convert, is_list: bool) -> None:
        self.convert = convert
        self.is_list = is_list

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        multiple = param.multiple or param.nargs == -1
        if value is None:
            return () if multiple else None
        if multiple and isinstance(value, str):
            raise typer.BadParameter("Value must be an iterable.", ctx=ctx, param=param)
        try:
            if self.is_list:
                items = value if isinstance(value, (list, tuple)) else [value]
                return [self.convert(item, ctx) for item in items]
            return self.convert(value, ctx)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), ctx=ctx, param=param) from None
        except _TyperCoerces:
            return _typer_coercion(param, self).coerce(value, param=param, ctx=ctx)


def _typer_coercion(param: Any, ours: _Coercer) -> Any:
    # typer's own coercer, built the way typer builds it: from an empty slot.
    param._runtime_param = None
    try:
        return param.get_runtime_param()
    finally:
        param._runtime_param = ours


def coercer_for(param: Any) -> _Coercer | None:
    """The pydantic-free coercer for one of typer's parameters; None where typer's own must do."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or not hasattr(param, "_runtime_param"):
        return None
    annotation, info = descriptor.annotation, descriptor.parameter_info
    is_list = get_origin(annotation) is list
    if is_list:
        (annotation,) = get_args(annotation)
    convert = _converter(annotation, info)
    return None if convert is None else _Coercer(convert, is_list)


def coerce_without_pydantic(*params: Any) -> None:
    """Give each of typer's parameters that can have one a pydantic-free coercer.

    Args:
        params: A typer-built command's `params`, and its help option (click makes
            that one on first use: `get_help_option`).
    """
    for param in params:
        coercer = coercer_for(param)
        if coercer is not None and not isinstance(param._runtime_param, _Coercer):
            param._runtime_param = coercer
