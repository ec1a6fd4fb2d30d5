"""`diff --deep`: whether a tensor's values changed, read from both files in bounded chunks.

Values are compared in logical order whatever the strides. Equal dtypes compare
bit for bit. Different floating dtypes compare B against A converted to B's dtype
the way `tensor.to(dtype)` rounds (to nearest, ties to even), so a checkpoint cast
from float32 to bfloat16 is recognised as a faithful cast rather than "every value
changed". numpy has no bfloat16: its values come from the bit patterns (the upper
half of a float32), and rounding to it is done on float32 bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memlayout.core.content import ContentReader, paired_chunks
from memlayout.core.facts import TensorFact

if TYPE_CHECKING:
    import numpy as np

# Dtypes whose values numpy can hold exactly (bfloat16 through float32).
_FLOAT_WIDTH = {"float64": 3, "float32": 2, "float16": 1, "bfloat16": 1}
_INTEGER = {
    "int64": "<i8", "int32": "<i4", "int16": "<i2", "int8": "i1",
    "uint64": "<u8", "uint32": "<u4", "uint16": "<u2", "uint8": "u1", "bool": "u1",
}


@dataclass(frozen=True)
class ValueComparison:
    """How the values of one tensor in A compare with its match in B."""

    elements: int
    differing: int
    """Elements of B that are not A's (as converted to B's dtype)."""
    max_abs_diff: float | None
    """Largest |B - A| over elements finite in both; None for non-numeric comparisons."""
    how: str
    """"bitwise", "as bfloat16" (A rounded to B's dtype), "as float32" (A widened exactly)."""

    @property
    def equal(self) -> bool:
        return self.differing == 0


def comparable(a: TensorFact, b: TensorFact) -> bool:
    """Whether `compare_values` can compare these two tensors."""
    if a.shape != b.shape or not (a.has_data and b.has_data):
        return False
    if a.dtype == b.dtype:
        return True
    both_float = a.dtype in _FLOAT_WIDTH and b.dtype in _FLOAT_WIDTH
    both_int = a.dtype in _INTEGER and b.dtype in _INTEGER
    return both_float or both_int


def compare_values(a_reader: ContentReader, a: TensorFact, b_reader: ContentReader, b: TensorFact) -> ValueComparison:
    """Compare two tensors of one shape element by element, streaming both.

    Args:
        a_reader: Reads A's contents.
        a: The tensor in A.
        b_reader: Reads B's contents.
        b: Its match in B (same shape; `comparable(a, b)` holds).

    Returns:
        The count of differing elements and, for numbers, the largest difference.
    """
    import numpy as np

    differing = 0
    worst: float | None = None
    numeric = a.dtype in _FLOAT_WIDTH or a.dtype in _INTEGER
    how = "bitwise" if a.dtype == b.dtype else f"as {b.dtype}"
    for left, right in paired_chunks(a_reader.chunks(a), b_reader.chunks(b)):
        if a.dtype == b.dtype:
            unequal = left != right
            count = int(np.count_nonzero(unequal))
            if count and numeric:
                worst = _max_abs(worst, _numbers(left[unequal], a.dtype), _numbers(right[unequal], b.dtype))
            differing += count
            continue
        expected = _numbers(left, a.dtype)
        if b.dtype in _FLOAT_WIDTH:
            expected = _round_to(expected, left, a.dtype, b.dtype)
        actual = _numbers(right, b.dtype)
        unequal = expected != actual
        if b.dtype in _FLOAT_WIDTH:
            unequal &= ~(np.isnan(expected) & np.isnan(actual))
        count = int(np.count_nonzero(unequal))
        if count:
            worst = _max_abs(worst, expected[unequal], actual[unequal])
        differing += count
    if worst is None and differing == 0 and numeric:
        worst = 0.0
    return ValueComparison(a.numel, differing, worst if numeric else None, how)


def _numbers(bits: np.ndarray, dtype: str) -> np.ndarray:
    """Bit patterns (unsigned) as numbers: float64 for floats, int64/uint64 for integers."""
    import numpy as np

    if dtype == "bfloat16":
        return (bits.astype(np.uint32) << 16).view("<f4").astype(np.float64)
    if dtype in _FLOAT_WIDTH:
        return bits.view({"float64": "<f8", "float32": "<f4", "float16": "<f2"}[dtype]).astype(np.float64)
    return bits.view(_INTEGER[dtype])


def _round_to(values: np.ndarray, bits: np.ndarray, source: str, target: str) -> np.ndarray:
    """A's values as `tensor.to(target)` would leave them, back in float64 (or as given for integers)."""
    import numpy as np

    if source in _FLOAT_WIDTH and _FLOAT_WIDTH[target] > _FLOAT_WIDTH[source]:
        return values  # widening is exact (bfloat16 and float16 are not each other's subsets)
    if target == "float32":
        return values.astype(np.float32).astype(np.float64)
    if target == "float16":
        return values.astype(np.float16).astype(np.float64)
    # bfloat16: round the float32 bit pattern to its upper 16 bits, to nearest, ties to
    # even, as torch does (c10::BFloat16's round_to_nearest_even); NaN stays NaN.
    as_float32 = bits.view("<f4") if source == "float32" else values.astype(np.float32)
    word = as_float32.view(np.uint32).astype(np.uint64)
    rounded = ((word + 0x7FFF + ((word >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view("<f4")
    return np.where(np.isnan(as_float32), np.nan, rounded.astype(np.float64))


def _max_abs(worst: float | None, expected: Any, actual: Any) -> float | None:
    import numpy as np

    diff = np.abs(np.asarray(actual, dtype=np.float64) - np.asarray(expected, dtype=np.float64))
    diff = diff[np.isfinite(diff)]
    if diff.size == 0:
        return worst
    top = float(diff.max())
    return top if worst is None else max(worst, top)
