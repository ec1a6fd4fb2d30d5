"""Where torch is not installed, a command that reaches for it says so in one line, naming the extra."""

from __future__ import annotations

import importlib
import sys

import pytest

from memlayout.cli.errors import exit_code


def _run(module: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = exit_code(lambda: importlib.import_module(module), debug=False)
    return code, capsys.readouterr().err


def test_an_import_of_torch_anywhere_in_a_command_is_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # as if not installed
    code, err = _run("torch", capsys)
    assert code == 2
    assert err == (
        "memlayout: error: this command needs torch, which is not installed "
        "(install it with: pip install 'memlayout[torch]')\n"
    )


def test_another_missing_module_is_no_missing_torch(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run("no_such_module_anywhere", capsys)
    assert code == 2
    assert err.startswith("memlayout: error: unexpected ModuleNotFoundError: No module named 'no_such_module_anywhere'")
