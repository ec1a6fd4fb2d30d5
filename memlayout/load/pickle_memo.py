"""Refuse a pickle whose memo indices would make CPython's unpickler allocate without bound.

CPython's C unpickler keeps its memo as a dense array: `LONG_BINPUT i` (or text
`PUT i`) grows it to `2 * i` slots and writes NULL into every new one, so an
86-byte pickle that says `LONG_BINPUT 959917433` makes the process touch 15 GB
before it reads a single further byte (found by fuzzing; the pure-Python
unpickler, torch's weights-only one included, keeps a dict and is not affected).
A pickle's writer numbers memo entries 0, 1, 2, ... as it stores them, and every
store takes at least two bytes, so no genuine index reaches the pickle's length.

`check_memo_indices` walks the opcodes, without building anything, up to STOP,
and refuses any index at or beyond the pickle's length: the memo then stays under
16 bytes per byte of pickle. The walk follows each opcode's argument layout from
`pickletools`, which documents the format the C unpickler reads.
"""

from __future__ import annotations

import contextlib
import functools
import io
import pickletools
import re
import sys
from collections.abc import Callable
from typing import Any

from memlayout.errors import CorruptCheckpointError

# How the walk steps over each opcode: a positive number is the opcode's whole
# size; the rest name an argument layout, or one of the two opcodes that matter.
_LENGTH4, _LENGTH1, _ONE_LINE, _TWO_LINES, _LENGTH8, _LONG_BINPUT, _PUT, _STOP, _UNKNOWN = range(-1, -10, -1)


def _step_table() -> list[int]:
    table = [_UNKNOWN] * 256
    for opcode in pickletools.opcodes:
        argument = opcode.arg
        if opcode.name == "LONG_BINPUT":
            kind = _LONG_BINPUT
        elif opcode.name == "PUT":
            kind = _PUT
        elif opcode.name == "STOP":
            kind = _STOP
        elif argument is None or argument.n >= 0:
            kind = 1 + (argument.n if argument is not None else 0)
        elif argument.n == pickletools.UP_TO_NEWLINE:
            # GLOBAL and INST name a module and a class: two lines.
            kind = _TWO_LINES if opcode.name in ("GLOBAL", "INST") else _ONE_LINE
        elif argument.n == pickletools.TAKEN_FROM_ARGUMENT1:
            kind = _LENGTH1
        elif argument.n in (pickletools.TAKEN_FROM_ARGUMENT4, pickletools.TAKEN_FROM_ARGUMENT4U):
            kind = _LENGTH4
        elif argument.n == pickletools.TAKEN_FROM_ARGUMENT8U:
            kind = _LENGTH8
        else:  # pragma: no cover - a layout pickletools does not have today
            raise AssertionError(f"unknown argument layout of {opcode.name}")
        table[ord(opcode.code)] = kind
    return table


_STEPS = _step_table()


_RUN = 4096
STRINGS_FROM_BITS = 20
"""`_fixed_size_run` steps over short strings too for pickles of 2**20 bytes and more."""


