"""A header's shapes are validated once per distinct (dtype, shape), and a look-alike never rides on that."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors import SafetensorError, safe_open

from memlayout.errors import CorruptCheckpointError
from memlayout.load import load_path
from tests.load.test_safetensors_file import write_raw


@pytest.mark.parametrize("odd_dim", [2.0, True, "2", -2])
def test_a_shape_equal_to_a_valid_one_but_not_of_ints_is_refused(tmp_path: Path, odd_dim: object) -> None:
    # 2.0 == 2 and True == 1 hash alike: the entry after a valid [4, 2] must not pass as it.
    header = {
        "a": {"dtype": "F32", "shape": [4, 2], "data_offsets": [0, 32]},
        "b": {"dtype": "F32", "shape": [4, odd_dim], "data_offsets": [32, 64]},
    }
    path = write_raw(tmp_path / "m.safetensors", header, bytes(64))
    with pytest.raises(CorruptCheckpointError, match="tensor 'b' has shape"):
        load_path(str(path))
    # safetensors itself refuses the file too.
    with pytest.raises(SafetensorError, match="invalid JSON in header"), safe_open(str(path), framework="numpy"):
        pass


def test_equal_shapes_share_one_tuple_and_all_load(tmp_path: Path) -> None:
    header = {f"t{i}": {"dtype": "F16", "shape": [3, 2], "data_offsets": [12 * i, 12 * i + 12]} for i in range(5)}
    path = write_raw(tmp_path / "m.safetensors", header, bytes(60))
    with load_path(str(path)) as source:
        shapes = {id(record.shape) for record in source.tensors}
        assert [record.shape for record in source.tensors] == [(3, 2)] * 5
        assert len(shapes) == 1
