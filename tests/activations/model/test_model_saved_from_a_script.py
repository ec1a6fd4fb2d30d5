"""`memlayout activations --trust` of a model a script saved: its classes are pickled as `__main__.Name`.

issue 26, defect 6: the class was on PYTHONPATH and unpickling still failed, because
the pickle asks `__main__`, which is memlayout's entry point. The hint now names
`--main-module`, and following it works.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from memlayout.cli.app import app

ROOT = Path(__file__).resolve().parents[3]
TIED = textwrap.dedent('''
    import torch
    from torch import nn


    class Tied(nn.Module):
        """An embedding whose head shares its weight."""

        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, x):
            return self.head(self.emb(x))
''')
INPUT = ["--input", "int64[2,3]<10"]


@pytest.fixture(scope="module")
def saved_from_a_script(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(tied.pt, written by `python save.py`, whose Tied is __main__.Tied; a folder whose tiedmod.py defines Tied)."""
    folder = tmp_path_factory.mktemp("script")
    (folder / "save.py").write_text(TIED + '\ntorch.save(Tied(), "tied.pt")\n')
    subprocess.run([sys.executable, "save.py"], cwd=folder, check=True, timeout=120)
    library = folder / "lib"
    library.mkdir()
    (library / "tiedmod.py").write_text(TIED)
    return folder / "tied.pt", library


def test_the_hint_names_main_module_and_following_it_builds_the_model(
    saved_from_a_script: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, library = saved_from_a_script
    monkeypatch.syspath_prepend(str(library))  # the class on PYTHONPATH, as the user put it
    refused = CliRunner().invoke(app, ["activations", str(path), *INPUT])
    assert refused.exit_code == 2
    hint = re.search(r"pass (--trust --main-module MODULE) \(the module on PYTHONPATH that defines Tied\)",
                     refused.stderr)
    assert hint, refused.stderr
    # --trust alone: the class is importable, and unpickling still looks in __main__.
    trusted = CliRunner().invoke(app, ["activations", str(path), *INPUT, "--trust"])
    assert trusted.exit_code == 2 and len(trusted.stderr.splitlines()) == 1
    assert "saved from a script" in trusted.stderr and "--main-module MODULE" in trusted.stderr
    # The hinted command, as the user types it, in a process of its own.
    hinted = hint.group(1).replace("MODULE", "tiedmod").split()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(library)]))
    done = subprocess.run(
        [sys.executable, "-m", "memlayout", "activations", str(path), *INPUT, *hinted, "--format", "json"],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["target"]["class"] == "Tied"


def test_main_module_without_a_pickled_module_is_one_line() -> None:
    result = CliRunner().invoke(
        app, ["activations", "tests.activations.models:flat_cnn", "--input", "float32[2,3,16,16]",
              "--main-module", "tiedmod"]
    )
    assert result.exit_code == 2 and "--main-module applies to a pickled module file" in result.stderr


def test_a_main_module_that_does_not_import_is_one_line(saved_from_a_script: tuple[Path, Path]) -> None:
    path, _ = saved_from_a_script
    result = CliRunner().invoke(app, ["activations", str(path), *INPUT, "--trust", "--main-module", "no_such_mod"])
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1
    assert "--main-module no_such_mod cannot be imported" in result.stderr and "PYTHONPATH" in result.stderr


# What torch does with such a file, asked of torch itself.


def test_torch_load_looks_in_main_and_the_stand_in_pickle_module_reads_the_named_module(
    saved_from_a_script: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from memlayout.load.main_module import pickle_module_resolving_main

    path, library = saved_from_a_script
    monkeypatch.syspath_prepend(str(library))
    with pytest.raises(AttributeError, match="Tied"):
        torch.load(path, weights_only=False)
    model = torch.load(path, weights_only=False, pickle_module=pickle_module_resolving_main("tiedmod"))
    assert type(model).__module__ == "tiedmod" and type(model).__name__ == "Tied"
    assert model.head.weight is model.emb.weight  # the tie survives
