"""Write a file or a folder so that readers see the old one or the whole new one, never a part.

Reports (`inspect -o`) and flattened checkpoints (`flatten -o`, `--in-place`) all go
through here. What happens depends on what the output path is, following `cp`,
`sed -i --follow-symlinks` and ruff:

- A character or block device, FIFO or socket (`/dev/null`, a pipe), and the
  process's own descriptors (`/dev/stdout`, `/dev/fd/N`, `/proc/self/fd/N`), are
  written straight into: no temporary, no rename. Renaming a file over
  `/dev/null` as root would break the machine.
- A symlink is followed (chains too) and its final target is replaced, beside the
  target, so the link stays a link. A dangling link is refused, as `cp` refuses
  to write through one.
- A regular file is written to a temporary in the target's folder, fsynced, and
  renamed over the target; the folder entry is fsynced. A new file gets
  `0666 & ~umask` (the kernel applies the umask and any default ACL); a replaced
  file keeps its mode and, where the process may, its owner and group.
- On Linux the temporary is an `O_TMPFILE`: it has no name until the commit links
  it in (`linkat` through `/proc/self/fd`), so a crash cannot leave it behind.
  Where that is not available the temporary is named
  `.memlayout-<pid>-<boot>-<start>-<random>-tmp`, recording the writing process, its
  boot and its start time, and holds an `flock` while it is written. Every later
  write into that folder removes such temporaries whose writer is dead; one still
  being written is never touched.

Writers use whichever handle they need, and may use both:

    with atomic_file(out) as output:
        torch.save(obj, output.path)          # a path: torch.save, safetensors, reloading
    with atomic_file(out) as output:
        os.copy_file_range(src_fd, output.fd, n)   # a raw descriptor
    with atomic_file(out) as output, output.open() as stream:
        stream.write(data)                    # a buffered file object

`output.path` opens the file being written (for an `O_TMPFILE`, its
`/proc/self/fd/N` name); when the block ends without an exception the file is
fsynced and committed, and on any exception it is discarded and the target is left
as it was. `output.is_stream` says the target is a device or pipe: it cannot be
re-read or sought, so verification after writing is impossible there, and
`copy_file_range` into a pipe fails (use `os.sendfile` or plain writes).

`atomic_directory` does the same for a folder (a Hugging Face model directory):
the new folder is built beside OUT and swapped in with one `renameat2` call, so
OUT is absent, the old OUT, or the whole new one at every instant.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from memlayout.errors import OutputError

try:  # POSIX advisory locks; absent on Windows, where only the PID check remains.
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

TEMPORARY_PREFIX = ".memlayout-"
# <pid>-<boot id, 8 hex>-<process start time in clock ticks>-<random>-<kind>
_TEMPORARY_NAME = re.compile(r"^\.memlayout-(\d+)-([0-9a-f]{8})-(\d+)-([0-9a-z]+)-(tmp|dir|aside-.+)$")
_OWN_DESCRIPTOR = re.compile(r"^/(?:proc/(?:self|thread-self|\d+)|dev)/fd/(\d+)$")
_OWN_STREAMS = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_MAX_SYMLINKS = 40  # as Linux's own limit (ELOOP)

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


# ---------------------------------------------------------------------------
# Who is writing: the name of a temporary records it, and a lock proves it.


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


def _hold_lock(fd: int) -> None:
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
                    _rename(path, target, _RENAME_NOREPLACE)
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


# ---------------------------------------------------------------------------
# Where a path really leads.


@dataclass(frozen=True)
class ResolvedTarget:
    """What an output path names once symlinks are followed."""

    path: str
    """The final path (a symlink's target, never a symlink)."""
    status: os.stat_result | None
    """Its status, None when it does not exist yet."""
    own_descriptor: int | None
    """N for /dev/stdout, /dev/fd/N or /proc/self/fd/N: this process's own descriptor."""

    @property
    def is_stream(self) -> bool:
        """A device, FIFO, socket or own descriptor: written straight into."""
        if self.own_descriptor is not None:
            return True
        if self.status is None:
            return False
        mode = self.status.st_mode
        return stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)

    @property
    def is_socket(self) -> bool:
        return self.status is not None and stat.S_ISSOCK(self.status.st_mode)


def _own_descriptor(path: str) -> int | None:
    if path in _OWN_STREAMS:
        return _OWN_STREAMS[path]
    match = _OWN_DESCRIPTOR.match(path)
    if match is None:
        return None
    if path.startswith("/proc/") and path.split("/")[2] not in ("self", "thread-self", str(os.getpid())):
        return None
    return int(match.group(1))


