"""The hooks as docs/ci.md documents them, run by the real `pre-commit` from a temporary git repository.

Two ways, both offline:

- `.pre-commit-hooks.yaml`: the temporary project's `.pre-commit-config.yaml`
  names this checkout (its HEAD commit) in `repos:`, as a user's config names the
  published repository, and `pre-commit run` does what it does for them: a
  virtualenv, `pip install` of the repository, each hook's `entry` on the matching
  files. (`pre-commit try-repo` does the same but builds a new environment on every
  call.) It must not need the package index, so pip is told to use none: the
  dependencies are found on the test interpreter's own site-packages (PYTHONPATH),
  and memlayout is built without an isolated build environment, with the setuptools
  found there.
- the `repo: local` config docs/ci.md shows, copied from the page itself: the
  hooks run the `memlayout` installed beside the test's interpreter.

The project holds checkpoints as their libraries write them
(`tests/checkpoints_as_written.py`: transformers, diffusers, safetensors,
torch.save, Lightning); both hooks pass them, and fail a checkpoint with a real
problem, naming its file.
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
from tests.checkpoints_as_written import AS_WRITTEN, PROBLEMS, write_all

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
        # A `repo: local` hook of `language: system` runs the memlayout installed beside this interpreter.
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", "--all-files", "--verbose"],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )
    return result.returncode, result.stdout + result.stderr


def hook_status(output: str, name: str) -> str:
    line = next(line for line in output.splitlines() if line.startswith(name + "."))
    return line.rsplit(".", 1)[-1]


def hook_output(output: str, name: str) -> str:
    """What one hook printed (pre-commit --verbose): the lines after its status line, up to the next hook's."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(name + "."))
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"^\S.*\.{3,}(Passed|Failed|Skipped)", lines[i])),
               len(lines))
    return "\n".join(lines[start + 1 : end])


@pytest.fixture(scope="module")
def as_written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of checkpoints as transformers, diffusers, safetensors, torch.save and Lightning write them."""
    folder = tmp_path_factory.mktemp("as-written") / "checkpoints"
    write_all(folder, AS_WRITTEN)
    return folder


def docs_local_config(repo_root: Path) -> dict[str, object]:
    """The `repo: local` `.pre-commit-config.yaml` of docs/ci.md, read from the page."""
    page = (repo_root / "docs" / "ci.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", page, re.S) if "repo: local" in b]
    config: dict[str, object] = yaml.safe_load(block)
    return config


def local_project(tmp_path: Path, repo_root: Path, checkpoints: Path | None = None) -> Path:
    """A git repository with docs/ci.md's local hooks, and (copied in) a folder of checkpoints."""
    project = tmp_path / "project"
    project.mkdir()
    _git(project, "init", "-q")
    (project / ".pre-commit-config.yaml").write_text(yaml.safe_dump(docs_local_config(repo_root)))
    if checkpoints is not None:
        shutil.copytree(checkpoints, project / "checkpoints")
    _git(project, "add", ".")
    return project


def test_the_docs_local_hooks_are_both_hooks_of_the_manifest(repo_root: Path) -> None:
    manifest = {hook["id"]: hook for hook in yaml.safe_load((repo_root / ".pre-commit-hooks.yaml").read_text())}
    (repo,) = docs_local_config(repo_root)["repos"]  # type: ignore[misc]
    assert repo["repo"] == "local"
    for hook in repo["hooks"]:
        assert hook["language"] == "system"
        assert {k: hook[k] for k in ("id", "name", "entry", "files")} == {
            k: manifest[hook["id"]][k] for k in ("id", "name", "entry", "files")
        }
    assert [hook["id"] for hook in repo["hooks"]] == HOOK_IDS


def test_save_pretrained_models_and_a_save_file_pass_the_docs_hooks_and_a_bloated_pt_fails_them(
    repo_root: Path, tmp_path: Path
) -> None:
    """The user's journey: a repository of save_pretrained models and a save_file file, under docs/ci.md's hooks."""
    checkpoints = tmp_path / "checkpoints"
    write_all(checkpoints, {name: AS_WRITTEN[name] for name in
                            ("transformers GPT-2", "transformers BERT", "safetensors save_file")})
    project = local_project(tmp_path, repo_root, checkpoints)
    code, output = run_hooks(project, tmp_path / "home")
    assert code == 0, output
    assert hook_status(output, "memlayout inspect") == "Passed"
    assert hook_status(output, "memlayout flatten --check") == "Passed"
    flatten_said = hook_output(output, "memlayout flatten --check")
    for name in ("checkpoints/gpt2/model.safetensors", "checkpoints/bert/model.safetensors",
                 "checkpoints/encoder.safetensors"):
        assert f"{name}: already flat (1 storage)" in flatten_said, flatten_said

    torch.save(models.sliced_bloat_state(), project / "checkpoints" / "bloated.pt")
    _git(project, "add", ".")
    code, output = run_hooks(project, tmp_path / "home")
    assert code == 1
    assert hook_status(output, "memlayout inspect") == "Failed"
    assert hook_status(output, "memlayout flatten --check") == "Failed"
    assert "checkpoints/bloated.pt: would change (torch.save state dict):" in hook_output(
        output, "memlayout flatten --check")
    assert "checkpoints/bloated.pt" in hook_output(output, "memlayout inspect")
    assert "ML301 warning storage-bloat" in hook_output(output, "memlayout inspect")


