"""memlayout as a user installs it: the wheel and sdist built, and installed into fresh virtualenvs (issue 40).

memlayout is not on PyPI, and the README's `pip install memlayout` and its GitHub
Actions workflow failed at their first step. These tests do what the README says:
the Install section's commands on a copy of this checkout, and the workflow's
steps, each run as written by bash in a folder laid out as the user's, with the
virtualenv's `pip` and `memlayout` first on PATH. Then the installed package, away
from the source tree, runs `--version`, `inspect` against the JSON schema it
ships, `explain` and the HTML map (the rule docs and templates it must carry).

Nothing is downloaded: pip is told to use no index, and memlayout's dependencies
(torch among them, for the `torch` extra) are found on PYTHONPATH, the test
interpreter's own site-packages less any memlayout installed there (an editable
install would otherwise shadow the wheel). A virtualenv made with
--system-site-packages from this one would see the base interpreter's packages,
not this virtualenv's, so PYTHONPATH it is, as tests/test_pre_commit_hooks.py does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]  # type: ignore[index]


def _clone(to: Path) -> Path:
    """A copy of this checkout's files (what a clone holds, with any uncommitted change), at `to`."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True
    )
    if listed.returncode:
        pytest.skip("the source must be a git checkout, whose files are what a clone holds")
    for name in listed.stdout.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, to / name)
    return to


def _dependencies(to: Path) -> Path:
    """This interpreter's site-packages, less memlayout itself, as one folder of links."""
    to.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if "memlayout" not in entry.name.lower():
            (to / entry.name).symlink_to(entry)
    return to


def _virtualenv(to: Path) -> Path:
    """A fresh virtualenv with pip and nothing else."""
    subprocess.run([sys.executable, "-m", "venv", str(to)], check=True, capture_output=True, timeout=300)
    return to


