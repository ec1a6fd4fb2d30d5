"""The `memlayout` command: one typer app; each command lives in its own module.

A command imports only what it uses: each command's module is imported, and its
click command built, only when it runs (or `--help` lists it), and heavy imports
(torch, rich tables) happen inside commands, so `memlayout --help` and metadata
inspection start fast. The command modules (`*_command.py`) leave out `from
__future__ import annotations`: typer reads a command's signature each time it
builds the command, and string annotations would be compiled and evaluated then
(3.5 of the 5 ms it took to build inspect's), where real ones come ready-made from
the module's bytecode.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

from memlayout import cyclic_gc
from memlayout.cli.coercion import coerce_without_pydantic
from memlayout.cli.errors import USAGE_OR_LOAD_ERROR, exit_code
from memlayout.output.writer import QuietStdout
from memlayout.version import __version__

COMMANDS = {
    "inspect": ("memlayout.cli.inspect_command", "inspect_command"),
    "rules": ("memlayout.cli.rules_command", "rules_command"),
    "explain": ("memlayout.cli.rules_command", "explain_command"),
    "flatten": ("memlayout.cli.flatten_command", "flatten_command"),
    "diff": ("memlayout.cli.diff_command", "diff_command"),
    "activations": ("memlayout.cli.activations_command", "activations_command"),
}
"""Each command's name -> (module, function), in the order `--help` lists them."""

WITHOUT_CYCLIC_GC = frozenset({"inspect", "diff", "rules", "explain"})
"""Commands that run with CPython's cyclic collector paused: they read, keep what
they build until the report is written, and make no cycles worth collecting, while
each collection would traverse everything kept: the imports' objects, and at 40,000
tensors every fact (benchmarks/README.md). Reference counting frees as usual;
flatten and activations, which run torch, keep the collector."""


def _cyclic_gc_paused(command: str | None) -> contextlib.AbstractContextManager[None]:
    """The collector paused while `command` is built and run, when it is one of `WITHOUT_CYCLIC_GC`.

    Resumed afterwards, for a caller that runs the command in its own process (tests, main()).
    """
    return cyclic_gc.paused() if command in WITHOUT_CYCLIC_GC else contextlib.nullcontext()


def _parser_errors() -> tuple[type[Exception], ...]:
    # typer 0.29 raises its own vendored click's exceptions; older releases raise click's.
    errors: list[type[Exception]] = [typer.TyperException]
    try:
        import click
    except ImportError:  # pragma: no cover - typer without click
        return tuple(errors)
    return (*errors, click.ClickException)


def _is_usage_error(exc: Exception) -> bool:
    names = {cls.__name__ for cls in type(exc).__mro__}
    return "UsageError" in names and "NoArgsIsHelpError" not in names


class OneLineUsageErrors(TyperGroup):
    """A bad flag or value is one `memlayout: error: ...` line and exit 2, like every other error.

    click would print the usage, a hint and a boxed message; a CI log and a
    pre-commit run want the one line.
    """

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        def run() -> Any:
            return super(OneLineUsageErrors, self).main(
                args, prog_name, complete_var, standalone_mode=False, windows_expand_args=windows_expand_args, **extra
            )

        code = self._code_of(run)
        if standalone_mode:  # click's contract, for its test runner; main() asks for the code instead
            sys.exit(code)
        return code

    def _code_of(self, run: Callable[[], Any]) -> int:
        """What `run` returns, or the exit code of a bad flag or value, said in one line."""
        try:
            code = run()
        except _parser_errors() as exc:
            if not _is_usage_error(exc):
                exc.show()  # type: ignore[attr-defined]
                return int(exc.exit_code)  # type: ignore[attr-defined]
            # typer words a rejected choice through pydantic, whose prefix says nothing.
            message = exc.format_message().replace("Value error, ", "")  # type: ignore[attr-defined]
            print(f"memlayout: error: {message}", file=sys.stderr)
            return int(exc.exit_code)  # type: ignore[attr-defined]
        except typer.Abort:
            print("memlayout: aborted", file=sys.stderr)
            return 1
        return code if isinstance(code, int) else 0


