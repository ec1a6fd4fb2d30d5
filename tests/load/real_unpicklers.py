"""What the real loaders (pickle.load, joblib.load, numpy.load) import from a file, asked of them safely.

Every `find_class` of CPython's unpicklers, C and pure-Python alike, raises the
audit event `pickle.find_class` before it imports anything. A child process
records each one while the real loader reads the file, and an audit hook refuses
the events a payload's call raises (`os.system`, `subprocess.Popen`, `exec`...),
so the loader stops there and nothing runs. What memlayout reports a file
imports is then compared with what its own loader asked for.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

LOADERS = {
    "pickle.load": ("import pickle", "with open(path, 'rb') as f: pickle.load(f)"),
    "joblib.load": ("import joblib, joblib.numpy_pickle", "joblib.load(path)"),
    "numpy.load": ("import numpy", "numpy.load(path, allow_pickle=True)"),
    "numpy.load(npz)": ("import numpy, zipfile",
                        "with numpy.load(path, allow_pickle=True) as z: [z[k] for k in z.files]"),
}
"""(what is imported before the hook is installed, the load itself)."""

_CHILD = """
import json, sys
# Modules the loaders import lazily (codecs for protocol 2's bytes, zip names), imported
# before the hook, whose refusal of `exec` would stop their import.
import encodings.cp437, encodings.latin_1
{setup}
path = sys.argv[1]
imported = []
RUNS = ("os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen", "exec")

def hook(event, args):
    if event == "pickle.find_class":
        imported.append([args[0], args[1]])
    elif event.startswith(RUNS):
        raise RuntimeError("refused " + event)

sys.addaudithook(hook)
outcome = "loaded"
try:
    {load}
except Exception as exc:
    outcome = type(exc).__name__ + ": " + str(exc)[:200]
print(json.dumps({{"imported": imported, "outcome": outcome}}))
"""


def imported_by(loader: str, path: Path) -> tuple[set[tuple[str, str]], str]:
    """(the (module, name) pairs `loader` asked find_class for reading `path`, how the load ended)."""
    setup, load = LOADERS[loader]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD.format(setup=setup, load=load), str(path)],
        capture_output=True, text=True, timeout=120, check=True,
    )
    result = json.loads(done.stdout.splitlines()[-1])
    return {(module, name) for module, name in result["imported"]}, result["outcome"]
