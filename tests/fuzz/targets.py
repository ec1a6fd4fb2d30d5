"""What is fuzzed: each target turns fuzz bytes into a file memlayout reads, seeded with real files.

Raw byte edits of a zip mostly trip its CRCs, and of a safetensors file its header
length, so several targets put the fuzz bytes *behind* those checks: a zip member
rewritten with a valid CRC, a safetensors header with the right length in front
and the real data section behind. Seeds are the committed real files
(`tests/corpus/seeds/`) plus, for every format that holds a pickle, the malicious
payloads of `tests/load/malicious.py` aimed at a canary path: a payload that ever
ran would touch it (see `harness.py`).
"""

from __future__ import annotations

import io
import shutil
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.corpus.make_seeds import SEED_DIR, seed_paths
from tests.load import malicious


@dataclass(frozen=True)
class Target:
    """One fuzz target."""

    name: str
    description: str
    seeds: Callable[[str], list[bytes]]
    """canary path -> initial inputs."""
    materialize: Callable[[bytes, Path], Path]
    """(input, scratch folder) -> the path to inspect, rewritten in the scratch folder."""


def _seed(name: str) -> bytes:
    return (SEED_DIR / name).read_bytes()


def _payload_pickles(canary: str) -> list[bytes]:
    return [payload.build(canary) for payload in malicious.PAYLOADS]


def _write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


# --- zip members behind valid CRCs ----------------------------------------------


