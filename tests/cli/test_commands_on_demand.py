"""Each command is imported and built when it runs: a command imports only what it uses.

Every command runs in a fresh process here, and reports which modules it imported.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from memlayout.cli import app as cli
from memlayout.cli.app import COMMANDS, app

DEMO = Path(__file__).resolve().parents[2] / "fixtures" / "demo_checkpoint.pt"


def _imports_of(args: list[str], cwd: Path) -> dict[str, Any]:
    child = (
        "import json, sys\n"
        "from memlayout.cli.app import main\n"
        "code = main(sys.argv[1:])\n"
        "names = sorted(n for n in sys.modules if n.split('.')[0] in ('pydantic', 'rich', 'torch', 'numpy')\n"
        "               or n.startswith('memlayout.cli.') or n.startswith('memlayout.flatten')\n"
        "               or n.startswith('memlayout.activations') or n.startswith('memlayout.diff'))\n"
        "print(json.dumps({'code': code, 'modules': names}), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", child, *args], capture_output=True, text=True, cwd=cwd, timeout=120)
    result: dict[str, Any] = json.loads(done.stderr.splitlines()[-1])
    return result


def test_a_command_imports_only_what_it_uses(tmp_path: Path) -> None:
    inspected = _imports_of(["inspect", str(DEMO), "--format", "json", "--select", "ML1,ML2",
                             "--min-duplicate-bytes", "16", "--fail-on", "never"], tmp_path)
    assert inspected["code"] == 0
    # No pydantic (typer's adapters), no other command, no table renderer for JSON, no torch
    # (memlayout/__init__.py loads the empty memlayout.flatten package, for its name).
    unexpected = [
        name for name in inspected["modules"]
        if name.split(".")[0] in ("pydantic", "rich", "torch")
        or (name.startswith("memlayout.cli.") and name.endswith("_command") and name != "memlayout.cli.inspect_command")
        or name.startswith(("memlayout.flatten.", "memlayout.activations", "memlayout.diff"))
    ]
    assert unexpected == [], unexpected
    listed = _imports_of(["rules"], tmp_path)
    assert listed["code"] == 0
    assert [n for n in listed["modules"] if n.endswith("_command")] == ["memlayout.cli.rules_command"]


def test_help_lists_every_command_in_order() -> None:
    done = subprocess.run([sys.executable, "-m", "memlayout", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == list(COMMANDS)


def test_reading_commands_run_without_the_cyclic_collector_and_give_it_back(monkeypatch: Any) -> None:
    seen: list[bool] = []
    real = cli.build_command

    def watching(name: str) -> Any:
        command = real(name)
        callback = command.callback

        def run(*args: Any, **kwargs: Any) -> Any:
            seen.append(gc.isenabled())
            return callback(*args, **kwargs)

        command.callback = run
        return command

    monkeypatch.setattr(cli, "build_command", watching)
    runner = CliRunner()
    assert runner.invoke(app, ["inspect", str(DEMO), "--fail-on", "never"]).exit_code == 0
    assert runner.invoke(app, ["rules"]).exit_code == 0
    assert runner.invoke(app, ["flatten", "--check", str(DEMO)]).exit_code in (0, 1)
    assert seen == [False, False, True]  # inspect and rules read; flatten keeps the collector
    assert gc.isenabled()


def test_the_collector_resumes_after_the_report_is_freed(monkeypatch: Any) -> None:
    # inspect ends by raising Exit; were its traceback (and so the report) still alive
    # when the collector resumed, the first collection would traverse every fact.
    from memlayout.pipeline import batch as batch_module

    reports: list[weakref.ref[Any]] = []
    real_inspect_paths = batch_module.inspect_paths

    def keeping_a_weak_reference(*args: Any, **kwargs: Any) -> Any:
        report = real_inspect_paths(*args, **kwargs)
        reports.append(weakref.ref(report))
        return report

    alive_when_resumed: list[bool] = []
    real_enable = gc.enable

    def enable() -> None:
        alive_when_resumed.append(any(ref() is not None for ref in reports))
        real_enable()

    monkeypatch.setattr(batch_module, "inspect_paths", keeping_a_weak_reference)
    monkeypatch.setattr(gc, "enable", enable)
    result = CliRunner().invoke(app, ["inspect", str(DEMO), "--format", "json", "--fail-on", "never"])
    assert result.exit_code == 0, result.output
    assert len(reports) == 1
    assert alive_when_resumed and not any(alive_when_resumed)
    assert gc.isenabled()
