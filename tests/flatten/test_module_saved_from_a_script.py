"""`memlayout flatten --trust` of a module a script saved: its classes are pickled as `__main__.Name`.

issue 26, defect 6: the hint said "put the model's code on PYTHONPATH", which cannot
help, since the pickle asks `__main__`. The refusal now says the file was saved from
a script, and its hint (`--main-module`, followed in tests/journeys, or the state
dict saved in that script) works when followed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from memlayout.cli.app import app

SCRIPT = textwrap.dedent('''
    import torch
    from torch import nn


    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight


    model = Tied()
    torch.save(model, "tied.pt")
    torch.save(model.state_dict(), "tied_state.pt")
''')


def test_a_script_s_module_is_refused_with_a_hint_that_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "save.py").write_text(SCRIPT)
    subprocess.run([sys.executable, "save.py"], cwd=tmp_path, check=True, timeout=120)
    monkeypatch.syspath_prepend(str(tmp_path))  # the script's folder on PYTHONPATH changes nothing
    refused = CliRunner().invoke(app, ["flatten", str(tmp_path / "tied.pt"), "-o", str(tmp_path / "out.pt"), "--trust"])
    assert refused.exit_code == 2 and len(refused.stderr.splitlines()) == 1
    assert "__main__.Tied" in refused.stderr and "saved from a script" in refused.stderr
    # The script's folder on PYTHONPATH alone cannot help; --main-module names the module to look in.
    assert "put the model's code on PYTHONPATH" not in refused.stderr
    assert "pass --main-module MODULE, the module on PYTHONPATH that defines Tied" in refused.stderr
    assert "torch.save(model.state_dict(), ...) and flatten that, which needs no --trust" in refused.stderr
    assert not (tmp_path / "out.pt").exists()
    # The hint, followed: the state dict the script saved flattens without --trust, tie kept.
    done = CliRunner().invoke(app, ["flatten", str(tmp_path / "tied_state.pt"), "-o", str(tmp_path / "out.pt")])
    assert done.exit_code == 0, done.stderr
    flat = torch.load(tmp_path / "out.pt", weights_only=True)
    assert flat["emb.weight"].data_ptr() == flat["head.weight"].data_ptr()


def test_each_main_module_refusal_names_a_fix_that_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "save.py").write_text(SCRIPT)
    subprocess.run([sys.executable, "save.py"], cwd=tmp_path, check=True, timeout=120)
    (tmp_path / "tied_model.py").write_text(SCRIPT.split("\n\nmodel = Tied()")[0])  # the class, importable
    monkeypatch.syspath_prepend(str(tmp_path))
    module, state, out = str(tmp_path / "tied.pt"), str(tmp_path / "tied_state.pt"), str(tmp_path / "out.pt")

    def refused(*argv: str) -> str:
        result = CliRunner().invoke(app, ["flatten", *argv])
        assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        assert not (tmp_path / "out.pt").exists()
        return result.stderr

    def works(*argv: str) -> None:
        result = CliRunner().invoke(app, ["flatten", *argv])
        assert result.exit_code == 0, result.stderr
        (tmp_path / "out.pt").unlink()

    # Without --trust: "add --trust".
    assert "(add --trust, only if you trust whoever wrote the file)" in refused(module, "-o", out, "--main-module",
                                                                              "tied_model")
    works(module, "-o", out, "--main-module", "tied_model", "--trust")
    # A module that does not define the class: "give the module that defines the classes".
    assert "--main-module torch defines no Tied" in refused(module, "-o", out, "--trust", "--main-module", "torch")
    works(module, "-o", out, "--trust", "--main-module", "tied_model")
    # A file that names nothing in __main__, or a conversion that never unpickles: "drop --main-module".
    assert "(drop --main-module)" in refused(state, "-o", out, "--trust", "--main-module", "tied_model")
    works(state, "-o", out, "--trust")
    to_safetensors = str(tmp_path / "out.safetensors")
    assert "(drop --main-module)" in refused(state, "-o", to_safetensors, "--to", "safetensors", "--trust",
                                             "--main-module", "tied_model")
    assert CliRunner().invoke(app, ["flatten", state, "-o", to_safetensors, "--to", "safetensors"]).exit_code == 0
    # The flat module loads in the script's world: its class as __main__.Tied, the tie kept.
    flat = tmp_path / "flat.pt"
    assert CliRunner().invoke(app, ["flatten", module, "-o", str(flat), "--trust", "--main-module",
                                    "tied_model"]).exit_code == 0
    check = "import torch; from tied_model import Tied; import __main__; __main__.Tied = Tied; " \
            "m = torch.load('flat.pt', weights_only=False); assert m.head.weight is m.emb.weight; print('ok')"
    assert subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120).stdout.strip() == "ok"
