"""What a loader hands to the facts layer: plain records, no torch objects.

Every format (live objects, torch.save zips, safetensors, ...) is reduced to these
records, so facts and rules work the same on a live model and on a file that was
never unpickled for real.

The records are NamedTuples: immutable and typed like a frozen dataclass, but
built in a third of the time and a fraction of the memory (a mixture-of-experts
checkpoint holds 100,000 tensors; the figures are in benchmarks/README.md), and
defined in a seventh of the time (a frozen dataclass compiles six methods when
this module is imported, on every `memlayout` start). Hot loops build them
positionally, which mypy checks against the field types. `LoadedSource`, which
loaders fill in step by step, is the one dataclass.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, NamedTuple, Protocol


class TensorKind(str, enum.Enum):
    """How a tensor is held by its owner."""

    PARAMETER = "parameter"
    BUFFER = "buffer"
    TENSOR = "tensor"


class StorageRecord(NamedTuple):
    """One storage: a block of bytes that tensors view."""

    key: str
    """Identifier unique within the source (a zip record key, a pointer, a file range)."""
    device: str
    """"cpu", "cuda:0", "meta", ... as the source names it."""
    nbytes: int
    """Size of the whole storage in bytes."""
    base_address: int | None = None
    """Address of byte 0 where the bytes are used in place: a live data pointer, or
    the offset in a file torch maps (a zip under `torch.load(mmap=True)`, safetensors).
    None when unknown or when torch's loader copies the bytes into fresh memory
    (legacy torch.save, TorchScript, torch.export), which its allocator aligns."""
    has_data: bool = True
    """False for meta tensors and metadata-only sources: nothing can be read."""
    file: str = ""
    """The weight file of a model directory that holds it; "" for a source of one file."""


class TensorRecord(NamedTuple):
    """One named tensor as the loader found it."""

    name: str
    """Dotted path, e.g. "model.0.weight" or "optimizer.state.0.exp_avg"."""
    kind: TensorKind
    dtype: str
    """torch's short dtype name, e.g. "float32"."""
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_key: str
    offset: int
    """Storage offset in elements."""
    requires_grad: bool = False
    object_id: int | None = None
    """Identity of the Python object when known (live or pickled); views of one
    Parameter under several names share it, distinct Parameter objects do not."""
    optimizer_state: bool = False
    """The tensor lives in an optimizer state dict (exp_avg and friends)."""
    section: str = ""
    """Top-level key of a nested checkpoint ("model", "optimizer"); "" for a flat state dict or a module."""
    pinned: bool | None = None
    shared_memory: bool | None = None


class ShardRecord(NamedTuple):
    """One rank's piece of a tensor spread over ranks (a DTensor: FSDP2, tensor parallel).

    The TensorRecord of the same name describes the local piece itself (its shape,
    strides and storage); this says where the piece sits in the whole tensor.
    """

    name: str
    placements: tuple[str, ...]
    """One per mesh dimension, as torch writes them: "Shard(dim=0)", "Replicate()", "_StridedShard(...)"."""
    mesh_shape: tuple[int, ...]
    global_shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    global_offset: tuple[int, ...]
    """Where the local piece starts in the whole tensor, per dimension."""
    fsdp: bool
    """Managed by FSDP2 (`fully_shard` on the module or a module above it)."""
    padding_bytes: int
    """Bytes of the piece's storage past the piece: FSDP2 pads every rank's piece to the largest one."""
    storage_key: str
    itemsize: int


class RankRecord(NamedTuple):
    """What one rank of a sharded model holds: its totals and its pieces."""

    rank: int
    tensor_bytes: int
    """Sum of this rank's distinct tensors' sizes: its pieces, and what it holds whole."""
    storage_bytes: int
    padding_bytes: int
    """FSDP2's padding over all of this rank's pieces."""
    shards: tuple[ShardRecord, ...]
    whole: tuple[tuple[str, int], ...]
    """(name, bytes) of the parameters this rank holds whole: plain tensors, or replicated on every mesh dimension."""


class RnnRecord(NamedTuple):
    """An RNN/LSTM/GRU module and the weights cuDNN wants as one chunk."""

    mode: str
    """"LSTM", "GRU", "RNN_TANH" or "RNN_RELU"; "RNN" for an Elman RNN recognized from
    state-dict names, whose tanh or relu the weights cannot show."""
    flat_weight_names: tuple[str, ...]
    """Full dotted names in `_flat_weights_names` order."""
    unregistered: tuple[str, ...] = ()
    """Names that are plain tensor attributes, not registered Parameters."""
    known_from: str = "names"
    """How the RNN is known, which decides how its weights reach cuDNN: "names" (recognized
    from a state dict's names: loaded into a built module), "pickled" (an RNN module
    object pickled in the file: `torch.load` rebuilds it as it was saved) or "live" (a
    module in memory)."""
    weights_replaced: bool = False
    """A live RNN only: a weight attribute is another object than the one it last laid out,
    so torch lays the weights out again at the next forward."""


