"""The exit code is returned, never raised, from a command up to `main()` (issue 30 §5).

It once went as `typer.Exit`, caught and raised again in `MemlayoutCommand.invoke`,
turned into `SystemExit` by the group and caught back into a return value by
`main()`; a load error of every path became a CLI-only exception on the way. Now a
command returns its code, `cli.errors.exit_code` is the one place an error becomes
one line and 2, and nothing on the way calls `sys.exit`.
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import pytest
import torch

from memlayout.cli.app import main
from memlayout.cli.errors import exit_code
from memlayout.errors import UsageError


@pytest.fixture
def no_sys_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(code: object = None) -> NoReturn:
        raise AssertionError(f"sys.exit({code!r}) was called on the way out")

    monkeypatch.setattr("sys.exit", refuse)


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["explain", "ML101"], 0),
        (["explain", "ML999"], 2),  # a MemlayoutError
        (["inspect", "--fail-on", "sometimes", "x.pt"], 2),  # a bad flag
        (["--version"], 0),
        (["inspect", "no-such-file.pt"], 2),  # every path failed to load
    ],
    ids=["clean", "error", "bad-flag", "version", "every-path-failed"],
)
def test_main_returns_the_code_without_exiting_on_the_way(
    no_sys_exit: None, argv: list[str], code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.count("\n") == (0 if code == 0 else 1), err


def test_findings_return_1(no_sys_exit: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.pt"
    torch.save({"w": torch.zeros(4, 4).t()}, path)  # non-contiguous: ML201, a warning
    assert main(["inspect", str(path), "--format", "json"]) == 1
    assert main(["inspect", str(path), "--format", "json", "--fail-on", "never"]) == 0


def test_one_path_failing_to_load_is_its_loaders_line_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "no-such-file.pt"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("memlayout: error: ") and err.count("\n") == 1


def test_an_error_is_one_line_and_2_and_with_debug_goes_on(capsys: pytest.CaptureFixture[str]) -> None:
    def fail() -> int:
        raise UsageError("no such thing", "try another")

    assert exit_code(fail, debug=False) == 2
    assert capsys.readouterr().err == "memlayout: error: no such thing (try another)\n"
    with pytest.raises(UsageError):
        exit_code(fail, debug=True)
    assert exit_code(lambda: None, debug=False) == 0
    assert exit_code(lambda: 1, debug=False) == 1
