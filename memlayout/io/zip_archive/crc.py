"""CRC-32: of bytes, fast, and of a concatenation from the CRCs of its parts."""

from __future__ import annotations

import functools
import zlib
from typing import Any

from memlayout.io.zip_archive.records import SATURATED

_fast_crc32: Any = None


def crc32(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC-32 of `data`, continuing from `value`, as `zlib.crc32` computes it.

    ISA-L's carry-less-multiply CRC (the `isal` package) runs at tens of GB/s where
    zlib's table CRC runs near 2 GB/s, and a flattened checkpoint's every byte is
    summed once when it is verified. Both release the GIL on large buffers.
    """
    global _fast_crc32
    if _fast_crc32 is None:
        try:
            from isal import isal_zlib

            _fast_crc32 = isal_zlib.crc32
        except ImportError:  # a platform without its wheel: zlib gives the same values
            _fast_crc32 = zlib.crc32
    return int(_fast_crc32(data, value))


_CRC_POLY = 0xEDB88320


def _multiply(a: int, b: int) -> int:
    # a * b modulo the CRC-32 polynomial, bit-reflected (zlib's multmodp).
    product = 0
    mask = 1 << 31
    while True:
        if a & mask:
            product ^= b
            if a & (mask - 1) == 0:
                return product
        mask >>= 1
        b = (b >> 1) ^ _CRC_POLY if b & 1 else b >> 1


@functools.cache
def _powers() -> list[int]:
    # x^1, then x^2, x^4, ...: x^(2^k) mod p
    powers = [1 << 30]
    for _ in range(31):
        powers.append(_multiply(powers[-1], powers[-1]))
    return powers


def _crc32_combine_python(first: int, second: int, second_length: int) -> int:
    # x^(8 * second_length) mod p, from the table of x^(2^k) (zlib's x2nmodp).
    powers = _powers()
    power = 1 << 31
    bit = 3
    length = second_length
    while length:
        if length & 1:
            power = _multiply(powers[bit & 31], power)
        length >>= 1
        bit += 1
    return _multiply(power, first) ^ second


def _zlib_combine() -> Any:
    # zlib's own crc32_combine64 through ctypes costs about 1 us a call, against
    # about 50 us for the same arithmetic in Python. The library is the one Python's
    # zlib module is linked against, looked up on first use (the readers never
    # need it) by its usual name; only where that fails is `find_library` asked,
    # which may run `ldconfig`.
    import ctypes

    def combine_in(library: str | None) -> Any:
        try:
            function = ctypes.CDLL(library).crc32_combine64
        except (OSError, AttributeError):
            return None
        function.argtypes = [ctypes.c_ulong, ctypes.c_ulong, ctypes.c_int64]
        function.restype = ctypes.c_ulong
        return function

    function = combine_in("libz.so.1")
    if function is None:
        import ctypes.util

        name = ctypes.util.find_library("z")
        function = combine_in(name) if name else None
    return function or False


_combine_in_c: Any = None


def crc32_combine(first: int, second: int, second_length: int) -> int:
    """CRC-32 of A + B from CRC-32(A), CRC-32(B) and len(B), reading no bytes.

    Args:
        first: CRC-32 of the first part.
        second: CRC-32 of the second part.
        second_length: Length of the second part in bytes.

    Returns:
        CRC-32 of the concatenation, as `zlib.crc32(a + b)`.
    """
    global _combine_in_c
    if _combine_in_c is None:
        _combine_in_c = _zlib_combine()
    if _combine_in_c:
        return int(_combine_in_c(first, second, second_length)) & SATURATED
    return _crc32_combine_python(first, second, second_length)
