"""Write a file or directory so that readers see the old one or the whole new one, never a part.

Reports (`inspect -o`) and flattened checkpoints (`flatten -o`) both go through here:
a temporary beside the target, fsynced, renamed over it, and the directory entry
fsynced, so a crash or a failed verification leaves the target as it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from memlayout.errors import UsageError


def fsync_path(path: str) -> None:
    """Flush a written file's data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_directory(directory: str) -> None:
    # The rename is durable only once the directory entry is on disk; some
    # filesystems refuse to fsync a directory, and then there is nothing more to do.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(out: str, suffix: str = ".tmp", directory: bool = False) -> Iterator[str]:
    """A temporary path beside `out`; renamed over `out` when the block succeeds.

    The block writes (and, for checkpoints, verifies) the temporary; the caller
    fsyncs what it wrote. Any exception removes the temporary and leaves `out` alone.

    Args:
        out: The final path.
        suffix: Suffix of the temporary name (some writers care about extensions).
        directory: The temporary is a directory (an HF model folder).

    Yields:
        The temporary path to write.

    Raises:
        UsageError: the folder `out` would go in does not exist.
    """
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise UsageError(f"cannot write {out}: {parent} does not exist", "create the directory first")
    if directory:
        temporary = tempfile.mkdtemp(dir=parent, prefix=".memlayout-", suffix=suffix)
    else:
        fd, temporary = tempfile.mkstemp(dir=parent, prefix=".memlayout-", suffix=suffix)
        os.close(fd)
    try:
        yield temporary
        if directory and os.path.isdir(out):
            # A directory cannot be renamed over a non-empty one: move the old aside
            # first, and put it back if the swap fails.
            aside = tempfile.mkdtemp(dir=parent, prefix=".memlayout-old-")
            os.rmdir(aside)
            os.replace(out, aside)
            try:
                os.replace(temporary, out)
            except BaseException:
                os.replace(aside, out)
                raise
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(temporary, out)
        _fsync_directory(parent)
    except BaseException:
        if os.path.isdir(temporary):
            shutil.rmtree(temporary, ignore_errors=True)
        elif os.path.exists(temporary):
            os.unlink(temporary)
        raise


def write_text(path: str, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically and durably."""
    with atomic_path(path) as temporary:
        with open(temporary, "w", encoding="utf-8") as stream:
            stream.write(text)
        fsync_path(temporary)
