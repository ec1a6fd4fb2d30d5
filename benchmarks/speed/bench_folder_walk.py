"""A folder walk by content: what `memlayout inspect FOLDER` costs to choose and to audit its files.

Usage: python benchmarks/speed/bench_folder_walk.py [--quick]

The folder: 10,000 small files of the kinds a model or data folder holds (JSON,
text, PNG headers, CSV), with a safetensors file, a pickle named `notes.txt` and
an `.npy` among them. memlayout's walk (`memlayout.pipeline.folder_walk`) lists
the folder and reads the first 512 bytes of every file to recognize it by
content. The goal: the walk in under twice the time `find FOLDER` takes to list
it. Beside it, for information, the floor of any walk by content: opening each
file, reading its first bytes and closing it, in a bare loop of the same
calls, and the same loop in C (`benchmarks/speed/c/first_bytes.c`) and in C through
io_uring (`first_bytes_uring.c`, three linked requests per file, one system call
per 256 files), each compiled with `cc -O2` when a compiler (and liburing) is
there. Each is timed in round-robin rounds, best round counted; `find` and the C
programs run as processes, as a user runs them.

Then the audit itself (issue 50): a second folder of 10,000 small files of the
kinds a model registry holds, a quarter each safetensors files, torch.save files
(`.pt`), joblib files compressed with zlib (`compress=3`, scikit-learn's usual)
and text, audited whole by `memlayout inspect FOLDER` in-process
(`memlayout.pipeline.batch.inspect_paths`): every file must come back accounted
for, read with its report or recognized as data, none failed. Timed against the
bare Python loop that reads the same files' first bytes, best of 3 rounds (1 with
`--quick`).
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import ROOT, Row, ms, print_table, quick_requested, round_robin, write_results

GOAL = 2.0
DATA = ROOT / ".bench-data"
FILES = 10_000
HEAD = 512
_KINDS = (
    ("json", lambda i: b'{"id": %d, "label": "item %d"}\n' % (i, i)),
    ("txt", lambda i: b"line %d of some notes\n" % i * 4),
    ("png", lambda i: b"\x89PNG\r\n\x1a\n" + bytes(range(64)) * 4),
    ("csv", lambda i: b"a,b,c\n%d,%d,%d\n" % (i, i + 1, i + 2)),
)


def small_files_folder(count: int) -> Path:
    """`count` small files, three of which a walk by content must pick (whatever their names)."""
    folder = DATA / f"folder-{count}"
    if folder.is_dir() and len(os.listdir(folder)) == count:
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for index in range(count - 3):
        suffix, make = _KINDS[index % len(_KINDS)]
        (partial / f"item-{index:05d}.{suffix}").write_bytes(make(index))
    import numpy as np
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(4, 4)}, str(partial / "weights.safetensors"))
    (partial / "notes.txt").write_bytes(pickle.dumps({"epoch": 3}))
    np.save(partial / "embedding.npy", np.zeros((8, 4), np.float32))
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder


MIXED_KINDS = ("safetensors", "pt", "joblib", "txt")


def mixed_folder(count: int) -> Path:
    """`count` small files, a quarter of each kind a registry's audit reads (see the module docstring)."""
    folder = DATA / f"mixed-{count}"
    if folder.is_dir() and len(os.listdir(folder)) == count:
        return folder
    import io

    import joblib
    import numpy as np
    import torch
    from safetensors.torch import save

    samples = {
        "safetensors": save({"w": torch.zeros(4, 4), "b": torch.zeros(4)}),
        "txt": b"epoch 3, loss 0.25\n" * 8,
    }
    saved = io.BytesIO()
    torch.save({"layer.weight": torch.zeros(4, 4), "layer.bias": torch.zeros(4)}, saved)
    samples["pt"] = saved.getvalue()
    dumped = io.BytesIO()
    joblib.dump({"mean": np.arange(8.0), "scale": np.ones(8), "classes": ["a", "b"]}, dumped, compress=3)
    samples["joblib"] = dumped.getvalue()
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for index in range(count):
        kind = MIXED_KINDS[index % len(MIXED_KINDS)]
        (partial / f"file-{index:05d}.{kind}").write_bytes(samples[kind])
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder


