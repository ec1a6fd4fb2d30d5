"""ML6xx: what loading the file for real would execute, and outdated formats."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from memlayout.core.facts import Facts
from memlayout.core.flatten_support import conversion_hint, flatten_hint
from memlayout.load.detect import CONTAINER_FORMATS
from memlayout.load.names import claimed_formats
from memlayout.rules.pickle_dangers import Danger, judge
from memlayout.rules.registry import Finding, RuleContext, RuleExample, rule
from memlayout.severity import Severity

_SHOWN = 12


def _as_safetensors(facts: Facts) -> str:
    """The "as safetensors" step of a re-save hint, with the steps save_file needs first.

    safetensors' `save_file` refuses tensors that share memory ("Some tensors share
    memory, this will lead to duplicate memory on disk"), views of one storage as
    much as one tensor under two names, and non-contiguous tensors ("You are trying
    to save a non contiguous tensor"); a legacy state dict often holds both.
    `.clone()` keeps a tensor's strides, so a transposed one needs `.contiguous()`.
    """
    shared = [
        name
        for storage in facts.storages
        for name in storage.tensors
        if len(storage.tensors) > 1
    ]
    shared += [t.name for t in facts.tensors if len(t.names) > 1 and t.name not in shared]
    strided = [t.name for t in facts.tensors if t.shape and not t.contiguous]
    steps = []
    if shared:
        steps.append(f"`.clone()` of each tensor that shares memory ({_listed(shared)})")
    if strided:
        steps.append(f"`.contiguous()` of each tensor that is not contiguous ({_listed(strided)})")
    if not steps:
        return "as safetensors"
    refused = " and ".join(kind for kind, names in (("shared", shared), ("non-contiguous", strided)) if names)
    return f"as safetensors after {' and '.join(steps)}, since safetensors' save_file refuses {refused} tensors"


def _listed(paths: list[str]) -> str:
    shown = ", ".join(paths[:_SHOWN])
    return shown + (f" and {len(paths) - _SHOWN} more" if len(paths) > _SHOWN else "")


@rule(
    "ML601",
    "unsafe-pickle",
    Severity.ERROR,
    "the pickle references globals that torch's weights-only loader refuses",
    "never load it with weights_only=False unless you trust whoever wrote it; `memlayout flatten IN -o "
    "OUT.safetensors --to safetensors --tensors-only` writes its tensors as safetensors without running it; or, "
    "trusting it, load it once where its classes are importable and re-save `model.state_dict()`",
    """
A pickle names every class and function it needs as a global, and unpickling
imports each one and calls it (REDUCE), constructs it (NEWOBJ) or runs its
`__setstate__` (BUILD). `torch.load` defaults to `weights_only=True`, which accepts
only tensors, containers and a fixed allowlist; this file names globals outside
it, so loading it needs `weights_only=False`, which imports and runs them. For a
pickled `nn.Module` they are the model's own classes (the code must be importable
and is executed); `os.system`, `builtins.exec`, `subprocess.Popen` and the like
run arbitrary commands. memlayout lists them from the pickle without importing
or calling any of them.

Each global is listed with its danger class: runs code or reaches the system (a
command, a file, the network, an import: a list of globals, each with the scanner
or advisory that names it and a test that shows it), constructs an arbitrary
object (outside the allow-list, inert by itself), or allow-listed. The finding is
an error when some global runs code, a warning when every one only constructs an
object. Its fingerprint covers the globals and their classes, so a baseline that
accepted one file's globals does not hide a global the file gains.
""",
    detects=(
        "A pickle (a torch.save file, TorchScript, DCP metadata, a bare or joblib pickle, a numpy array "
        "of Python objects, a pickle inside a compressed stream or a zip or tar archive) that names globals "
        "outside the allowlist of torch's weights-only loader: the model's own classes, or callables such as "
        "`os.system`. The globals numpy and joblib rebuild an array with are allowed in a bare or joblib pickle "
        "and in a numpy `.npy`/`.npz` array of objects: an array of numbers, strings or dicts is cleared, with a "
        "note that numpy.load needs allow_pickle=True for it. Error when a global runs code or reaches the system, "
        "warning when every one only constructs an object."
    ),
    example=RuleExample(
        setup="""
