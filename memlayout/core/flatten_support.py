"""What `memlayout flatten` does with each source format, in one place.

Rules read it so that a finding's hint never sends the user to a flatten that
refuses, and says `--trust` where flatten needs it; flatten reads it to refuse,
in the same words, both when asked to write and under `--check`. Plain data
about formats: nothing here imports torch or the flatten machinery, so the
rules stay light. Every format a loader produces has an entry (a test holds the
table to `memlayout.load.FORMATS` and to the flatten writer registry).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from memlayout.core.facts import SourceFact
from memlayout.load.detect import CONTAINER_FORMATS
from memlayout.load.main_module import classes_from_main


class Trust(enum.Enum):
    """When flattening a format needs `--trust` (real objects, which runs code from the file)."""

    NEVER = "never"
    """Nothing from the file is executed: safetensors, live objects."""
    IF_UNSAFE_GLOBALS = "if-unsafe-globals"
    """A torch pickle: only when it names globals outside torch's weights-only allow-list."""
    ALWAYS = "always"
    """The format's own loader runs code from the file (TorchScript)."""


FLATTEN_FIXES: dict[str, str] = {
    "ML201": "copies each tensor alone in its storage into dense order",
    "ML203": "starts every slot on --align bytes, and a safetensors data section where its own writer would",
    "ML204": "merges the storages into one flat buffer per device, dtype and requires_grad",
    "ML301": "copies only the bytes the tensors use",
    "ML401": "gives each RNN one buffer, laid out as cuDNN's weight space",
    "ML602": "writes a current torch.save zip",
}
"""The findings `memlayout flatten` fixes, and how: what `flatten --check` judges (tests flatten each
away). A tensor that views another's bytes stays a view, so ML201 and ML203 of such a tensor stay."""
FIXED_BY_MOVING = ("ML501", "moves every tensor to the --device asked for")
"""Fixed only where `--device` moves every tensor to one device."""


class FormatSupport(NamedTuple):
    """How flatten treats one loader format."""

    writes: str
    """What OUT is, e.g. "a torch.save zip"."""
    trust: Trust = Trust.NEVER
    trust_reason: str = ""
    """Why loading it for real runs code from the file, for `Trust.ALWAYS`."""
    refusal: str = ""
    """Why flatten refuses this format; empty when it flattens it."""
    alternative: str = ""
    """What works instead, for a refused format."""
    pads: bool = True
    """Whether OUT can hold padding between tensors, so flatten can align each one.
    A safetensors data section allows no gaps: flatten orders its tensors but cannot pad them."""
    one_storage_per_file: bool = False
    """Whether each file OUT writes is one storage whatever its dtypes: a safetensors
    file has one data section, which loading maps as one block of bytes."""
    file_alignment: int = 0
    """Where the format's own writer starts data that its loader uses in place, in bytes:
    torch.save's records on 64 (`torch.load(mmap=True)` maps them), safetensors' data section
    on 8 (its writer pads the header to 8, and stores the largest elements first, so each
    tensor starts on a multiple of its element size). 0 where the loader copies into fresh memory."""


TORCH_RECORD_ALIGNMENT = 64
"""torch.save starts every storage's record on 64 bytes (`kFieldAlignment`)."""
SAFETENSORS_SECTION_ALIGNMENT = 8
"""safetensors' own writer pads its header so the data section starts on 8 bytes ("Force alignment
to 8 bytes", `prepare` in safetensors' Rust core)."""

_PICKLE_TRUST = "re-saving it needs the real objects, and unpickling them runs code from the file"