def _members(archive: bytes) -> list[tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(io.BytesIO(archive)) as source:
        return [(info, source.read(info)) for info in source.infolist()]


def _rezip(members: list[tuple[zipfile.ZipInfo, bytes]], replace: dict[str, bytes]) -> bytes:
    output = io.BytesIO()
    with zipfile.ZipFile(output, "w", zipfile.ZIP_STORED) as target:
        for info, data in members:
            target.writestr(info, replace.get(info.filename, data))
    return output.getvalue()


@dataclass(frozen=True)
class _MemberFuzz:
    """Input = one selector byte + the bytes of one member of one base archive, CRC made valid."""

    bases: tuple[str, ...]
    suffixes: tuple[str, ...]
    file_name: str

    def choices(self) -> list[tuple[list[tuple[zipfile.ZipInfo, bytes]], str]]:
        found = []
        for base in self.bases:
            members = _members(_seed(base))
            for info, _ in members:
                if info.filename.endswith(self.suffixes):
                    found.append((members, info.filename))
        return found

    def seeds(self, canary: str, payloads: bool) -> list[bytes]:
        inputs = []
        for index, (members, name) in enumerate(self.choices()):
            inputs.append(bytes([index]) + dict((i.filename, d) for i, d in members)[name])
            if payloads and name.endswith(".pkl"):
                inputs += [bytes([index]) + pickle for pickle in _payload_pickles(canary)]
            elif payloads and name.endswith("serialized_state_dict.pt"):  # a nested torch.save archive
                inputs += [bytes([index]) + malicious.torch_zip(pickle) for pickle in _payload_pickles(canary)]
        return inputs

    def materialize(self, data: bytes, folder: Path) -> Path:
        choices = _CHOICES_CACHE.setdefault(id(self), self.choices())
        members, name = choices[data[0] % len(choices)] if data else choices[0]
        return _write(folder, self.file_name, _rezip(members, {name: data[1:]}))


_CHOICES_CACHE: dict[int, list[tuple[list[tuple[zipfile.ZipInfo, bytes]], str]]] = {}

_TORCH_PICKLES = _MemberFuzz(("state_dict.pt", "module.pt", "checkpoint.pt", "views.pt"), ("data.pkl",), "model.pt")
_SCRIPT_MEMBERS = _MemberFuzz(("script.pt",), (".pkl", ".py", ".debug_pkl", "version"), "script.pt")
_PT2_MEMBERS = _MemberFuzz(
    ("model.pt2", "model_older.pt2"), (".json", "archive_format", "version", ".pt"), "model.pt2"
)


# --- headers and side files ---------------------------------------------------------


def _safetensors_parts(name: str) -> tuple[bytes, bytes]:
    raw = _seed(name)
    (length,) = struct.unpack_from("<Q", raw)
    return raw[8 : 8 + length], raw[8 + length :]


def _safetensors_header(data: bytes, folder: Path) -> Path:
    _, body = _safetensors_parts("model.safetensors")
    return _write(folder, "model.safetensors", struct.pack("<Q", len(data)) + data + body)


def _copied_folder(seed: str, folder: Path) -> Path:
    target = folder / seed
    if not target.exists():
        shutil.copytree(seed_paths()[seed], target)
    return target


def _hf_index(data: bytes, folder: Path) -> Path:
    target = _copied_folder("hf_sharded", folder)
    (target / "model.safetensors.index.json").write_bytes(data)
    return target


def _dcp_metadata(data: bytes, folder: Path) -> Path:
    target = _copied_folder("dcp", folder)
    (target / ".metadata").write_bytes(data)
    return target


def _raw(name: str) -> Callable[[bytes, Path], Path]:
    return lambda data, folder: _write(folder, name, data)


TARGETS: dict[str, Target] = {
    target.name: target
    for target in [
        Target(
            "torch-zip", "torch.save zip files, raw bytes: state dict, pickled module, training checkpoint, views",
            lambda canary: [_seed(n) for n in ("state_dict.pt", "module.pt", "checkpoint.pt", "views.pt")]
            + [malicious.torch_zip(p) for p in _payload_pickles(canary)],
            _raw("model.pt"),
        ),
        Target(
            "torch-pickle", "the data.pkl of those files behind a valid zip CRC",
            lambda canary: _TORCH_PICKLES.seeds(canary, payloads=True), _TORCH_PICKLES.materialize,
        ),
        Target(
            "legacy", "legacy (pre-1.6) non-zip torch.save files: state dict and module",
            lambda canary: [_seed("legacy.pt"), _seed("legacy_module.pt"), malicious.legacy_poisoned_header(canary)]
            + [malicious.legacy(p) for p in _payload_pickles(canary)],
            _raw("legacy.pt"),
        ),
        Target(
            "legacy-tar", "torch.save's tar format: state dict and module",
            lambda canary: [_seed("tar_state_dict.pt"), _seed("tar_module.pt")]
            + [malicious.legacy_tar(p) for p in _payload_pickles(canary)]
            + [malicious.legacy_tar_poisoned_record(canary, m) for m in ("storages", "tensors")],
            _raw("model.tar"),
        ),
        Target(
            "torchscript", "torch.jit.save archives, raw bytes",
            lambda canary: [_seed("script.pt")], _raw("script.pt"),
        ),
        Target(
            "torchscript-members", "one TorchScript member (pickles, code, version) behind a valid CRC",
            lambda canary: _SCRIPT_MEMBERS.seeds(canary, payloads=True), _SCRIPT_MEMBERS.materialize,
        ),
        Target(
            "pt2", "torch.export .pt2 archives, raw bytes",
            lambda canary: [_seed("model.pt2"), _seed("model_older.pt2")], _raw("model.pt2"),
        ),
        Target(
            "pt2-members", "one .pt2 member (weights configs, version) behind a valid CRC",
            lambda canary: _PT2_MEMBERS.seeds(canary, payloads=True), _PT2_MEMBERS.materialize,
        ),
        Target(
            "safetensors-header", "the safetensors JSON header, its length in front and the real data behind",
            lambda canary: [_safetensors_parts(n)[0] for n in ("model.safetensors",)]
            + [_safetensors_parts(f"hf_sharded/model-0000{i}-of-00002.safetensors")[0] for i in (1, 2)],
            _safetensors_header,
        ),
        Target(
            "hf-index", "a Hugging Face model.safetensors.index.json beside its real shards",
            lambda canary: [_seed("hf_sharded/model.safetensors.index.json")], _hf_index,
        ),
        Target(
            "dcp-metadata", "a torch.distributed.checkpoint .metadata beside its real .distcp file",
            lambda canary: [_seed("dcp/.metadata"), *_payload_pickles(canary)], _dcp_metadata,
        ),
    ]
}