def test_the_docs_hooks_pass_checkpoints_as_every_library_writes_them(
    repo_root: Path, as_written: Path, tmp_path: Path
) -> None:
    project = local_project(tmp_path, repo_root, as_written)
    code, output = run_hooks(project, tmp_path / "home")
    assert code == 0, output
    flatten_said = hook_output(output, "memlayout flatten --check")
    # Every file the hooks' pattern matches got a verdict line, and each one passes.
    committed = subprocess.run(["git", "ls-files"], cwd=project, capture_output=True, text=True, check=True).stdout
    matched = [name for name in committed.split() if re.search(r"\.(pt|pth|bin|ckpt|safetensors)$", name)]
    assert len(matched) == 6, matched
    for name in matched:
        (line,) = [line for line in flatten_said.splitlines() if line.startswith(f"{name}: ")]
        assert line.startswith((f"{name}: already flat", f"{name}: passes")), line


@pytest.mark.parametrize("problem", PROBLEMS)
def test_the_docs_hooks_fail_a_checkpoint_with_a_real_problem_and_name_it(
    problem: str, repo_root: Path, as_written: Path, tmp_path: Path
) -> None:
    project = local_project(tmp_path, repo_root, as_written)
    (path,) = write_all(project / "checkpoints", {problem: PROBLEMS[problem]}).values()
    _git(project, "add", ".")
    name = path.relative_to(project).as_posix()
    code, output = run_hooks(project, tmp_path / "home")
    assert code == 1, output
    assert hook_status(output, "memlayout inspect") == "Failed"
    inspect_said = hook_output(output, "memlayout inspect")
    assert f"memlayout: {name} [torch-zip]" in inspect_said and "warning" in inspect_said, inspect_said
    flatten_said = hook_output(output, "memlayout flatten --check")
    if problem == "lost tie":
        # flatten keeps both copies (it never ties what the model did not): not its to fix, and
        # its line says who reports it.
        assert hook_status(output, "memlayout flatten --check") == "Passed"
        assert "ML102 warning duplicate-weights" in flatten_said and "`memlayout inspect` reports it" in flatten_said
        # Followed: inspect reports it, naming the file.
        assert "ML102 warning duplicate-weights" in inspect_said
    else:
        assert hook_status(output, "memlayout flatten --check") == "Failed"
        assert f"{name}: would change (torch.save state dict):" in flatten_said, flatten_said


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


def test_both_hooks_run_under_pre_commit(
    repo_root: Path, source_revision: str, as_written: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    _git(project, "init", "-q")
    config = {"repos": [{"repo": str(repo_root), "rev": source_revision, "hooks": [{"id": i} for i in HOOK_IDS]}]}
    (project / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config))
    flat = torch.zeros(64)
    torch.save({"a": flat[:32], "b": flat[32:]}, project / "flat.pt")
    shutil.copytree(as_written, project / "checkpoints")
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

    # The project's [tool.memlayout] reaches both hooks (pre-commit runs them from the repository root):
    # the finding ignored, flatten's check, which judges inspect's findings, passes too.
    (project / "pyproject.toml").write_text('[tool.memlayout]\nignore = ["ML301"]\n')
    _git(project, "add", ".")
    code, output = run_hooks(project, home)
    assert hook_status(output, "memlayout inspect") == "Passed"
    assert hook_status(output, "memlayout flatten --check") == "Passed"
    # An alignment asked for there is one too: save_pretrained's data section starts on 8 bytes, not 64.
    header = (project / "checkpoints" / "gpt2" / "model.safetensors").read_bytes()[:8]
    assert (8 + int.from_bytes(header, "little")) % 64, "the case needs a data section off 64 bytes"
    (project / "pyproject.toml").write_text('[tool.memlayout]\nignore = ["ML301"]\nalignment = 64\n')
    _git(project, "add", ".")
    code, output = run_hooks(project, home)
    assert hook_status(output, "memlayout flatten --check") == "Failed"
    assert "checkpoints/gpt2/model.safetensors: would change (safetensors):" in output
