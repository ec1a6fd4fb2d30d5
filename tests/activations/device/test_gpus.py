"""The `--gpu` table (gpus.py) against what torch reported on real GPUs, and the option's refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memlayout.activations.device.gpus import GPUS, gpu_spec, spec_for_device_name
from memlayout.errors import UsageError

PROBES = sorted((Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "gpu").glob("probe-*.json"))


@pytest.mark.parametrize("probe", PROBES, ids=[p.stem for p in PROBES])
def test_a_probed_gpus_row_is_what_torch_reported_there(probe: Path) -> None:
    properties = json.loads(probe.read_text())["device"]["properties"]
    spec = spec_for_device_name(properties["name"])
    assert spec is not None, f"{properties['name']} was probed and has no row"
    assert spec.memory_source == "measured"
    assert spec.capability == (properties["major"], properties["minor"])
    assert spec.total_memory == properties["total_memory"]
    assert spec.sm_count == properties["multi_processor_count"]


@pytest.mark.gpu
def test_the_present_gpus_row_is_what_torch_reports() -> None:
    import torch

    properties = torch.cuda.get_device_properties(0)
    spec = spec_for_device_name(properties.name)
    if spec is None:
        pytest.skip(f"{properties.name} has no row in the --gpu table")
    assert spec.capability == (properties.major, properties.minor)
    assert spec.sm_count == properties.multi_processor_count
    # rows hold torch's total_memory, the frame buffer less the driver's reservation, which moves with the driver
    # (81,079 to 81,106 MiB on H100s in the reports gpus.py cites)
    assert abs(spec.total_memory - properties.total_memory) <= 0.01 * properties.total_memory


def test_every_row_has_its_own_name_and_device() -> None:
    assert len({s.key for s in GPUS}) == len(GPUS) == len({s.device_name for s in GPUS})
    assert gpu_spec("H100") is gpu_spec("h100")


def test_an_unknown_gpu_is_one_line_listing_the_known_ones() -> None:
    with pytest.raises(UsageError) as raised:
        gpu_spec("h300")
    assert all(spec.key in raised.value.one_line() for spec in GPUS)
    result = subprocess.run(
        [sys.executable, "-m", "memlayout", "activations", "tests.activations.models:gpt2", "--gpu", "h300"],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "unknown --gpu 'h300'" in result.stderr and "a100-80gb" in result.stderr


def test_gpu_implies_a_cuda_step_and_refuses_another_device() -> None:
    from memlayout.activations.trace.world import device_for_gpu

    assert device_for_gpu("cpu", "fake", "a10g") == "cuda"
    assert device_for_gpu("cuda:1", "fake", "a10g") == "cuda:1"
    with pytest.raises(UsageError, match="`device` is meta"):
        device_for_gpu("meta", "fake", "a10g")
    with pytest.raises(UsageError, match="`real` measures"):
        device_for_gpu("cuda", "real", "a10g")


def test_the_cpu_build_says_in_one_line_it_needs_the_cuda_build_and_how_to_install_it() -> None:
    import torch

    if torch.backends.cuda.is_built():  # type: ignore[no-untyped-call]
        pytest.skip("this torch is a CUDA build")
    result = subprocess.run(
        [sys.executable, "-m", "memlayout", "activations", "tests.activations.models:gpt2", "--gpu", "h100",
         "--inputs", "tests.activations.models:gpt2_inputs"],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "needs a torch built with CUDA" in result.stderr
    assert "pip install torch --index-url https://download.pytorch.org/whl/cu130" in result.stderr
