"""The `memlayout` command ends without the interpreter's teardown, and loses nothing by it.

`entry()` runs `main()`, then exits as usual (threads waited for, `atexit` handlers
run) until its own exit handler, registered first and so run last, flushes the
standard streams and calls `os._exit`: after `import torch`, the teardown it skips
took 0.3-0.8 s. Each test runs the real command (or `entry()`) in a fresh process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "fixtures" / "demo_checkpoint.pt"


def _python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)


def test_the_command_writes_its_whole_report_and_returns_mains_exit_code() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "memlayout", "inspect", str(DEMO), "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1  # the demo has findings at the default --fail-on
    assert json.loads(done.stdout)["findings"]


def test_exit_handlers_registered_while_the_command_runs_still_run_and_the_teardown_does_not(tmp_path: Path) -> None:
    # What torch, logging and weakref.finalize do: register a handler on first use,
    # inside the command. An object that a teardown would finalize shows it was skipped.
    handler, teardown = tmp_path / "handler", tmp_path / "teardown"
    done = _python(
        "import atexit, pathlib, sys\n"
        "import memlayout.cli.app as app\n"
        "class Finalized:\n"
        f"    def __del__(self): pathlib.Path({str(teardown)!r}).write_text('ran')\n"
        "def main(argv=None):\n"
        f"    atexit.register(pathlib.Path({str(handler)!r}).write_text, 'ran')\n"
        "    sys.modules['__main__'].kept = Finalized()\n"
        "    print('report')\n"
        "    return 3\n"
        "app.main = main\n"
        "app.entry()\n",
        tmp_path,
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "report\n"
    assert handler.read_text() == "ran"
    assert not teardown.exists()


def test_importing_the_command_registers_no_exit_handler(tmp_path: Path) -> None:
    # entry()'s handler must be the first one registered to run last: a handler
    # registered at import, before it, would be skipped with the teardown.
    done = _python(
        "import atexit, sys\n"
        "registered = []\n"
        "plain = atexit.register\n"
        "atexit.register = lambda f, *a, **k: (registered.append(f), plain(f, *a, **k))[1]\n"
        "import memlayout.cli.app\n"
        "print(registered)\n",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"


def test_a_thread_still_running_is_waited_for(tmp_path: Path) -> None:
    marker = tmp_path / "finished"
    done = _python(
        "import pathlib, sys, threading, time\n"
        "def work():\n"
        "    time.sleep(0.5)\n"
        f"    pathlib.Path({str(marker)!r}).write_text('yes')\n"
        "threading.Thread(target=work).start()\n"
        "from memlayout.cli.app import entry\n"
        "sys.argv = ['memlayout', 'rules']\n"
        "entry()\n",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "yes"


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("args", [["rules"], ["--version"], ["explain", "ML101"]], ids=" ".join)
def test_a_standard_output_that_cannot_take_the_output_is_one_line_and_exit_2(args: list[str], buffered: bool) -> None:
    # Buffered, the write fails only at the final flush; unbuffered, inside the command.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "memlayout", *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
            env=env,
        )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("memlayout: error:"), done.stderr
