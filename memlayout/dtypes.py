"""Torch dtypes described without importing torch.

Loaders that read files name dtypes by torch's short names ("float32", "bfloat16")
so that facts and rules never need torch. The table also tells the content checks
how to find NaN and Inf from bit patterns alone, which works for formats numpy
lacks (bfloat16, float8).
"""

from __future__ import annotations

from typing import NamedTuple


class DtypeInfo(NamedTuple):
    """What memlayout needs to know about one torch dtype."""

    name: str
    """torch's name without the `torch.` prefix, e.g. "float32"."""
    itemsize: int
    """Bytes per element."""
    is_floating: bool
    """A real floating type (complex types are not)."""
    special_mask: int | None = None
    """Bits to test for a non-finite value: an element is NaN or Inf exactly when
    `bits & special_mask == special_pattern`. None for non-floating types."""
    special_pattern: int | None = None


def _ieee(name: str, itemsize: int, exponent_bits: int, mantissa_bits: int) -> DtypeInfo:
    # IEEE-style: an all-ones exponent is Inf (zero mantissa) or NaN.
    mask = ((1 << exponent_bits) - 1) << mantissa_bits
    return DtypeInfo(name, itemsize, True, mask, mask)


DTYPES: dict[str, DtypeInfo] = {
    info.name: info
    for info in [
        _ieee("float64", 8, 11, 52),
        _ieee("float32", 4, 8, 23),
        _ieee("float16", 2, 5, 10),
        _ieee("bfloat16", 2, 8, 7),
        _ieee("float8_e5m2", 1, 5, 2),
        # The "fn" float8 types have no Inf; NaN is one pattern ("fnuz": negative zero's).
        DtypeInfo("float8_e5m2fnuz", 1, True, 0xFF, 0x80),
        DtypeInfo("float8_e4m3fn", 1, True, 0x7F, 0x7F),
        DtypeInfo("float8_e4m3fnuz", 1, True, 0xFF, 0x80),
        DtypeInfo("float8_e8m0fnu", 1, True, 0xFF, 0xFF),
        DtypeInfo("complex128", 16, False),
        DtypeInfo("complex64", 8, False),
        DtypeInfo("complex32", 4, False),
        DtypeInfo("int64", 8, False),
        DtypeInfo("int32", 4, False),
        DtypeInfo("int16", 2, False),
        DtypeInfo("int8", 1, False),
        DtypeInfo("uint64", 8, False),
        DtypeInfo("uint32", 4, False),
        DtypeInfo("uint16", 2, False),
        DtypeInfo("uint8", 1, False),
        DtypeInfo("bool", 1, False),
        DtypeInfo("qint8", 1, False),
        DtypeInfo("quint8", 1, False),
        DtypeInfo("qint32", 4, False),
        DtypeInfo("quint4x2", 1, False),
        DtypeInfo("float4_e2m1fn_x2", 1, False),
    ]
}

# Legacy typed-storage class names as they appear in torch.save pickles
# ("torch FloatStorage"), mapped to the element dtype they hold.
STORAGE_CLASS_DTYPES: dict[str, str] = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64",
    "QInt8Storage": "qint8",
    "QUInt8Storage": "quint8",
    "QInt32Storage": "qint32",
    "QUInt4x2Storage": "quint4x2",
    "UntypedStorage": "uint8",
}

# safetensors' dtype codes, mapped to torch names.
SAFETENSORS_DTYPES: dict[str, str] = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E8M0": "float8_e8m0fnu",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
    "C64": "complex64",
}


def dtype_info(name: str) -> DtypeInfo:
    """Look up a dtype by torch's short name; unknown names get a 1-byte opaque entry.

    Args:
        name: "float32", or "torch.float32" (the prefix is dropped).

    Returns:
        The `DtypeInfo`. An unknown dtype is treated as opaque bytes so that layout
        checks still work on it; content checks skip it.
    """
    # Called per tensor by facts and rules: the usual short name is one dict hit.
    known = DTYPES.get(name)
    if known is not None:
        return known
    short = name.removeprefix("torch.")
    return DTYPES.get(short, DtypeInfo(short, 1, False))
