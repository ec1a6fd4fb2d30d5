"""The remote page's scheduler examples split a registry over machines with `--shard K/N`.

Each example under docs/examples/schedulers/ is a file a user copies: a GitHub
Actions matrix, a Kubernetes Indexed Job and a Slurm array. Its memlayout command
line runs here as written, once for each index the scheduler would set, and the
JSON Lines outputs, joined as the page says (`cat audit-*.jsonl > audit.jsonl`),
hold every path of the registry exactly once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples" / "schedulers"
JOIN = "cat audit-*.jsonl > audit.jsonl"
PATHS = 9
Runs = list[tuple[str, dict[str, str]]]


def github_actions(work: Path) -> Runs:
    workflow = yaml.safe_load((EXAMPLES / "github-actions.yml").read_text())
    shard = workflow["jobs"]["shard"]
    (run,) = [step["run"] for step in shard["steps"] if "memlayout inspect" in step.get("run", "")]
    shards = shard["strategy"]["matrix"]["shard"]
    assert f"/{len(shards)} " in run, "N in --shard K/N is the matrix's size"
    # GitHub substitutes the expression before the shell sees the line.
    return [(run.replace("${{ matrix.shard }}", str(k)), {}) for k in shards]


def kubernetes(work: Path) -> Runs:
    job = yaml.safe_load((EXAMPLES / "k8s-indexed-job.yaml").read_text())
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    (container,) = spec["template"]["spec"]["containers"]
    assert container["command"] == ["sh", "-c"]
    (line,) = container["args"]
    # The volumes are mounted here as folders of the scratch directory.
    for mount in container["volumeMounts"]:
        line = line.replace(mount["mountPath"] + "/", f"{work}/")
    assert container["workingDir"] in [m["mountPath"] for m in container["volumeMounts"]]
    return [(line, {"JOB_COMPLETION_INDEX": str(i)}) for i in range(spec["completions"])]


def slurm(work: Path) -> Runs:
    script = (EXAMPLES / "slurm-array.sh").read_text()
    match = re.search(r"^#SBATCH --array=(\d+)-(\d+)$", script, flags=re.MULTILINE)
    assert match is not None
    first, last = int(match.group(1)), int(match.group(2))
    (line,) = re.findall(r"^memlayout .+$", script, flags=re.MULTILINE)
    count = str(last - first + 1)
    return [(line, {"SLURM_ARRAY_TASK_ID": str(k), "SLURM_ARRAY_TASK_COUNT": count}) for k in range(first, last + 1)]


@pytest.mark.parametrize("example", [github_actions, kubernetes, slurm], ids=lambda f: f.__name__)
def test_the_shards_joined_hold_every_path_once(example: Callable[[Path], Runs], tmp_path: Path) -> None:
    registry = []
    for index in range(PATHS):
        name = f"ckpt-{index}.pt"
        shutil.copy2(ROOT / "fixtures" / "demo_checkpoint.pt", tmp_path / name)
        registry.append(name)
    (tmp_path / "registry.txt").write_text("# the checkpoints to audit\n" + "\n".join(registry) + "\n")
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    runs = example(tmp_path)
    assert len(runs) > 1
    for line, variables in runs:
        done = subprocess.run(["sh", "-c", line], cwd=tmp_path, env={**os.environ, "PATH": path, **variables},
                              capture_output=True, text=True, timeout=120)
        # --fail-on never: the demo's findings are in the report, and the shard succeeds.
        assert done.returncode == 0, line + "\n" + done.stderr
    assert len(list(tmp_path.glob("audit-*.jsonl"))) == len(runs)
    subprocess.run(["sh", "-c", JOIN], cwd=tmp_path, check=True)
    lines = [json.loads(text) for text in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert sorted(line["path"] for line in lines) == sorted(registry)
    assert all(line["report"]["findings"] for line in lines)


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.iterdir()))
def test_the_remote_page_shows_each_example_and_its_join(name: str) -> None:
    page = (ROOT / "docs" / "remote.md").read_text()
    assert f'--8<-- "docs/examples/schedulers/{name}"' in page
    assert JOIN in page and JOIN in (EXAMPLES / name).read_text()
