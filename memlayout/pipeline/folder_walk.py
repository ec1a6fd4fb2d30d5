"""Which members of a folder `inspect` reads: chosen by content, never by name.

A folder that is no model by itself, and what a model folder holds besides its
model, is walked file by file. Each file's first bytes (`load.HEAD_BYTES`, one
read) decide: a safetensors file, a torch zip, a pickle stream of any kind (a
bare pickle, a joblib file, a legacy torch.save), a numpy `.npy`/`.npz` are
inspected, whatever they are called; anything else (JSON, text, images, a zip of
other things) is skipped, so a pickle named `notes.txt` is found and a README
never is. A file with a checkpoint's suffix is inspected even when no format
recognizes it, so a damaged `model.pt` is reported rather than passed over.

One `os.open` relative to the folder, one read and one close per file: the first
bytes, not the file. That is the least any walk by content can do; the folder's
listing itself is the few `getdents` calls `find` makes (benchmarks/bench_folder_walk.py).
"""

from __future__ import annotations

import os
from collections.abc import Collection

from memlayout.load import HEAD_BYTES, recognized_format
from memlayout.load.detect import lists_a_torch_pickle

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".pt2")
"""Suffixes whose file is reported even when no format recognizes its content (a damaged checkpoint)."""

_READ_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


def _head(name: str, folder_fd: int) -> bytes | None:
    """The first `HEAD_BYTES` of a file in the folder; None when it cannot be opened (a broken link, no permission)."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=folder_fd)
    except OSError:
        return None
    try:
        return os.read(fd, HEAD_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)


def is_inspected(path: str, head: bytes) -> bool:
    """Whether a walk inspects a file with these first bytes: some format reads it.

    A zip counts only when it is numpy's or names a torch pickle; a zip of other
    things (a dataset, an ONNX bundle) is no checkpoint.

    Args:
        path: The file.
        head: Its first bytes.

    Returns:
        True when `inspect` should read it.
    """
    found = recognized_format(path, head)
    if found == "torch-zip":
        return lists_a_torch_pickle(path)
    return found is not None


def folder_members(folder: str, taken: Collection[str] = ()) -> list[str]:
    """The members of `folder` a walk inspects, in name order.

    Hidden entries are skipped (as ruff and black walk a tree), so the order of a
    combined report does not depend on the filesystem.

    Args:
        folder: A directory.
        taken: Names of files a model loader already read from this folder (its
            weights and index), which the walk leaves out.

    Returns:
        Paths under `folder`: every sub-folder, and every file `is_inspected`
        accepts or whose name has a checkpoint's suffix.
    """
    found: list[str] = []
    prefix = folder if folder.endswith(os.sep) else folder + os.sep  # os.path.join, once per folder
    folder_fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        with os.scandir(folder_fd) as listing:
            entries = sorted(listing, key=lambda e: e.name)
        for entry in entries:
            name = entry.name
            if name.startswith(".") or name in taken:
                continue
            path = prefix + name
            if entry.is_dir():
                found.append(path)
                continue
            head = _head(name, folder_fd) if entry.is_file() else None
            if head is None:
                continue
            if name.lower().endswith(CHECKPOINT_SUFFIXES) or is_inspected(path, head):
                found.append(path)
    finally:
        os.close(folder_fd)
    return found
