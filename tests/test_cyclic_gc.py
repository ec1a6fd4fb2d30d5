"""Pausing the cyclic collector has one home, `memlayout.cyclic_gc.paused` (issue 30 §4)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import pytest
import torch

import memlayout
from memlayout import cyclic_gc
from memlayout.cli.app import main


@pytest.fixture
def collector_on() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.enable()
    yield
    if not was_enabled:
        gc.disable()


def test_the_collector_is_off_inside_and_back_on_after(collector_on: None) -> None:
    with cyclic_gc.paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_already_off_stays_off(collector_on: None) -> None:
    gc.disable()
    with cyclic_gc.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_the_collector_comes_back_after_an_error(collector_on: None) -> None:
    with pytest.raises(RuntimeError), cyclic_gc.paused():
        raise RuntimeError
    assert gc.isenabled()


def test_the_library_and_the_cli_both_pause_through_it(
    collector_on: None, monkeypatch: pytest.MonkeyPatch, tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[str] = []
    real = cyclic_gc.paused

    @contextlib.contextmanager
    def counted() -> Iterator[None]:
        calls.append("paused")
        with real():
            yield

    monkeypatch.setattr(cyclic_gc, "paused", counted)
    memlayout.inspect({"w": torch.zeros(2)})
    assert calls == ["paused"]
    calls.clear()
    assert main(["rules"]) == 0
    assert calls  # building and running `rules` paused the collector through the one context manager
    assert gc.isenabled()
