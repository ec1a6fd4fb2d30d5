"""What a file that holds no pickle and no checkpoint is, from its first bytes: text, an image, a library.

A folder walk accounts for every file (`memlayout.pipeline.folder_walk`): a file
no format reads is reported as data, with what it is, so that a reader of the
audit sees a verdict on every file rather than a silence. The check is a few
comparisons of the first bytes; nothing here decides whether something is a
pickle (`memlayout.load.FORMATS` has already said no).
"""

from __future__ import annotations

_SIGNATURES: tuple[tuple[bytes, int, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", 0, "a PNG image"),
    (b"\xff\xd8\xff", 0, "a JPEG image"),
    (b"GIF87a", 0, "a GIF image"),
    (b"GIF89a", 0, "a GIF image"),
    (b"WEBP", 8, "a WebP image"),
    (b"II*\x00", 0, "a TIFF image"),
    (b"MM\x00*", 0, "a TIFF image"),
    (b"WAVE", 8, "a WAV sound"),
    (b"fLaC", 0, "a FLAC sound"),
    (b"OggS", 0, "an Ogg stream"),
    (b"ftyp", 4, "an MP4 or QuickTime video"),
    (b"%PDF-", 0, "a PDF document"),
    (b"\x89HDF\r\n\x1a\n", 0, "an HDF5 file (Keras .h5 models keep Lambda layers' code there, which memlayout "
                               "does not audit)"),
    (b"GGUF", 0, "a GGUF model (tensors and metadata, no pickle)"),
    (b"SQLite format 3\x00", 0, "an SQLite database"),
    (b"\x7fELF", 0, "an ELF executable or shared library (native code, which memlayout does not audit)"),
    (b"MZ", 0, "a Windows executable or DLL (native code, which memlayout does not audit)"),
    (b"\xcf\xfa\xed\xfe", 0, "a Mach-O executable or library (native code, which memlayout does not audit)"),
    (b"\x00asm", 0, "a WebAssembly module"),
    (b"PACK", 0, "a git pack"),
    (b"PK\x05\x06", 0, "an empty zip archive"),
)


_CONTROL = bytes(code for code in range(32) if chr(code) not in "\t\n\r\f\b\x1b") + b"\x7f"
"""Control characters text does not hold (tabs, line breaks, form feeds and escapes aside)."""


def _is_text(head: bytes) -> bool:
    # Asked of every data file of a walk: C-speed checks only. Valid UTF-8 (the head may end
    # inside a character), and at most 1 byte in 20 a control character.
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:
            return False
    controls = len(head) - len(head.translate(None, _CONTROL))
    return b"\x00" not in head and controls * 20 <= len(head)


_AT_START: dict[int, list[tuple[bytes, str]]] = {}
for _signature, _at, _what in _SIGNATURES:
    if _at == 0:
        _AT_START.setdefault(_signature[0], []).append((_signature, _what))
_FURTHER_IN = [(signature, at, what) for signature, at, what in _SIGNATURES if at]


def describe_data(head: bytes) -> str:
    """What a file with these first bytes is, for a file no format memlayout reads recognizes.

    Args:
        head: The file's first bytes (empty for an empty file).

    Returns:
        A few words: "text", "a PNG image", "an empty file", "binary data in no format memlayout reads".
    """
    if not head:
        return "an empty file"
    # Once per data file of a walk: the signatures that open with this first byte, then the few
    # that sit a few bytes in.
    for signature, what in _AT_START.get(head[0], ()):
        if head.startswith(signature):
            return what
    for signature, at, what in _FURTHER_IN:
        if head[at : at + len(signature)] == signature:
            return what
    if _is_text(head):
        return "JSON text" if head.lstrip()[:1] in (b"{", b"[") else "text"
    return "binary data in no format memlayout reads (no pickle: pickle.load fails on it before importing anything)"