def _environment(venv: Path, dependencies: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PIP_", "VIRTUAL_ENV"))}
    return {
        **env,
        "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": str(dependencies),
        "PIP_NO_INDEX": "1",
        # pip reads "no" options from the environment inverted: 0 turns build isolation off,
        # so a build finds setuptools on PYTHONPATH instead of the index.
        "PIP_NO_BUILD_ISOLATION": "0",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


def _bash(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def dependencies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _dependencies(tmp_path_factory.mktemp("site") / "dependencies")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist built from a clone, and the wheel built from that sdist (so the sdist is complete)."""
    work = tmp_path_factory.mktemp("build")
    clone = _clone(work / "memlayout")
    dist = work / "dist"
    build = "import sys; from setuptools import build_meta; print(getattr(build_meta, sys.argv[1])(sys.argv[2]))"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    sdist = subprocess.run([sys.executable, "-c", build, "build_sdist", str(dist)], cwd=clone, env=env,
                           capture_output=True, text=True, check=True).stdout.split()[-1]
    with tarfile.open(dist / sdist) as archive:
        archive.extractall(work / "unpacked", filter="data")
    unpacked = work / "unpacked" / sdist.removesuffix(".tar.gz")
    wheel = subprocess.run([sys.executable, "-c", build, "build_wheel", str(dist)], cwd=unpacked, env=env,
                           capture_output=True, text=True, check=True).stdout.split()[-1]
    return {"clone": clone, "sdist": dist / sdist, "wheel": dist / wheel}


def test_the_wheel_and_the_sdist_carry_every_file_of_the_package(built: dict[str, Path]) -> None:
    package = {
        path.relative_to(built["clone"]).as_posix()
        for path in (built["clone"] / "memlayout").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    # The schemas, the HTML map's templates and py.typed travel as package data.
    assert {"memlayout/report/schema_v2.json", "memlayout/diff/schema_v1.json", "memlayout/activations/schema_v1.json",
            "memlayout/report/templates/storage_map.html.j2", "memlayout/py.typed"} <= package
    assert built["wheel"].name == f"memlayout-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(built["wheel"]) as wheel:
        in_wheel = {name for name in wheel.namelist() if name.startswith("memlayout/")}
        metadata = wheel.read(f"memlayout-{VERSION}.dist-info/METADATA").decode()
    assert in_wheel == package
    with tarfile.open(built["sdist"]) as sdist:
        in_sdist = {name.split("/", 1)[1] for name in sdist.getnames() if "/memlayout/" in name}
    assert package <= in_sdist
    # torch only with its extra: the base install reads files without it.
    torch = [line for line in metadata.splitlines() if re.match(r"Requires-Dist: torch\b", line)]
    assert torch and all('extra == "torch"' in line for line in torch), torch


def test_the_readme_install_commands_work_as_written(
    built: dict[str, Path], dependencies: Path, tmp_path: Path
) -> None:
    install = README[README.index("## Install") : README.index("\n## ", README.index("## Install"))]
    commands = re.findall(r"^\$ (pip .+?)(?:\s+#.*)?$", install, re.M)
    assert [c.split()[:2] for c in commands] == [["pip", "install"], ["pip", "install"], ["pip", "wheel"],
                                                 ["pip", "install"]], commands
    shutil.copytree(built["clone"], tmp_path / "memlayout")
    venv = _virtualenv(tmp_path / "venv")
    env = _environment(venv, dependencies)
    for command in commands[:3]:  # from the clone, with the torch extra, and the wheel built from it
        done = _bash(command, tmp_path, env)
        assert done.returncode == 0, command + "\n" + done.stdout + done.stderr
    installed = _bash("python -c 'import memlayout; print(memlayout.__file__)'", tmp_path, env)
    assert installed.stdout.startswith(str(venv)), installed.stdout + installed.stderr
    assert _bash("memlayout --version", tmp_path, env).stdout.strip() == f"memlayout {VERSION}"
    (wheel,) = (tmp_path / "wheels").glob("*.whl")
    assert wheel.name == f"memlayout-{VERSION}-py3-none-any.whl"
    # The last line, where there is no clone, is the workflow's install step, tested below.
    assert commands[3] == "pip install wheels/memlayout-*.whl"


def _workflow_steps() -> list[dict[str, Any]]:
    (block,) = re.findall(r"```yaml\n(# \.github/workflows/memlayout\.yml\n.*?)```", README, flags=re.DOTALL)
    steps: list[dict[str, Any]] = yaml.safe_load(block)["jobs"]["memlayout"]["steps"]
    return steps


def test_the_github_actions_workflow_installs_and_runs_as_written(
    built: dict[str, Path], dependencies: Path, tmp_path: Path
) -> None:
    """The user's repository: checkpoints/ and the wheel under wheels/, no memlayout source anywhere."""
    project = tmp_path / "project"
    (project / "wheels").mkdir(parents=True)
    (project / "checkpoints").mkdir()
    shutil.copy2(built["wheel"], project / "wheels")
    shutil.copy2(ROOT / "fixtures" / "demo_checkpoint.pt", project / "checkpoints")
    venv = _virtualenv(tmp_path / "venv")
    env = _environment(venv, dependencies)
    steps = [step for step in _workflow_steps() if "run" in step]
    assert steps[0]["run"].startswith("pip install ")
    for step in steps:
        done = _bash(step["run"], project, env)
        # Findings exit 1, which the SARIF step lets the upload carry on past and the other steps fail on (the
        # demo's storage bloat and transposed weight are flatten's to fix too).
        failing = "memlayout inspect" in step["run"] or "memlayout flatten --check" in step["run"]
        assert done.returncode == (1 if failing else 0), step["run"] + done.stderr
    schema = json.loads((ROOT / "tests" / "report" / "sarif-schema-2.1.0.json").read_text())
    sarif = json.loads((project / "memlayout.sarif").read_text())
    jsonschema.Draft4Validator(schema).validate(sarif)
    assert sarif["runs"][0]["results"]

    # The installed package, away from the source tree.
    located = _bash("python -c 'import memlayout; print(memlayout.__file__)'", project, env)
    package = Path(located.stdout.strip()).parent
    assert package.is_relative_to(venv), located.stdout + located.stderr
    assert _bash("memlayout --version", project, env).stdout.strip() == f"memlayout {VERSION}"
    report = _bash("memlayout inspect checkpoints/demo_checkpoint.pt --format json --fail-on never", project, env)
    assert report.returncode == 0, report.stderr
    inspected = json.loads(report.stdout)
    shipped = json.loads((package / "report" / f"schema_v{inspected['schema']}.json").read_text())
    jsonschema.Draft202012Validator(shipped).validate(inspected)
    assert shipped == json.loads((ROOT / "memlayout" / "report" / f"schema_v{inspected['schema']}.json").read_text())
    explained = _bash("memlayout explain ML301", project, env)
    assert explained.returncode == 0 and "ML301 storage-bloat" in explained.stdout, explained.stderr
    mapped = _bash("memlayout inspect checkpoints/demo_checkpoint.pt --format html -o map.html", project, env)
    assert mapped.returncode == 1, mapped.stderr
    css = (package / "report" / "templates" / "storage_map.css").read_text()
    assert css.strip().splitlines()[0] in (project / "map.html").read_text()
