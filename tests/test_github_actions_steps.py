"""docs/ci.md's GitHub Actions workflow, its steps run as a script, as the runner runs them.

The workflow is the README's block, which docs/ci.md includes. Each `run:` step
runs in bash, in order, in a checkout holding `checkpoints/`: the `uses:` steps
(checkout, setup-python, upload-sarif) are the runner's own, and the step that
installs memlayout's wheel is what this environment already did. As on the
runner, a failing step fails the job unless it says `continue-on-error`, and
after a failure only steps that say `if: always()` still run.
(tests/test_packaging.py runs the same steps from the wheel they install, on the
demo checkpoint; here they run on the files a project commits.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.checkpoints_as_written import AS_WRITTEN, PROBLEMS, write_all

REPO = Path(__file__).resolve().parent.parent
SARIF_SCHEMA = REPO / "tests" / "report" / "sarif-schema-2.1.0.json"


@dataclass(frozen=True)
class Step:
    name: str
    code: int | None
    """The exit status; None for a step skipped after a failure."""
    output: str


def workflow() -> dict[str, object]:
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index("<!-- --8<-- [start:github-actions] -->") : readme.index("<!-- --8<-- [end:github-actions] -->")]
    (text,) = re.findall(r"```yaml\n(.*?)```", block, re.S)
    loaded: dict[str, object] = yaml.safe_load(text)
    return loaded


def run_steps(checkout: Path) -> tuple[bool, list[Step]]:
    """(whether the job failed, each `run:` step's outcome)."""
    (job,) = workflow()["jobs"].values()  # type: ignore[attr-defined]
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    failed, steps = False, []
    for step in job["steps"]:
        if "run" not in step or step["run"].startswith("pip install"):
            continue
        if failed and step.get("if") != "always()":
            steps.append(Step(step["name"], None, ""))
            continue
        done = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=checkout, env=env, capture_output=True,
                              text=True, timeout=300)
        steps.append(Step(step["name"], done.returncode, done.stdout + done.stderr))
        failed = failed or (done.returncode != 0 and not step.get("continue-on-error"))
    return failed, steps


def step(steps: list[Step], command: str) -> Step:
    (found,) = [s for s in steps if command in s.name]
    return found


@pytest.fixture(scope="module")
def as_written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("as-written") / "checkpoints"
    write_all(folder, AS_WRITTEN)
    return folder


def sarif_uris(checkout: Path) -> list[str]:
    log = json.loads((checkout / "memlayout.sarif").read_text())
    jsonschema.validate(log, json.loads(SARIF_SCHEMA.read_text()))
    return [r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in log["runs"][0]["results"]]


def test_the_workflow_passes_checkpoints_as_their_libraries_write_them(as_written: Path, tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    shutil.copytree(as_written, checkout / "checkpoints")
    failed, steps = run_steps(checkout)
    assert not failed, steps
    assert [s.code for s in steps] == [0, 0, 0], steps
    flatten = step(steps, "flatten --check")
    # The configs beside the weights (diffusers' config.json, generation_config.json) are accounted
    # for as data and fail nothing.
    assert re.search(r" 0 would change, 0 not checked; \d+ other files read as data, nothing to flatten: JSON text",
                     flatten.output.splitlines()[-1]), flatten.output
    # Info findings (fragmented torch.save files) are notices, not failures; no warning or error.
    assert not re.search(r"^::(warning|error) ", step(steps, "annotations").output, re.M)
    sarif_uris(checkout)


@pytest.mark.parametrize("problem", ["saved slice of a large storage", "bloated shard of a sharded model"])
def test_the_workflow_fails_a_real_problem_and_every_output_names_the_file_to_fix(
    problem: str, as_written: Path, tmp_path: Path
) -> None:
    checkout = tmp_path / "checkout"
    shutil.copytree(as_written, checkout / "checkpoints")
    (path,) = write_all(checkout / "checkpoints", {problem: PROBLEMS[problem]}).values()
    name = path.relative_to(checkout).as_posix()
    failed, steps = run_steps(checkout)
    assert failed
    # The SARIF step goes on (continue-on-error), and its results name the file, for a sharded
    # model the shard, not the folder.
    assert step(steps, "SARIF").code == 1
    assert name in sarif_uris(checkout)
    flatten = step(steps, "flatten --check")
    assert flatten.code == 1 and "would change" in flatten.output, flatten.output
    assert name.rsplit("/", 1)[-1] in flatten.output
    # The annotations step runs after the failure (if: always()), its warning on the file.
    annotations = step(steps, "annotations")
    assert annotations.code == 1
    assert f"::warning file={name},title=ML301 storage-bloat::" in annotations.output, annotations.output
