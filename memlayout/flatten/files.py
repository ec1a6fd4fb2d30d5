"""Flatten a checkpoint on disk (or an import spec) into OUT: load -> plan -> write.

IN is loaded as records, its facts and flat plan are built, and the writer
registered for its format (`memlayout.flatten.writers`) moves the bytes and writes
OUT in the same format, verified. A Hugging Face directory is flattened file by
file into a new directory.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace

from memlayout import _torch
from memlayout.core.fact_builder import build_facts
from memlayout.core.facts import Facts
from memlayout.core.flatten_support import flatten_route
from memlayout.errors import FlattenError, UnsafeContentError, UsageError
from memlayout.flatten.live import resolve_device
from memlayout.flatten.options import FlattenOptions, Progress
from memlayout.flatten.plan import FlatPlan, plan_flatten
from memlayout.flatten.writers import FlattenJob, FlattenWriter, converter_for, registry, writer_for
from memlayout.flatten.writers.interface import LayoutAfter
from memlayout.flatten.writers.safetensors_dir import (
    converted_index,
    converted_name,
    index_metadata,
)
from memlayout.io.atomic_write import atomic_directory, resolve_target
from memlayout.load import load_path
from memlayout.load.main_module import MAIN, classes_from_main, objects_from_main
from memlayout.load.records import DeclaredTie, PickleGlobal


@dataclass(frozen=True)
class FlattenResult:
    """What happened, for the summary."""

    source: str
    out: str | None
    format: str
    """The format read and written ("torch-zip state dict", "torch-zip module", ...)."""
    device: str | None
    """The devices OUT records ("cuda:0", "cpu, cuda:0"); None for --check."""
    device_reason: str
    """Why this device ("kept: ...", "auto: CUDA is available", "as asked")."""
    storages_before: int
    storages_after: int
    bytes_before: int
    bytes_after: int
    padding_bytes: int
    bytes_copied: int
    seconds: float
    already_flat: bool
    changes: tuple[str, ...]
    """What flattening changes (or would change, with --check)."""
    notes: tuple[str, ...]
    verified: bool
    unverified_reason: str = ""
    """Why OUT was not re-read, when it was not."""
    verification: tuple[str, ...] = ()
    """What verification proved, one clause per kind of change (`memlayout.flatten.verification`), when it ran."""
    stages: tuple[tuple[str, float], ...] = ()
    """Seconds per stage ("plan", "copy", "verify", "fsync", ...), in order."""


def _same_file(a: str, b: str) -> bool:
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.abspath(a) == os.path.abspath(b)


def _check_paths(path: str, options: FlattenOptions) -> str | None:
    if options.check:
        return None
    if options.in_place:
        if options.out is not None and not _same_file(path, options.out):
            raise UsageError("--in-place rewrites IN; do not also give a different -o")
        if not os.path.exists(path):
            raise UsageError(f"--in-place needs a file or directory, and {path} is not one")
        return path
    if options.out is None:
        raise UsageError("no output given", "pass -o OUT, or --check to only check, or --in-place")
    if _same_file(path, options.out):
        raise UsageError(f"-o {options.out} is IN itself", "pass --in-place to rewrite IN, or choose another OUT")
    if os.path.isdir(options.out) and not os.path.isdir(path):
        # A file is flattened into one file; a folder as OUT is a Hugging Face directory's.
        # Refused before any work, like `cp`'s target errors, rather than after the copy.
        name = os.path.basename(path.rstrip(os.sep)) if os.path.exists(path) else "model.pt"
        suggestion = os.path.join(options.out, name)
        raise UsageError(
            f"-o {options.out} is an existing folder, and flatten writes IN ({path}) as one file",
            f"give the file to write, e.g. -o {suggestion}",
        )
    return options.out


def refuse_unflattenable(facts: Facts, options: FlattenOptions) -> None:
    """Raise flatten's refusal for this source, if it has one; the same with and without --check.

    Args:
        facts: The loaded source's facts.
        options: What was asked (--trust).

    Raises:
        FlattenError: flatten does not rewrite this format (and what to do instead).
        UnsafeContentError: rewriting it needs real objects and --trust was not given.
    """
    route = flatten_route(facts.source)
    where = facts.source.path or "the source"
    if route.refusal:
        raise FlattenError(f"{where}: {route.refusal}", route.alternative or None)
    if route.trust_reason and not options.trust:
        raise UnsafeContentError(
            f"{where}: flatten needs --trust: {route.trust_reason}",
            f"pass {route.command.removeprefix('memlayout flatten ')} only if you trust whoever wrote the file",
        )
    if options.main_module is not None and not classes_from_main(facts.source.pickle_globals):
        raise UsageError(
            f"--main-module applies to a pickle saved from a script, and {where} looks nothing up in __main__",
            "drop --main-module",
        )
    if route.trust_reason and facts.source.pickle_globals:
        _require_importable(where, facts.source.pickle_globals, options.main_module)


def _require_importable(where: str, pickle_globals: tuple[PickleGlobal, ...], main_module: str | None) -> None:
    # With --trust the pickle is unpickled for real, which imports every class it
    # names. One that cannot be imported fails the write; --check says so too,
    # rather than promising a change the write cannot make.
    import importlib

    from_main = classes_from_main(pickle_globals)
    if from_main and main_module is None:
        # A script's torch.save names its classes `__main__.X`, and here `__main__` is
        # memlayout: no PYTHONPATH makes them import. --main-module says where they
        # are defined; OUT's pickle names them `__main__.X` again, as IN's does.
        listed = ", ".join(f"__main__.{name}" for name in from_main[:3])
        raise UsageError(
            f"{where}: the pickle needs {listed}: it was saved from a script, whose classes only that script defines",
            f"pass --main-module MODULE, the module on PYTHONPATH that defines {', '.join(from_main[:3])} (OUT "
            "still names them __main__, so the script loads it as it loads IN); or, in that script, "
            "torch.save(model.state_dict(), ...) and flatten that, which needs no --trust",
        )
    if from_main and main_module is not None:
        objects_from_main(main_module, from_main)
    for found in pickle_globals:
        if found.allowed or found.module == MAIN:
            continue
        try:
            getattr(importlib.import_module(found.module), found.name.split(".")[0])
        except Exception as exc:  # any failure to import is the same refusal
            raise UsageError(
                f"{where}: the pickle needs {found.module}.{found.name}, which cannot be imported here ({exc})",
                "put the model's code on PYTHONPATH, or install its package, so that its classes import",
            ) from None


def _device_choice(device: str) -> tuple[str | None, str]:
    """(the device every tensor moves to, or None to keep each one's; why), for the plan and the summary."""
    resolved = resolve_device(device)
    if resolved is None:
        return None, "kept: OUT records each tensor's device as IN does; --device moves them"
    if device == "auto":
        return resolved, "auto: " + ("CUDA is available" if resolved != "cpu" else "no CUDA device, using CPU")
    return resolved, "as asked"


def _devices_written(plan: FlatPlan, facts: Facts) -> str:
    """The devices OUT records, for the summary ("cuda:0", "cpu, cuda:0")."""
    untouched = {key[0] for key in plan.untouched}
    devices = {flat.device for flat in plan.buffers} | {s.device for s in facts.storages if s.key in untouched}
    return ", ".join(sorted(devices)) or "cpu"


def _result(
    path: str, out: str | None, fmt: str, facts: Facts, after: LayoutAfter, notes: tuple[str, ...],
    device: tuple[str | None, str], copied: int, seconds: float, changes: list[str], verified: bool,
    verification: tuple[str, ...] = (), stages: tuple[tuple[str, float], ...] = (),
) -> FlattenResult:
    return FlattenResult(
        source=path,
        out=out,
        format=fmt,
        device=device[0],
        device_reason=device[1],
        storages_before=len(facts.storages),
        storages_after=after.storages,
        bytes_before=sum(s.nbytes for s in facts.storages),
        bytes_after=after.nbytes,
        padding_bytes=after.padding_bytes,
        bytes_copied=copied,
        seconds=seconds,
        already_flat=not changes,
        changes=tuple(changes),
        notes=notes,
        verified=verified,
        unverified_reason=_unverified_reason(out, verified),
        verification=verification if verified else (),
        stages=stages,
    )


def _unverified_reason(out: str | None, verified: bool) -> str:
    if verified or out is None:
        return ""
    return "OUT is a device or pipe, which cannot be re-read" if resolve_target(out).is_stream else "--no-verify"


def flatten_path(path: str, options: FlattenOptions, progress: Progress | None = None) -> FlattenResult:
    """Flatten the model or checkpoint at `path` into `options.out`, verified.

    Args:
        path: A torch.save file, a safetensors file or HF directory, or an import
            spec `pkg.mod:factory` (whose model is saved as a state dict, the format
            that needs no code to load).
        options: Output, device, alignment, trust, check and verification switches.
        progress: Called as `progress(task, done, total)` with the bytes copied and
            verified so far, by writers that stream.

    Returns:
        A `FlattenResult` for the summary.

    Raises:
        UsageError: inconsistent paths or options.
        UnsafeContentError: a source that needs real objects (a module pickle), without `trust`.
        FlattenError: a format flatten refuses, or flattening or verification failed;
            nothing was written.
        TorchNotInstalledError: torch is not installed, and this is no `check`.
    """
    from memlayout.load.hf_dir import is_hf_dir

    if options.to is not None and options.in_place:
        raise UsageError(f"--in-place would replace IN with {options.to}", "pass -o OUT instead")
    if os.path.isdir(path) and is_hf_dir(path):
        if options.to is not None:
            return _convert_hf_dir(path, options, progress)
        return _flatten_hf_dir(path, options, progress)
    return _flatten_file(path, _check_paths(path, options), options, progress)


def _flatten_file(
    path: str, out: str | None, options: FlattenOptions, progress: Progress | None = None,
    declared: tuple[DeclaredTie, ...] = (),
) -> FlattenResult:
    """Flatten (or, with `options.to`, convert) one source; `declared` adds the ties its folder's config declares."""
    planning = time.perf_counter()
    source = load_path(path)
    try:
        source.declared_ties.extend(t for t in declared if t not in source.declared_ties)
        facts = build_facts(source)
        writer = _writer(source.format, facts, options)
        # Refusals come first and are the same with --check: a CI gate on --check
        # must fail the way flatten itself would, not promise a change it refuses.
        notes = writer.admit(source, facts, options)
        label = writer.label(source)
        movable = writer.movable(source)
        if movable is not source:
            facts = build_facts(movable)
        if options.check:
            plan = plan_flatten(facts, align=options.align, device="cpu" if options.to else None)
            changes = writer.changes(plan, facts, source)
            return _result(path, None, label, facts, writer.layout_after(plan, facts), plan.notes + notes,
                           (None, "check only"), 0, 0.0, changes, False)
        _torch.require("flatten, except --check,")
        target, reason = _device_choice(options.device)
        if options.to is not None and target is None:
            target, reason = "cpu", f"{options.to} records no device: tensors are written from the CPU"
        plan = plan_flatten(facts, align=options.align, device=target)
        changes = writer.changes(plan, facts, source)
        writer.refuse(source, options, target)
        device = (target or _devices_written(plan, facts), reason)
        assert out is not None
        started = time.perf_counter()
        written = writer.write(FlattenJob(path, out, source, facts, plan, options, progress))
        seconds = time.perf_counter() - started
        stages = (("plan", started - planning), *written.stages.items())
        return _result(path, out, label, facts, writer.layout_after(plan, facts), plan.notes + notes, device,
                       written.bytes_copied, seconds, changes, written.verified, written.verification, stages)
    finally:
        source.close()


def _writer(source_format: str, facts: Facts, options: FlattenOptions) -> FlattenWriter:
    """The writer for this source: its format's, or with --to the converter to that format."""
    if options.to is not None:
        converter = converter_for(options.to, source_format)
        if converter is None:
            where = facts.source.path or "the source"
            # Each converter of that target knows what to do instead with what it does not read.
            others = registry().converters_to(options.to)
            if others:
                raise others[0].declines(source_format, where)
            raise FlattenError(f"flatten writes no {options.to} files", "leave out --to")
        return converter
    refuse_unflattenable(facts, options)
    writer = writer_for(source_format)
    if writer is None:
        raise FlattenError(
            f"flatten has no writer for {source_format} sources",
            "convert to a torch.save state dict or a safetensors file first",
        )
    return writer


def _flatten_hf_dir(path: str, options: FlattenOptions, progress: Progress | None = None) -> FlattenResult:
    """Flatten each weight file of a model directory on its own and copy the rest.

    A shard keeps exactly its tensors, so the index stays true, and savers already
    store a tie once (in one shard). The new directory is built beside OUT and
    swapped in only when every file is written and verified.
    """
    import shutil

    from memlayout.load.hf_dir import weight_files

    files, _ = weight_files(path)
    if options.check:
        return _merge_results(path, None, [
            flatten_path(os.path.join(path, name), replace(options, out=None)) for name in files
        ], files)
    out = _check_paths(path, options)
    assert out is not None
    results = []
    # --in-place asked for IN to be rewritten, so its files may be replaced.
    with atomic_directory(out, force=options.force or options.in_place) as temporary:
        for name in sorted(os.listdir(path)):
            source, target = os.path.join(path, name), os.path.join(temporary, name)
            if name in files:
                results.append(flatten_path(source, replace(options, out=target, in_place=False), progress))
            elif os.path.isdir(source):
                # New files, as `cp -r` makes them: the umask applies, not IN's modes.
                shutil.copytree(source, target, copy_function=shutil.copyfile)
            else:
                shutil.copyfile(source, target)
    return _merge_results(path, out, results, files)


def _convert_hf_dir(path: str, options: FlattenOptions, progress: Progress | None = None) -> FlattenResult:
    """Convert a model directory's weight files to safetensors shards and an index; copy the rest.

    Each file is converted on its own with the ties its config.json declares (so the
    embedding is kept and the tied head dropped, as transformers does), the index
    is rewritten for the new names, and the old weight files and index are left out.
    """
    import shutil

    from memlayout.load.hf_dir import BIN_INDEX, SAFETENSORS_INDEX, config_ties, weight_files
    from memlayout.load.safetensors_file import read_header

    files, _ = weight_files(path)
    names = _names_in(path, files)
    ties = tuple(config_ties(path, [n for file_names in names.values() for n in file_names]))
    notes = _ties_across_files(ties, names)
    if options.check:
        results = [_flatten_file(os.path.join(path, name), None, replace(options, out=None), None, ties)
                   for name in files]
        return _merge_results(path, None, results, files, notes)
    out = _check_paths(path, options)
    assert out is not None
    results = []
    skipped = {*files, BIN_INDEX, SAFETENSORS_INDEX}
    with atomic_directory(out, force=options.force) as temporary:
        weight_map: dict[str, str] = {}
        dropped: set[str] = set()
        total = 0
        for name in files:
            target = os.path.join(temporary, converted_name(name))
            results.append(_flatten_file(os.path.join(path, name), target, replace(options, out=target), progress,
                                         ties))
            header, _ = read_header(target)
            weight_map.update(dict.fromkeys((e.name for e in header.entries), converted_name(name)))
            dropped.update(n for n in header.metadata if n != "format" and header.metadata[n] in weight_map)
            total += sum(e.nbytes for e in header.entries)
        if len(files) > 1:
            with open(os.path.join(temporary, SAFETENSORS_INDEX), "wb") as index:
                index.write(converted_index(weight_map, dropped, total, index_metadata(path)))
        for name in sorted(os.listdir(path)):
            source, target = os.path.join(path, name), os.path.join(temporary, name)
            if name in skipped:
                continue
            if os.path.isdir(source):
                shutil.copytree(source, target, copy_function=shutil.copyfile)
            else:
                shutil.copyfile(source, target)
    return _merge_results(path, out, results, files, notes)


def _names_in(path: str, files: list[str]) -> dict[str, list[str]]:
    """The tensor names each weight file stores (read as metadata, nothing executed)."""
    names = {}
    for name in files:
        with load_path(os.path.join(path, name)) as source:
            names[name] = [t.name for t in source.tensors]
    return names


def _ties_across_files(ties: tuple[DeclaredTie, ...], names: dict[str, list[str]]) -> tuple[str, ...]:
    """Declared ties whose two names lie in different files: IN stores them apart, and so does OUT."""
    file_of = {n: file for file, file_names in names.items() for n in file_names}
    return tuple(
        f"lost tie: {tie.target} is declared tied to {tie.source} ({tie.declared_by}), but IN stores them in "
        f"{file_of[tie.target]} and {file_of[tie.source]}; OUT keeps both, not re-tied"
        for tie in ties
        if tie.target in file_of and tie.source in file_of and file_of[tie.target] != file_of[tie.source]
    )


def _merge_results(
    path: str, out: str | None, results: list[FlattenResult], files: list[str], notes: tuple[str, ...] = ()
) -> FlattenResult:
    first = results[0]
    return FlattenResult(
        source=path,
        out=out,
        format=f"Hugging Face directory ({len(files)} {first.format} file{'s' if len(files) != 1 else ''})",
        device=first.device,
        device_reason=first.device_reason,
        storages_before=sum(r.storages_before for r in results),
        storages_after=sum(r.storages_after for r in results),
        bytes_before=sum(r.bytes_before for r in results),
        bytes_after=sum(r.bytes_after for r in results),
        padding_bytes=sum(r.padding_bytes for r in results),
        bytes_copied=sum(r.bytes_copied for r in results),
        seconds=sum(r.seconds for r in results),
        already_flat=all(r.already_flat for r in results),
        changes=tuple(f"{name}: {change}" for name, r in zip(files, results, strict=True) for change in r.changes),
        notes=tuple(dict.fromkeys((*notes, *(note for r in results for note in r.notes)))),
        verified=all(r.verified for r in results),
        unverified_reason=next((r.unverified_reason for r in results if r.unverified_reason), ""),
        # Each file was checked as its own kind of change asked; the directory's check is all of them.
        verification=tuple(dict.fromkeys(clause for r in results for clause in r.verification)),
    )


__all__ = ["FlattenOptions", "FlattenResult", "flatten_path"]
