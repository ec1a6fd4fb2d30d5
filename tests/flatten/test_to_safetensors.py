"""`flatten --to safetensors`: what safetensors' and torch's own loaders read from OUT is what torch.load reads from
IN."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from memlayout.cli.app import main
from tests.corpus.make_seeds import seed_paths
from tests.flatten.conftest import bits, named_tensors

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

SEEDS = seed_paths()


def convert(source: Path, out: Path, *extra: str) -> int:
    return main(["flatten", str(source), "-o", str(out), "--to", "safetensors", *extra])


def metadata_of(path: Path) -> dict[str, str]:
    with safe_open(str(path), "pt") as handle:
        return dict(handle.metadata() or {})


def assert_reads_as(out: Path, expected: dict[str, torch.Tensor]) -> None:
    """load_file(OUT) gives IN's tensors bit for bit; a name it lacks is a tie save_model's metadata restores."""
    written = load_file(str(out))
    metadata = metadata_of(out)
    assert metadata["format"] == "pt"
    assert set(written) <= set(expected)
    for name, tensor in expected.items():
        got = written.get(name)
        if got is None:
            kept = metadata[name]
            got = written[kept]
            assert expected[kept].untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr(), name
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert torch.equal(bits(got), bits(tensor.contiguous())), name


def assert_flat(out: Path) -> None:
    """The data section starts on 64 bytes, and every tensor on a multiple of its element size."""
    raw = out.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    assert (8 + length) % 64 == 0
    header = json.loads(raw[8 : 8 + length])
    sizes = {"F64": 8, "I64": 8, "C64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2, "I8": 1, "U8": 1,
             "BOOL": 1}
    for name, entry in header.items():
        if name != "__metadata__":
            assert (8 + length + entry["data_offsets"][0]) % sizes[entry["dtype"]] == 0, name


@pytest.mark.parametrize("seed", ["state_dict.pt", "views.pt", "legacy.pt", "hf_bin/pytorch_model.bin"])
def test_corpus_pickles_read_back_as_torch_load_reads_them(seed: str, tmp_path: Path) -> None:
    source = SEEDS[seed.split("/")[0]] / seed.split("/", 1)[1] if "/" in seed else SEEDS[seed]
    out = tmp_path / "model.safetensors"
    assert convert(source, out) == 0
    assert_reads_as(out, torch.load(source, weights_only=True))
    assert_flat(out)


def test_a_safetensors_file_converts_to_itself_with_format_pt(tmp_path: Path) -> None:
    out = tmp_path / "model.safetensors"
    assert convert(SEEDS["model.safetensors"], out) == 0
    assert_reads_as(out, load_file(str(SEEDS["model.safetensors"])))
    assert_flat(out)


def mixed_state() -> dict[str, torch.Tensor]:
    """Every dtype safetensors stores, views of a larger storage, strides, empties and scalars."""
    torch.manual_seed(0)
    big = torch.randn(64, 32)
    return {
        "f64": torch.randn(3, 5, dtype=torch.float64),
        "f16": torch.randn(7).half(),
        "bf16": torch.randn(3, 3).bfloat16(),
        "i8": torch.randint(-100, 100, (9,), dtype=torch.int8),
        "u8": torch.randint(0, 255, (), dtype=torch.uint8),
        "flags": torch.rand(5) > 0.5,
        "i64": torch.arange(11),
        "nan": torch.tensor([float("nan"), -0.0, float("inf")]),
        "slice": big[3:5],
        "transposed": big[10:20].t(),
        "channels_last": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        "empty": torch.empty(0, 4),
        "empty_view": big[:0],
        "complex": torch.randn(3, dtype=torch.complex64),
    }


def test_every_dtype_and_layout_reads_back_bit_for_bit(tmp_path: Path) -> None:
    source, out = tmp_path / "mixed.pt", tmp_path / "mixed.safetensors"
    torch.save(mixed_state(), source)
    assert convert(source, out) == 0
    expected = torch.load(source, weights_only=True)
    assert set(load_file(str(out))) == set(expected)
    assert_reads_as(out, expected)
    assert_flat(out)


def test_the_pickle_is_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {marker}",))

    source, out = tmp_path / "hostile.pt", tmp_path / "hostile.safetensors"
    torch.save({"weight": torch.ones(3), "payload": Payload()}, source)
    assert convert(source, out, "--tensors-only") == 0
    assert not marker.exists()
    assert list(load_file(str(out))) == ["weight"]


def test_a_refused_conversion_leaves_an_existing_out_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "model.safetensors"
    out.write_bytes(b"keep me")
    assert convert(SEEDS["checkpoint.pt"], out) == 2
    assert out.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_formats_it_does_not_convert_are_refused_with_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert convert(SEEDS["tar_state_dict.pt"], tmp_path / "out.safetensors") == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "memlayout flatten" in error
    assert not (tmp_path / "out.safetensors").exists()


def test_in_place_conversion_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "model.pt"
    torch.save({"w": torch.ones(2)}, source)
    assert main(["flatten", str(source), "--in-place", "--to", "safetensors"]) == 2
    assert "-o OUT" in capsys.readouterr().err
    assert torch.equal(torch.load(source, weights_only=True)["w"], torch.ones(2))


# Ties -----------------------------------------------------------------------------------------


class Tied(torch.nn.Module):
    """An embedding and an output head that is the same Parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def test_a_tie_is_written_as_safetensors_save_model_writes_it(tmp_path: Path) -> None:
    from safetensors.torch import load_model, save_model

    torch.manual_seed(0)
    model = Tied()
    source, ours, theirs = tmp_path / "tied.pt", tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    torch.save(model.state_dict(), source)
    save_model(model, str(theirs))
    assert convert(source, ours) == 0
    assert set(load_file(str(ours))) == set(load_file(str(theirs))) == {"embed.weight"}
    # save_model records the dropped name; "format": "pt" is what transformers adds.
    assert metadata_of(theirs) == {"head.weight": "embed.weight"}
    assert metadata_of(ours) == {**metadata_of(theirs), "format": "pt"}
    # load_model restores the tie through the module's own one, strict: nothing missing.
    fresh = Tied()
    torch.nn.init.zeros_(fresh.embed.weight)
    missing, unexpected = load_model(fresh, str(ours))
    assert not missing and not unexpected
    assert fresh.head.weight is fresh.embed.weight
    assert torch.equal(fresh.embed.weight, model.embed.weight)


