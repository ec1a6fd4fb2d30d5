"""What a failed write tells the user: the OSErrors of writing, as one OutputError with a hint."""

from __future__ import annotations

import errno
import os

from memlayout.errors import OutputError

FULL_HINT = "free space on its filesystem or choose another OUT; nothing was written"

# Errors of writing itself; any other OSError in the block (reading IN, say) is the caller's.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})


def describe(exc: OSError) -> str:
    return exc.strerror or str(exc)


def disk_is_full(fd: int) -> bool:
    try:
        status = os.fstatvfs(fd)
    except OSError:
        return False
    return status.f_bavail * status.f_frsize < (1 << 20)


def write_error(out: str, exc: OSError) -> OutputError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return OutputError(f"cannot write {out}: {describe(exc)}", FULL_HINT)
    return OutputError(f"cannot write {out}: {describe(exc)}")
