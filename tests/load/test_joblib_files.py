"""joblib files: the pickle read past each array's raw bytes, as joblib.load reads it, executing nothing.

Every file is written by joblib.dump itself. The globals memlayout names are
compared with what joblib.load asks `find_class` for (`real_unpicklers`), so a
payload hidden after an array, or inside an array of objects (a nested pickle),
is named as joblib.load would import it.
"""

from __future__ import annotations

import os
from pathlib import Path

import joblib
import numpy as np
import pytest

from memlayout.load import load_path
from memlayout.pipeline.inspection import run_inspection
from tests.load.real_unpicklers import imported_by


class Payload:
    """Runs a command when unpickled for real."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch '{self.marker}'",)


def _arrays() -> dict[str, object]:
    rng = np.random.default_rng(0)
    return {
        "mean": rng.standard_normal(16),
        "components": np.asfortranarray(rng.standard_normal((4, 16)).astype(np.float32)),
        "labels": np.array(["cat", "dog"]),
        "counts": np.arange(7),
        "empty": np.zeros((0, 2)),
        "scalar": np.float64(3.5),
    }


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_a_joblib_file_of_arrays_is_cleared_as_joblib_load_reads_it(tmp_path: Path, protocol: int) -> None:
    path = tmp_path / "scaler.joblib"
    joblib.dump(_arrays(), path, protocol=protocol)
    imported, outcome = imported_by("joblib.load", path)
    assert outcome == "loaded"
    source = load_path(str(path))
    assert {(g.module, g.name) for g in source.pickle_globals} == imported
    assert all(g.allowed for g in source.pickle_globals)  # numpy's and joblib's array globals only
    # the scalar is numpy's own pickle (numpy.core.multiarray.scalar), not one of joblib's arrays
    assert any("joblib: 5 numpy arrays" in note for note in source.notes), source.notes
    assert "ML601" not in {f.code for f in run_inspection(str(path)).findings}


def test_raw_bytes_that_look_like_opcodes_are_stepped_over(tmp_path: Path) -> None:
    # An array whose bytes spell LONG_BINPUT 2**31-1 and STOP: read as opcodes they
    # would be refused (the memo guard) or end the pickle early.
    path = tmp_path / "opcodes.joblib"
    tricky = np.frombuffer(b"r\xff\xff\xff\x7f." * 8, dtype=np.uint8)
    joblib.dump({"a": tricky, "b": np.arange(3)}, path)
    source = load_path(str(path))
    assert any("joblib: 2 numpy arrays" in note for note in source.notes)
    assert {(g.module, g.name) for g in source.pickle_globals} == imported_by("joblib.load", path)[0]


@pytest.mark.parametrize("where", ["after-an-array", "in-an-array-of-objects"])
def test_a_payload_joblib_load_would_run_is_named_and_not_run(tmp_path: Path, where: str) -> None:
    marker = tmp_path / "PWNED"
    path = tmp_path / "model.joblib"
    value: dict[str, object] = {"weights": np.ones((3, 5), np.float32)}
    if where == "after-an-array":
        value["hook"] = Payload(marker)
    else:
        value["objects"] = np.array([{"a": 1}, Payload(marker)], dtype=object)
        value["after"] = np.arange(4)
    joblib.dump(value, path)
    imported, outcome = imported_by("joblib.load", path)
    assert "refused os.system" in outcome  # joblib.load got as far as running it
    source = load_path(str(path))
    named = {(g.module, g.name) for g in source.pickle_globals}
    assert imported <= named and ("posix", "system") in named
    (finding,) = [f for f in run_inspection(str(path)).findings if f.code == "ML601"]
    assert "posix.system can run arbitrary code" in finding.message
    assert "joblib.load" in finding.message
    assert not marker.exists()


def test_a_pickled_model_class_is_flagged_as_for_torch(tmp_path: Path) -> None:
    # What a fitted estimator looks like: its class, which joblib.load imports and builds.
    path = tmp_path / "estimator.joblib"
    joblib.dump({"model": Path("weights")}, path)
    (finding,) = [f for f in run_inspection(str(path)).findings if f.code == "ML601"]
    assert "pathlib" in finding.message and "can run arbitrary code" not in finding.message


def test_a_file_cut_inside_an_array_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "cut.joblib"
    joblib.dump({"a": np.ones(1000)}, path)
    path.write_bytes(path.read_bytes()[:400])
    from memlayout.errors import CorruptCheckpointError

    with pytest.raises(CorruptCheckpointError, match="ends inside a joblib array of 8,000 bytes"):
        load_path(str(path))


def test_the_hint_of_a_pickled_model_is_followed(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "model.joblib"
    joblib.dump(torch.nn.Linear(4, 2), path)
    (finding,) = [f for f in run_inspection(str(path)).findings if f.code == "ML601"]
    assert "re-save its data in a format that is no pickle (safetensors" in finding.hint
    model = joblib.load(path)  # the hint: only a file you trust, as this one
    save_file(model.state_dict(), str(tmp_path / "model.safetensors"))
    assert "ML601" not in {f.code for f in run_inspection(str(tmp_path / "model.safetensors")).findings}