@functools.cache
def _fixed_size_run(bits: int) -> Callable[[bytes, int], re.Match[bytes] | None]:
    """A compiled regex's `match` that steps over a run of fixed-size opcodes.

    LONG_BINPUTs are part of a run only when their index is below `2**bits`. Every
    alternative starts with a different opcode byte, so the run is matched without
    backtracking, in compiled code.

    From `STRINGS_FROM_BITS` up, a BINUNICODE of fewer than 256 bytes is part of a
    run too, one alternative per length: a torch state dict's pickle has two per
    tensor (its name, its storage key), and each ended the run, costing a step of
    the walk in Python. The 256 alternatives take a few ms to compile, which only a
    pickle of a megabyte or more (thousands of tensors) wins back.
    """
    by_size: dict[int, list[int]] = {}
    for code, step in enumerate(_STEPS):
        if step > 0:
            by_size.setdefault(step, []).append(code)
    fixed_size = [
        b"[" + b"".join(re.escape(bytes([code])) for code in codes) + b"]" + b"." * (size - 1)
        for size, codes in sorted(by_size.items())
    ]
    # The engine tries alternatives in order, so the commonest opcodes of a large
    # pickle come first: those of one and two bytes, then memo stores and short
    # strings (a torch state dict has eight and two per tensor), then the rare
    # longer ones. Tried before the memo stores, the three longer alternatives
    # cost 6 of the 42 ms of the walk of a 40,000-tensor pickle.
    alternatives = fixed_size[:2]
    # A little-endian uint32 below 2**bits: its top bytes zero, the one holding bit
    # `bits` below 2**(bits % 8), the rest anything.
    whole, rest = divmod(min(bits, 32), 8)
    index = [b"."] * whole + ([b"[\\x00-" + re.escape(bytes([(1 << rest) - 1])) + b"]"] if rest else [])
    index += [b"\\x00"] * (4 - len(index))
    long_binput = next(op for op in pickletools.opcodes if op.name == "LONG_BINPUT").code.encode("latin-1")
    alternatives.append(re.escape(long_binput) + b"".join(index))
    if bits >= STRINGS_FROM_BITS:
        # The opcode, a little-endian uint32 length below 256, then that many bytes.
        binunicode = next(op for op in pickletools.opcodes if op.name == "BINUNICODE").code.encode("latin-1")
        lengths = [re.escape(bytes([length])) + b"\\x00\\x00\\x00" + b".{%d}" % length for length in range(256)]
        alternatives.append(re.escape(binunicode) + b"(?:" + b"|".join(lengths) + b")")
    alternatives += fixed_size[2:]
    # At most _RUN opcodes per match: the regex engine keeps a little state for each
    # repetition until the match ends, and a DCP .metadata's storage table is one
    # uninterrupted run of millions of fixed-size opcodes. The repetition is
    # possessive where the engine has it (Python 3.11): no alternative is a prefix
    # of another, so there is never anything to backtrack to, and not recording
    # where to go back to saves a tenth of the walk. The match is the same.
    possessive = b"+" if sys.version_info >= (3, 11) else b""
    return re.compile(b"(?:" + b"|".join(alternatives) + b"){0,%d}" % _RUN + possessive, re.DOTALL).match


def largest_memo_index(data: bytes, start: int = 0, skip_below: int = 0) -> tuple[int, int, bool]:
    """The largest index any PUT or LONG_BINPUT of the pickle at `data[start:]` stores to.

    Args:
        data: Bytes holding the pickle (anything after its STOP is ignored).
        start: Where the pickle starts.
        skip_below: LONG_BINPUT indices below the largest power of two not above
            this are not looked at (nor counted): runs of fixed-size opcodes are
            then stepped over by a compiled regex. 0 looks at every opcode.

    Returns:
        (largest index or -1; where the walk ended: just past STOP, or at an unknown
        opcode, where the unpickler stops too; whether the data ran out first).
    """
    position, end, largest = start, len(data), -1
    steps, find, from_bytes = _STEPS, data.find, int.from_bytes
    # One pass of a few comparisons per opcode, or, skipping, per variable-length
    # opcode the regex does not step over (a torch state dict's pickle has two
    # strings per tensor, its name and its storage key, among two dozen fixed-size
    # opcodes; a large pickle's regex steps over short strings as well).
    skip = _fixed_size_run(skip_below.bit_length() - 1) if skip_below > 0 else None
    while position < end:
        if skip is not None:
            run = skip(data, position)
            if run is not None:
                position = run.end()
            if position >= end:
                break
        step = steps[data[position]]
        if step > 0:
            position += step
        elif step == _LENGTH4:
            position += 5 + from_bytes(data[position + 1 : position + 5], "little")
        elif step == _LONG_BINPUT:
            index = from_bytes(data[position + 1 : position + 5], "little")
            if index > largest:
                largest = index
            position += 5
        elif step == _LENGTH1:
            if position + 1 >= end:
                break
            position += 2 + data[position + 1]
        elif step == _STOP:
            return largest, position + 1, False
        elif step in (_ONE_LINE, _PUT):
            line_end = find(b"\n", position + 1)
            if line_end < 0:
                break
            if step == _PUT:
                with contextlib.suppress(ValueError):  # not a number: the unpickler refuses it
                    largest = max(largest, int(data[position + 1 : line_end]))
            position = line_end + 1
        elif step == _TWO_LINES:
            first_end = find(b"\n", position + 1)
            line_end = find(b"\n", first_end + 1) if first_end >= 0 else -1
            if line_end < 0:
                break
            position = line_end + 1
        elif step == _LENGTH8:
            position += 9 + from_bytes(data[position + 1 : position + 9], "little")
        else:
            return largest, position, False  # an unknown opcode: the unpickler stops here as well
    return largest, min(position, end), True


