"""Where an output path really leads: symlinks followed, devices, pipes and own descriptors recognised."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

from memlayout.errors import OutputError

_OWN_DESCRIPTOR = re.compile(r"^/(?:proc/(?:self|thread-self|\d+)|dev)/fd/(\d+)$")
_OWN_STREAMS = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_MAX_SYMLINKS = 40  # as Linux's own limit (ELOOP)


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
