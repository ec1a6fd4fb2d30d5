"""Shared fixtures for loader tests: checkpoints written into tmp_path by the real writers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memlayout.cli.app import app


@dataclass(frozen=True)
class CliResult:
    """What one CLI run returned."""

    exit_code: int
    stdout: str
    stderr: str


def run_cli(*args: str) -> CliResult:
    """Run `memlayout ARGS` in-process and capture both streams separately."""
    result = CliRunner().invoke(app, list(args))
    return CliResult(result.exit_code, result.stdout, result.stderr)


def assert_one_line_error(result: CliResult, *fragments: str) -> None:
    """Exit 2, exactly one stderr line, no traceback, and the line names the problem."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert lines[0].startswith("memlayout: error:")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    """A file a malicious payload would create; tests assert it never appears."""
    return tmp_path / "PWNED"


def pickle_with_locations(tensors: dict[str, tuple[int, str]], legacy: bool = False) -> tuple[bytes, dict[str, bytes]]:
    """A torch.save-style data.pkl whose float32 storages claim the given locations.

    This is what a machine with GPUs writes for CUDA tensors: the persistent id
    carries "cuda:0" and the bytes are stored as usual. Built with pickle's own
    persistent_id hook, so no GPU is needed.

    Args:
        tensors: name -> (element count, location).
        legacy: Write the legacy non-zip format's persistent ids, whose sixth item
            is the storage view (None for a whole storage).

    Returns:
        The pickle bytes and the storage records (key -> bytes) for a zip.
    """
    import collections
    import io
    import pickle

    import torch

    class StorageRef:
        def __init__(self, key: str, numel: int, location: str) -> None:
            self.key, self.numel, self.location = key, numel, location

    class TensorRef:
        def __init__(self, storage: StorageRef) -> None:
            self.storage = storage

        def __reduce__(self) -> tuple[object, tuple[object, ...]]:
            numel = self.storage.numel
            return (torch._utils._rebuild_tensor_v2, (self.storage, 0, (numel,), (1,), False,
                                                      collections.OrderedDict()))

    class LocationPickler(pickle.Pickler):
        def persistent_id(self, obj: object) -> object:
            if isinstance(obj, StorageRef):
                saved_id = ("storage", torch.FloatStorage, obj.key, obj.location, obj.numel)
                return (*saved_id, None) if legacy else saved_id
            return None

    state = {}
    records = {}
    for index, (name, (numel, location)) in enumerate(tensors.items()):
        state[name] = TensorRef(StorageRef(str(index), numel, location))
        records[str(index)] = bytes(4 * numel)
    buffer = io.BytesIO()
    LocationPickler(buffer, protocol=2).dump(state)
    return buffer.getvalue(), records
