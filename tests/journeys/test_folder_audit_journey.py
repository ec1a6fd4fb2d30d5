"""A pre-deployment audit of a model folder in one `inspect` (issue 40, defect 7).

The user's folder holds the model's safetensors file and what usually sits
beside it: a pickle someone tampered with (os.system), a preprocessing step
saved with joblib, an `.npy` of Python objects and an `.npy` of embeddings.
`memlayout inspect FOLDER` used to report the safetensors file alone: folders
were walked by extension, a model folder not at all. Every file is written by
its own library; the run is watched by the suite's execution canary
(`tests.fuzz.harness.Canary`), and what memlayout says each pickle imports is
what joblib.load and numpy.load ask `find_class` for.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import torch
from safetensors.torch import save_file

from memlayout.load import load_path
from tests.fuzz.harness import CANARY_MARK
from tests.load.real_unpicklers import imported_by

REPO = Path(__file__).resolve().parents[2]


class Payload:
    """Creates the canary file when unpickled for real."""

    def __init__(self, canary: Path) -> None:
        self.canary = canary

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch '{self.canary}'",)


def _model_folder(folder: Path, canary: Path) -> Path:
    folder.mkdir()
    torch.manual_seed(0)
    save_file({"embed.weight": torch.randn(16, 8), "head.bias": torch.zeros(16)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text('{"model_type": "toy"}')
    with open(folder / "tokenizer_extra.pkl", "wb") as out:
        pickle.dump({"vocab": ["a", "b"], "hook": Payload(canary)}, out)
    joblib.dump({"mean": np.arange(8.0), "scale": np.ones(8)}, folder / "preprocess.joblib")
    np.save(folder / "labels.npy", np.array([{"id": 0}, Payload(canary)], dtype=object), allow_pickle=True)
    np.save(folder / "embeddings.npy", np.random.default_rng(0).standard_normal((32, 8)).astype(np.float32))
    return folder


def _inspect_watched(folder: Path, canary: Path) -> tuple[int, dict[str, Any], list[str]]:
    """`memlayout inspect FOLDER --format json` in a fresh process that the execution canary watches."""
    driver = (
        "import json, sys\n"
        "from tests.fuzz.harness import Canary\n"
        f"canary = Canary({str(canary)!r})\n"
        "from memlayout.cli.app import main\n"
        "code = main(['inspect', sys.argv[1], '--format', 'json'])\n"
        "print(json.dumps({'code': code, 'executions': canary.check()}), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", driver, str(folder)], capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    watched = json.loads(done.stderr.strip().splitlines()[-1])
    return watched["code"], json.loads(done.stdout), watched["executions"]


def test_one_inspect_audits_every_pickle_and_array_in_a_model_folder(tmp_path: Path) -> None:
    canary = tmp_path / f"{CANARY_MARK}-audit"
    folder = _model_folder(tmp_path / "model", canary)
    code, batch, executions = _inspect_watched(folder, canary)
    assert executions == [] and not canary.exists()

    by_name = {Path(entry["path"]).name: entry["report"] for entry in batch["reports"]}
    assert set(by_name) == {"model", "tokenizer_extra.pkl", "preprocess.joblib", "labels.npy", "embeddings.npy"}
    assert all(report is not None for report in by_name.values()), batch
    findings = {name: {f["code"]: f for f in report["findings"]} for name, report in by_name.items()}

    # The tampered pickle and the array of objects are flagged by what they import.
    assert "posix.system can run arbitrary code" in findings["tokenizer_extra.pkl"]["ML601"]["message"]
    assert "pickle.load, joblib.load" in findings["tokenizer_extra.pkl"]["ML601"]["message"]
    assert "numpy.load refuses unless allow_pickle=True" in findings["labels.npy"]["ML601"]["message"]
    assert "posix.system can run arbitrary code" in findings["labels.npy"]["ML601"]["message"]
    # The joblib file imports only numpy's and joblib's array machinery: cleared.
    assert findings["preprocess.joblib"] == {}
    assert "it imports nothing outside the allow-list" in by_name["preprocess.joblib"]["source"]["notes"][0]
    # The embeddings are data: one float32 tensor, no pickle, no finding.
    embeddings = by_name["embeddings.npy"]
    assert embeddings["source"]["format"] == "npy" and findings["embeddings.npy"] == {}
    assert [(t["dtype"], t["shape"]) for t in embeddings["tensors"]] == [("float32", [32, 8])]
    assert code == 1  # ML601 is an error

    # What memlayout names is what each file's own loader would import (and, for the payloads, run).
    for name, loader in (("preprocess.joblib", "joblib.load"), ("labels.npy", "numpy.load"),
                         ("tokenizer_extra.pkl", "pickle.load")):
        imported, _ = imported_by(loader, folder / name)
        assert {(g.module, g.name) for g in load_path(str(folder / name)).pickle_globals} == imported, name
    assert not canary.exists()
