"""ML601's danger classes: each entry of the runs-code list shows, here, why it is there.

Every entry of `REACHES` carries a proof: the global, resolved as the unpickler
resolves it, called the way a pickle's REDUCE would call it. The proofs run in one
child process under an audit hook (tests/rules/proofs_driver.py) that blocks the
operation the entry says the global reaches (a command, a connection, an import,
a file) and records that it was asked for. So each parametrized case below fails
if its global does not do what the list says, and nothing is ever carried out.
An entry whose module this Python or this torch lacks (`nt` off Windows, a torch
function removed since) is skipped with the reason: it stays listed for the files
written where it exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memlayout.rules.pickle_dangers import REACHES, Danger, Reach, judge, reach_of

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def proofs() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.rules.proofs_driver"], capture_output=True, text=True, timeout=600, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONBREAKPOINT": "0"}, stdin=subprocess.DEVNULL, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


@pytest.mark.parametrize("reach", REACHES, ids=[f"{r.module}.{r.name}" for r in REACHES])
def test_each_global_said_to_run_code_does_reach_the_system(reach: Reach, proofs: dict[str, Any]) -> None:
    result = proofs[f"{reach.module}:{reach.name}"]
    if result["outcome"] == "absent":
        pytest.skip(f"not importable here ({result['why']}); listed for the Pythons and torches that have it")
    assert result["outcome"] == "shown", (reach.proof, result)


@pytest.mark.parametrize("reach", REACHES, ids=[f"{r.module}.{r.name}" for r in REACHES])
def test_each_entry_classes_the_globals_it_covers_as_running_code(reach: Reach) -> None:
    name = "anything_at_all" if reach.name == "*" else reach.name
    assert reach_of(reach.module, name) is reach
    assert judge(reach.module, name, allowed=False).danger is Danger.RUNS_CODE
    if reach.name == "*":  # a module entry covers its submodules
        assert reach_of(f"{reach.module}.sub", "f") is reach


@pytest.mark.parametrize(
    ("module", "name", "danger"),
    [
        # Python 2 spellings resolve to Python 3's (pickle's _compat_pickle), as the unpickler maps them.
        ("__builtin__", "eval", Danger.RUNS_CODE),
        ("__builtin__", "getattr", Danger.RUNS_CODE),
        ("commands", "getoutput", Danger.RUNS_CODE),
        ("httplib", "HTTPSConnection", Danger.RUNS_CODE),
        # fickling GHSA-5j3x-jp52-966f: protocol 4 walks a dotted name, through pathlib's import of os.
        ("pathlib", "os.system", Danger.RUNS_CODE),
        # A walk through a dunder reaches any object of the interpreter.
        ("collections", "OrderedDict.__init__.__globals__", Danger.RUNS_CODE),
        ("torch._utils", "_rebuild_tensor_v2.__builtins__.eval", Danger.RUNS_CODE),
        # Outside the allow-list, inert by themselves: built, not run.
        ("numpy._core.multiarray", "scalar", Danger.CONSTRUCTS_OBJECT),
        ("torch.nn.modules.linear", "Linear", Danger.CONSTRUCTS_OBJECT),
        ("sklearn.preprocessing._data", "StandardScaler", Danger.CONSTRUCTS_OBJECT),
        # Python 2's apply does not exist in Python 3: the unpickler cannot resolve it.
        ("__builtin__", "apply", Danger.CONSTRUCTS_OBJECT),
        # Names that only look like the dangerous ones.
        ("ossaudiodev", "open", Danger.CONSTRUCTS_OBJECT),
        ("torch.utils.data", "DataLoader", Danger.CONSTRUCTS_OBJECT),
        ("operator", "add", Danger.CONSTRUCTS_OBJECT),
    ],
)
def test_the_class_of_globals_beside_the_list(module: str, name: str, danger: Danger) -> None:
    assert judge(module, name, allowed=False).danger is danger


def test_an_allow_listed_global_is_allow_listed_whatever_its_name() -> None:
    judged = judge("torch._utils", "_rebuild_tensor_v2", allowed=True, member="a.pkl")
    assert (judged.danger, judged.does, judged.member) == (Danger.ALLOW_LISTED, "", "a.pkl")


def test_every_entry_names_its_source_and_what_it_does() -> None:
    for reach in REACHES:
        assert reach.does and reach.source and reach.proof, reach
    assert len({(r.module, r.name) for r in REACHES}) == len(REACHES)
