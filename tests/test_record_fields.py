"""Records and facts are built positionally in the hot loops; each value lands in its own field.

mypy checks the types of a positional call, but not which of two int (or bool)
fields a value goes to. These build one record and one fact whose fields all
hold different values, and compare them field by field by name.
"""

from __future__ import annotations

from memlayout.core.fact_builder import build_facts
from memlayout.core.strides import MemoryFormat, byte_set
from memlayout.load.pickled_objects import PickledStorage, PickledTensor
from memlayout.load.pickled_tree import tensor_records
from memlayout.load.records import LoadedSource, StorageRecord, TensorKind, TensorRecord


def test_tensor_records_put_each_value_in_its_field() -> None:
    storage = PickledStorage("7", "float32", "cuda:1", 64, 256)
    tensor = PickledTensor(storage, 4, (4, 3), (1, 4), "float32", True, True)
    root = {"optimizer": {"state": {0: {"exp_avg": tensor}}, "param_groups": []}}
    tensors, storages = tensor_records(root, {"7": 1024}, {"7": 256}, "the file")
    (record,) = tensors
    assert (len(record), len(storages["7"])) == (len(record._fields), len(storages["7"]._fields))
    assert record._asdict() == {
        "name": "optimizer.state.0.exp_avg", "kind": TensorKind.PARAMETER, "dtype": "float32",
        "shape": (4, 3), "stride": (1, 4), "storage_key": "7", "offset": 4, "requires_grad": True,
        "object_id": id(tensor), "optimizer_state": True, "section": "optimizer", "pinned": None,
        "shared_memory": None,
    }
    assert storages["7"]._asdict() == {
        "key": "7", "device": "cuda:1", "nbytes": 256, "base_address": 1024, "has_data": True, "file": "",
    }


def test_facts_put_each_value_in_its_field() -> None:
    # A transposed view at element offset 3 of a storage with unused bytes on both sides.
    record = TensorRecord(
        name="opt.w", kind=TensorKind.PARAMETER, dtype="bfloat16", shape=(2, 5), stride=(1, 2),
        storage_key="k", offset=3, requires_grad=True, object_id=99, optimizer_state=True, section="opt",
        pinned=True, shared_memory=False,
    )
    alias = record._replace(name="opt.alias", object_id=98)
    storage = StorageRecord(key="k", device="cuda:2", nbytes=40, base_address=4096, has_data=True, file="a.bin")
    facts = build_facts(LoadedSource("f.pt", "test", [record, alias], {"k": storage}))
    (fact,) = facts.tensors
    assert fact._asdict() == {
        "name": "opt.w", "names": ("opt.w", "opt.alias"), "kind": TensorKind.PARAMETER, "dtype": "bfloat16",
        "itemsize": 2, "device": "cuda:2", "shape": (2, 5), "stride": (1, 2), "storage": "s0", "offset": 3,
        "numel": 10, "nbytes": 20, "contiguous": False, "memory_format": MemoryFormat.STRIDED,
        "bytes_used": byte_set((2, 5), (1, 2), 3, 2), "self_overlapping": False, "data_address": 4096 + 6,
        "requires_grad": True, "parameter_ids": (99, 98), "optimizer_state": True, "section": "opt",
        "pinned": True, "shared_memory": False, "has_data": True,
    }
    (storage_fact,) = facts.storages
    assert storage_fact._asdict() == {
        "id": "s0", "key": "k", "device": "cuda:2", "nbytes": 40, "tensors": ("opt.w",), "used": ((6, 26),),
        "used_bytes": 20, "padding_bytes": 0, "unused_bytes": 20, "base_address": 4096, "has_data": True,
        "file": "a.bin",
    }


def test_the_facts_of_a_view_alone_in_its_storage_put_each_value_in_its_field() -> None:
    # One name, one view per storage: the inlined path that builds most facts.
    record = TensorRecord(
        name="w", kind=TensorKind.PARAMETER, dtype="float16", shape=(3, 2), stride=(1, 3),
        storage_key="k", offset=2, requires_grad=False, object_id=7, optimizer_state=False, section="model",
        pinned=False, shared_memory=True,
    )
    storage = StorageRecord(key="k", device="cpu", nbytes=30, base_address=512, has_data=True, file="b.bin")
    facts = build_facts(LoadedSource("f.pt", "test", [record], {"k": storage}))
    (fact,) = facts.tensors
    assert len(fact) == len(fact._fields)
    assert fact._asdict() == {
        "name": "w", "names": ("w",), "kind": TensorKind.PARAMETER, "dtype": "float16",
        "itemsize": 2, "device": "cpu", "shape": (3, 2), "stride": (1, 3), "storage": "s0", "offset": 2,
        "numel": 6, "nbytes": 12, "contiguous": False, "memory_format": MemoryFormat.STRIDED,
        "bytes_used": byte_set((3, 2), (1, 3), 2, 2), "self_overlapping": False, "data_address": 512 + 4,
        "requires_grad": False, "parameter_ids": (7,), "optimizer_state": False, "section": "model",
        "pinned": False, "shared_memory": True, "has_data": True,
    }
    (storage_fact,) = facts.storages
    assert len(storage_fact) == len(storage_fact._fields)
    assert storage_fact._asdict() == {
        "id": "s0", "key": "k", "device": "cpu", "nbytes": 30, "tensors": ("w",), "used": ((4, 16),),
        "used_bytes": 12, "padding_bytes": 0, "unused_bytes": 18, "base_address": 512, "has_data": True,
        "file": "b.bin",
    }
