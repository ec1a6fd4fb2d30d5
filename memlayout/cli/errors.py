"""How every command turns errors into one stderr line and exit code 2."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import typer

from memlayout.errors import MemlayoutError, TorchNotInstalledError

USAGE_OR_LOAD_ERROR = 2


@contextmanager
def one_line_errors(debug: bool) -> Iterator[None]:
    """Print `memlayout: error: ...` and exit 2; with --debug, re-raise for the traceback."""
    try:
        yield
    except (typer.Exit, typer.Abort):
        raise
    except MemlayoutError as exc:
        if debug:
            raise
        print(f"memlayout: error: {exc.one_line()}", file=sys.stderr)
        raise typer.Exit(USAGE_OR_LOAD_ERROR) from None
    except KeyboardInterrupt:
        print("memlayout: interrupted", file=sys.stderr)
        raise typer.Exit(130) from None
    except Exception as exc:  # a bug or an unforeseen input: still one line, never a traceback
        if debug:
            raise
        if _torch_is_missing(exc):
            # A command that runs torch, where memlayout was installed without it.
            message = TorchNotInstalledError("this command needs torch, which is not installed").one_line()
        else:
            message = f"unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback)"
        print(f"memlayout: error: {message}", file=sys.stderr)
        raise typer.Exit(USAGE_OR_LOAD_ERROR) from None


def _torch_is_missing(exc: Exception) -> bool:
    name = exc.name if isinstance(exc, ModuleNotFoundError) else None
    return (name or "").partition(".")[0] == "torch" and importlib.util.find_spec("torch") is None
