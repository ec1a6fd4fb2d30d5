"""inspect -> the hint's `flatten --trust --main-module` -> the script loads OUT, for a module a script saved (issue
40).

A user's training script defines its model class and `torch.save(model)`s it, so
the pickle names the class `__main__.Tied`. `activations` took `--main-module`,
but `flatten --trust` refused the file ("saved from a script") with a hint to
re-save a state dict. Now inspect's hint names `--main-module MODULE`, flatten
resolves the script's classes there, and OUT still names them `__main__.X`: the
script that loaded IN loads OUT the same way, with its own classes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent('''
    import sys

    import torch
    from torch import nn


    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.proj = nn.Linear(4, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight


    def identity(x):
        return x


    if __name__ == "__main__":
        if sys.argv[1] == "save":
            torch.manual_seed(0)
            model = Tied()
            model.activation = identity
            # A transposed copy, as a weight loaded from another framework often is: ML201.
            model.proj.weight = nn.Parameter(model.proj.weight.detach().t().contiguous().t())
            torch.save(model, "model.pt")
        else:
            before = torch.load("model.pt", weights_only=False)
            after = torch.load(sys.argv[2], weights_only=False)
            assert type(after) is Tied and after.activation is identity, (type(after), after.activation)
            assert after.head.weight is after.emb.weight
            assert list(before.state_dict()) == list(after.state_dict())
            for name, value in before.state_dict().items():
                assert torch.equal(value, after.state_dict()[name]), name
            print("loaded with the script's own classes")
''')


def run(*argv: str, cwd: Path, pythonpath: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH", "")) if p)
    return subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def memlayout(*args: str, cwd: Path, pythonpath: str = "") -> subprocess.CompletedProcess[str]:
    return run(sys.executable, "-m", "memlayout", *args, cwd=cwd, pythonpath=pythonpath)


def test_flatten_main_module_from_inspects_hint_keeps_the_file_loadable_by_its_script(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    saved = run(sys.executable, "train.py", "save", cwd=tmp_path)
    assert saved.returncode == 0, saved.stderr

    inspected = memlayout("inspect", "model.pt", "--format", "json", "--fail-on", "never", cwd=tmp_path)
    assert inspected.returncode == 0, inspected.stderr
    findings = json.loads(inspected.stdout)["findings"]
    strided = [f for f in findings if f["code"] == "ML201"]
    assert strided, findings
    hinted = re.findall(r"`(memlayout flatten [^`]*)`", strided[0]["hint"])
    assert hinted == ["memlayout flatten --trust --main-module MODULE"], strided[0]["hint"]
    assert "MODULE is the module on PYTHONPATH that defines Tied, identity" in strided[0]["hint"]

    # Without --main-module the refusal names it.
    refused = memlayout("flatten", "model.pt", "-o", "flat.pt", "--trust", cwd=tmp_path)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "pass --main-module MODULE, the module on PYTHONPATH that defines Tied, identity" in refused.stderr

    # The hint, followed: MODULE is the script's module, its folder on PYTHONPATH.
    command = [word.replace("MODULE", "train") for word in shlex.split(hinted[0])[1:]]
    done = memlayout(*command, "model.pt", "-o", "flat.pt", cwd=tmp_path, pythonpath=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "strides [1, 4] -> [4, 1]" in done.stdout

    # The script loads OUT as it loads IN: its own __main__ classes, every value, the tie.
    loaded = run(sys.executable, "train.py", "load", "flat.pt", cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr
    after = memlayout("inspect", "flat.pt", "--format", "json", "--fail-on", "never", cwd=tmp_path)
    assert "ML201" not in {f["code"] for f in json.loads(after.stdout)["findings"]}
    main_globals = {g for g in re.findall(r"__main__\.\w+", after.stdout)}
    assert main_globals == {"__main__.Tied", "__main__.identity"}, main_globals
