"""What each format's first bytes (or a directory's file names) look like, read without its loader.

A command that reads a torch zip should not import the safetensors, pt2 or pickle
loaders just to hear them say no. Each check here needs only the path and the
first bytes; where the bytes match but only the loader can tell for sure (a
pickle's first object, a tar's first member), `load.FORMATS` names a second
check in the loader's own module, run only then.
"""

from __future__ import annotations

import functools
import os
import struct

ZIP_LOCAL_HEADER = b"PK\x03\x04"
NPY_MAGIC = b"\x93NUMPY"
"""How numpy's .npy format opens (numpy.lib.format.MAGIC_PREFIX)."""

SAFETENSORS_HEADER_LENGTH_BYTES = 8
"""A safetensors file opens with the header's length, a little-endian u64."""
SAFETENSORS_MAX_HEADER_BYTES = 100_000_000
"""The largest header safetensors itself reads (MAX_HEADER_SIZE in the Rust crate): a bigger
length is a damaged file, and reading it would be a memory bomb."""

HF_SAFETENSORS_INDEX = "model.safetensors.index.json"
HF_SAFETENSORS_SINGLE = "model.safetensors"
HF_BIN_INDEX = "pytorch_model.bin.index.json"
HF_BIN_SINGLE = "pytorch_model.bin"
HF_WEIGHT_FILES = (HF_SAFETENSORS_INDEX, HF_SAFETENSORS_SINGLE, HF_BIN_INDEX, HF_BIN_SINGLE)
"""The standard weight and index file names of a Hugging Face model directory."""

DCP_METADATA_FILE = ".metadata"
DCP_DATA_SUFFIX = ".distcp"

PT2_WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
PT2_OLDER_PROGRAM = "serialized_exported_program.json"

TAR_MAGIC = b"ustar"
TAR_MAGIC_AT = 257
TAR_BLOCK = 512

PICKLE_PROTO = 0x80
PICKLE_HIGHEST_PROTOCOL = 5
"""pickle.HIGHEST_PROTOCOL of every Python memlayout runs on (3.8 to now); a test holds it to pickle's."""
_CANNOT_OPEN = frozenset(["GET", "BINGET", "LONG_BINGET", "PUT", "BINPUT", "LONG_BINPUT", "PERSID", "NEXT_BUFFER"])


@functools.cache
def opening_opcodes() -> frozenset[int]:
    """The opcodes `pickle.load` can read first: those that push onto an empty stack,
    except the memo's (empty at first), a persistent id (torch.load's first
    pickle.load is given no persistent_load) and NEXT_BUFFER (nor any buffers)."""
    # pickletools only once a file's bytes are asked about: `memlayout rules` loads this
    # package too, and never reads a file.
    import pickletools

    return frozenset(
        ord(op.code) for op in pickletools.opcodes if not op.stack_before and op.name not in _CANNOT_OPEN
    )


def is_zip(path: str, head: bytes) -> bool:
    """Whether the first bytes are a zip's local file header, as torch.save's zip format writes first."""
    return head.startswith(ZIP_LOCAL_HEADER)


def is_npy(path: str, head: bytes) -> bool:
    """Whether the first bytes are numpy's .npy magic string."""
    return head.startswith(NPY_MAGIC)


def looks_like_safetensors(head: bytes) -> bool:
    """Whether the first bytes are a safetensors header start: a length, then `{`.

    Args:
        head: The file's first bytes (at least 10 to match).

    Returns:
        True when byte 8 opens a JSON object and the length is plausible.
    """
    opening = head[SAFETENSORS_HEADER_LENGTH_BYTES : SAFETENSORS_HEADER_LENGTH_BYTES + 2]
    if len(opening) < 2 or opening[:1] != b"{":
        return False
    # A JSON object's next byte opens a key, closes it, or is whitespace; and the
    # length must be one safetensors accepts. Random bytes pass both with odds
    # around 1e-13, so noise stays "unrecognized" instead of "damaged safetensors".
    if opening[1:] not in (b'"', b"}", b" ", b"\n", b"\r", b"\t"):
        return False
    length: int = struct.unpack("<Q", head[:SAFETENSORS_HEADER_LENGTH_BYTES])[0]
    return 2 <= length <= SAFETENSORS_MAX_HEADER_BYTES


def is_safetensors(path: str, head: bytes) -> bool:
    return looks_like_safetensors(head)


def is_hf_dir(path: str, head: bytes) -> bool:
    """Whether a directory holds Hugging Face weights by their standard file names (never a file)."""
    return not head and any(os.path.isfile(os.path.join(path, name)) for name in HF_WEIGHT_FILES)


