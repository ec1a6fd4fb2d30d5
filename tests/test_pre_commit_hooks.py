"""Both hooks of `.pre-commit-hooks.yaml`, run by the real `pre-commit` from a temporary git repository.

The temporary project's `.pre-commit-config.yaml` names this checkout (its HEAD
commit) in `repos:`, as a user's config names the published repository, and
`pre-commit run` does what it does for them: a virtualenv, `pip install` of the
repository, each hook's `entry` on the matching files. (`pre-commit try-repo` does
the same but builds a new environment on every call.) It must not need the package
index, so pip is told to use none: the dependencies are found on the test
interpreter's own site-packages (PYTHONPATH), and memlayout is built without an
isolated build environment, with the setuptools found there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
import yaml

from tests import models

HOOK_IDS = ["memlayout-inspect", "memlayout-flatten-check"]


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", *args],
        cwd=cwd, check=True, capture_output=True,
    )


@pytest.fixture(scope="module")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def source_revision(repo_root: Path) -> str:
    """The HEAD commit of this checkout, which must hold the hooks' manifest."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root, capture_output=True, text=True)
    manifest = subprocess.run(["git", "cat-file", "-e", "HEAD:.pre-commit-hooks.yaml"], cwd=repo_root)
    if head.returncode or manifest.returncode:
        pytest.skip("the hooks' source must be a git checkout whose HEAD has .pre-commit-hooks.yaml")
    return head.stdout.strip()


def run_hooks(project: Path, home: Path) -> tuple[int, str]:
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(home),
        "PIP_NO_INDEX": "1",
        # pip reads "no" options from the environment inverted: 0 turns isolation off.
        "PIP_NO_BUILD_ISOLATION": "0",
        "PYTHONPATH": sysconfig.get_paths()["purelib"],
        "PRE_COMMIT_COLOR": "never",
    }
    result = subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", "--all-files", "--verbose"],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )
    return result.returncode, result.stdout + result.stderr


def hook_status(output: str, name: str) -> str:
    line = next(line for line in output.splitlines() if line.startswith(name + "."))
    return line.rsplit(".", 1)[-1]


def test_the_manifest_declares_both_hooks_on_checkpoint_files(repo_root: Path) -> None:
    hooks = {hook["id"]: hook for hook in yaml.safe_load((repo_root / ".pre-commit-hooks.yaml").read_text())}
    assert list(hooks) == HOOK_IDS
    import re

    for hook in hooks.values():
        assert hook["language"] == "python"
        pattern = re.compile(hook["files"])
        for name in ("a.pt", "dir/b.pth", "c.bin", "d.ckpt", "e.safetensors"):
            assert pattern.search(name)
        assert not pattern.search("notes.txt") and not pattern.search("model.pt.json")
    assert hooks["memlayout-inspect"]["entry"] == "memlayout inspect"
    assert hooks["memlayout-flatten-check"]["entry"] == "memlayout flatten --check"


def test_both_hooks_run_under_pre_commit(repo_root: Path, source_revision: str, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    _git(project, "init", "-q")
    config = {"repos": [{"repo": str(repo_root), "rev": source_revision, "hooks": [{"id": i} for i in HOOK_IDS]}]}
    (project / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config))
    flat = torch.zeros(64)
    torch.save({"a": flat[:32], "b": flat[32:]}, project / "flat.pt")
    (project / "README.md").write_text("not a checkpoint: no hook looks at it\n")
    _git(project, "add", ".")
    home = tmp_path / "pre-commit-home"

    code, output = run_hooks(project, home)
    assert code == 0, output
    assert hook_status(output, "memlayout inspect") == "Passed"
    assert hook_status(output, "memlayout flatten --check") == "Passed"
    # The hooks' environment installs no torch: memlayout requires it only with its extra.
    # (Here pip finds the other requirements on PYTHONPATH, so it installs memlayout alone.)
    (metadata,) = home.glob("*/*/lib/python*/site-packages/memlayout-*.dist-info/METADATA")
    requires = [line for line in metadata.read_text().splitlines() if line.startswith("Requires-Dist: ")]
    assert any(line.startswith("Requires-Dist: typer") for line in requires), requires
    # The range may be written in either order ("torch<2.15,>=2.13" is how setuptools writes it).
    torch_requirements = [line for line in requires if re.match(r"Requires-Dist: torch\s*[<>=!~]", line)]
    assert torch_requirements and all('extra == "torch"' in line for line in torch_requirements), requires
    assert not list(home.glob("*/*/lib/python*/site-packages/torch")), "the hooks' environment installed torch"

    torch.save(models.sliced_bloat_state(), project / "bloated.pt")
    _git(project, "add", ".")
    code, output = run_hooks(project, home)
    assert code == 1
    assert hook_status(output, "memlayout inspect") == "Failed"
    assert hook_status(output, "memlayout flatten --check") == "Failed"
    assert "ML301 warning storage-bloat" in output and "bloated.pt: would change" in output

    # The project's [tool.memlayout] reaches the hook (pre-commit runs it from the repository root).
    (project / "pyproject.toml").write_text('[tool.memlayout]\nignore = ["ML301"]\n')
    _git(project, "add", ".")
    code, output = run_hooks(project, home)
    assert hook_status(output, "memlayout inspect") == "Passed"
    assert hook_status(output, "memlayout flatten --check") == "Failed"
