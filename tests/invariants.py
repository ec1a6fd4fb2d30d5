"""What every read that succeeds must return, however damaged or hostile the file was.

The damaged-file properties (`tests/load/test_damaged_files.py`), the fuzz
targets (`tests/fuzz/harness.py`) and the corpora (`tests/corpus/`) ask more of an
input memlayout accepts than "no unexpected exception": what it reports must be
possible. `violations(path)` reads the file as `inspect` does and lists every
broken property of the records and the facts built from them:

- names are unique, in the records and across the facts' views;
- every tensor has a non-negative offset, a shape and strides of non-negative
  ints of one length, and a storage the source holds;
- every tensor's bytes (offset, shape, strides and dtype) lie inside its
  storage, whose size is non-negative, and a view's byte count is its element
  count times its dtype's size;
- every storage whose bytes are located lies inside its file, and holds at
  least the bytes its records say;
- a storage's used, padding and unused bytes add up to its size.

`after_flatten_violations(source, flat, folder)` asks the same of flatten's
output: checking the fix memlayout recommends never fails (issue 26).
"""

from __future__ import annotations

import math
import re
from typing import Any

_SHOWN = 20


def _extent_bytes(offset: int, shape: tuple[int, ...], stride: tuple[int, ...], itemsize: int) -> int:
    """One past the last byte a view touches, from byte 0 of its storage (0 for an empty view)."""
    if any(size == 0 for size in shape):
        return 0
    return (offset + sum((size - 1) * step for size, step in zip(shape, stride, strict=True)) + 1) * itemsize


def _is_index_tuple(values: Any) -> bool:
    return isinstance(values, tuple) and all(type(v) is int and v >= 0 for v in values)


def _record_violations(source: Any) -> list[str]:
    from memlayout.dtypes import dtype_info

    found: list[str] = []
    seen: set[str] = set()
    layout_recorded = not source.layout_unrecorded
    for storage in source.storages.values():
        if type(storage.nbytes) is not int or storage.nbytes < 0:
            found.append(f"storage {storage.key!r:.60} has size {storage.nbytes!r:.40}")
    for tensor in source.tensors:
        name = f"tensor {tensor.name!r:.80}"
        if tensor.name in seen:
            found.append(f"{name} is reported twice")
        seen.add(tensor.name)
        if type(tensor.offset) is not int or tensor.offset < 0:
            found.append(f"{name} has offset {tensor.offset!r:.40}")
            continue
        if not (_is_index_tuple(tensor.shape) and _is_index_tuple(tensor.stride)) or len(tensor.shape) != len(
            tensor.stride
        ):
            found.append(f"{name} has shape {tensor.shape!r:.60} and stride {tensor.stride!r:.60}")
            continue
        storage = source.storages.get(tensor.storage_key)
        if storage is None:
            found.append(f"{name} views storage {tensor.storage_key!r:.60}, which the source does not hold")
            continue
        end = _extent_bytes(tensor.offset, tensor.shape, tensor.stride, dtype_info(tensor.dtype).itemsize)
        if layout_recorded and storage.has_data and end > storage.nbytes:
            found.append(f"{name} reaches byte {end} of storage {storage.key!r:.60}, which holds {storage.nbytes}")
    return found


def _file_violations(source: Any) -> list[str]:
    from memlayout.load.mapped_files import MappedFiles

    reader = source.reader
    if not isinstance(reader, MappedFiles) or not reader.maps:
        return []
    found: list[str] = []
    for key, start in reader.starts.items():
        size = reader.sizes.get(key)
        file = (reader.file_of or {}).get(key, 0)
        length = len(reader.maps[file])
        if size is None or start < 0 or size < 0 or start + size > length:
            found.append(f"storage {key!r:.60} spans bytes {start}..{start + (size or 0)} of a {length}-byte file")
    for storage in source.storages.values():
        if storage.has_data and storage.key in reader.sizes and storage.nbytes > reader.sizes[storage.key]:
            found.append(f"storage {storage.key!r:.60} holds {storage.nbytes} bytes, its span "
                         f"{reader.sizes[storage.key]}")
    return found