def test_memlayout_reads_the_dropped_name_as_a_tie_not_as_a_loss(tmp_path: Path) -> None:
    import memlayout

    source, out = tmp_path / "tied.pt", tmp_path / "tied.safetensors"
    torch.save(Tied().state_dict(), source)
    assert convert(source, out) == 0
    assert "ML103" not in {f.code for f in memlayout.inspect(str(out)).findings}


# What is not a tensor -------------------------------------------------------------------------


def test_non_tensor_contents_are_listed_and_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.safetensors"
    assert convert(SEEDS["checkpoint.pt"], out) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0
    assert "optimizer.param_groups.0.lr (float)" in error and "--tensors-only" in error
    assert not out.exists()
    # --check refuses alike, so a CI gate fails the way the write would.
    assert main(["flatten", str(SEEDS["checkpoint.pt"]), "--check", "--to", "safetensors"]) == 2
    assert "--tensors-only" in capsys.readouterr().err


def test_tensors_only_writes_every_tensor_and_names_what_it_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.safetensors"
    assert convert(SEEDS["checkpoint.pt"], out, "--tensors-only") == 0
    summary = capsys.readouterr().out
    assert "not written (--tensors-only)" in summary and "optimizer.param_groups.0.lr (float)" in summary
    assert_reads_as(out, named_tensors(torch.load(SEEDS["checkpoint.pt"], weights_only=True)))


def test_a_module_pickle_converts_to_its_state_dict_with_tensors_only(tmp_path: Path) -> None:
    out = tmp_path / "module.safetensors"
    assert convert(SEEDS["module.pt"], out) == 2
    assert convert(SEEDS["module.pt"], out, "--tensors-only") == 0
    # The test trusts its own seed; memlayout never unpickled it for real.
    module = torch.load(SEEDS["module.pt"], weights_only=False)
    assert_reads_as(out, dict(module.state_dict(keep_vars=False)))


# The hints that send the user here -------------------------------------------------------------


@pytest.mark.parametrize(("seed", "code"), [("module.pt", "ML601"), ("legacy.pt", "ML602"),
                                            ("legacy_module.pt", "ML601")])
