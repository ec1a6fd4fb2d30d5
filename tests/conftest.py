"""Shared test options. Golden files are rewritten only on request: `pytest --overwrite`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--overwrite", action="store_true", default=False, help="rewrite golden files instead of comparing"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests marked `gpu` where no CUDA device exists.

    Whether a device exists, not whether this torch was built with CUDA: the wheel
    `pip install torch` gives on Linux is a CUDA build, and on a machine without a
    GPU its CUDA kernels fail with "Found no NVIDIA driver". Tests of a step traced for
    a GPU (`--gpu`, fake CUDA tensors) need neither, and run on every build.
    """
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; this machine has none")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture
def overwrite_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--overwrite"))


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(autouse=True)
def reference_cpu_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU's roofline as measured on the machine the documentation's examples were made on.

    A plan search minimises recompute time, priced at the CPU's rates, which each machine
    measures for itself: on CI's runners a faster bandwidth against the same FLOP/s chose
    another plan under the same budget than the one the docs show. Tests of plans pin the
    rates; `roofline.cpu_roofline` itself still measures.
    """
    if importlib.util.find_spec("torch") is None:  # the install without torch plans nothing
        return
    from memlayout.activations.device import roofline
    from memlayout.activations.trace import world

    reference = roofline.Roofline("this machine's CPU", float32_flops=2.0**36, half_flops=2.0**30,
                                  memory_bandwidth=2.0**35, source=roofline.CPU_RATES_SOURCE)
    monkeypatch.setattr(world, "cpu_roofline", lambda: reference)
