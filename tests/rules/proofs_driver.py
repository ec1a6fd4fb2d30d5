"""Runs every proof of `memlayout.rules.pickle_dangers.REACHES` under an audit hook that blocks them.

Usage: python -m tests.rules.proofs_driver   (prints one JSON object: entry -> outcome)

Run in a process of its own by tests/rules/test_pickle_dangers.py: an audit hook
(PEP 578) cannot be removed once added. The hook is armed only while a proof runs;
then it records every event that reaches the system and raises before the
operation happens (a command, a connection, a file removed), so no proof ever
completes what it starts. A proof shows its entry's danger when the event its
entry names is recorded with the arguments the proof gave it.
"""

from __future__ import annotations

import _compat_pickle
import contextlib
import importlib
import io
import json
import sys
from typing import Any, ClassVar

from memlayout.rules.pickle_dangers import REACHES, Reach

ALWAYS_BLOCKED = frozenset([
    "os.system", "subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.kill", "os.killpg",
    "socket.connect", "socket.sendto", "socket.getaddrinfo", "ctypes.dlopen", "webbrowser.open",
    "shutil.rmtree", "shutil.move", "urllib.Request", "pty.spawn",
])
"""Events that reach outside the process: blocked whenever a proof runs, whatever it is meant to show."""


class Blocked(RuntimeError):
    """Raised by the hook instead of letting a proof reach the system."""


class _Armed:
    watch = ""
    on = False
    seen: ClassVar[list[str]] = []


def _matches(event: str, args: tuple[Any, ...]) -> bool:
    # The event must be the proof's own, not an import's along the way.
    if event == "open":
        return bool(args) and args[0] == "/dev/null"
    if event == "import":
        return bool(args) and str(args[0]).startswith("memlayout_proof_")
    if event == "exec":
        filename = getattr(args[0], "co_filename", "") if args else ""
        return filename.startswith("<") or "memlayout_proof_" in filename
    if event == "compile":
        return len(args) > 1 and str(args[1]).startswith("<")
    if event == "socket.connect":
        return len(args) > 1 and tuple(args[1])[:2] == ("127.0.0.1", 9)
    if event == "socket.getaddrinfo":
        return len(args) > 1 and args[0] in ("127.0.0.1", b"127.0.0.1") and str(args[1]) == "9"
    if event == "pickle.find_class":
        return tuple(args[:2]) == ("os", "system")
    if event == "shutil.rmtree":
        return bool(args) and "memlayout-proof" in str(args[0])
    if event in ("object.__setattr__", "object.__delattr__"):
        return len(args) > 1 and args[1] == "x"
    return True


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not _Armed.on:
        return
    if event == _Armed.watch and _matches(event, args):
        _Armed.seen.append(event)
        raise Blocked(event)
    if event in ALWAYS_BLOCKED or event.startswith(("os.exec", "os.spawn")):
        _Armed.seen.append(event)
        raise Blocked(event)


def resolve(reach: Reach) -> Any:
    """The global as the unpickler resolves it: Python 2 names mapped (`commands` is subprocess), a dotted
    name walked attribute by attribute (protocol 4); the module itself for a module entry."""
    module = _compat_pickle.IMPORT_MAPPING.get(reach.module, reach.module)
    found: Any = importlib.import_module(module)
    if reach.name != "*":
        for part in reach.name.split("."):
            found = getattr(found, part)
    return found


def run(reach: Reach) -> dict[str, Any]:
    """One entry's proof: "shown" with the events it raised, or "absent" when its module is not installed."""
    try:
        target = resolve(reach)
    except (ImportError, AttributeError) as exc:
        return {"outcome": "absent", "why": f"{type(exc).__name__}: {exc}"}
    namespace = {"g": target, "__builtins__": __builtins__}
    _Armed.watch = reach.event
    _Armed.seen.clear()
    error = ""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        _Armed.on = True
        try:
            result = eval(reach.proof, namespace)  # the proof is ours, and the hook blocks what it reaches
        except BaseException as exc:  # SystemExit included: pip and others exit
            result, error = None, f"{type(exc).__name__}: {exc}"
        finally:
            _Armed.on = False
    if not reach.event:
        return {"outcome": "shown" if result else "missed", "error": error}
    shown = reach.event in _Armed.seen
    return {"outcome": "shown" if shown else "missed", "seen": _Armed.seen, "error": error[:300]}


def main() -> int:
    import shutil
    import tempfile
    from pathlib import Path

    # One scratch folder for everything the proofs make (the modules the import proofs import,
    # whose import is blocked before it runs; venv's and pip's folders), removed at the end.
    folder = Path(tempfile.mkdtemp(prefix="memlayout-proofs-"))
    tempfile.tempdir = str(folder)
    try:
        for name in ("memlayout_proof_module", "memlayout_proof_importlib", "memlayout_proof_pkgutil",
                     "memlayout_proof_cloudpickle"):
            (folder / f"{name}.py").write_text("x = 1\n")
        sys.path.insert(0, str(folder))
        sys.addaudithook(_hook)
        results = {f"{reach.module}:{reach.name}": run(reach) for reach in REACHES}
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the hook is disarmed between proofs
    sys.__stdout__.write(json.dumps(results) + "\n")  # type: ignore[union-attr]
    return 0


if __name__ == "__main__":
    sys.exit(main())