import torch

model = torch.nn.Linear(4, 4)
torch.save(model, "model.pt")  # pickles the module's class, not only tensors
""",
        command="memlayout inspect model.pt",
        fixed="""
torch.save(model.state_dict(), "model.pt")
""",
    ),
)
def unsafe_pickle(ctx: RuleContext) -> Iterator[Finding]:
    judged = [judge(g.module, g.name, g.allowed, g.member) for g in ctx.facts.source.pickle_globals]
    refused = [g for g in judged if g.danger is not Danger.ALLOW_LISTED]
    if not refused:
        return
    paths = sorted(dict.fromkeys(f"{g.module}.{g.name}" for g in refused))
    modules = sorted({g.module for g in refused})
    dangerous = sorted({f"{g.module}.{g.name}" for g in refused if g.danger is Danger.RUNS_CODE})
    unpickling = _UNPICKLING.get(ctx.facts.source.format, _TORCH_LOAD)
    if ctx.facts.source.format in CONTAINER_FORMATS:
        unpickling = _UNPACKED
    message = (
        f"{unpickling.refused.format(count=len(paths))}: {_listed(paths)}; {unpickling.runs} would import "
        f"{_listed(modules)} and call or construct them while unpickling"
    )
    if dangerous:
        message += f", and {_listed(dangerous)} can run arbitrary code or reach the system"
    # The class of each global, not only its name: a global that moves to runs-code when the table
    # learns what it does is a new finding, which a baseline of the old one does not hide.
    subject = sorted({f"{g.module}\x1f{g.name}\x1f{g.danger.value}" for g in refused})
    # Severity follows the worst class: an object built from a class of the model's own is a
    # warning, a global that runs a command or reaches the system an error.
    severity = Severity.ERROR if dangerous else Severity.WARNING
    convert = conversion_hint(ctx.facts.source)
    hint = unpickling.hint if not convert else (
        f"never load it with weights_only=False unless you trust whoever wrote it; to get its tensors as "
        f"safetensors without running it, {convert}; or, trusting it, load it once where its classes are "
        "importable and re-save `model.state_dict()`"
    )
    yield unsafe_pickle.finding((), message, hint=hint, severity=severity, subject=subject, pickle_globals=judged)


_RESAVE_STATE_DICT = (
    "never load it with weights_only=False unless you trust whoever wrote it; if you do, load it once where "
    "its classes are importable and re-save `model.state_dict()` (or safetensors), which weights_only=True reads"
)


class _Unpickling(NamedTuple):
    """Which loader refuses a format's pickles, which one runs them, and what to do instead."""

    refused: str
    """The message's first clause, with {count} globals."""
    runs: str
    hint: str


_TORCH_LOAD = _Unpickling(
    "the pickle references {count} global(s) that torch.load(weights_only=True) refuses",
    "torch.load(weights_only=False)",
    _RESAVE_STATE_DICT,
)
_NUMPY_LOAD = _Unpickling(
    "the array holds Python objects, a pickle that numpy.load refuses unless allow_pickle=True; "
    "it references {count} global(s)",
    "numpy.load(allow_pickle=True)",
    "never load it with allow_pickle=True unless you trust whoever wrote it; if you do, load it once and "
    "re-save what it holds without objects (an array of a numeric dtype, which numpy.load reads without "
    "allow_pickle)",
)
_UNPICKLING = {
    "npy": _NUMPY_LOAD,
    "npz": _NUMPY_LOAD,
    "pickle": _TORCH_LOAD._replace(
        runs="pickle.load, joblib.load or torch.load(weights_only=False)",
        hint="never unpickle it (pickle.load, joblib.load, torch.load(weights_only=False)) unless you trust "
        "whoever wrote it; if you do, load it once where its classes are importable and re-save its data in a "
        "format that is no pickle (safetensors, or `torch.save(model.state_dict())`, which weights_only=True reads)",
    ),
}
"""How each format's pickles are loaded, where it is not torch.load (every torch format is)."""
_UNPACKED = _Unpickling(
    "the pickles inside reference {count} global(s) that torch.load(weights_only=True) refuses",
    "unpacking it and loading them (torch.load(weights_only=False), joblib.load, pickle.load)",
    "never load what it holds (joblib.load, pickle.load, torch.load(weights_only=False)) unless you trust "
    "whoever wrote it; if you do, unpack and load it once where its classes are importable and re-save its data "
    "in a format that is no pickle (safetensors, or `torch.save(model.state_dict())`, which weights_only=True reads)",
)
"""Pickles inside a compressed stream or an archive (`memlayout.load.unpack`): whatever unpacks them loads them."""