_IMPORTS = frozenset(ord(op.code) for op in pickletools.opcodes if op.name in ("GLOBAL", "INST", "STACK_GLOBAL"))
_FAILS_WITHOUT_PERSISTENT_LOAD = frozenset(ord(op.code) for op in pickletools.opcodes if op.name.endswith("PERSID"))


def reaches_an_import_or_stop(data: bytes) -> bool:
    """Whether `pickle.load` could get as far as importing a global, or to STOP, on bytes starting with `data`.

    A cheap walk of the opcodes' layout, building nothing: an opcode that is no
    opcode, or a persistent id (which plain `pickle.load` refuses), before any
    global and before STOP means the unpickler stops there having imported nothing.
    A folder walk asks this of every file that opens with an opcode byte (a PNG
    does: NEWFALSE, then PERSID), so that only a possible pickle costs an unpickler.

    Args:
        data: The file's first bytes.

    Returns:
        False when the unpickler must fail before any import; True when the walk
        meets a global, STOP, or the end of `data` (the rest of the file decides).
    """
    position, end, steps = 0, len(data), _STEPS
    while position < end:
        code = data[position]
        if code in _IMPORTS:
            return True
        if code in _FAILS_WITHOUT_PERSISTENT_LOAD:
            return False
        step = steps[code]
        if step > 0:
            position += step
        elif step in (_LONG_BINPUT, _LENGTH4):
            position += 5 + (int.from_bytes(data[position + 1 : position + 5], "little") if step == _LENGTH4 else 0)
        elif step == _LENGTH1:
            position += 2 + (data[position + 1] if position + 1 < end else 0)
        elif step == _LENGTH8:
            position += 9 + int.from_bytes(data[position + 1 : position + 9], "little")
        elif step in (_ONE_LINE, _PUT):
            line_end = data.find(b"\n", position + 1)
            if line_end < 0:
                return True
            position = line_end + 1
        else:
            return step == _STOP  # _TWO_LINES is GLOBAL or INST, met above; the rest is no opcode
    return True


def _refuse_far_indices(largest: int, length: int, what: str) -> None:
    if largest >= max(length, 256):
        raise CorruptCheckpointError(
            f"{what} could not be read: it stores to memo slot {largest:,}, beyond what a pickle "
            f"of {length:,} bytes can hold"
        )


def check_memo_indices(data: bytes, what: str, start: int = 0) -> None:
    """Refuse the pickle at `data[start:]` if a memo index reaches its length.

    Indices below the largest power of two within `data[start:]` are never
    refused, so runs of opcodes holding only those are stepped over in compiled
    code. When the pickle ends well before the data does, the indices skipped may
    reach its length after all, and the walk is repeated with the pickle's length.

    Raises:
        CorruptCheckpointError: an index no genuine pickle of this size can hold.
    """
    bound = max(len(data) - start, 256)
    largest, end, _ = largest_memo_index(data, start, skip_below=bound)
    length = end - start
    if 1 << (bound.bit_length() - 1) > max(length, 256):
        largest, end, _ = largest_memo_index(data, start, skip_below=max(length, 256))
    _refuse_far_indices(largest, end - start, what)


_CHUNK = 1 << 20


def check_stream_memo_indices(stream: Any, what: str, opcodes_before: int | None = None) -> None:
    """`check_memo_indices` for a pickle read from a stream; the stream's position is kept.

    Reads ahead only as far as the pickle's STOP (doubling a window from 1 MiB), so
    a legacy file's storages after its pickle are not read.

    Args:
        stream: A binary stream (read, seek, tell) at the pickle's opcodes.
        what: The pickle, as the error names it.
        opcodes_before: Bytes of the same pickle's opcodes before the stream's
            position, when it resumes there: a joblib file resumes its pickle after
            each array's raw bytes, and the memo indices may count every opcode since
            the start, but not the arrays' bytes.
    """
    if isinstance(stream, io.BytesIO) and opcodes_before is None:
        # getvalue() hands back the bytes the stream was made from, uncopied; a
        # memoryview's tobytes() copied the whole pickle (5 MB at 40,000 tensors),
        # and exporting the buffer made the stream copy it first, a second time.
        check_memo_indices(stream.getvalue(), what, stream.tell())
        return
    position = stream.tell()
    before = opcodes_before or 0
    try:
        window = stream.read(_CHUNK)
        while True:
            largest, end, ran_out = largest_memo_index(window)
            more = stream.read(len(window)) if ran_out else b""
            if not more:
                _refuse_far_indices(largest, before + end, what)
                return
            window += more
    finally:
        stream.seek(position)
