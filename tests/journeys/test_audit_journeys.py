"""Pre-deployment audits an attacker cannot slip past (issue 50): the four defects, as a user met them.

Each test does what the user did, with files the user's own libraries wrote, and
runs `memlayout` in a fresh process watched by the suite's execution canary
(`tests.fuzz.harness.Canary`): a payload that ran would create the canary file.

1. A baseline recorded for a checkpoint whose only finding was a harmless ML601
   (a numpy scalar) hid the `os.system` the replaced file called: ML601's
   fingerprint was the rule and its (no) tensors.
2. `joblib.dump(..., compress=...)` files were "not a checkpoint format" alone and
   skipped inside a folder, which then passed.
3. A torch zip named `model.safetensors` stopped the walk of its folder at
   "invalid safetensors header"; none of the other files was reported.
4. ML601's JSON named no global: only its message told `posix.system` from a
   numpy class outside torch's allow-list.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.fuzz.harness import CANARY_MARK

REPO = Path(__file__).resolve().parents[2]


class Payload:
    """Creates the canary file when unpickled for real."""

    def __init__(self, canary: Path) -> None:
        self.canary = canary

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch '{self.canary}'",)


def memlayout_watched(canary: Path, *args: str, cwd: Path) -> tuple[int, str, str, list[str]]:
    """`memlayout ARGS` in a fresh process that the execution canary watches: (exit, stdout, stderr, executions)."""
    driver = (
        "import json, sys\n"
        "from tests.fuzz.harness import Canary\n"
        f"canary = Canary({str(canary)!r})\n"
        "from memlayout.cli.app import main\n"
        "code = main(sys.argv[1:])\n"
        "print('CANARY ' + json.dumps({'code': code, 'executions': canary.check()}), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", driver, *args], capture_output=True, text=True, timeout=300, cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    lines = done.stderr.strip().splitlines()
    watched = json.loads(lines[-1].removeprefix("CANARY "))
    return watched["code"], done.stdout, "\n".join(lines[:-1]), watched["executions"]


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    return tmp_path / f"{CANARY_MARK}-audit"


# 1. A baseline hides a new payload


def _checkpoint_with_a_numpy_scalar(path: Path) -> None:
    torch.save({"weight": torch.zeros(4), "best_loss": np.float64(0.25)}, path)


def _same_checkpoint_calling_os_system(path: Path, canary: Path) -> None:
    torch.save({"weight": torch.zeros(4), "best_loss": Payload(canary)}, path)


def test_a_baseline_does_not_hide_a_payload_that_replaces_an_accepted_pickle(tmp_path: Path, canary: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    _checkpoint_with_a_numpy_scalar(ckpt)
    code, out, _, ran = memlayout_watched(canary, "inspect", "ckpt.pt", "--write-baseline", "base.json",
                                          "--format", "json", cwd=tmp_path)
    assert code == 0 and ran == [] and json.loads(out)["baseline"]["suppressed"] == 1

    _same_checkpoint_calling_os_system(ckpt, canary)
    code, out, _, ran = memlayout_watched(canary, "inspect", "ckpt.pt", "--baseline", "base.json", "--format",
                                          "json", cwd=tmp_path)
    report = json.loads(out)
    (finding,) = [f for f in report["findings"] if f["code"] == "ML601"]
    assert finding["severity"] == "error" and "posix.system" in finding["message"]
    assert report["baseline"]["suppressed"] == 0 and len(report["baseline"]["fixed"]) == 1  # the scalar's is gone
    assert code == 1 and ran == [] and not canary.exists()

    code, out, _, ran = memlayout_watched(canary, "inspect", "ckpt.pt", "--baseline", "base.json", "--format",
                                          "sarif", cwd=tmp_path)
    states = {(r["ruleId"], r["baselineState"]) for r in json.loads(out)["runs"][0]["results"]}
    assert ("ML601", "new") in states and ("ML601", "unchanged") not in states
    assert code == 1 and ran == []


def test_a_baseline_written_before_findings_were_keyed_on_their_globals_shows_them_with_a_note(
    tmp_path: Path, canary: Path
) -> None:
    # What --write-baseline wrote before: version 1, ML601 keyed on its rule and (no) tensors.
    import hashlib

    ckpt = tmp_path / "ckpt.pt"
    _same_checkpoint_calling_os_system(ckpt, canary)
    old_key = hashlib.sha256(b"ML601").hexdigest()[:16]
    (tmp_path / "base.json").write_text(json.dumps(
        {"memlayout-baseline": 1, "findings": [{"path": "ckpt.pt", "code": "ML601", "fingerprint": old_key,
                                                "tensors": []}]}))
    code, out, _, ran = memlayout_watched(canary, "inspect", "ckpt.pt", "--baseline", "base.json", cwd=tmp_path)
    assert code == 1 and ran == []
    assert "ML601" in out and "shown although recorded" in out and "re-run with --write-baseline base.json" in out
    code, out, _, _ = memlayout_watched(canary, "inspect", "ckpt.pt", "--baseline", "base.json", "-f", "sarif",
                                        cwd=tmp_path)
    states = {(r["ruleId"], r["baselineState"]) for r in json.loads(out)["runs"][0]["results"]}
    assert ("ML601", "updated") in states  # SARIF's word for "in the baseline, but changed"


# 2. Compressed pickles pass in silence


def _codecs() -> list[str]:
    import importlib.util

    return ["zlib", "gzip", "bz2", "lzma", "xz", *(["lz4"] if importlib.util.find_spec("lz4") else [])]


@pytest.mark.parametrize("codec", _codecs())
def test_a_compressed_joblib_file_that_calls_os_system_is_flagged_alone_and_in_a_folder(
    codec: str, tmp_path: Path, canary: Path
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    save_file({"w": torch.zeros(4, 4)}, str(folder / "weights.safetensors"))
    joblib.dump({"scaler_mean": np.arange(8.0), "hook": Payload(canary)}, folder / "preprocess.joblib",
                compress=(codec, 3))
    code, out, _, ran = memlayout_watched(canary, "inspect", "model/preprocess.joblib", "-f", "json", cwd=tmp_path)
    report = json.loads(out)
    assert report["source"]["format"] == codec
    (finding,) = [f for f in report["findings"] if f["code"] == "ML601"]
    assert {(g["module"], g["name"], g["danger"]) for g in finding["globals"]} >= {
        ("posix", "system", "runs-code"), ("numpy", "ndarray", "allow-listed"),
    }
    assert code == 1 and ran == []

    code, out, _, ran = memlayout_watched(canary, "inspect", "model", "-f", "json", cwd=tmp_path)
    batch = json.loads(out)
    by_name = {Path(r["path"]).name: r for r in batch["reports"]}
    assert set(by_name) == {"preprocess.joblib", "weights.safetensors"}
    assert "ML601" in {f["code"] for f in by_name["preprocess.joblib"]["report"]["findings"]}
    assert code == 1 and batch["exit_code"] == 1 and ran == [] and not canary.exists()


def test_torch_save_into_a_gzip_stream_is_read_with_its_tensors(tmp_path: Path, canary: Path) -> None:
    with gzip.open(tmp_path / "model.pt.gz", "wb") as out:
        torch.save({"w": torch.zeros(4, 4), "hook": Payload(canary)}, out)
    code, out, _, ran = memlayout_watched(canary, "inspect", "model.pt.gz", "-f", "json", cwd=tmp_path)
    report = json.loads(out)
    assert report["source"]["contents"] == [{"member": "", "within": ["gzip"], "format": "torch-zip", "what": ""}]
    assert [t["name"] for t in report["tensors"]] == ["w"]
    assert "ML601" in {f["code"] for f in report["findings"]} and code == 1 and ran == []


# 3. One file whose name lies stops a folder walk


def test_a_torch_zip_named_model_safetensors_is_read_as_what_it_is_and_the_walk_goes_on(
    tmp_path: Path, canary: Path
) -> None:
    folder = tmp_path / "release"
    folder.mkdir()
    torch.save({"w": torch.zeros(2), "hook": Payload(canary)}, folder / "model.safetensors")
    for index in range(4):
        (folder / f"notes-{index}.txt").write_text(f"run {index}\n")
        (folder / f"metrics-{index}.json").write_text(json.dumps({"step": index}))
    np.save(folder / "embedding.npy", np.zeros((4, 2), np.float32))
    save_file({"w": torch.zeros(2)}, str(folder / "adapter.safetensors"))
    (folder / "tokenizer.pkl").write_bytes(pickle.dumps({"vocab": ["a", "b"]}))
    (folder / "truncated.pt").write_bytes((folder / "model.safetensors").read_bytes()[:300])
    assert len(os.listdir(folder)) == 13
    code, out, err, ran = memlayout_watched(canary, "inspect", "release", "-f", "json", cwd=tmp_path)
    batch = json.loads(out)
    entries = {Path(r["path"]).name: r for r in batch["reports"]}
    assert set(entries) == set(os.listdir(folder))  # every file accounted for
    lying = entries["model.safetensors"]["report"]
    assert lying["source"]["format"] == "torch-zip"
    codes = {f["code"]: f for f in lying["findings"]}
    assert codes["ML601"]["severity"] == "error" and "named like a safetensors file" in codes["ML604"]["message"]
    assert entries["truncated.pt"]["error"] and entries["notes-0.txt"]["data"] == "text"
    assert entries["metrics-0.json"]["data"] == "JSON text" and entries["adapter.safetensors"]["report"]
    assert batch["summary"] == {"paths": 13, "inspected": 4, "failed": 1, "data": 8,
                                "findings": batch["summary"]["findings"]}
    assert code == 2 and err.count("memlayout: error:") == 1  # the truncated file: not everything was read
    assert ran == [] and not canary.exists()


# 4. ML601's JSON says nothing a machine can act on


def test_ml601_json_lists_each_global_with_its_danger_class_and_severity_follows(tmp_path: Path, canary: Path) -> None:
    torch.save({"weight": torch.zeros(2), "best": np.float64(1.0)}, tmp_path / "scalar.pt")
    torch.save({"weight": torch.zeros(2), "best": np.float64(1.0), "hook": Payload(canary)}, tmp_path / "evil.pt")
    found: dict[str, Any] = {}
    for name in ("scalar.pt", "evil.pt"):
        _, out, _, ran = memlayout_watched(canary, "inspect", name, "-f", "json", cwd=tmp_path)
        assert ran == []
        (found[name],) = [f for f in json.loads(out)["findings"] if f["code"] == "ML601"]
    classes = {f"{g['module']}.{g['name']}": g["danger"] for g in found["evil.pt"]["globals"]}
    assert classes["posix.system"] == "runs-code"
    assert classes["numpy._core.multiarray.scalar"] == "constructs-object"
    assert classes["torch._utils._rebuild_tensor_v2"] == "allow-listed"
    assert found["evil.pt"]["severity"] == "error" and found["scalar.pt"]["severity"] == "warning"
    assert all(g["does"] for g in found["evil.pt"]["globals"] if g["danger"] != "allow-listed")
    assert found["evil.pt"]["fingerprint"] != found["scalar.pt"]["fingerprint"]
