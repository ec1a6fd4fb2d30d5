"""torch's default weights-only allow-list, copied, and the one question asked of it.

`RestrictedUnpickler` records, for every global a pickle names, whether
`torch.load(weights_only=True)` would accept it; ML601 reports those it would not,
and flatten's legacy writer refuses them.
"""

from __future__ import annotations

import _compat_pickle

from memlayout import _torch

# Globals torch's own weights-only unpickler accepts by default, copied from
# torch 2.14.1's `torch/_weights_only_unpickler.py` (`_get_allowed_globals`) as
# "module.name" paths. Anything else is what `weights_only=False` would import and
# call, which ML601 reports. Notably absent there, so absent here: builtins.dict,
# list, tuple, int, str, slice, frozenset (pickle builds those with opcodes, never
# globals), layouts such as torch.strided (pickled through _get_layout) and memory
# formats. Where torch is installed, its own list decides every global that might
# differ (`weights_only_allows`); the copy alone serves the install without torch.
# tests/load/test_copied_tables.py compares it with every torch of the tested range.
WEIGHTS_ONLY_COPIED_FROM = "2.14.1"
"""The torch release the copied allow-list below comes from: the newest of the tested range."""
_TENSOR_TYPE_NAMES = ("Double", "Float", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte")
_STORAGE_TYPE_NAMES = (*_TENSOR_TYPE_NAMES, "Bool", "ComplexDouble", "ComplexFloat")
_DTYPE_NAMES = [
    "bcomplex32", "bfloat16", "bits16", "bits1x8", "bits2x4", "bits4x2", "bits8", "bool", "complex128",
    "complex32", "complex64", "float16", "float32", "float4_e2m1fn_x2", "float64",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "int16", "int32", "int64", "int8", "qint32", "qint8", "quint2x4", "quint4x2", "quint8",
    "uint16", "uint32", "uint64", "uint8"
] + [f"{kind}{bits}" for kind in ("int", "uint") for bits in range(1, 8)]
# The dtypes of the copy that torch 2.13.0, the oldest of the tested range, does not accept. (torch
# 2.6.0 also lacks float4_e2m1fn_x2, float8_e8m0fnu, int1-7 and uint1-7.)
_NEWER_DTYPE_NAMES = ["bcomplex32"]
_REBUILD_FUNCTIONS = [
    "_rebuild_parameter", "_rebuild_parameter_with_state", "_rebuild_qtensor",
    "_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_sparse_tensor",
    "_rebuild_meta_tensor_no_storage", "_rebuild_nested_tensor", "_rebuild_wrapper_subclass",
    "_rebuild_device_tensor_from_numpy", "_rebuild_device_tensor_from_cpu_tensor"
]
WEIGHTS_ONLY_ALLOWED_PATHS: frozenset[str] = frozenset(
    [
        "collections.OrderedDict",
        "collections.Counter",
        "torch.nn.parameter.Parameter",
        "torch.serialization._get_layout",
        "torch.Size",
        "torch.Tensor",
        "torch.device",
        "_codecs.encode",
        "builtins.bytearray",
        "builtins.set",
        "builtins.complex",
        "torch._tensor._rebuild_from_type_v2",
        "torch.storage.TypedStorage",
        "torch.storage.UntypedStorage",
        "torch.BoolTensor",
        "torch.cuda.BoolTensor",
        "torch.QInt8Storage",
        "torch.QUInt8Storage",
        "torch.QInt32Storage",
        "torch.QUInt4x2Storage",
        "torch.QUInt2x4Storage",
    ]
    + [f"torch.{name}" for name in _DTYPE_NAMES]
    + [f"torch.{q}" for q in ("per_tensor_affine", "per_tensor_symmetric", "per_channel_affine",
                              "per_channel_symmetric", "per_channel_affine_float_qparams")]
    + [f"torch._utils.{name}" for name in _REBUILD_FUNCTIONS]
    + [f"{ns}{t}Tensor" for ns in ("torch.", "torch.cuda.", "torch.sparse.", "torch.cuda.sparse.")
       for t in _TENSOR_TYPE_NAMES]
    + [f"{ns}{t}Storage" for ns in ("torch.", "torch.cuda.") for t in _STORAGE_TYPE_NAMES]
)
WEIGHTS_ONLY_NEWER_THAN_OLDEST: frozenset[tuple[str, str]] = frozenset(
    ("torch", name) for name in _NEWER_DTYPE_NAMES
)
"""Globals of the copy that the oldest torch of the tested range (2.13.0) does not accept: for these, as
for every global outside the copy, the installed torch is asked."""
WEIGHTS_ONLY_PROTOCOLS: frozenset[int] = frozenset([2, 3])
"""The pickle protocols torch's weights-only unpickler reads: it refuses protocol 1's
text LONG (the legacy magic number) and protocol 4's FRAME."""
WEIGHTS_ONLY_ALLOWED: frozenset[tuple[str, str]] = frozenset(
    (path.rpartition(".")[0], path.rpartition(".")[2]) for path in WEIGHTS_ONLY_ALLOWED_PATHS
)


def weights_only_allows(module: str, name: str) -> bool:
    """Whether torch's default weights-only loader accepts this global.

    Args:
        module: The module as the pickle spells it (Python 2 names included).
        name: The attribute name.

    Returns:
        True when `torch.load(weights_only=True)` would resolve it: the installed
        torch's own answer where torch is installed, else the copy's. Like torch, it
        first maps Python 2 spellings (`__builtin__.set`) to Python 3 ones. Only
        globals that some torch of the tested range refuses import torch, so a
        plain state dict is read without it.
    """
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    if (module, name) in WEIGHTS_ONLY_ALLOWED and (module, name) not in WEIGHTS_ONLY_NEWER_THAN_OLDEST:
        return True  # every torch of the tested range accepts it: no need to import torch
    torchs = _torch.weights_only_default_globals()
    if torchs is None:  # the install without torch: the copy is all there is
        return (module, name) in WEIGHTS_ONLY_ALLOWED
    return f"{module}.{name}" in torchs