def _fact_violations(facts: Any) -> list[str]:
    found: list[str] = []
    seen: set[str] = set()
    storages = {s.id: s for s in facts.storages}
    layout_recorded = not facts.source.layout_unrecorded
    for view in facts.tensors:
        for name in view.names:
            if name in seen:
                found.append(f"name {name!r:.80} reaches two views")
            seen.add(name)
        if view.numel != math.prod(view.shape) or view.nbytes != view.numel * view.itemsize:
            found.append(f"view {view.name!r:.80}: {view.numel} elements of {view.itemsize} bytes, nbytes "
                         f"{view.nbytes}")
        storage = storages[view.storage]
        if layout_recorded and storage.has_data and view.bytes_used.intervals and (
            view.bytes_used.start < 0 or view.bytes_used.end > storage.nbytes
        ):
            found.append(f"view {view.name!r:.80} uses bytes {view.bytes_used.start}..{view.bytes_used.end} "
                         f"of a {storage.nbytes}-byte storage")
    for storage in facts.storages:
        if storage.used_bytes + storage.padding_bytes + storage.unused_bytes != storage.nbytes:
            found.append(f"storage {storage.id}: used {storage.used_bytes} + padding {storage.padding_bytes} + "
                         f"unused {storage.unused_bytes} is not its {storage.nbytes} bytes")
    return found


def violations(path: str) -> list[str]:
    """Every property that what memlayout reads from `path` breaks; empty when the read is sound or refused.

    Args:
        path: A file or directory `inspect` reads.

    Returns:
        One line per broken property (at most 20).
    """
    from memlayout.core.fact_builder import build_facts
    from memlayout.errors import MemlayoutError
    from memlayout.load import load_path

    try:
        source = load_path(path)
    except MemlayoutError:
        return []  # refused: nothing was returned to judge
    with source:
        found = _record_violations(source) + _file_violations(source)
        try:
            facts = build_facts(source)
        except MemlayoutError:
            return found[:_SHOWN]
        found += _fact_violations(facts)
    return found[:_SHOWN]


# Findings `memlayout flatten` removes (ML501 and ML602 too: OUT is one device, a current zip).
FIXED_BY_FLATTEN = frozenset({"ML201", "ML203", "ML204", "ML301", "ML401", "ML501", "ML602"})
# `flatten --to safetensors` converts the file to another format: a step past what
# flatten's rewrite of OUT claims, so a hint naming it does not send the user in a circle.
_SENDS_TO_FLATTEN = re.compile(r"memlayout[ .]flatten(?! --to)")


def after_flatten_violations(source: str, flat: str, folder: str, moved_to: str | None = None) -> list[str]:
    """What `diff SOURCE FLAT` and `inspect FLAT` say that flatten should have made untrue (issue 26).

    flatten's output is what memlayout recommends, so checking it must not fail:
    `diff SOURCE FLAT --fail-on warning` exits 0, FLAT's storages waste no byte
    (flatten copies only used bytes; its alignment is padding), and no finding on
    FLAT sends the user to flatten, which would leave FLAT as it is.

    Args:
        source: A file or directory flatten read.
        flat: What `memlayout flatten SOURCE -o FLAT` wrote.
        folder: An empty directory for the reports.
        moved_to: The `--device` flatten was given: diff's warnings that tensors
            moved there are what the user asked for, not regressions.

    Returns:
        One line per broken property; empty when flatten's output checks clean.
    """
    import json
    from pathlib import Path

    from memlayout.cli.app import main

    diff_report, inspect_report = Path(folder) / "diff.json", Path(folder) / "inspect.json"
    found: list[str] = []
    code = main(["diff", source, flat, "--fail-on", "warning", "--format", "json", "-o", str(diff_report)])
    changes = json.loads(diff_report.read_text())["changes"] if code in (0, 1) else []
    regressions = [
        f"{c['severity']} {c['kind']}: {c['message']}" for c in changes
        if c["severity"] != "info" and not (moved_to and c["kind"] == "device" and c["after"] == moved_to)
    ]
    if regressions or (code != 0 and not (moved_to and code == 1)):
        found.append(f"diff exits {code}: " + "; ".join(regressions))
    main(["inspect", flat, "--fail-on", "never", "--format", "json", "-o", str(inspect_report)])
    report = json.loads(inspect_report.read_text())
    found += [
        f"storage {s['id']} wastes {s['unused_bytes']} bytes ({s['padding_bytes']} padding)"
        for s in report["storages"] if s["unused_bytes"]
    ]
    found += [
        f"{f['code']} on flatten's output sends the user to flatten: {f['message']}"
        for f in report["findings"] if _SENDS_TO_FLATTEN.search(f["hint"])
    ]
    return found[:_SHOWN]
