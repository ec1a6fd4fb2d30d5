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
