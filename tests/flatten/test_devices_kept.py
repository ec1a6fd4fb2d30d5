"""flatten keeps the device each tensor's file records, on a machine without that device (issue 21, item 4).

A torch.save file names each storage's device in its persistent id, and torch.load
puts the storage there (or where `map_location` says). These files are written as
a machine with GPUs writes them, without a GPU: the persistent ids say `cuda:0`
and `cuda:1`, and every test first checks that torch.load reads them so. What
flatten wrote is read back the same way: the location each storage of OUT
records (torch.load's `map_location` is handed each persistent id's location),
and its values with `map_location="cpu"`, bitwise.
"""

from __future__ import annotations

import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from memlayout.cli.app import main
from memlayout.flatten.apply import as_bits
from tests.load.conftest import pickle_with_locations

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

LOCATIONS = {"encoder.weight": (48, "cuda:0"), "encoder.bias": (8, "cuda:0"), "head.weight": (24, "cuda:1"),
             "step": (4, "cpu")}


def _values(numel: int, seed: int) -> bytes:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(numel, generator=generator).numpy().tobytes()


def _torch_zip(path: Path, locations: dict[str, tuple[int, str]]) -> Path:
    data_pkl, records = pickle_with_locations(locations)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", data_pkl)
        archive.writestr("archive/byteorder", "little")
        for index, key in enumerate(records):
            archive.writestr(f"archive/data/{key}", _values(len(records[key]) // 4, index))
        archive.writestr("archive/version", "3\n")
    return path


def _legacy(path: Path, locations: dict[str, tuple[int, str]]) -> Path:
    """The non-zip torch.save format, written out: magic, protocol, system info, the pickle, keys, storages."""
    main_pickle, records = pickle_with_locations(locations, legacy=True)
    sys_info = {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}
    parts = [pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2), pickle.dumps(1001, protocol=2),
             pickle.dumps(sys_info, protocol=2), main_pickle, pickle.dumps(sorted(records), protocol=2)]
    for key in sorted(records):
        numel = len(records[key]) // 4
        parts += [struct.pack("<q", numel), _values(numel, int(key))]
    path.write_bytes(b"".join(parts))
    return path


def recorded_devices(path: Path) -> dict[str, str]:
    """name -> the location OUT's persistent id records, as torch.load hands it to `map_location`."""
    by_storage: dict[int, str] = {}

    def record(storage: Any, location: str) -> Any:
        by_storage[storage.data_ptr()] = location
        return storage

    tree = torch.load(path, map_location=record, weights_only=True)
    return {name: by_storage[tensor.untyped_storage().data_ptr()] for name, tensor in tree.items()}


def _assert_same_values(before: Path, after: Path) -> None:
    a = torch.load(before, map_location="cpu", weights_only=True)
    b = torch.load(after, map_location="cpu", weights_only=True)
    assert list(a) == list(b)
    for name in a:
        assert (a[name].dtype, a[name].shape) == (b[name].dtype, b[name].shape), name
        assert torch.equal(as_bits(a[name]), as_bits(b[name])), name


WRITERS = {"torch-zip": _torch_zip, "legacy": _legacy}


@pytest.fixture(params=sorted(WRITERS))
def cuda_file(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path = WRITERS[request.param](tmp_path / f"{request.param}.pt", LOCATIONS)
    assert recorded_devices(path) == {name: where for name, (_, where) in LOCATIONS.items()}  # torch reads it so
    return path


def test_by_default_out_records_the_devices_in_records(
    cuda_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "flat.pt"
    assert main(["flatten", str(cuda_file), "-o", str(out)]) == 0
    summary = capsys.readouterr().out
    assert recorded_devices(out) == recorded_devices(cuda_file)
    _assert_same_values(cuda_file, out)
    assert "device    cpu, cuda:0, cuda:1 (kept:" in summary
    # One flat buffer per device: the three devices' tensors never share a storage.
    loaded = torch.load(out, map_location="cpu", weights_only=True)
    storages = {loaded[name].untyped_storage().data_ptr() for name in loaded}
    assert len(storages) == 3
    # --check agrees: OUT is as flat as the devices allow.
    assert main(["flatten", str(out), "--check"]) == 0


def test_keep_is_the_default_by_name(cuda_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "flat.pt"
    assert main(["flatten", str(cuda_file), "-o", str(out), "--device", "keep"]) == 0
    assert recorded_devices(out) == recorded_devices(cuda_file)


def test_device_cpu_moves_every_tensor(cuda_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "flat.pt"
    assert main(["flatten", str(cuda_file), "-o", str(out), "--device", "cpu"]) == 0
    assert set(recorded_devices(out).values()) == {"cpu"}
    _assert_same_values(cuda_file, out)


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto moves to CUDA where there is one")
def test_device_auto_is_the_old_behaviour_by_name(cuda_file: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "flat.pt"
    assert main(["flatten", str(cuda_file), "-o", str(out), "--device", "auto"]) == 0
    assert "auto: no CUDA device, using CPU" in capsys.readouterr().out
    assert set(recorded_devices(out).values()) == {"cpu"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_moving_to_cuda_without_cuda_is_one_line_and_its_hint_works(
    cuda_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], device: str
) -> None:
    out = tmp_path / "flat.pt"
    assert main(["flatten", str(cuda_file), "-o", str(out), "--device", device]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CUDA is not available" in err and "--device keep, cpu or auto" in err
    assert not out.exists()
    assert main(["flatten", str(cuda_file), "-o", str(out), "--device", "keep"]) == 0


def test_the_library_keeps_devices_by_default(cuda_file: Path, tmp_path: Path) -> None:
    from memlayout.flatten.files import flatten_path
    from memlayout.flatten.options import FlattenOptions

    out = tmp_path / "flat.pt"
    result = flatten_path(str(cuda_file), FlattenOptions(out=str(out)))
    assert result.device == "cpu, cuda:0, cuda:1" and result.verified
    assert recorded_devices(out) == recorded_devices(cuda_file)


def _script_on_cuda(path: Path) -> Path:
    """A TorchScript archive whose persistent ids say cuda:0, as torch.jit.save writes one from a GPU."""
    scripted = torch.jit.script(torch.nn.Linear(3, 2))
    plain = path.with_name("cpu-script.pt")
    torch.jit.save(scripted, str(plain))
    cpu, cuda = b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0"
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith("/data.pkl"):
                assert cpu in data
                data = data.replace(cpu, cuda)
            target.writestr(info.filename, data)
    return path


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_torchscript_that_records_cuda_is_refused_without_cuda_and_the_hint_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # torch.jit.save records the device a tensor is on: keeping cuda:0 needs CUDA.
    path = _script_on_cuda(tmp_path / "script.pt")
    with pytest.raises(RuntimeError):
        torch.jit.load(str(path))  # torch itself puts the weights on cuda:0
    out = tmp_path / "flat.pt"
    assert main(["flatten", str(path), "-o", str(out), "--trust"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "records tensors on cuda:0" in err and "pass --device cpu" in err
    assert not out.exists()
    assert main(["flatten", str(path), "-o", str(out), "--trust", "--device", "cpu"]) == 0
    moved = torch.jit.load(str(out))
    reference = torch.jit.load(str(path), map_location="cpu")
    assert torch.equal(moved.weight, reference.weight) and moved.weight.device.type == "cpu"


def test_safetensors_records_no_device_and_is_flattened_by_default(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = tmp_path / "model.safetensors"
    save_file({"a": torch.randn(3, 4), "b": torch.randn(5)}, str(path))
    out = tmp_path / "flat.safetensors"
    assert main(["flatten", str(path), "-o", str(out)]) == 0
    before, after = load_file(str(path)), load_file(str(out))
    assert all(torch.equal(before[name], after[name]) for name in before)
