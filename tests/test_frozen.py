"""Positional constructors make the same frozen records as the dataclass's own __init__."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memlayout.frozen import positional_constructor
from memlayout.load.records import StorageRecord, new_storage_record


@given(
    key=st.text(max_size=8),
    device=st.sampled_from(["cpu", "cuda:0", "meta"]),
    nbytes=st.integers(min_value=0),
    base=st.none() | st.integers(min_value=0),
    has_data=st.booleans(),
)
def test_same_record_as_the_generated_init(key: str, device: str, nbytes: int, base: int | None, has_data: bool) -> None:
    made = new_storage_record(key, device, nbytes, base, has_data)
    expected = StorageRecord(key, device, nbytes, base, has_data)
    assert type(made) is StorageRecord
    assert made == expected and hash(made) == hash(expected) and repr(made) == repr(expected)


def test_records_stay_frozen() -> None:
    record = new_storage_record("0", "cpu", 4, None, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.nbytes = 8  # type: ignore[misc]


def test_refuses_classes_whose_init_does_more_than_assign() -> None:
    @dataclass(frozen=True)
    class Checked:
        value: int

        def __post_init__(self) -> None:
            assert self.value >= 0

    @dataclass(frozen=True)
    class Derived:
        value: int
        twice: int = field(init=False, default=0)

    for cls in (Checked, Derived):
        with pytest.raises(TypeError):
            positional_constructor(cls)
