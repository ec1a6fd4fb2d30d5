"""Who is writing: the name of a temporary records it, a lock proves it, and dead writers' leftovers go."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from collections.abc import Iterator

from memlayout.io.atomic_write.syscalls import RENAME_NOREPLACE, rename_with_flags

try:  # POSIX advisory locks; absent on Windows, where only the PID check remains.
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

TEMPORARY_PREFIX = ".memlayout-"
# <pid>-<boot id, 8 hex>-<process start time in clock ticks>-<random>-<kind>
_TEMPORARY_NAME = re.compile(r"^\.memlayout-(\d+)-([0-9a-f]{8})-(\d+)-([0-9a-z]+)-(tmp|dir|aside-.+)$")


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as stream:
            return stream.read().strip().replace("-", "")[:8]
    except OSError:
        return "00000000"


def _start_time(pid: int) -> int:
    # Field 22 of /proc/PID/stat: the start time in clock ticks since boot, which
    # tells a reused PID from the writer that recorded it. 0 where unknown.
    try:
        with open(f"/proc/{pid}/stat", "rb") as stream:
            fields = stream.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return 0


def temporary_name(kind: str) -> str:
    """A fresh temporary name recording this process; `kind` is tmp, dir or aside-NAME."""
    pid = os.getpid()
    return f"{TEMPORARY_PREFIX}{pid}-{_boot_id()}-{_start_time(pid)}-{os.urandom(4).hex()}-{kind}"


def _writer_is_alive(pid: int, boot: str, start: int) -> bool:
    if boot != _boot_id():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    return start == 0 or _start_time(pid) in (0, start)


def _try_lock(fd: int) -> bool:
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return True  # a filesystem without flock: the PID check alone decides
    return True


def hold_lock(fd: int) -> None:
    if fcntl is None:
        return
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX)


def remove_stale_temporaries(directory: str) -> list[str]:
    """Remove temporaries left in `directory` by memlayout processes that died.

    A temporary is stale when its name says who wrote it, that process is gone (a
    different boot, no such PID, or a PID now used by a later process), and no one
    holds its lock (a writer in another PID namespace still does). Anything else,
    and every name memlayout did not make, is left alone. An aside copy of a folder
    (see `atomic_directory`) whose target is missing is renamed back, not deleted.

    Args:
        directory: The folder to clean.

    Returns:
        The names removed or restored.
    """
    cleaned: list[str] = []
    try:
        entries = [e for e in os.scandir(directory) if e.name.startswith(TEMPORARY_PREFIX)]
    except OSError:
        return cleaned
    for entry in entries:
        match = _TEMPORARY_NAME.match(entry.name)
        if match is None:
            continue
        pid, boot, start, _, kind = match.groups()
        if _writer_is_alive(int(pid), boot, int(start)):
            continue
        path = entry.path
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            mode = os.fstat(fd).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)) or not _try_lock(fd):
                continue
            if kind.startswith("aside-"):
                target = os.path.join(directory, kind[len("aside-"):])
                if not os.path.lexists(target):
                    rename_with_flags(path, target, RENAME_NOREPLACE)
                    cleaned.append(entry.name)
                    continue
            if stat.S_ISDIR(mode):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
            cleaned.append(entry.name)
        except OSError:
            continue
        finally:
            os.close(fd)
    return cleaned


@contextlib.contextmanager
def parent_lock(directory: str) -> Iterator[None]:
    # Serialises the commits of memlayout processes in one folder, so that checking
    # OUT and swapping it in are one step for them.
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
