"""One folder, built beside OUT and swapped in with one renameat2 call (see `atomic_directory`)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator

from memlayout.errors import OutputError
from memlayout.io.atomic_write.syscalls import (
    RENAME_EXCHANGE,
    RENAME_NOREPLACE,
    fsync_directory,
    rename_with_flags,
)
from memlayout.io.atomic_write.targets import resolve_target
from memlayout.io.atomic_write.temporaries import (
    TEMPORARY_PREFIX,
    hold_lock,
    parent_lock,
    remove_stale_temporaries,
    temporary_name,
)
from memlayout.io.atomic_write.write_errors import FULL_HINT, describe


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
        raise OutputError(f"cannot write {out}: cannot create a folder in {home}: {describe(exc)}") from exc
    hold_lock(lock)
    try:
        yield staging
        with parent_lock(home):
            if inside:
                _move_entries_into(staging, target)
            else:
                _swap_in(staging, target, force, out)
        fsync_directory(home)
    except OSError as exc:
        raise OutputError(f"cannot write {out}: {describe(exc)}",
                          FULL_HINT if exc.errno in (errno.ENOSPC, errno.EDQUOT) else None) from exc
    finally:
        os.close(lock)
        if os.path.lexists(staging):
            shutil.rmtree(staging, ignore_errors=True)


def _swap_in(staging: str, target: str, force: bool, out: str) -> None:
    try:
        rename_with_flags(staging, target, RENAME_NOREPLACE)
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
        rename_with_flags(staging, target, RENAME_EXCHANGE)
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
                rename_with_flags(source, destination, RENAME_EXCHANGE)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                shutil.rmtree(destination)
                os.rename(source, destination)
                continue
            shutil.rmtree(source, ignore_errors=True)
        else:
            os.replace(source, destination)