class ModuleRecord(NamedTuple):
    """One module of the tree, for sources that hold modules."""

    path: str
    """Dotted path; "" for the root."""
    class_name: str
    """Qualified class, e.g. "torch.nn.modules.rnn.LSTM"."""
    rnn: RnnRecord | None = None


class ChunkRecord(NamedTuple):
    """One stored piece of a tensor that a checkpoint keeps in pieces (torch.distributed.checkpoint)."""

    name: str
    offsets: tuple[int, ...]
    """Where the piece starts in the whole tensor, per dimension."""
    sizes: tuple[int, ...]
    file: str
    """The file holding its bytes, relative to the checkpoint; "" when the metadata names none."""
    byte_offset: int
    """Where its bytes start in `file`; -1 when unknown."""
    byte_length: int


class DeclaredTie(NamedTuple):
    """Two tensors that somebody declared to be one (config, model class or --tie)."""

    target: str
    source: str
    declared_by: str
    """Where the declaration comes from, e.g. "config.json tie_word_embeddings"."""


class PickleGlobal(NamedTuple):
    """A global a pickle references, and whether torch's weights-only loader allows it."""

    module: str
    name: str
    allowed: bool
    member: str = ""
    """Where the pickle that names it is, inside a compressed stream or an archive ("model/extra.pkl",
    members of nested archives joined by "!"); "" for the file's own pickles."""


class MemberRecord(NamedTuple):
    """One file found inside a compressed stream or an archive, and what it was read as."""

    member: str
    """Its name inside ("model/extra.pkl"), members of nested archives joined by "!"; "" for the
    one stream a compressed file holds."""
    within: tuple[str, ...]
    """The containers around it, outermost first: ("gzip", "tar")."""
    format: str
    """The format it was read as (a `FORMATS` name), or "data" for what holds no pickle or checkpoint."""
    what: str = ""
    """For data, what it is ("text", "a PNG image"); "" otherwise."""


class StorageReader(Protocol):
    """Reads raw bytes of a storage without materializing tensors."""

    def read(self, storage_key: str, start: int, length: int) -> bytes | memoryview:
        """Return `length` bytes of storage `storage_key` from byte `start`."""
        ...


@dataclass
class LoadedSource:
    """Everything a loader found, in the shape facts are built from.

    A context manager: leaving the `with` block closes what the loader opened (the
    files and maps behind `reader`), so no caller has to remember to.

    Example:
        >>> with load_path("model.pt") as source:  # doctest: +SKIP
        ...     facts = build_facts(source)
    """

    path: str | None
    """The file, directory or import spec; None for objects passed in Python."""
    format: str
    """"live-module", "state-dict", "torch-zip", "safetensors", ..."""
    tensors: list[TensorRecord]
    storages: dict[str, StorageRecord]
    modules: list[ModuleRecord] = field(default_factory=list)
    declared_ties: list[DeclaredTie] = field(default_factory=list)
    reader: StorageReader | None = None
    pickle_globals: list[PickleGlobal] = field(default_factory=list)
    legacy_format: bool = False
    notes: list[str] = field(default_factory=list)
    """Things the loader wants the user to know that are not findings."""
    live_object: Any = None
    """The loaded object itself when it is real (a live object); flatten uses it."""
    layout_unrecorded: str = ""
    """Why the source records no real storages, strides, offsets or devices, when it
    records none (DCP metadata): its storage records are then stand-ins, one per
    tensor, and the rules that read layout do not run. Empty when the layout is real."""
    content_unreadable: str = ""
    """Why the tensors' bytes cannot be read, when `reader` is None; empty otherwise."""
    also_valid_as: tuple[str, ...] = ()
    """Other container formats the file is also valid as ("zip", "pickle", "tar",
    "safetensors"): a polyglot, which other tools read differently (ML603)."""
    shards: list[ShardRecord] = field(default_factory=list)
    """The live object's DTensors, one record each: this rank's pieces of sharded tensors."""
    rank: int = 0
    """This process's rank in the default process group (0 without one)."""
    world_size: int = 1
    """Ranks in the default process group, or the largest device mesh of a DTensor (1 without either)."""
    model_config: dict[str, Any] | None = None
    """A remote model folder's config.json as fetched, for what asks it again (diff's ties restored on
    load); None elsewhere (a local folder's is read from disk)."""
    files: tuple[str, ...] = ()
    """For a directory: the files the loader read (weights, index, metadata), relative to `path`.
    A folder walk inspects the directory's other files on their own."""
    chunks: list[ChunkRecord] = field(default_factory=list)
    """The pieces a checkpoint stores each tensor in, where it records them (DCP); empty otherwise."""
    contents: list[MemberRecord] = field(default_factory=list)
    """For a compressed stream or an archive: every file found inside, and what it was read as."""

    def close(self) -> None:
        """Release the files and maps behind `reader`; safe to call more than once."""
        close = getattr(self.reader, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> LoadedSource:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def section_of(prefix: str, key: Any, value_is_tensor: bool, section: str) -> str:
    """The section a child of a container belongs to, for loaders that walk trees.

    A container directly under the root names a section ("model", "optimizer");
    tensors directly under the root and everything deeper inherit the parent's.
    """
    if prefix == "" and not value_is_tensor:
        return str(key)
    return section
