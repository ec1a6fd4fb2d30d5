"""What `inspect` does with each member of a folder: chosen by content, never by name, and none left out.

A folder that is no model by itself, and what a model folder holds besides its
model, is walked file by file. Each file's first bytes (`load.HEAD_BYTES`, one
read) decide:

- read: some format memlayout reads recognizes it (a safetensors file, a torch
  zip, a pickle stream of any kind, a numpy array, a compressed stream, a zip or
  tar archive), whatever it is called; a file with a checkpoint's or a pickle's
  suffix is read even when no format recognizes it, so a damaged `model.pt` is
  reported as damaged rather than passed over;
- data: nothing memlayout reads, said to be what it is (text, an image,
  `load.data_kinds`): pickle.load would fail on it before importing anything;
- unreadable, with the reason: it cannot be opened (no permission, a broken
  link), it is no regular file (a pipe, a device), or it is an archive memlayout
  does not open (7-Zip, RAR), whose members would go unaudited.

Hidden files and folders are walked too: a payload named `.model.pt` loads as
well as any other. So every file of the folder is accounted for in the report,
and an audit's exit status can say that everything was read.

One `os.open` relative to the folder, one read and one close per file: the first
bytes, not the file. That is the least any walk by content can do
(benchmarks/speed/bench_folder_walk.py).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from typing import NamedTuple

from memlayout.load import HEAD_BYTES, recognized_format
from memlayout.load.data_kinds import describe_data
from memlayout.load.detect import unopened_archive

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".pt2", ".pkl", ".pickle", ".joblib")
"""Suffixes whose file is reported even when no format recognizes its content (a damaged checkpoint)."""

_READ_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


class FolderEntry(NamedTuple):
    """One member of a folder, and what the walk does with it."""

    path: str
    kind: str
    """"folder" (walked), "read" (recognized by content), "expected" (a checkpoint's name, no format
    recognizes it: read, so its damage is reported), "data" or "unreadable"."""
    what: str = ""
    """For data, what it is; for an unreadable member, why."""


def _head(name: str, folder_fd: int) -> bytes | str:
    """The first `HEAD_BYTES` of a file in the folder, or why it cannot be read."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=folder_fd)
    except OSError as exc:
        return f"cannot be opened: {exc.strerror}"
    try:
        return os.read(fd, HEAD_BYTES)
    except OSError as exc:
        return f"cannot be read: {exc.strerror}"
    finally:
        os.close(fd)


def is_inspected(path: str, head: bytes) -> bool:
    """Whether a walk reads a file with these first bytes: some format memlayout reads recognizes it.

    Args:
        path: The file.
        head: Its first bytes.

    Returns:
        True when `inspect` should read it.
    """
    return recognized_format(path, head) is not None


def _special(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"))
    return next((what for test, what in kinds if test(mode)), "not a regular file")


def _entry(path: str, name: str, folder_fd: int, listed: os.DirEntry[str]) -> FolderEntry:
    # The listing's file types answer for nearly every member without a stat of its own.
    if listed.is_dir():
        return FolderEntry(path, "folder")
    if not listed.is_file():
        return _not_a_file(path, name, folder_fd, listed)
    head = _head(name, folder_fd)
    if isinstance(head, str):
        return FolderEntry(path, "unreadable", head)
    if is_inspected(path, head):
        return FolderEntry(path, "read")
    if name.lower().endswith(CHECKPOINT_SUFFIXES):
        return FolderEntry(path, "expected")
    archive = unopened_archive(head)
    if archive is not None:
        return FolderEntry(path, "unreadable", f"{archive}, which memlayout does not open: what it holds is not "
                                               "audited (extract it and inspect the files)")
    return FolderEntry(path, "data", describe_data(head))


def _not_a_file(path: str, name: str, folder_fd: int, listed: os.DirEntry[str]) -> FolderEntry:
    try:
        mode = os.stat(name, dir_fd=folder_fd).st_mode
    except OSError as exc:
        if listed.is_symlink():
            return FolderEntry(path, "unreadable", f"a symbolic link to {os.readlink(name, dir_fd=folder_fd)}, "
                                                   "which does not exist")
        return FolderEntry(path, "unreadable", f"cannot be examined: {exc.strerror}")
    return FolderEntry(path, "unreadable", f"{_special(mode)}, not a file: memlayout reads files and folders")


def folder_entries(folder: str, taken: Collection[str] = ()) -> list[FolderEntry]:
    """Every member of `folder`, in name order, with what a walk does with it.

    Args:
        folder: A directory.
        taken: Names of files a model loader already read from this folder (its
            weights and index), which the walk leaves out: they are part of the model's report.

    Returns:
        One entry per member, hidden ones included; sub-folders are not entered here.
    """
    found: list[FolderEntry] = []
    prefix = folder if folder.endswith(os.sep) else folder + os.sep  # os.path.join, once per folder
    folder_fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        with os.scandir(folder_fd) as listing:
            entries = sorted(listing, key=lambda e: e.name)
        for entry in entries:
            if entry.name in taken:
                continue
            found.append(_entry(prefix + entry.name, entry.name, folder_fd, entry))
    finally:
        os.close(folder_fd)
    return found


def folder_members(folder: str, taken: Collection[str] = ()) -> list[str]:
    """The members of `folder` a walk reads or enters, in name order (`folder_entries` has every member).

    Args:
        folder: A directory.
        taken: As for `folder_entries`.

    Returns:
        Paths under `folder`: every sub-folder, and every file a format recognizes
        or whose name has a checkpoint's suffix.
    """
    return [entry.path for entry in folder_entries(folder, taken) if entry.kind in ("folder", "read", "expected")]