def is_dcp_dir(path: str, head: bytes) -> bool:
    """Whether a directory looks like a torch.distributed.checkpoint save: `.metadata` or any `*.distcp`."""
    if head:
        return False
    if os.path.isfile(os.path.join(path, DCP_METADATA_FILE)):
        return True
    try:
        return any(name.endswith(DCP_DATA_SUFFIX) for name in os.listdir(path))
    except OSError:
        return False


def is_pt2_zip(path: str, head: bytes) -> bool:
    """Whether a zip is a torch.export archive: its directory lists `<archive>/archive_format`,
    a weights config or the older layout's exported program."""
    if not is_zip(path, head):
        return False
    from memlayout.io.zip_archive import central_directory_bytes

    directory = central_directory_bytes(path)
    return (
        b"/archive_format" in directory
        or PT2_WEIGHTS_CONFIG.encode() in directory
        or PT2_OLDER_PROGRAM.encode() in directory
    )


_CENTRAL_ENTRY = struct.Struct("<4s24xHHH12x")
"""A central directory entry's signature, then its name, extra and comment lengths; the name follows."""


def _directory_names(directory: bytes) -> list[bytes]:
    names, at = [], 0
    while at + _CENTRAL_ENTRY.size <= len(directory):
        signature, name_length, extra_length, comment_length = _CENTRAL_ENTRY.unpack_from(directory, at)
        if signature != b"PK\x01\x02":
            break
        start = at + _CENTRAL_ENTRY.size
        names.append(directory[start : start + name_length])
        at = start + name_length + extra_length + comment_length
    return names


def is_npz(path: str, head: bytes) -> bool:
    """Whether a zip is numpy's `.npz`: every member's name ends in `.npy`, as numpy.savez writes them."""
    if not is_zip(path, head):
        return False
    from memlayout.io.zip_archive import central_directory_bytes

    directory = central_directory_bytes(path)
    if b".npy" not in directory:
        return False  # most zips: decided without walking the directory
    names = _directory_names(directory)
    return bool(names) and all(name.endswith(b".npy") for name in names)


def lists_a_torch_pickle(path: str) -> bool:
    """Whether a zip's directory names a `data.pkl`, as every torch.save, TorchScript and torch.export zip does."""
    from memlayout.io.zip_archive import central_directory_bytes

    return b"data.pkl" in central_directory_bytes(path)


def is_torchscript_zip(path: str, head: bytes) -> bool:
    """Whether a zip holds a TorchScript archive: its directory lists `<archive>/constants.pkl` or
    `<archive>/code/`, names torch.save never writes."""
    if not is_zip(path, head):
        return False
    from memlayout.io.zip_archive import central_directory_bytes

    directory = central_directory_bytes(path)
    return b"/constants.pkl" in directory or b"/code/" in directory


def has_tar_magic(path: str, head: bytes) -> bool:
    """Whether a file has the ustar magic at byte 257, as every tar torch.save wrote has.

    Args:
        path: The file (unused: the first bytes tell).
        head: Its first `TAR_BLOCK` bytes, or the whole of a shorter file, as
            `memlayout.load` reads them: a shorter file has no magic at byte 257.
    """
    return head[TAR_MAGIC_AT : TAR_MAGIC_AT + len(TAR_MAGIC)] == TAR_MAGIC


def has_proto_signature(head: bytes) -> bool:
    """Whether the bytes open a pickle by its signature: PROTO and a protocol the unpickler accepts.

    `pickle.dump` writes PROTO from protocol 2 on; protocols 0 and 1 open with any
    other opcode, and the unpickler accepts PROTO 0 and 1 too.

    Args:
        head: The file's first bytes.

    Returns:
        True when they start with PROTO and a protocol number the unpickler accepts.
    """
    return len(head) >= 2 and head[0] == PICKLE_PROTO and head[1] <= PICKLE_HIGHEST_PROTOCOL


def opens_like_a_pickle(path: str, head: bytes) -> bool:
    """Whether `pickle.load` could start reading the file and import something or finish.

    Its first byte must be an opcode that opens a pickle, and the opcodes in `head`
    must not stop the unpickler before any global or STOP (a PNG opens with
    NEWFALSE, then PERSID, which `pickle.load` refuses): a loader is imported to
    confirm only a file that passes both.
    """
    if not head or head[0] not in (_OPENING or _opening()):
        return False
    from memlayout.load.pickle_memo import reaches_an_import_or_stop

    return reaches_an_import_or_stop(head)


_OPENING: frozenset[int] = frozenset()


def _opening() -> frozenset[int]:
    # Asked once per file of a folder walk: a module global after the first call,
    # where even a cached function costs a call each time.
    global _OPENING
    _OPENING = opening_opcodes()
    return _OPENING