FORMAT_SUPPORT: dict[str, FormatSupport] = {
    "torch-zip": FormatSupport("a torch.save zip", Trust.IF_UNSAFE_GLOBALS, file_alignment=TORCH_RECORD_ALIGNMENT),
    "safetensors": FormatSupport(
        "a safetensors file", pads=False, one_storage_per_file=True, file_alignment=SAFETENSORS_SECTION_ALIGNMENT
    ),
    "hf-safetensors": FormatSupport(
        "a Hugging Face directory (each safetensors file flattened)", pads=False, one_storage_per_file=True,
        file_alignment=SAFETENSORS_SECTION_ALIGNMENT,
    ),
    "hf-pytorch": FormatSupport(
        "a Hugging Face directory (each torch.save file flattened)", Trust.IF_UNSAFE_GLOBALS,
        file_alignment=TORCH_RECORD_ALIGNMENT,
    ),
    "live-module": FormatSupport("a torch.save state dict"),
    "state-dict": FormatSupport("a torch.save state dict"),
    "torch-legacy": FormatSupport("a current torch.save zip (the format changes)", Trust.IF_UNSAFE_GLOBALS),
    "torch-legacy-tar": FormatSupport("a current torch.save zip (the format changes)", Trust.IF_UNSAFE_GLOBALS),
    "torchscript": FormatSupport(
        "a TorchScript archive",
        Trust.ALWAYS,
        "only torch.jit.load can rebuild the module, and it compiles and runs the archive's code",
    ),
    "torch-export": FormatSupport(
        "a torch.export archive",
        Trust.ALWAYS,
        "only torch.export.load can rebuild the program, and it unpickles parts of the archive with "
        "weights_only=False",
    ),
    "dcp": FormatSupport(
        "",
        refusal=(
            "a torch.distributed.checkpoint directory has no layout of its own to flatten: dcp.load copies "
            "each tensor into the state dict the caller passes, so the caller's tensors decide the layout"
        ),
        alternative=(
            "flatten the model before loading into it: `memlayout.flatten(model)`, then "
            "`dcp.load(model.state_dict(), checkpoint_id=DIR)` keeps the flat buffers"
        ),
    ),
    "npy": FormatSupport(
        "",
        refusal="an .npy file is a numpy array, not a torch checkpoint: it has one array and no layout to flatten",
        alternative="load it with numpy.load and save `torch.from_numpy(array)` with torch.save if torch needs it",
    ),
    "npz": FormatSupport(
        "",
        refusal="an .npz file holds numpy arrays, not a torch checkpoint",
        alternative="load it with numpy.load and save `{name: torch.from_numpy(array)}` with torch.save, then "
        "flatten that file",
    ),
    "pickle": FormatSupport(
        "",
        refusal="a bare pickle is not a torch.save file, and its tensor bytes are not located without unpickling it",
        alternative="load it (pickle.load runs code from the file: only one you trust), torch.save the object, "
        "then flatten that file",
    ),
}


_CONTAINER = FormatSupport(
    "",
    refusal="a compressed stream or an archive is no checkpoint of its own: flatten rewrites the checkpoint inside",
    alternative="unpack it (gunzip, unxz, unzip, tar -x; joblib.load for a joblib file you trust), then flatten "
    "the checkpoint it holds",
)
FORMAT_SUPPORT.update({name: _CONTAINER for name in sorted(CONTAINER_FORMATS)})


SAFETENSORS_CONVERSION = ("torch-zip", "torch-legacy", "safetensors")
"""The file formats `memlayout flatten --to safetensors` converts, reading them without running anything."""
_CONVERTED_DIRECTORIES = ("hf-pytorch", "hf-safetensors")
"""Model directories of those files, converted file by file."""


def conversion_hint(source: SourceFact) -> str:
    """The command that converts this source to safetensors without running it; "" where none does.

    Args:
        source: The source's facts.

    Returns:
        "run `memlayout flatten --to safetensors`", with `--tensors-only` where the
        pickle holds objects (a module, anything outside torch's weights-only
        allow-list), which safetensors cannot store; or "".
    """
    if source.path is None or source.format not in (*SAFETENSORS_CONVERSION, *_CONVERTED_DIRECTORIES):
        return ""
    only = " --tensors-only" if _unsafe_globals(source) else ""
    return f"run `memlayout flatten --to safetensors{only}`"


class FlattenRoute(NamedTuple):
    """What flatten does with one loaded source."""

    command: str
    """The command that flattens it ("memlayout flatten", with --trust where needed); "" when refused."""
    writes: str
    """What OUT is."""
    trust_reason: str
    """Why it needs --trust; "" when it does not."""
    refusal: str
    """Why flatten refuses it; "" when it does not."""
    alternative: str
    """What works instead, when refused."""


def _unsafe_globals(source: SourceFact) -> list[str]:
    return sorted({f"{g.module}.{g.name}" for g in source.pickle_globals if not g.allowed})