def test_the_safetensors_hint_works_when_followed(seed: str, code: str, tmp_path: Path) -> None:
    import re
    import shlex

    import memlayout

    finding = next(f for f in memlayout.inspect(str(SEEDS[seed])).findings if f.code == code)
    command = re.search(r"`(memlayout flatten --to safetensors[^`]*)`", finding.hint)
    assert command is not None, finding.hint
    out = tmp_path / "model.safetensors"
    assert main([*shlex.split(command.group(1))[1:], str(SEEDS[seed]), "-o", str(out)]) == 0
    assert code not in {f.code for f in memlayout.inspect(str(out)).findings}
    # The test trusts its own seed; the hint's command never unpickled it for real.
    loaded = torch.load(SEEDS[seed], weights_only=False)
    expected = loaded.state_dict() if isinstance(loaded, torch.nn.Module) else loaded
    assert_reads_as(out, dict(expected))


@pytest.mark.parametrize("writer", ["torch-zip", "legacy"])
def test_a_cuda_checkpoint_converts_on_a_machine_without_cuda(writer: str, tmp_path: Path) -> None:
    from tests.flatten.test_devices_kept import LOCATIONS, WRITERS

    source = WRITERS[writer](tmp_path / "cuda.pt", LOCATIONS)
    out = tmp_path / "cuda.safetensors"
    assert convert(source, out) == 0
    assert_reads_as(out, torch.load(source, map_location="cpu", weights_only=True))


@pytest.mark.parametrize("seed", ["hf_bin", "hf_sharded"])
def test_corpus_model_directories_convert_file_by_file(seed: str, tmp_path: Path) -> None:
    out = tmp_path / "converted"
    assert main(["flatten", str(SEEDS[seed]), "-o", str(out), "--to", "safetensors"]) == 0
    expected: dict[str, torch.Tensor] = {}
    for file in SEEDS[seed].iterdir():
        if file.suffix == ".bin":
            expected.update(torch.load(file, weights_only=True))
        elif file.suffix == ".safetensors":
            expected.update(load_file(str(file)))
    files = sorted(p.name for p in out.iterdir())
    assert not [name for name in files if name.endswith(".bin") or name.startswith("pytorch_model")]
    assert "config.json" in files
    for file in out.glob("*.safetensors"):
        assert_reads_as(file, {name: expected[name] for name in load_file(str(file))})
    if len(list(out.glob("*.safetensors"))) > 1:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"]) == {name for f in out.glob("*.safetensors") for name in load_file(str(f))}


def test_a_write_that_reads_back_wrong_never_replaces_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from memlayout.flatten.writers import to_safetensors

    write = to_safetensors._write_file

    def write_then_damage(path: str, *rest: Any) -> int:
        written = write(path, *rest)
        with open(path, "r+b") as handle:  # the last data byte changes, as a bad disk or a bug would
            handle.seek(-1, os.SEEK_END)
            last = handle.read(1)
            handle.seek(-1, os.SEEK_END)
            handle.write(bytes([last[0] ^ 0xFF]))
        return written

    monkeypatch.setattr(to_safetensors, "_write_file", write_then_damage)
    out = tmp_path / "model.safetensors"
    out.write_bytes(b"the previous OUT")
    assert convert(SEEDS["state_dict.pt"], out) == 2
    assert "verification failed" in capsys.readouterr().err
    assert out.read_bytes() == b"the previous OUT"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


@pytest.mark.parametrize(
    ("args", "says"),
    [(["--to", "onnx"], "--to safetensors"), (["--tensors-only"], "--to safetensors"),
     (["--to", "safetensors", "--device", "cuda:0"], "cpu")],
)
def test_options_that_cannot_work_are_one_line(
    args: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.safetensors"
    assert main(["flatten", str(SEEDS["state_dict.pt"]), "-o", str(out), *args]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and says in error
    assert not out.exists()


def test_check_says_a_converted_file_needs_nothing_more(tmp_path: Path) -> None:
    out = tmp_path / "model.safetensors"
    assert main(["flatten", str(SEEDS["state_dict.pt"]), "--check", "--to", "safetensors"]) == 1
    assert convert(SEEDS["state_dict.pt"], out) == 0
    assert main(["flatten", str(out), "--check", "--to", "safetensors"]) == 0