def resolve_target(out: str) -> ResolvedTarget:
    """Follow `out` through symlinks, one link at a time, to what a write would change.

    Args:
        out: The output path as given.

    Returns:
        The final target, its status, and whether it is one of this process's own
        descriptors (recognised before `/proc`'s magic links are followed).

    Raises:
        OutputError: a dangling symlink, a symlink loop, or an unreadable link.
    """
    current = out
    for _ in range(_MAX_SYMLINKS):
        descriptor = _own_descriptor(current)
        if descriptor is not None:
            try:
                return ResolvedTarget(current, os.fstat(descriptor), descriptor)
            except OSError as exc:
                raise OutputError(f"cannot write {out}: descriptor {descriptor} is not open") from exc
        try:
            status = os.lstat(current)
        except FileNotFoundError:
            if current != out:
                raise OutputError(
                    f"cannot write {out}: it is a symlink to {current}, which does not exist",
                    "create the target first, or remove the link to write a new file there",
                ) from None
            return ResolvedTarget(current, None, None)
        except OSError as exc:
            raise OutputError(f"cannot write {out}: {exc.strerror}") from exc
        if not stat.S_ISLNK(status.st_mode):
            return ResolvedTarget(current, status, None)
        try:
            link = os.readlink(current)
        except OSError as exc:
            raise OutputError(f"cannot write {out}: {exc.strerror}") from exc
        # Joined, not normalised: a `..` after a symlinked folder must be resolved by the kernel.
        current = link if os.path.isabs(link) else os.path.join(os.path.dirname(current) or ".", link)
    raise OutputError(f"cannot write {out}: too many levels of symbolic links")


# ---------------------------------------------------------------------------
# renameat2, and the durability of folder entries.


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


def _rename(source: str, target: str, flags: int) -> None:
    """rename(2) with renameat2 flags; raises OSError(EINVAL) where they are not supported."""
    renameat2 = _libc_renameat2()
    if renameat2 is None:
        raise OSError(errno.EINVAL, "renameat2 is not available")
    if renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), flags) != 0:
        import ctypes

        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), source, None, target)


def _fsync_directory(directory: str) -> None:
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


@contextlib.contextmanager
def _parent_lock(directory: str) -> Iterator[None]:
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


def _describe(exc: OSError) -> str:
    return exc.strerror or str(exc)


# ---------------------------------------------------------------------------
# One file.


@dataclass
class OutputFile:
    """A file being written by `atomic_file`; use `fd`, `open()` or `path`, or several.

    Attributes:
        target: The file the commit replaces (symlinks followed).
        is_stream: The target is a device, FIFO, socket or own descriptor: written
            straight into, it can be neither re-read nor sought.
    """

    target: str
    is_stream: bool
    _resolved: ResolvedTarget
    _fd: int | None = None
    _path: str | None = None
    _spool: int | None = None
    _opened: list[BinaryIO] = field(default_factory=list)

    @property
    def fd(self) -> int:
        """A descriptor open for writing (and reading, unless a stream) on the file being written."""
        if self._fd is None:
            self._fd = _open_stream(self._resolved)
        return self._fd

    @property
    def path(self) -> str:
        """A path that opens the file being written, for writers that take a path.

        For a socket (which no path can open) it names an unnamed spool whose bytes
        are sent into the socket when the block ends.
        """
        if self._path is None:
            if self._resolved.is_socket or (
                self._resolved.own_descriptor is not None and self._resolved.status is not None
                and stat.S_ISSOCK(self._resolved.status.st_mode)
            ):
                self._spool = _anonymous_file(None)
                self._path = f"/proc/self/fd/{self._spool}"
            elif self._resolved.own_descriptor is not None:
                self._path = f"/proc/self/fd/{self.fd}"
            else:
                self._path = self._resolved.path
        return self._path

    def open(self) -> BinaryIO:
        """A buffered binary file object on `fd`; flushed at commit, closing it keeps `fd` open."""
        stream = open(self.fd, "wb", closefd=False)  # noqa: SIM115 - the caller closes it
        self._opened.append(stream)
        return stream

    def _flush(self) -> None:
        for stream in self._opened:
            if not stream.closed:
                stream.flush()


def _open_stream(resolved: ResolvedTarget) -> int:
    if resolved.own_descriptor is not None:
        return os.dup(resolved.own_descriptor)
    if resolved.is_socket:
        import socket

        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(resolved.path)
        except OSError:
            connection.close()
            raise
        return connection.detach()
    # No O_TRUNC on a device or pipe (there is nothing to truncate), as `cp` opens them.
    return os.open(resolved.path, os.O_WRONLY | os.O_CLOEXEC)