class MemlayoutCommands(OneLineUsageErrors):
    """The commands of `COMMANDS`, each imported and built on first use."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        coerce_without_pydantic(*self.params)

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        coerce_without_pydantic(option)
        return option

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            # Building the command imports it and everything it runs (rules, rich):
            # most of a small inspect's time, and collections during it find nothing.
            with _cyclic_gc_paused(cmd_name):
                self.commands[cmd_name] = build_command(cmd_name)
        return self.commands.get(cmd_name)


class MemlayoutCommand(TyperCommand):
    """One command, coercing its values without pydantic (memlayout.cli.coercion)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        coerce_without_pydantic(*self.params)

    def invoke(self, ctx: Any) -> int:
        """Run the command and return its exit code; an error becomes one line here (`exit_code`).

        A command returns its code rather than raising it: an exception's traceback
        would hold the command's frame and so its report, and resuming the collector
        with the report alive made the first collection traverse every fact (30-45 ms
        of CPU at 40,000 tensors) only to find them freed a moment later.
        """
        debug = bool(ctx.params.get("debug", False))
        with _cyclic_gc_paused(self.name):
            return exit_code(lambda: super(MemlayoutCommand, self).invoke(ctx), debug)

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        coerce_without_pydantic(option)
        return option

    def format_options(self, ctx: Any, formatter: Any) -> None:
        """The options under a heading per group where the command groups them (`rich_help_panel`), in the order
        the groups first appear, an option of no group (--help) in the last; click's one "Options" list otherwise."""
        groups: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                group = getattr(param, "rich_help_panel", None) or (list(groups)[-1] if groups else None)
                groups.setdefault(group or "Options", []).append(record)
        if not any(getattr(param, "rich_help_panel", None) for param in self.get_params(ctx)):
            super().format_options(ctx, formatter)
            return
        for group, records in groups.items():
            with formatter.section(group):
                formatter.write_dl(records)


def build_command(name: str) -> Any:
    """The click command typer builds for one of `COMMANDS`."""
    module, function = COMMANDS[name]
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    single.command(name, cls=MemlayoutCommand)(getattr(importlib.import_module(module), function))
    return typer.main.get_command(single)


app = typer.Typer(
    cls=MemlayoutCommands,
    name="memlayout",
    help="Memory-layout diagnostics for PyTorch models and checkpoints.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"memlayout {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    """Memory-layout diagnostics for PyTorch models and checkpoints."""


def main(argv: list[str] | None = None) -> int:
    """The whole CLI entry: run the app and return its exit code.

    The code comes back as a return value all the way: each command returns it,
    `MemlayoutCommand.invoke` turns an error into one line and 2 (`cli.errors.exit_code`),
    and `OneLineUsageErrors.main` does the same for a bad flag.
    """
    stdout = sys.stdout
    # A reader that leaves early (`| head`) silences stdout instead of failing a write.
    sys.stdout = QuietStdout(stdout)
    try:
        code = app(args=argv, prog_name="memlayout", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except OSError as exc:
        # Commands turn their own errors into one line; what reaches here is writing
        # outside them (`rules`, `--version`, `--help`) to a full disk. (A closed pipe
        # is no error: QuietStdout goes quiet.)
        with contextlib.suppress(OSError, ValueError):
            print(f"memlayout: error: cannot write the output: {exc}", file=sys.stderr)
        return USAGE_OR_LOAD_ERROR
    finally:
        sys.stdout = stdout


def entry() -> NoReturn:
    """The `memlayout` command (and `python -m memlayout`): `main()`, then an exit without teardown.

    When `main()` returns, every file it wrote is fsynced and renamed into place.
    The exit then goes as usual, waiting for any thread still running and running
    the handlers registered with `atexit` (logging, `weakref.finalize`, temporary
    folders, torch's own), up to the interpreter's teardown, which after `import
    torch` (flatten, activations) took 0.3-0.8 s on the development VM, as long as
    flatten's own copy of a 1 GiB checkpoint (benchmarks/README.md). That teardown
    is skipped: the handler registered here, before any other (nothing the CLI
    imports registers one; a test checks it), runs last, flushes the standard
    streams and ends the process with `os._exit`.

    For the process's entry point only: a program that calls memlayout from Python
    calls `main()`, which returns the exit code.
    """
    code: list[int] = []
    atexit.register(_end_without_teardown, code)
    code.append(main())
    sys.exit(code[0])


def _end_without_teardown(code: list[int]) -> None:
    if not code:
        return  # main() raised: the usual exit reports it
    status = code[0]
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass  # the reader left (`memlayout inspect ... | head`): nothing is lost that it wanted
    except (OSError, ValueError) as exc:
        # A full disk behind `> report.json`: the teardown would print a traceback and exit 120.
        print(f"memlayout: error: cannot write the output: {exc}", file=sys.stderr)
        status = USAGE_OR_LOAD_ERROR
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    entry()
