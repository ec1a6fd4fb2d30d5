"""torch.export .pt2 archives: weights from the JSON configs, no unpickling."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from memlayout.load import load_path
from memlayout.load.records import TensorKind
from tests.load.conftest import assert_one_line_error, run_cli


class TiedWithView(nn.Module):
    """A head tied to the embedding, and a buffer that views another buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.head = nn.Linear(4, 5, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("table", torch.arange(6, dtype=torch.float32))
        self.register_buffer("tail", self.table[2:])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids)) + self.table.sum() + self.tail.sum()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TiedWithView written by torch.export.save."""
    path = tmp_path_factory.mktemp("pt2") / "model.pt2"
    program = torch.export.export(TiedWithView(), (torch.tensor([1, 2]),))
    torch.export.save(program, str(path))
    return path


def test_weights_config_gives_kinds_views_and_ties(exported: Path) -> None:
    source = load_path(str(exported))
    by_name = {t.name: t for t in source.tensors}
    assert source.format == "torch-export"
    assert by_name["embed.weight"].kind is TensorKind.PARAMETER
    assert by_name["table"].kind is TensorKind.BUFFER
    assert by_name["embed.weight"].storage_key == by_name["head.weight"].storage_key
    assert by_name["tail"].storage_key == by_name["table"].storage_key
    assert (by_name["tail"].offset, by_name["tail"].shape) == (2, (4,))


def test_reader_serves_the_raw_records(exported: Path) -> None:
    source = load_path(str(exported))
    table = next(t for t in source.tensors if t.name == "table")
    assert source.reader is not None
    data = bytes(source.reader.read(table.storage_key, 0, 24))
    assert data == torch.arange(6, dtype=torch.float32).numpy().tobytes()


def test_older_layout_is_refused_with_a_reason(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model/archive_format", "pt2")
        archive.writestr("model/serialized_state_dict.pt", b"PK")
    path = tmp_path / "old.pt2"
    path.write_bytes(buffer.getvalue())
    assert_one_line_error(run_cli("inspect", str(path)), "older layout", "will not execute")


def test_damaged_weights_config_is_a_one_line_error(exported: Path, tmp_path: Path) -> None:
    source = zipfile.ZipFile(exported)
    path = tmp_path / "damaged.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        for info in source.infolist():
            data = source.read(info.filename)
            if info.filename.endswith("model_weights_config.json"):
                data = data[: len(data) // 2]
            archive.writestr(info, data)
    assert_one_line_error(run_cli("inspect", str(path)), "torch.export")
