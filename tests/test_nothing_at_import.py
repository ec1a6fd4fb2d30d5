"""Nothing happens at import, and `memlayout inspect` starts no process and writes nothing but OUT.

A tool run on untrusted files in a locked-down CI job should start no process and
load no library it does not need. Both tests watch a fresh interpreter through an
audit hook (PEP 578), which sees every process start, every file opened for
writing and every library ctypes loads, whoever asks for it.
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import memlayout

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "fixtures" / "demo_checkpoint.pt"

# Audit events that start a process, or load a shared library through ctypes.
_WATCH = """
import json, os, sys

STARTS = {"subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn", "os.fork", "os.forkpty",
          "pty.spawn", "ctypes.dlopen"}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
seen = []

def watch(event, args):
    if event == "ctypes.dlopen" and args[0] is None:
        return  # dlopen(NULL) is the running program itself, loading nothing; importing ctypes asks for it
    if event in STARTS:
        seen.append([event, repr(args)[:300]])
    elif event == "open":
        path, mode, flags = args
        if isinstance(path, int):
            return  # a descriptor already open: its own open was seen
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & WRITE_FLAGS:
            seen.append(["write", str(path)])
    elif event in ("os.rename", "os.link", "os.symlink", "os.remove", "os.rmdir", "os.mkdir", "os.truncate",
                   "os.chmod", "os.chown", "shutil.rmtree"):
        seen.append([event, repr(args)[:300]])

sys.addaudithook(watch)
"""

# Modules whose job needs a library at import: a class statement needs its base.
NEEDS_TORCH_AT_IMPORT = {
    "memlayout.activations.trace.tracer": "StepTracer subclasses torch's TorchDispatchMode",
    "memlayout.activations.trace.fake_step": "FakeStepMode subclasses torch's TorchDispatchMode",
    "memlayout.activations.trace.generate_mode": "GenerateStepMode subclasses FakeStepMode",
}


def _modules() -> list[str]:
    found = [m.name for m in pkgutil.walk_packages(memlayout.__path__, "memlayout.")]
    return ["memlayout", *sorted(name for name in found if name != "memlayout.__main__")]  # __main__ runs the CLI


def test_importing_any_module_starts_no_process_and_loads_no_torch_or_numpy() -> None:
    modules = [name for name in _modules() if name not in NEEDS_TORCH_AT_IMPORT]
    child = _WATCH + (
        "import importlib\n"
        "for name in ('torch', 'numpy'):\n"
        "    sys.modules[name] = None  # importing either fails, naming the module that tried\n"
        "failed = {}\n"
        f"for module in {modules!r}:\n"
        "    try:\n"
        "        importlib.import_module(module)\n"
        "    except ImportError as exc:\n"
        "        failed[module] = str(exc)\n"
        "loaded = [name for name in ('ctypes',) if name in sys.modules]\n"
        "print(json.dumps({'failed': failed, 'seen': seen, 'loaded': loaded}))\n"
    )
    done = subprocess.run([sys.executable, "-B", "-c", child], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["failed"] == {}, "modules that import torch or numpy when imported"
    assert result["seen"] == [], "a process started, a library was loaded or a file written at import"
    assert result["loaded"] == [], "ctypes is imported where it is used, not at import"
    assert len(modules) > 100  # every module, not an empty list


def test_the_modules_allowed_torch_at_import_exist_and_need_it() -> None:
    child = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        f"for name in {sorted(NEEDS_TORCH_AT_IMPORT)!r}:\n"
        "    try:\n"
        "        __import__(name)\n"
        "    except ImportError:\n"
        "        continue\n"
        "    raise SystemExit(f'{name} imports without torch: take it off the list')\n"
    )
    done = subprocess.run([sys.executable, "-B", "-c", child], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout


def test_inspect_starts_no_process_and_writes_nothing_but_its_outputs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    report, page = out / "report.json", out / "map.html"
    child = _WATCH + (
        "from memlayout.cli.app import main\n"
        "code = main(sys.argv[1:])\n"
        "print(json.dumps({'code': code, 'seen': seen}), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-B", "-c", child, "inspect", str(DEMO), "--deep", "--format", "json", "-o", str(report),
         "--html", str(page)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    result = json.loads(done.stderr.splitlines()[-1])
    assert result["code"] == 1, done.stderr  # the demo has findings
    assert json.loads(report.read_text())["findings"] and "<html" in page.read_text()
    starts = [event for event in result["seen"] if event[0] not in ("write", "os.link", "os.rename")]
    assert starts == [], "inspect started a process, loaded a library or changed a file"
    # The atomic writer opens a nameless file in OUT's folder and links it in as OUT.
    written = {Path(event[1]) for event in result["seen"] if event[0] == "write"}
    assert written <= {out, report, page}, written
    assert sorted(os.listdir(out)) == ["map.html", "report.json"]
