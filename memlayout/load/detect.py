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
from typing import NamedTuple

from memlayout.errors import MemlayoutError

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

class Codec(NamedTuple):
    """A compressed stream memlayout recognizes by its first bytes (what `memlayout.load.unpack` decompresses)."""

    name: str
    """The format name a file of it is reported as ("gzip")."""
    magic: bytes
    """How the stream opens; a weak magic (zlib, lzma) is confirmed by decompressing the first bytes."""
    writer: str
    """Who writes it, for the docs: joblib's `compress=` names, gzip, xz."""


CODECS: tuple[Codec, ...] = (
    Codec("gzip", b"\x1f\x8b\x08", "gzip, joblib compress='gzip', torch.save into gzip.open"),
    Codec("bz2", b"BZh", "bzip2, joblib compress='bz2'"),
    Codec("xz", b"\xfd7zXZ\x00", "xz, joblib compress='xz', torch.save into lzma.open"),
    Codec("lz4", b"\x04\x22\x4d\x18", "lz4's frame format, joblib compress='lz4'"),
    Codec("zstd", b"\x28\xb5\x2f\xfd", "zstd (read where the zstandard package is installed)"),
    Codec("joblib-zf", b"ZF0x", "joblib before 0.10: 'ZF', the length in hex, then a zlib stream"),
    Codec("zlib", b"", "zlib, joblib's default compress=True or compress=3"),
    Codec("lzma", b"", "lzma's alone format, joblib compress='lzma'"),
)
"""Every compressed stream memlayout opens, by name."""

ARCHIVE_FORMATS = ("zip", "tar")
"""Archives of members, read member by member (`memlayout.load.unpack`)."""
CONTAINER_FORMATS = frozenset([codec.name for codec in CODECS] + list(ARCHIVE_FORMATS))
"""Formats whose content is other files: what a source of one of them reports it found inside."""

UNOPENED_ARCHIVES = {b"7z\xbc\xaf\x27\x1c": "a 7-Zip archive", b"Rar!\x1a\x07": "a RAR archive"}
"""Archives memlayout recognizes but does not open (no reader in the standard library): never cleared."""


def _is_zlib(head: bytes) -> bool:
    # RFC 1950's header: deflate (method 8), a window of at most 32 KiB, a check
    # that makes the two bytes a multiple of 31, and no preset dictionary. Text can
    # pass ("x^" does), so the unpacker confirms by inflating the first bytes.
    if len(head) < 2:
        return False
    cmf, flags = head[0], head[1]
    return cmf & 0x0F == 8 and cmf >> 4 <= 7 and (cmf << 8 | flags) % 31 == 0 and not flags & 0x20


def _is_lzma_alone(head: bytes) -> bool:
    # lzma's alone header: a properties byte (lc, lp, pb packed below 225), a
    # dictionary size that liblzma's encoder writes as 2**n or 2**n + 2**(n-1), the
    # uncompressed size (all ones when unknown, as lzma.LZMAFile and joblib write it),
    # then the range coder's first byte, which is always 0. The unpacker then
    # confirms by decompressing.
    if len(head) < 14 or head[0] >= 225 or head[13] != 0:
        return False
    dictionary = int.from_bytes(head[1:5], "little")
    if not 1 << 12 <= dictionary <= 3 << 29:
        return False
    top = 1 << (dictionary.bit_length() - 1)
    size = head[5:13]
    return dictionary in (top, top | top >> 1) and (size == b"\xff" * 8 or int.from_bytes(size, "little") < 1 << 40)


def compression_of(head: bytes) -> str | None:
    """The `CODECS` name of the compressed stream `head` opens, or None.

    Args:
        head: A file's (or a member's, or a decompressed stream's) first bytes.

    Returns:
        "gzip", "zlib", ...; None for anything else.
    """
    for codec in CODECS:
        # bz2 opens with "BZh" and the block size, a digit.
        if codec.magic and head.startswith(codec.magic) and (codec.name != "bz2" or head[3:4].isdigit()):
            return codec.name
    if _is_zlib(head):
        return "zlib"
    if _is_lzma_alone(head):
        return "lzma"
    return None


def is_compressed(path: str, head: bytes) -> bool:
    """Whether the first bytes open a compressed stream memlayout decompresses."""
    return compression_of(head) is not None


_LAST: tuple[bytes, str | None] = (b"", None)
"""The last head asked about and its codec: `load.FORMATS` asks once per codec, of the same bytes."""


def compresses_as(codec: str, path: str, head: bytes) -> bool:
    """Whether the first bytes open a stream of `codec` (bound with functools.partial in `load.FORMATS`).

    Asked of every file a folder walk reads, once per codec: `compression_of` runs once per
    head, and the other codecs' questions are answered from its result.
    """
    global _LAST
    last = _LAST  # one read of the pair: another thread may replace it, never half of it
    if last[0] is not head:
        last = _LAST = (head, compression_of(head))
    return last[1] == codec


def unopened_archive(head: bytes) -> str | None:
    """What archive memlayout recognizes but does not open, by its first bytes ("a 7-Zip archive"), or None."""
    for magic, what in UNOPENED_ARCHIVES.items():
        if head.startswith(magic):
            return what
    return None


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
    """Whether a directory holds Hugging Face weights under their standard file names (never a file).

    A name is not enough: `model.safetensors` must open as safetensors and
    `pytorch_model.bin` as a torch.save file, or the folder is no model
    `from_pretrained` could load, and is walked file by file instead, each file read
    for what it is (a torch zip named `model.safetensors` is reported as one).
    """
    if head:
        return False
    for name in HF_WEIGHT_FILES:
        weights = os.path.join(path, name)
        if not os.path.isfile(weights):
            continue
        if name.endswith(".json"):
            return True
        try:
            with open(weights, "rb") as handle:
                first = handle.read(TAR_BLOCK)
        except OSError:
            return True  # the loader says why it cannot be read
        if (looks_like_safetensors(first) if name == HF_SAFETENSORS_SINGLE
                else is_zip(weights, first) or opens_like_a_pickle(weights, first) or has_tar_magic(weights, first)):
            return True
    return False


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


def dcp_file_names(folder: str) -> tuple[str, ...]:
    """The files of a torch.distributed.checkpoint save in `folder` (`.metadata`, `*.distcp`): read only together."""
    try:
        names = os.listdir(folder)
    except OSError:
        return ()
    return tuple(sorted(name for name in names if name == DCP_METADATA_FILE or name.endswith(DCP_DATA_SUFFIX)))


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


def is_plain_zip(path: str, head: bytes) -> bool:
    """Whether a zip is an archive of other files: its directory names no `<archive>/data.pkl` (torch.save,
    TorchScript and torch.export zips all do, and numpy's come first). A zip whose directory memlayout's
    own reader cannot read is left to torch-zip's loader, which says what is wrong with it."""
    if not is_zip(path, head):
        return False
    from memlayout.io.zip_archive import ZipReader, central_directory_bytes

    directory = central_directory_bytes(path)
    names = _directory_names(directory)
    # torch.save's layout: `<archive>/data.pkl`, one folder deep. A data.pkl anywhere else
    # (picklescan's malicious1.zip has one at the top) is a pickle in an archive, which
    # torch.load cannot read and pickle.load can.
    if not names or any(name.endswith(b"/data.pkl") and name.count(b"/") == 1 for name in names):
        return False
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        ZipReader(fd, os.fstat(fd).st_size, what=path)
    except (MemlayoutError, OSError, ValueError):
        return False
    finally:
        os.close(fd)
    return True


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