@rule(
    "ML602",
    "legacy-format",
    Severity.INFO,
    "the file uses a legacy torch.save format: the pre-1.6 non-zip stream or the earlier tar archive",
    "run `memlayout flatten`, which writes a current torch.save zip, or `memlayout flatten IN -o OUT.safetensors "
    "--to safetensors`, which writes safetensors; neither runs the file's pickle",
    """
torch.save wrote a plain pickle stream followed by raw storages until torch 1.6,
and still does with `_use_new_zipfile_serialization=False`. Such a file cannot be
memory-mapped (`torch.load(mmap=True)` needs the zip format), its storages are not
aligned, and each is preceded by an 8-byte element count. Readers other than
torch.load rarely support it.

Before that stream, torch.save wrote a tar archive whose `storages`, `tensors` and
`pickle` members hold the raw storages, the tensors' shapes and strides, and the
object. torch.load still reads it, but only with `weights_only=False`: it refuses
the tar format under the weights-only loader, so loading one always unpickles
with full imports.
""",
    detects=(
        "A file in a legacy torch.save format: the pre-1.6 non-zip stream (still written with "
        "`_use_new_zipfile_serialization=False`) or the tar archive before it."
    ),
    example=RuleExample(
        setup="""
import torch

torch.save({"weight": torch.randn(4, 4)}, "model.pt", _use_new_zipfile_serialization=False)
""",
        command="memlayout inspect model.pt",
        fixed="""
torch.save({"weight": torch.randn(4, 4)}, "model.pt")
""",
    ),
)
def legacy_format(ctx: RuleContext) -> Iterator[Finding]:
    source = ctx.facts.source
    if not source.legacy_format:
        return
    where = source.path or "the source"
    if source.format == "torch-legacy-tar":
        message = f"{where} is a legacy tar-format torch.save file, which torch.load reads only with weights_only=False"
    else:
        message = f"{where} is a legacy (non-zip) torch.save file"
    yield legacy_format.finding(
        (),
        message,
        subject=(source.format,),
        hint=f"{flatten_hint(source)}, which writes a current torch.save zip" + (
            f"; or, for safetensors, {convert}" if (convert := conversion_hint(source)) else
            f", or re-save it with a current torch.save (zip format) or {_as_safetensors(ctx.facts)}"
        ),
    )


_READERS = {
    "zip": "zip readers (and scanners that open it as a zip archive)",
    "pickle": "pickle.load",
    "tar": "tar readers",
    "safetensors": "safetensors readers",
}


