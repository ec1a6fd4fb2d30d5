"""One file, written so that readers see the old file or the whole new one (see the package's docstring)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from memlayout.errors import OutputError
from memlayout.io.atomic_write.syscalls import fsync_directory, link_unnamed
from memlayout.io.atomic_write.targets import ResolvedTarget, resolve_target
from memlayout.io.atomic_write.temporaries import (
    hold_lock,
    remove_stale_temporaries,
    temporary_name,
)
from memlayout.io.atomic_write.write_errors import (
    FULL_HINT,
    WRITE_ERRNOS,
    describe,
    disk_is_full,
    write_error,
)


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
            hold_lock(fd)
            return fd, None
    while True:
        name = os.path.join(directory, temporary_name("tmp"))
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o666)
        except FileExistsError:
            continue
        hold_lock(fd)
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


def _commit_file(fd: int, name: str | None, target: str, directory: str) -> None:
    if name is not None:
        os.replace(name, target)
    else:
        try:
            # A new target: linked in under its own name at once.
            link_unnamed(fd, target)
        except FileExistsError:
            # An existing one: no link(2) replaces, so link a recorded name and rename
            # it over. A crash between the two leaves a temporary the next run removes.
            while True:
                staged = os.path.join(directory, temporary_name("tmp"))
                try:
                    link_unnamed(fd, staged)
                    break
                except FileExistsError:
                    continue
            try:
                os.replace(staged, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(staged)
                raise
    fsync_directory(directory)


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
        with _stream_file(out, resolved) as stream:
            yield stream
        return
    directory, fd, name = _temporary_beside(out, resolved)
    output = OutputFile(
        target=resolved.path, is_stream=False, _resolved=resolved, _fd=fd,
        _path=name if name is not None else f"/proc/self/fd/{fd}",
    )
    try:
        try:
            yield output
            output._flush()
        except OSError as exc:
            if exc.errno in WRITE_ERRNOS:
                raise write_error(out, exc) from exc
            raise
        except RuntimeError as exc:
            # torch's zip writer reports a failed write as RuntimeError, without errno.
            if disk_is_full(fd):
                raise OutputError(f"cannot write {out}: no space left on device", FULL_HINT) from exc
            raise
        try:
            os.fsync(fd)
            _keep_owner_and_mode(fd, resolved.status)
            _commit_file(fd, name, resolved.path, directory)
        except OSError as exc:
            raise write_error(out, exc) from exc
    except BaseException:
        if name is not None:
            with contextlib.suppress(OSError):
                os.unlink(name)
        raise
    finally:
        os.close(fd)


def _temporary_beside(out: str, resolved: ResolvedTarget) -> tuple[str, int, str | None]:
    """The folder `out` goes into, and a temporary file opened there (its name; None where it has none yet).

    Raises:
        OutputError: `out` is a folder, its folder is missing, or no file can be created there.
    """
    if resolved.status is not None and stat.S_ISDIR(resolved.status.st_mode):
        raise OutputError(f"cannot write {out}: it is a folder", "give the path of a file")
    directory = os.path.dirname(resolved.path) or "."
    if not os.path.isdir(directory):
        raise OutputError(f"cannot write {out}: {directory} does not exist", "create the folder first")
    remove_stale_temporaries(directory)
    try:
        fd, name = _open_temporary(directory)
    except OSError as exc:
        raise OutputError(f"cannot write {out}: cannot create a file in {directory}: {describe(exc)}") from exc
    return directory, fd, name


@contextlib.contextmanager
def _stream_file(out: str, resolved: ResolvedTarget) -> Iterator[OutputFile]:
    """`atomic_file` for a device, FIFO, socket or `/dev/stdout`: written in place, as there is nothing to rename;
    what was spooled is sent when the block ends."""
    output = OutputFile(target=resolved.path, is_stream=True, _resolved=resolved)
    try:
        yield output
        output._flush()
        if output._spool is not None:
            _send_all(output._spool, output.fd)
    except OSError as exc:
        if exc.errno in WRITE_ERRNOS or exc.errno in (errno.EPIPE, errno.ENXIO, errno.ECONNREFUSED):
            raise write_error(out, exc) from exc
        raise
    finally:
        if output._spool is not None:
            os.close(output._spool)
        if output._fd is not None:
            os.close(output._fd)


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
