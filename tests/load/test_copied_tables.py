"""Tables memlayout copies from torch are compared with torch's own, as flake8 tests its pycodestyle codes.

A copy drifts when torch changes: these fail on the torch upgrade that changes
them, and say what to add or remove.
"""

from __future__ import annotations

import pickle

import torch
from torch import _weights_only_unpickler
from torch._export.serde import serialize

from memlayout.load.pt2 import SCALAR_TYPES
from memlayout.load.restricted_pickle import WEIGHTS_ONLY_ALLOWED_PATHS, weights_only_allows


def test_weights_only_allowlist_is_torchs_own() -> None:
    torchs = set(_weights_only_unpickler._get_allowed_globals())
    assert not torchs - WEIGHTS_ONLY_ALLOWED_PATHS, f"add to the allowlist: {sorted(torchs - WEIGHTS_ONLY_ALLOWED_PATHS)}"
    assert not WEIGHTS_ONLY_ALLOWED_PATHS - torchs, f"remove from the allowlist: {sorted(WEIGHTS_ONLY_ALLOWED_PATHS - torchs)}"


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
    cases = [tuple(path.rsplit(".", 1)) for path in sorted(WEIGHTS_ONLY_ALLOWED_PATHS)] + _OTHER_GLOBALS
    disagree = [(m, n) for m, n in cases if weights_only_allows(m, n) != _torch_accepts(m, n)]
    assert not disagree


def test_pt2_scalar_types_are_torch_exports_own() -> None:
    torchs = {int(code): str(dtype).removeprefix("torch.") for code, dtype in serialize._SERIALIZE_TO_TORCH_DTYPE.items()}
    assert torchs == SCALAR_TYPES
    # And every code torch writes is one it reads back.
    assert {int(code) for code in serialize._TORCH_TO_SERIALIZE_DTYPE.values()} == set(torchs)
    assert all(isinstance(getattr(torch, name), torch.dtype) for name in SCALAR_TYPES.values())
