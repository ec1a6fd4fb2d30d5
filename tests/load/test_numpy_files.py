"""numpy's .npy and .npz files: numbers are reported as data, arrays of objects as the pickles they are.

Every file is written by numpy itself; what memlayout reports is checked against
`numpy.load` and `torch.from_numpy`, and the globals it names against what
numpy.load(allow_pickle=True) asks `find_class` for (`real_unpicklers`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from memlayout.load import load_path
from memlayout.pipeline.inspection import run_inspection
from tests.load.conftest import assert_one_line_error, run_cli
from tests.load.real_unpicklers import imported_by


class Payload:
    """Runs a command when unpickled for real."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch '{self.marker}'",)


ARRAYS = {
    "float32-c": lambda: np.arange(12, dtype=np.float32).reshape(3, 4),
    "float64-fortran": lambda: np.asfortranarray(np.arange(24, dtype=np.float64).reshape(2, 3, 4)),
    "int64": lambda: np.arange(5, dtype=np.int64),
    "bool": lambda: np.array([True, False, True]),
    "float16": lambda: np.ones((2, 2), dtype=np.float16),
    "complex64": lambda: np.ones(3, dtype=np.complex64),
    "uint8-scalar": lambda: np.array(7, dtype=np.uint8),
    "empty": lambda: np.zeros((0, 3), dtype=np.float32),
}


@pytest.mark.parametrize("kind", sorted(ARRAYS))
def test_a_numeric_array_is_one_tensor_with_the_bytes_numpy_load_gives(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "array.npy"
    np.save(path, ARRAYS[kind]())
    loaded = np.load(path)
    expected = torch.from_numpy(loaded)
    with load_path(str(path)) as source:
        (tensor,) = source.tensors
        assert source.format == "npy" and source.pickle_globals == []
        assert (tensor.dtype, tensor.shape, tensor.stride) == (str(expected.dtype).removeprefix("torch."),
                                                               tuple(expected.shape), expected.stride())
        assert source.reader is not None
        assert bytes(source.reader.read(tensor.storage_key, 0, loaded.nbytes)) == loaded.tobytes(order="A")
    report = run_inspection(str(path))
    assert not {f.code for f in report.findings} & {"ML601", "ML201"} or kind == "float64-fortran"


def test_a_big_endian_array_is_reported_as_its_bytes(tmp_path: Path) -> None:
    path = tmp_path / "big.npy"
    np.save(path, np.arange(4, dtype=">f4"))
    with load_path(str(path)) as source:
        (tensor,) = source.tensors
        assert (tensor.dtype, tensor.shape) == ("uint8", (16,))
        assert any(">f4 has no torch counterpart" in note for note in source.notes)


def test_an_array_of_objects_names_what_numpy_load_would_import_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    path = tmp_path / "objects.npy"
    np.save(path, np.array([{"lr": 0.1}, "text", Payload(marker)], dtype=object), allow_pickle=True)
    source = load_path(str(path))
    named = {(g.module, g.name) for g in source.pickle_globals}
    imported, outcome = imported_by("numpy.load", path)
    assert named == imported and ("posix", "system") in named, (named, imported)
    assert "refused os.system" in outcome  # numpy.load got as far as running the payload
    (finding,) = [f for f in run_inspection(str(path)).findings if f.code == "ML601"]
    assert "numpy.load refuses unless allow_pickle=True" in finding.message
    assert "posix.system can run arbitrary code" in finding.message
    assert not marker.exists()


def test_an_array_of_plain_objects_is_cleared_with_what_numpy_load_needs(tmp_path: Path) -> None:
    # Numbers, strings and dicts pickle through numpy's own array globals only: allow_pickle=True
    # imports numpy and nothing else. numpy's default still refuses it, which the note says.
    path = tmp_path / "plain.npy"
    np.save(path, np.array([{"a": 1}, "b", np.float64(2.0)], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle=False"):
        np.load(path)
    report = run_inspection(str(path))
    assert "ML601" not in {f.code for f in report.findings}
    assert "refuses unless allow_pickle=True" in report.facts.source.notes[0]


def test_the_hint_of_an_array_of_objects_is_followed(tmp_path: Path) -> None:
    from fractions import Fraction

    path = tmp_path / "mixed.npy"
    np.save(path, np.array([Fraction(3, 2), 2.5], dtype=object), allow_pickle=True)
    (finding,) = [f for f in run_inspection(str(path)).findings if f.code == "ML601"]
    assert "numpy.load(allow_pickle=True) would import fractions" in finding.message
    assert finding.severity.value == "warning"  # a Fraction is built, nothing runs
    assert "re-save what it holds without objects (an array of a numeric dtype" in finding.hint
    np.save(path, np.load(path, allow_pickle=True).astype(np.float64))  # trusting it, as the hint says
    assert "ML601" not in {f.code for f in run_inspection(str(path)).findings}
    np.load(path)  # and numpy's default reads it


@pytest.mark.parametrize("compressed", [False, True], ids=["savez", "savez_compressed"])
def test_an_npz_has_one_tensor_per_numeric_member_and_flags_object_members(tmp_path: Path, compressed: bool) -> None:
    marker = tmp_path / "PWNED"
    path = tmp_path / "arrays.npz"
    save = np.savez_compressed if compressed else np.savez
    save(path, weight=np.ones((2, 3), np.float32), step=np.array(3), objects=np.array([Payload(marker)], dtype=object))
    source = load_path(str(path))
    assert source.format == "npz"
    assert {t.name: t.shape for t in source.tensors} == {"weight": (2, 3), "step": ()}
    named = {(g.module, g.name) for g in source.pickle_globals}
    assert named == imported_by("numpy.load(npz)", path)[0]
    assert ("posix", "system") in named
    assert (source.reader is None) == compressed
    if not compressed:
        assert bytes(source.reader.read("weight", 0, 24)) == np.load(path)["weight"].tobytes()
    assert not marker.exists()


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        (lambda data: data[:8], "ends inside its .npy header"),
        (lambda data: data[:10] + b"{'descr': '<f4', 'shape': (2,)" + data[40:], "not a Python literal"),
        (lambda data: data[:-4], "holds 4 bytes of data; its header says 8"),
        (lambda data: data[:6] + b"\x09" + data[7:], "version 9"),
    ],
    ids=["no-magic", "header", "short", "version"],
)
def test_a_damaged_npy_is_one_line_and_exit_2(tmp_path: Path, damage: object, fragment: str) -> None:
    path = tmp_path / "damaged.npy"
    np.save(path, np.ones(2, np.float32))
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    assert_one_line_error(run_cli("inspect", str(path)), fragment)