def audit(folder: Path) -> int:
    """`memlayout inspect FOLDER` in-process; returns how many files it accounted for (asserted: all, none failed)."""
    from memlayout.pipeline.batch import inspect_paths

    batch = inspect_paths([str(folder)])
    assert not batch.failures, batch.failures[:3]
    assert all(p.report is not None or p.data is not None for p in batch.paths)
    return len(batch.paths)


def read_first_bytes(folder: Path) -> int:
    """The floor of a walk by content: open, read the first bytes, close, for every file."""
    folder_fd = os.open(folder, os.O_RDONLY)
    total = 0
    try:
        with os.scandir(folder_fd) as listing:
            for entry in listing:
                fd = os.open(entry.name, os.O_RDONLY, dir_fd=folder_fd)
                total += len(os.read(fd, HEAD))
                os.close(fd)
    finally:
        os.close(folder_fd)
    return total


def compiled(source: str, *libraries: str) -> Path | None:
    """`benchmarks/speed/c/<source>` built with `cc -O2` into the data folder; None without a compiler or its
    libraries."""
    compiler = shutil.which("cc")
    program = DATA / Path(source).stem
    if compiler is None:
        return None
    built = subprocess.run([compiler, "-O2", "-o", str(program), str(Path(__file__).parent / "c" / source),
                            *libraries], capture_output=True, check=False)
    return program if built.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    quick = quick_requested(argv)
    from memlayout.pipeline.folder_walk import folder_members

    folder = small_files_folder(FILES)
    found = [Path(p).name for p in folder_members(str(folder))]
    assert found == ["embedding.npy", "notes.txt", "weights.safetensors"], found
    find = shutil.which("find") or "find"
    timed = {
        "find": lambda: subprocess.run([find, str(folder)], stdout=subprocess.DEVNULL, check=True),
        "walk": lambda: folder_members(str(folder)),
        "first bytes": lambda: read_first_bytes(folder),
    }
    c_loops = {"first bytes in C": compiled("first_bytes.c"),
               "first bytes in C, io_uring": compiled("first_bytes_uring.c", "-luring")}
    for label, program in c_loops.items():
        if program is not None:
            timed[label] = lambda program=program: subprocess.run([str(program), str(folder)],
                                                                  stdout=subprocess.DEVNULL, check=True)
    best = round_robin(timed, 5 if quick else 21)
    mixed = mixed_folder(FILES)
    accounted = audit(mixed)
    assert accounted == FILES, accounted
    audited = round_robin({"audit": lambda: audit(mixed), "first bytes": lambda: read_first_bytes(mixed)},
                          1 if quick else 3)
    peer = best["find"]
    rows = [
        Row(f"memlayout's walk of {FILES:,} small files (3 picked by content)", ms(best["walk"]),
            f"find FOLDER {ms(peer)}", best["walk"] / peer, f"<= {GOAL}x", best["walk"] <= GOAL * peer),
        Row(f"open, read {HEAD} bytes, close each file (the floor of a walk by content)", ms(best["first bytes"]),
            f"find FOLDER {ms(peer)}", best["first bytes"] / peer, "(info)", True),
        *(Row(f"the same loop, {label.removeprefix('first bytes ')} (a process, as find is)", ms(best[label]),
              f"find FOLDER {ms(peer)}", best[label] / peer, "(info)", True) for label in c_loops if label in best),
        Row("memlayout's walk", ms(best["walk"]), f"the floor {ms(best['first bytes'])}",
            best["walk"] / best["first bytes"], "(info)", True),
        Row(f"inspect FOLDER of {FILES:,} mixed files (safetensors, .pt, joblib zlib, text), all accounted for",
            ms(audited["audit"]), f"their first bytes {ms(audited['first bytes'])}",
            audited["audit"] / audited["first bytes"], "(info)", True),
        Row("the audit, per file", f"{audited['audit'] / FILES * 1e6:.0f} us",
            f"{audited['first bytes'] / FILES * 1e6:.1f} us", audited["audit"] / audited["first bytes"], "(info)",
            True),
    ]
    print_table(f"bench_folder_walk: choosing a folder's files by content{' (quick)' if quick else ''}", rows)
    raw = {"seconds": best, "files": FILES, "head_bytes": HEAD, "picked": found,
           "audit_seconds": audited, "audited_files": accounted, "mixed_kinds": list(MIXED_KINDS)}
    print(f"raw numbers: {write_results('folder_walk', rows, raw, quick).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
