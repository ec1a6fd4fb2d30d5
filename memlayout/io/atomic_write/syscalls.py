"""renameat2 and linkat, which `os` lacks or cannot reach, and the durability of folder entries."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
from typing import Any

_AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


@functools.cache
def _libc_renameat2() -> Any:
    """libc's renameat2, looked up on first use; None where the C library has none (macOS).

    `CDLL(None)` is the C library the interpreter already runs on: nothing is loaded
    and no process is started (`ctypes.util.find_library` would run `ldconfig -p`).
    """
    import ctypes

    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def rename_with_flags(source: str, target: str, flags: int) -> None:
    """rename(2) with renameat2 flags; raises OSError(EINVAL) where they are not supported."""
    renameat2 = _libc_renameat2()
    if renameat2 is None:
        raise OSError(errno.EINVAL, "renameat2 is not available")
    if renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), flags) != 0:
        import ctypes

        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), source, None, target)


def fsync_directory(directory: str) -> None:
    # A rename is durable only once the folder entry is on disk; some filesystems
    # refuse to fsync a folder, and then there is nothing more to do.
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_path(path: str) -> None:
    """Flush a written file's data to disk (a regular file or an output's `path`)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # pipes and devices cannot be fsynced
            os.fsync(fd)
    finally:
        os.close(fd)


def link_unnamed(fd: int, target: str) -> None:
    # linkat(AT_SYMLINK_FOLLOW) through the magic link names the unnamed file.
    # os.link uses link(2), which never follows a link, unless a dir_fd is given.
    folder = os.open(os.path.dirname(target) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(f"/proc/self/fd/{fd}", os.path.basename(target), dst_dir_fd=folder, follow_symlinks=True)
    finally:
        os.close(folder)