@rule(
    "ML603",
    "polyglot",
    Severity.WARNING,
    "the file is valid as more than one format, so different tools read different contents",
    "do not pass the file on: `memlayout flatten IN -o OUT.safetensors --to safetensors` writes what torch.load "
    "reads as safetensors, without running it; or re-save the weights you trust with torch.save",
    """
torch.load picks the format from a file's first bytes, zip readers look for the
end record at its other end, tar readers check a header checksum, and pickle.load
starts at byte 0. A file can satisfy several at once: a legacy torch.save pickle
with a zip archive appended is loaded by torch as the pickle while every zip tool,
and any scanner that opens it as a zip, sees the archive, with a clean `data.pkl`
of its own. Such polyglots are how malicious checkpoints get past scanners
(fickling's `polyglot.py` builds them); no writer produces one by accident.
memlayout reads the format torch.load reads and lists the others.
""",
    detects=(
        "A file that is valid as more than one container format (zip, pickle, tar, "
        "safetensors), for example a legacy torch.save file with a zip archive appended."
    ),
    example=RuleExample(
        setup="""
import zipfile

import torch

state = {"weight": torch.randn(4, 4)}
torch.save(state, "model.pt", _use_new_zipfile_serialization=False)
with zipfile.ZipFile("model.pt", "a") as archive:  # appends a zip after the pickles
    archive.writestr("notes.txt", "looks like any zip")
""",
        command="memlayout inspect model.pt",
        fixed="""
torch.save(state, "model.pt")
""",
    ),
)
def polyglot(ctx: RuleContext) -> Iterator[Finding]:
    source = ctx.facts.source
    if not source.also_valid_as:
        return
    others = ", ".join(f"a valid {name}" for name in source.also_valid_as)
    readers = "; ".join(_READERS[name] for name in source.also_valid_as)
    convert = conversion_hint(source)
    yield polyglot.finding(
        (),
        f"{source.path or 'the file'} is a {source.format} file and also {others}: torch.load reads it as "
        f"{source.format}, while {readers} see other contents",
        subject=source.also_valid_as,
        hint=f"do not pass the file on: to keep what torch.load reads, as safetensors and without running it, "
        f"{convert}" if convert else "do not pass the file on: re-save the weights you trust with torch.save or "
        f"{_as_safetensors(ctx.facts)}",
    )


_DIRECTORY_FORMATS = frozenset(["dcp", "hf-dir", "hf-safetensors", "hf-pytorch", "live-module", "state-dict"])
_WHAT_RUNS = {
    "safetensors": "safetensors, which runs nothing",
    "npy": "numpy.load, which runs no pickle by default",
    "npz": "numpy.load, which runs no pickle by default",
}


@rule(
    "ML604",
    "misleading-name",
    Severity.WARNING,
    "the file's name claims a format its content is not",
    "rename the file after what it is (a torch.save zip as `.pt`), or re-save its contents in the format its "
    "name claims; never choose a loader by the name of a file someone else wrote",
    """
memlayout reads every file by its content, but people and most tools go by the
name: a `model.safetensors` is opened with safetensors, which runs no code, a
`notes.txt` in an editor, and a scanner that picks its checks by suffix skips a
`.json`. A torch.save zip named `model.safetensors` is loaded by whatever reads it
as a checkpoint with torch.load, which runs its pickle; a pickle named `notes.txt`
is one `pickle.load` away from running. No writer produces such a name by
accident: a name that lies about a checkpoint is how a payload gets past a review.
""",
    detects=(
        "A file whose suffix claims a format (`.safetensors`, `.npy`, `.npz`, `.pt2`, `.zip`, `.tar`, `.gz`, "
        "`.xz`, `.bz2`, `.lz4`; or text and images: `.json`, `.txt`, `.md`, `.csv`, `.yaml`, `.png`, `.jpg`) "
        "while its content is another format memlayout reads. Names worn by several formats (`.pt`, `.pth`, "
        "`.bin`, `.ckpt`, `.pkl`, `.joblib`, and `.pth.tar`, PyTorch's own name for a torch.save zip) claim "
        "nothing and are never reported."
    ),
    example=RuleExample(
        setup="""
import torch

state = {"weight": torch.randn(4, 4)}
torch.save(state, "model.safetensors")  # a torch.save zip under a safetensors name
""",
        command="memlayout inspect model.safetensors",
        fixed="""
from safetensors.torch import save_file

save_file(state, "model.safetensors")
""",
    ),
)
def misleading_name(ctx: RuleContext) -> Iterator[Finding]:
    source = ctx.facts.source
    if source.files or source.format in _DIRECTORY_FORMATS:
        return  # a folder's name is no claim about a file's format
    claim = claimed_formats(source.path) if source.path else None
    if claim is None or source.format in claim[1]:
        return
    suffix, formats = claim
    said = f"a {formats[0]} file" if formats else "text or an image, not a model"
    trusted = f" ({_WHAT_RUNS[formats[0]]})" if formats and formats[0] in _WHAT_RUNS else ""
    yield misleading_name.finding(
        (),
        f"{source.path} is named like {said} ({suffix}) but its content is {source.format}: a reader chosen "
        f"by the name{trusted} is not what would load it, and a reviewer who trusts the name is misled",
        subject=(suffix, source.format),
    )
