"""Tables memlayout copies from torch are compared with torch's own, as flake8 tests its pycodestyle codes.

A copy drifts when torch changes: these fail on the torch upgrade that changes
them, and say what to add or remove.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest
import torch
from torch import _weights_only_unpickler
from torch._export.serde import serialize

from memlayout import _torch
from memlayout.load import weights_only_allowlist
from memlayout.load.pt2 import SCALAR_TYPES
from memlayout.load.weights_only_allowlist import (
    WEIGHTS_ONLY_ALLOWED_PATHS,
    WEIGHTS_ONLY_COPIED_FROM,
    WEIGHTS_ONLY_NEWER_THAN_OLDEST,
    weights_only_allows,
)
from memlayout.pipeline.inspection import run_inspection

TORCH_VERSION = torch.__version__.split("+")[0]
NEWER = {f"{module}.{name}" for module, name in WEIGHTS_ONLY_NEWER_THAN_OLDEST}


def _makefile_torch(which: str) -> str:
    """The Makefile's TORCH_NEWEST or TORCH_OLDEST: the ends of the tested range (make test-torch-matrix)."""
    text = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    found = re.search(rf"^TORCH_{which} \?= (\S+)$", text, re.MULTILINE)
    assert found, f"the Makefile names no TORCH_{which}"
    return found.group(1)


def _torchs_list() -> frozenset[str]:
    torchs = _torch.weights_only_default_globals()
    assert torchs is not None
    return torchs


def test_weights_only_allowlist_is_torchs_own() -> None:
    """Runs on every torch of the matrix: the copy covers what this torch accepts, and what it adds is listed as
    newer than the oldest torch, so that this torch is asked about it."""
    torchs = _torchs_list()
    assert torchs == set(_weights_only_unpickler._get_allowed_globals())
    missing = sorted(torchs - WEIGHTS_ONLY_ALLOWED_PATHS)
    assert not missing, (f"torch {TORCH_VERSION} accepts what the copy (from {WEIGHTS_ONLY_COPIED_FROM}) lacks: "
                         f"{missing}")
    unasked = sorted(WEIGHTS_ONLY_ALLOWED_PATHS - torchs - NEWER)
    assert not unasked, f"torch {TORCH_VERSION} refuses what the copy accepts without asking it: {unasked}"
    if TORCH_VERSION == WEIGHTS_ONLY_COPIED_FROM:
        assert torchs == WEIGHTS_ONLY_ALLOWED_PATHS
    if _makefile_torch("OLDEST") == TORCH_VERSION:  # the fast path is as wide as the range allows
        assert WEIGHTS_ONLY_ALLOWED_PATHS - torchs == NEWER


def test_the_copy_comes_from_the_newest_torch_of_the_matrix() -> None:
    assert _makefile_torch("NEWEST") == WEIGHTS_ONLY_COPIED_FROM


def test_a_global_outside_the_copy_is_decided_by_the_installed_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    # As if the copy were older than torch: torch's own answer wins, both ways.
    monkeypatch.setattr(weights_only_allowlist, "WEIGHTS_ONLY_ALLOWED",
                        weights_only_allowlist.WEIGHTS_ONLY_ALLOWED - {("torch", "float32")})
    assert weights_only_allows("torch", "float32")
    monkeypatch.setattr(weights_only_allowlist, "WEIGHTS_ONLY_ALLOWED",
                        weights_only_allowlist.WEIGHTS_ONLY_ALLOWED | {("os", "system")})
    monkeypatch.setattr(weights_only_allowlist, "WEIGHTS_ONLY_NEWER_THAN_OLDEST", frozenset({("os", "system")}))
    assert not weights_only_allows("os", "system")


def test_every_dtype_torch_loads_weights_only_is_no_ml601(tmp_path: Path) -> None:
    """ML601 says torch.load(weights_only=True) refuses the file: never for a file it loads (torch 2.14 added
    torch.bcomplex32, which a copy from 2.13 lacked)."""
    names = [path.removeprefix("torch.") for path in _torchs_list() if path.startswith("torch.")]
    dtypes = {name: getattr(torch, name) for name in names if isinstance(getattr(torch, name, None), torch.dtype)}
    path = tmp_path / "dtypes.pt"
    torch.save(dtypes, path)
    assert torch.load(path, weights_only=True) == dtypes
    report = run_inspection(str(path))
    assert [f.message for f in report.findings if f.code == "ML601"] == []


def _torch_accepts(module: str, name: str) -> bool:
    """Whether torch's weights-only unpickler resolves `GLOBAL module name` (it runs nothing else)."""
    import io

    data = b"c" + module.encode() + b"\n" + name.encode() + b"\n."  # GLOBAL, STOP
    try:
        _weights_only_unpickler.Unpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError:
        return False
    return True


# Python 2 spellings torch maps through _compat_pickle, and globals it refuses.
_OTHER_GLOBALS = [
    ("__builtin__", "set"), ("__builtin__", "bytearray"), ("__builtin__", "complex"), ("copy_reg", "_reconstructor"),
    ("builtins", "dict"), ("builtins", "list"), ("builtins", "getattr"), ("builtins", "eval"), ("os", "system"),
    ("posix", "system"), ("torch.nn.modules.linear", "Linear"), ("torch", "strided"), ("torch", "channels_last"),
    ("collections", "defaultdict"), ("numpy.core.multiarray", "_reconstruct"),
]


def test_weights_only_allows_agrees_with_torchs_unpickler() -> None:
    paths = sorted(WEIGHTS_ONLY_ALLOWED_PATHS | _torchs_list())
    cases = [tuple(path.rsplit(".", 1)) for path in paths] + _OTHER_GLOBALS
    disagree = [(m, n) for m, n in cases if weights_only_allows(m, n) != _torch_accepts(m, n)]
    assert not disagree


def test_pt2_scalar_types_are_torch_exports_own() -> None:
    torchs = {int(code): str(dtype).removeprefix("torch.")
              for code, dtype in serialize._SERIALIZE_TO_TORCH_DTYPE.items()}
    # An older torch knows fewer codes (2.6 has none from 29, the float8 types, up); a code never changes meaning.
    assert torchs.items() <= SCALAR_TYPES.items(), (f"torch {TORCH_VERSION} differs: "
                                                    f"{torchs.items() - SCALAR_TYPES.items()}")
    if _makefile_torch("NEWEST") == TORCH_VERSION:
        assert torchs == SCALAR_TYPES
    # And every code torch writes is one it reads back.
    assert {int(code) for code in serialize._TORCH_TO_SERIALIZE_DTYPE.values()} == set(torchs)
    assert all(isinstance(getattr(torch, name), torch.dtype) for name in SCALAR_TYPES.values())