def flatten_route(source: SourceFact) -> FlattenRoute:
    """How `memlayout flatten` treats this source.

    Args:
        source: The source's facts (format and the globals its pickles name).

    Returns:
        The command that works, with the reason --trust is needed where it is, or
        the refusal and what to do instead.
    """
    support = FORMAT_SUPPORT.get(source.format)
    if support is None:
        return FlattenRoute("", "", "", f"flatten does not rewrite {source.format} sources", "")
    if support.refusal:
        return FlattenRoute("", support.writes, "", support.refusal, support.alternative)
    trust_reason = ""
    if support.trust is Trust.ALWAYS:
        trust_reason = support.trust_reason
    elif support.trust is Trust.IF_UNSAFE_GLOBALS:
        unsafe = _unsafe_globals(source)
        if unsafe:
            shown = ", ".join(unsafe[:3]) + (f" and {len(unsafe) - 3} more" if len(unsafe) > 3 else "")
            trust_reason = f"its pickle names {shown}, outside torch's weights-only allow-list; {_PICKLE_TRUST}"
    command = "memlayout flatten --trust" if trust_reason else "memlayout flatten"
    if trust_reason and classes_from_main(source.pickle_globals):
        # Saved from a script: its classes are `__main__.X`, found only through --main-module.
        command += " --main-module MODULE"
    return FlattenRoute(command, support.writes, trust_reason, "", "")


def stores_back_to_back(source: SourceFact) -> bool:
    """Whether the format keeps its tensors back to back in one mapped data section (safetensors).

    Args:
        source: The source's facts.

    Returns:
        True where each tensor's place in the file follows from the sizes before it, so
        no rewrite can pad one tensor alone.
    """
    support = FORMAT_SUPPORT.get(source.format)
    return support is not None and not support.pads


def file_alignment(source: SourceFact) -> int:
    """The boundary the format's own writer starts in-place data on (64 for torch.save, 8 for
    safetensors); 0 where its loader copies into fresh memory."""
    support = FORMAT_SUPPORT.get(source.format)
    return support.file_alignment if support is not None else 0


def alignment_hint(source: SourceFact, alignment: int | None, sizes_aligned: bool) -> str:
    """ML203's hint: flatten where it can align every tensor, else the copy that aligns.

    Args:
        source: The source's facts.
        alignment: The boundary the project asked for (`alignment`, `--align`); None
            where ML203 judged the format's own standard.
        sizes_aligned: Every tensor's length is a multiple of the boundary. A format
            without gaps (safetensors) then has every tensor aligned once its data
            section starts on a boundary, which flatten's rewrite makes it do, in
            whatever order it stores them.

    Returns:
        The hint text.
    """
    asked = f" --align {alignment}" if alignment else ""
    support = FORMAT_SUPPORT.get(source.format)
    if support is not None and not support.pads:
        if alignment is None:
            return (
                f"{flatten_hint(source)}: it lays the file out as safetensors' own writer does, the data "
                "section on an aligned boundary and the largest elements first, so every tensor starts on a "
                "multiple of its element size; or `.clone()` the tensor after loading"
            )
        if sizes_aligned:
            return (
                f"{flatten_hint(source, asked)}: it starts the data section on a {alignment}-byte boundary, and "
                f"every tensor here is a multiple of {alignment} bytes long, so each one starts aligned; or "
                "`.clone()` the tensor after loading"
            )
        return (
            "`.clone()` the tensor after loading (a fresh allocation is aligned); the format stores tensors "
            f"back to back with no gaps, and some here are not a multiple of {alignment} bytes long, so no "
            "rewrite of the file can align every one"
        )
    return f"{flatten_hint(source, asked)} (slots start on --align bytes, 64 by default), or `.clone()` the tensor"


def flatten_hint(source: SourceFact, options: str = "") -> str:
    """The flatten step of a finding's hint: a command that works for this source, or what works instead.

    Args:
        source: The source's facts.
        options: Flags the command needs besides --trust (" --align 64"), each with its leading space.

    Returns:
        A clause such as "run `memlayout flatten`", "run `memlayout flatten --trust`
        (...)", "call `memlayout.flatten(model)`" for an object passed in Python, or
        the alternative for a format flatten refuses.
    """
    if source.path is None:
        return "call `memlayout.flatten(model)`"
    route = flatten_route(source)
    if route.refusal:
        return route.alternative or route.refusal
    route = route._replace(command=route.command + options)
    if route.trust_reason:
        support = FORMAT_SUPPORT[source.format]
        where = ", with the classes it names importable" if support.trust is Trust.IF_UNSAFE_GLOBALS else ""
        from_main = classes_from_main(source.pickle_globals)
        if from_main:
            shown = ", ".join(from_main[:3]) + (f" and {len(from_main) - 3} more" if len(from_main) > 3 else "")
            return (
                f"run `{route.command}` (only for a file you trust: {route.trust_reason}; it was saved from a "
                f"script, so MODULE is the module on PYTHONPATH that defines {shown}, and OUT still names them "
                "the script's own, so the script loads OUT as it loads IN)"
            )
        return f"run `{route.command}` (only for a file you trust{where}: {route.trust_reason})"
    return f"run `{route.command}`"
