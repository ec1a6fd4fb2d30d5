"""How every command turns errors into one stderr line and exit code 2: `exit_code`, called once, by
`MemlayoutCommand`."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from typing import Any

import typer

from memlayout.errors import (
    BudgetUnreachableError,
    MemlayoutError,
    NothingFitsError,
    RanksBudgetUnreachableError,
    TorchNotInstalledError,
)

USAGE_OR_LOAD_ERROR = 2
BUDGET_UNREACHABLE = 1
NOTHING_FITS = (BudgetUnreachableError, RanksBudgetUnreachableError, NothingFitsError)
"""An answer rather than a failure: the step was predicted, and no plan (or no size) fits the budget; exit 1, as a
finding does, where a command that could not answer exits 2."""


def exit_code(run: Callable[[], Any], debug: bool) -> int:
    """Run a command and return its exit code: the one place an error becomes `memlayout: error: ...` and 2.

    A command returns its exit code (None counts as 0) and raises `MemlayoutError`
    for anything the user can fix; with --debug the error goes on, for its traceback.
    """
    try:
        code = run()
    except (typer.Exit, typer.Abort):
        raise
    except MemlayoutError as exc:
        if debug:
            raise
        print(f"memlayout: error: {exc.one_line()}", file=sys.stderr)
        return BUDGET_UNREACHABLE if isinstance(exc, NOTHING_FITS) else USAGE_OR_LOAD_ERROR
    except KeyboardInterrupt:
        print("memlayout: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug or an unforeseen input: still one line, never a traceback
        if debug:
            raise
        if _torch_is_missing(exc):
            # A command that runs torch, where memlayout was installed without it.
            message = TorchNotInstalledError("this command needs torch, which is not installed").one_line()
        else:
            message = f"unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback)"
        print(f"memlayout: error: {message}", file=sys.stderr)
        return USAGE_OR_LOAD_ERROR
    return code if isinstance(code, int) else 0


def _torch_is_missing(exc: Exception) -> bool:
    name = exc.name if isinstance(exc, ModuleNotFoundError) else None
    return (name or "").partition(".")[0] == "torch" and importlib.util.find_spec("torch") is None