def _anonymous_file(directory: str | None) -> int:
    """An unnamed file (O_TMPFILE) in `directory` (the temp folder when None); nothing to leave behind."""
    import tempfile

    where = directory if directory is not None else tempfile.gettempdir()
    flag = getattr(os, "O_TMPFILE", 0)
    if flag:
        try:
            return os.open(where, flag | os.O_RDWR | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
                raise
    fd, name = tempfile.mkstemp(dir=where)
    os.unlink(name)
    return fd


def _open_temporary(directory: str) -> tuple[int, str | None]:
    """A temporary in `directory`: (fd, None) for an O_TMPFILE, else (fd, its name)."""
    flag = getattr(os, "O_TMPFILE", 0)
    if flag and os.path.isdir("/proc/self/fd"):
        try:
            fd = os.open(directory, flag | os.O_RDWR | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            # Filesystems without O_TMPFILE say EOPNOTSUPP; kernels that predate it
            # open the folder itself and say EISDIR.
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
        else:
            _hold_lock(fd)
            return fd, None
    while True:
        name = os.path.join(directory, temporary_name("tmp"))
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o666)
        except FileExistsError:
            continue
        _hold_lock(fd)
        return fd, name


def _keep_owner_and_mode(fd: int, status: os.stat_result | None) -> None:
    if status is None:
        return  # a new file: the kernel already applied the umask and default ACLs
    if (status.st_uid, status.st_gid) != (os.geteuid(), os.getegid()):
        try:
            os.fchown(fd, status.st_uid, status.st_gid)
        except OSError:
            with contextlib.suppress(OSError):  # a member of the group may still keep it
                os.fchown(fd, -1, status.st_gid)
    # After chown, which clears set-id bits.
    os.fchmod(fd, stat.S_IMODE(status.st_mode))


def _link_unnamed(fd: int, target: str) -> None:
    # linkat(AT_SYMLINK_FOLLOW) through the magic link names the unnamed file.
    # os.link uses link(2), which never follows a link, unless a dir_fd is given.
    folder = os.open(os.path.dirname(target) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(f"/proc/self/fd/{fd}", os.path.basename(target), dst_dir_fd=folder, follow_symlinks=True)
    finally:
        os.close(folder)


def _commit_file(fd: int, name: str | None, target: str, directory: str) -> None:
    if name is not None:
        os.replace(name, target)
    else:
        try:
            # A new target: linked in under its own name at once.
            _link_unnamed(fd, target)
        except FileExistsError:
            # An existing one: no link(2) replaces, so link a recorded name and rename
            # it over. A crash between the two leaves a temporary the next run removes.
            while True:
                staged = os.path.join(directory, temporary_name("tmp"))
                try:
                    _link_unnamed(fd, staged)
                    break
                except FileExistsError:
                    continue
            try:
                os.replace(staged, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(staged)
                raise
    _fsync_directory(directory)


@contextlib.contextmanager
def atomic_file(out: str) -> Iterator[OutputFile]:
    """Write the file `out` so that it is the old file or the whole new one, never a part.

    Args:
        out: The output path: a new or existing file, a symlink to one, a device,
            FIFO or socket, or `/dev/stdout`.

    Yields:
        The `OutputFile` to write through its `fd`, `open()` or `path`. When the
        block ends normally the file is fsynced and committed; an exception
        discards it and leaves `out` as it was.

    Raises:
        OutputError: `out` is a folder or a dangling link, its folder is missing,
            or creating, writing or renaming failed (the disk is full, no permission).

    Example:
        >>> with atomic_file("report.json") as output, output.open() as stream:
        ...     stream.write(b"{}")
    """
    resolved = resolve_target(out)
    if resolved.is_stream:
        output = OutputFile(target=resolved.path, is_stream=True, _resolved=resolved)
        try:
            yield output
            output._flush()
            if output._spool is not None:
                _send_all(output._spool, output.fd)
        except OSError as exc:
            if exc.errno in _WRITE_ERRNOS or exc.errno in (errno.EPIPE, errno.ENXIO, errno.ECONNREFUSED):
                raise _write_error(out, exc) from exc
            raise
        finally:
            if output._spool is not None:
                os.close(output._spool)
            if output._fd is not None:
                os.close(output._fd)
        return
    if resolved.status is not None and stat.S_ISDIR(resolved.status.st_mode):
        raise OutputError(f"cannot write {out}: it is a folder", "give the path of a file")
    directory = os.path.dirname(resolved.path) or "."
    if not os.path.isdir(directory):
        raise OutputError(f"cannot write {out}: {directory} does not exist", "create the folder first")
    remove_stale_temporaries(directory)
    try:
        fd, name = _open_temporary(directory)
    except OSError as exc:
        raise OutputError(f"cannot write {out}: cannot create a file in {directory}: {_describe(exc)}") from exc
    output = OutputFile(
        target=resolved.path, is_stream=False, _resolved=resolved, _fd=fd,
        _path=name if name is not None else f"/proc/self/fd/{fd}",
    )
    try:
        try:
            yield output
            output._flush()
        except OSError as exc:
            if exc.errno in _WRITE_ERRNOS:
                raise _write_error(out, exc) from exc
            raise
        except RuntimeError as exc:
            # torch's zip writer reports a failed write as RuntimeError, without errno.
            if _disk_is_full(fd):
                raise OutputError(f"cannot write {out}: no space left on device", _FULL_HINT) from exc
            raise
        try:
            os.fsync(fd)
            _keep_owner_and_mode(fd, resolved.status)
            _commit_file(fd, name, resolved.path, directory)
        except OSError as exc:
            raise _write_error(out, exc) from exc
    except BaseException:
        if name is not None:
            with contextlib.suppress(OSError):
                os.unlink(name)
        raise
    finally:
        os.close(fd)


_FULL_HINT = "free space on its filesystem or choose another OUT; nothing was written"


def _disk_is_full(fd: int) -> bool:
    try:
        status = os.fstatvfs(fd)
    except OSError:
        return False
    return status.f_bavail * status.f_frsize < (1 << 20)


# Errors of writing itself; any other OSError in the block (reading IN, say) is the caller's.
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})


def _write_error(out: str, exc: OSError) -> OutputError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return OutputError(f"cannot write {out}: {_describe(exc)}", _FULL_HINT)
    return OutputError(f"cannot write {out}: {_describe(exc)}")


def _send_all(source: int, target: int) -> None:
    offset, size = 0, os.fstat(source).st_size
    while offset < size:
        sent = os.sendfile(target, source, offset, size - offset)
        if sent == 0:
            break
        offset += sent


def write_bytes(path: str, data: bytes) -> None:
    """Write `data` to `path` atomically and durably (see `atomic_file`)."""
    with atomic_file(path) as output, output.open() as stream:
        stream.write(data)


def write_text(path: str, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically and durably (see `atomic_file`)."""
    write_bytes(path, text.encode("utf-8"))


# ---------------------------------------------------------------------------
# One folder.


def _is_mount_point(path: str, status: os.stat_result) -> bool:
    try:
        parent = os.stat(os.path.join(path, ".."))
    except OSError:
        return False
    return parent.st_dev != status.st_dev


def _link_tree(source: str, target: str) -> None:
    """Rebuild folder `source` at `target`: folders recreated with their mode and owner,
    everything else hard-linked, so the two share every file."""
    os.mkdir(target)
    status = os.lstat(source)
    with contextlib.suppress(OSError):
        os.chown(target, status.st_uid, status.st_gid)
    os.chmod(target, stat.S_IMODE(status.st_mode))
    for entry in os.scandir(source):
        destination = os.path.join(target, entry.name)
        if entry.is_dir(follow_symlinks=False):
            _link_tree(entry.path, destination)
        else:
            os.link(entry.path, destination, follow_symlinks=False)


def _carry_over(old: str, staging: str) -> None:
    # What OUT holds that the new folder does not write stays, as the same files.
    written = set(os.listdir(staging))
    for entry in os.scandir(old):
        if entry.name in written or entry.name.startswith(TEMPORARY_PREFIX):
            continue
        destination = os.path.join(staging, entry.name)
        if entry.is_dir(follow_symlinks=False):
            _link_tree(entry.path, destination)
        else:
            os.link(entry.path, destination, follow_symlinks=False)


def _copy_folder_identity(old: os.stat_result, staging: str) -> None:
    with contextlib.suppress(OSError):
        os.chown(staging, old.st_uid, old.st_gid)
    os.chmod(staging, stat.S_IMODE(old.st_mode))


def _refuse_non_empty(out: str) -> OutputError:
    return OutputError(
        f"{out} is a folder that already holds files",
        "choose a new or empty folder, or pass --force to replace only the files written there "
        "(the others are kept)",
    )


def _has_entries(path: str) -> bool:
    with os.scandir(path) as entries:
        return any(not entry.name.startswith(TEMPORARY_PREFIX) for entry in entries)


@contextlib.contextmanager
def atomic_directory(out: str, force: bool = False) -> Iterator[str]:
    """Build a folder and swap it in as `out` in one step; yields the folder to fill.

    When the block ends normally, the folder's entries become `out`:
    - `out` absent: the folder is renamed to `out` (and never over one that appeared meanwhile);
    - `out` an empty folder, or any folder with `force`: every entry of `out` that the
      new folder does not hold is hard-linked into it (the same files, never copies),
      `out`'s mode and owner are copied, and the two are exchanged atomically
      (`renameat2(RENAME_EXCHANGE)`); the old folder, now holding only what was
      replaced, is removed;
    - `out` a non-empty folder without `force`: refused before anything is written.
    At every instant `out` is absent, the old folder or the whole new one. Where
    `out` is a mount point (a container volume), nothing can be renamed over it: the
    new entries are built inside it and renamed in one by one, each atomically.

    Args:
        out: The folder to write.
        force: Replace the entries of a non-empty `out` that the block writes.

    Yields:
        An empty staging folder, mode `0777 & ~umask`, to fill.

    Raises:
        OutputError: `out` is a file, a non-empty folder without `force`, or the
            swap failed; the staging folder is removed and `out` is unchanged.
    """
    resolved = resolve_target(out)
    target, status = resolved.path, resolved.status
    if status is not None and not stat.S_ISDIR(status.st_mode):
        raise OutputError(f"cannot write the folder {out}: a file is there", "choose a folder path")
    if status is not None and not force and _has_entries(target):
        raise _refuse_non_empty(out)
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        raise OutputError(f"cannot write {out}: {parent} does not exist", "create the folder first")
    inside = status is not None and _is_mount_point(target, status)
    home = target if inside else parent
    remove_stale_temporaries(home)
    staging = os.path.join(home, temporary_name("dir"))
    try:
        os.mkdir(staging, 0o777)
        lock = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise OutputError(f"cannot write {out}: cannot create a folder in {home}: {_describe(exc)}") from exc
    _hold_lock(lock)
    try:
        yield staging
        with _parent_lock(home):
            if inside:
                _move_entries_into(staging, target)
            else:
                _swap_in(staging, target, force, out)
        _fsync_directory(home)
    except OSError as exc:
        raise OutputError(f"cannot write {out}: {_describe(exc)}",
                          _FULL_HINT if exc.errno in (errno.ENOSPC, errno.EDQUOT) else None) from exc
    finally:
        os.close(lock)
        if os.path.lexists(staging):
            shutil.rmtree(staging, ignore_errors=True)


def _swap_in(staging: str, target: str, force: bool, out: str) -> None:
    try:
        _rename(staging, target, _RENAME_NOREPLACE)
        return
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            if not os.path.lexists(target):
                os.rename(staging, target)
                return
        elif exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
    status = os.stat(target)
    if not stat.S_ISDIR(status.st_mode):
        raise OutputError(f"cannot write the folder {out}: a file appeared there while writing")
    if not force and _has_entries(target):
        raise _refuse_non_empty(out)
    _carry_over(target, staging)
    _copy_folder_identity(status, staging)
    try:
        _rename(staging, target, _RENAME_EXCHANGE)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        _swap_aside(staging, target)
    # `staging` now names the old folder: only what was replaced, and extra links.
    shutil.rmtree(staging, ignore_errors=True)


def _swap_aside(staging: str, target: str) -> None:
    # No RENAME_EXCHANGE here: two renames, with OUT absent in between. The aside
    # name records OUT's name, so a crash in between is undone by the next run.
    aside_kind = f"aside-{os.path.basename(target)}"
    directory = os.path.dirname(target)
    aside = os.path.join(directory, temporary_name(aside_kind))
    if len(os.path.basename(aside).encode()) > 255:
        raise OutputError(f"cannot replace {target} on this filesystem: its name is too long to set it aside")
    os.rename(target, aside)
    try:
        os.rename(staging, target)
    except BaseException:
        os.rename(aside, target)
        raise
    os.rename(aside, staging)


def _move_entries_into(staging: str, target: str) -> None:
    for name in sorted(os.listdir(staging)):
        source, destination = os.path.join(staging, name), os.path.join(target, name)
        if os.path.isdir(source) and os.path.isdir(destination) and not os.path.islink(destination):
            try:
                _rename(source, destination, _RENAME_EXCHANGE)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                shutil.rmtree(destination)
                os.rename(source, destination)
                continue
            shutil.rmtree(source, ignore_errors=True)
        else:
            os.replace(source, destination)
