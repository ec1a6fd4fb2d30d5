"""inspect -> explain -> follow the hint -> inspect again, for every rule a file can trigger.

Each test is one user's journey: a file where the rule fires (made the way users
make such files: torch.save, save_pretrained, a model built from a transformers
config), `memlayout inspect`, `memlayout explain CODE`, then literally what the
finding's hint says, and `memlayout inspect` on the result. The finding must be
gone, and no finding at warning or above may appear that was not there before.

A hint that says to run a memlayout command is run as printed, on the file; a hint
that names Python (`.clone()`, `model.tie_weights()`, `map_location`) is done with
that library. Each test asserts the hint still says what it follows, so a reworded
hint is followed anew rather than silently skipped.

Not here: ML302 and ML303 fire on a builder under torchrun, not on a file
(tests/rules/test_rule_docs.py runs their examples on real ranks); ML402's hint
says flatten cannot help and names no step to follow.
"""

from __future__ import annotations

import json
import pickle
import re
import shlex
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from tests import models

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
AT_LEAST_WARNING = {"warning", "error"}


def memlayout(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memlayout", *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def inspect_findings(path: Path, *options: str) -> list[dict[str, Any]]:
    done = memlayout("inspect", str(path), "--format", "json", "--isolated", *options, cwd=path.parent)
    assert done.returncode in (0, 1), done.stderr
    findings: list[dict[str, Any]] = json.loads(done.stdout)["findings"]
    return findings


def finding_of(code: str, path: Path, *options: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """inspect, then explain: the finding to follow and everything inspect reported."""
    findings = inspect_findings(path, *options)
    fired = [f for f in findings if f["code"] == code]
    assert fired, (code, [f["code"] for f in findings])
    explained = memlayout("explain", code, cwd=path.parent)
    assert explained.returncode == 0 and explained.stderr == "", explained.stderr
    # Every command explain tells the user to run is one these journeys run.
    assert {c[1] for c in hinted_commands(explained.stdout)} <= {"inspect", "flatten"}, explained.stdout
    return fired[0], findings


def assert_fixed(code: str, before: list[dict[str, Any]], after_path: Path, *options: str) -> None:
    after = inspect_findings(after_path, *options)
    assert code not in {f["code"] for f in after}, after
    old = {f["code"] for f in before}
    new = [f for f in after if f["severity"] in AT_LEAST_WARNING and f["code"] not in old]
    assert not new, new


def hinted_commands(hint: str) -> list[list[str]]:
    """The `memlayout ...` commands a hint names, as argument lists."""
    return [shlex.split(command) for command in re.findall(r"`(memlayout [^`]*)`", hint)]


def run_hinted_flatten(hint: str, path: Path) -> Path:
    """Run the hint's first `memlayout flatten ...` on the file, as `run_flatten_command` does."""
    commands = [c for c in hinted_commands(hint) if c[:2] == ["memlayout", "flatten"]]
    assert commands, hint
    return run_flatten_command(commands[0], path)


def run_flatten_command(command: list[str], path: Path) -> Path:
    """A hinted `memlayout flatten ...` run on the file, then whatever its own error says to add.

    A finding's hint names no file ("run `memlayout flatten`"): a user types it with
    the file, and flatten answers in one line that OUT is missing and how to give
    it. The registry's texts spell the file IN and OUT: those are replaced.
    """
    to_safetensors = "--to" in command and command[command.index("--to") + 1] == "safetensors"
    out = path.with_name(f"flat_{path.stem}" + (".safetensors" if to_safetensors else path.suffix))
    argv = [str(path) if a == "IN" else str(out) if a.startswith("OUT") else a for a in command[1:]]
    if "IN" not in command:
        argv.append(str(path))
    first = memlayout(*argv, cwd=path.parent)
    if first.returncode == 2 and "-o" not in argv:
        assert "pass -o OUT" in first.stderr, first.stderr
        done = memlayout(*argv, "-o", str(out), cwd=path.parent)
    else:
        done = first
    assert done.returncode == 0, done.stderr
    assert out.exists()
    return out


def follow_every_hinted_command(code: str, finding: dict[str, Any], before: list[dict[str, Any]], path: Path) -> int:
    """Each `memlayout flatten ...` the hint names, run on a fresh copy of the file; how many there were."""
    commands = [c for c in hinted_commands(finding["hint"]) if c[:2] == ["memlayout", "flatten"]]
    for number, command in enumerate(commands):
        copy = path.with_name(f"copy{number}_{path.name}")
        copy.write_bytes(path.read_bytes())
        assert_fixed(code, before, run_flatten_command(command, copy))
    return len(commands)


def save_state(state: dict[str, torch.Tensor], path: Path) -> Path:
    torch.save(state, path)
    return path


# ML101 partial-overlap


def test_ml101_clone_each_tensor(tmp_path: Path) -> None:
    base = torch.arange(64, dtype=torch.float32)
    path = save_state({"a": base[0:40], "b": base[20:64]}, tmp_path / "model.pt")
    finding, before = finding_of("ML101", path)
    assert "`.clone()`" in finding["hint"]
    state = torch.load(path)
    fixed = save_state({name: tensor.clone() for name, tensor in state.items()}, tmp_path / "fixed.pt")
    assert_fixed("ML101", before, fixed)


# ML102 duplicate-weights


def test_ml102_tie_the_copy(tmp_path: Path) -> None:
    model = models.LostTieLM()
    path = save_state(model.state_dict(), tmp_path / "model.pt")
    finding, before = finding_of("ML102", path)
    assert "`b.weight = a.weight`" in finding["hint"]
    b, a = sorted(finding["tensors"], key=lambda name: name != "head.weight")
    assert (a, b) == ("embed.weight", "head.weight")
    model.load_state_dict(torch.load(path))
    model.head.weight = model.embed.weight
    fixed = save_state(model.state_dict(), tmp_path / "fixed.pt")
    assert_fixed("ML102", before, fixed)


def test_ml102_drop_the_copy(tmp_path: Path) -> None:
    path = save_state(models.LostTieLM().state_dict(), tmp_path / "model.pt")
    finding, before = finding_of("ML102", path)
    assert "drop the copy" in finding["hint"]
    state = torch.load(path)
    del state["head.weight"]
    assert_fixed("ML102", before, save_state(state, tmp_path / "fixed.pt"))


# ML103 broken-tie, on a Hugging Face directory whose config declares the tie


def write_untied_gpt2_dir(folder: Path) -> Path:
    """What a training script that broke the tie saves: config says tied, the file holds its own head."""
    model = models.tiny_gpt2()
    model.save_pretrained(folder)
    state = load_file(folder / "model.safetensors")
    state["lm_head.weight"] = state["transformer.wte.weight"] + 1
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_ml103_retie_after_loading_and_resave(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    path = write_untied_gpt2_dir(tmp_path / "gpt2")
    finding, before = finding_of("ML103", path)
    assert "`model.tie_weights()`" in finding["hint"] and "re-save" in finding["hint"]
    model = transformers.GPT2LMHeadModel.from_pretrained(path)
    model.tie_weights()
    model.save_pretrained(tmp_path / "retied")
    assert_fixed("ML103", before, tmp_path / "retied")


# ML104 aliased-not-tied, a pickled module


def test_ml104_make_them_one_parameter(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 100, bias=False))
    model[1].weight = nn.Parameter(model[0].weight.data)
    path = tmp_path / "model.pt"
    torch.save(model, path)
    finding, before = finding_of("ML104", path)
    assert "`b.weight = a.weight`" in finding["hint"]
    loaded = torch.load(path, weights_only=False)  # the test wrote it: trusted
    loaded[1].weight = loaded[0].weight
    torch.save(loaded, tmp_path / "fixed.pt")
    assert_fixed("ML104", before, tmp_path / "fixed.pt")


# ML105 self-overlap


@pytest.mark.parametrize("method", ["contiguous", "clone"])
def test_ml105_materialize_the_expanded_tensor(method: str, tmp_path: Path) -> None:
    path = save_state(models.ExpandedBufferModule().state_dict(), tmp_path / "model.pt")
    finding, before = finding_of("ML105", path)
    assert f"`.{method}()`" in finding["hint"]
    state = {name: getattr(t, method)() if name in finding["tensors"] else t for name, t in torch.load(path).items()}
    assert_fixed("ML105", before, save_state(state, tmp_path / "fixed.pt"))


# ML106 overlapping-chunks


def test_ml106_resave_with_dcps_own_planner(tmp_path: Path) -> None:
    import warnings

    import torch.distributed.checkpoint as dcp

    from tests.load.dcp_writers import save_overlapping_rows

    path = save_overlapping_rows(tmp_path / "ckpt", torch.arange(12.0).reshape(4, 3), [(0, 3), (2, 4)])
    finding, before = finding_of("ML106", path)
    assert "`dcp.save(model.state_dict(), checkpoint_id=DIR)`" in finding["hint"]
    kept = {"w": torch.zeros(4, 3)}  # the values you mean to keep: what dcp.load gives
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(kept, checkpoint_id=str(path))
        dcp.save(kept, checkpoint_id=str(tmp_path / "fixed"))
    assert_fixed("ML106", before, tmp_path / "fixed")


# ML201 non-contiguous


def test_ml201_store_it_contiguous(tmp_path: Path) -> None:
    model = models.TransposedWeightLinear()
    path = save_state(model.state_dict(), tmp_path / "model.pt")
    finding, before = finding_of("ML201", path)
    assert "`p.data = p.data.contiguous()`" in finding["hint"]
    model.load_state_dict(torch.load(path))
    for p in model.parameters():
        p.data = p.data.contiguous()
    assert_fixed("ML201", before, save_state(model.state_dict(), tmp_path / "fixed.pt"))


def test_ml201_run_memlayout_flatten(tmp_path: Path) -> None:
    path = save_state(models.TransposedWeightLinear().state_dict(), tmp_path / "model.pt")
    finding, before = finding_of("ML201", path)
    assert_fixed("ML201", before, run_hinted_flatten(finding["hint"], path))


# ML202 mixed-memory-format


def test_ml202_convert_the_whole_model(tmp_path: Path) -> None:
    model = models.mixed_format_convnet()
    path = save_state(model.state_dict(), tmp_path / "model.pt")
    finding, before = finding_of("ML202", path)
    assert "`model.to(memory_format=torch.channels_last)`" in finding["hint"]
    model = model.to(memory_format=torch.channels_last)
    assert_fixed("ML202", before, save_state(model.state_dict(), tmp_path / "fixed.pt"))


# ML203 misaligned


def test_ml203_clone_the_tensor(tmp_path: Path) -> None:
    path = save_state(models.misaligned_state(), tmp_path / "model.pt")
    finding, before = finding_of("ML203", path)
    assert "`.clone()`" in finding["hint"]
    state = {name: t.clone() if name in finding["tensors"] else t for name, t in torch.load(path).items()}
    assert_fixed("ML203", before, save_state(state, tmp_path / "fixed.pt"))


def test_ml203_run_memlayout_flatten(tmp_path: Path) -> None:
    path = save_state(models.misaligned_state(), tmp_path / "model.pt")
    finding, before = finding_of("ML203", path)
    assert_fixed("ML203", before, run_hinted_flatten(finding["hint"], path))


def test_ml203_on_a_save_pretrained_directory_at_an_asked_alignment_run_memlayout_flatten(tmp_path: Path) -> None:
    # save_pretrained's safetensors header starts the data section on 8 bytes, the format's own
    # standard: no finding, unless the project asks for 64 (mmap, DMA).
    folder = tmp_path / "gpt2"
    models.tiny_gpt2().save_pretrained(folder)
    assert "ML203" not in {f["code"] for f in inspect_findings(folder)}
    finding, before = finding_of("ML203", folder, "--align", "64")
    assert "`memlayout flatten --align 64`" in finding["hint"]
    assert_fixed("ML203", before, run_hinted_flatten(finding["hint"], folder), "--align", "64")


# ML204 fragmented


def test_ml204_run_memlayout_flatten(tmp_path: Path) -> None:
    path = save_state(models.fragmented_mlp().state_dict(), tmp_path / "model.pt")
    finding, before = finding_of("ML204", path)
    assert_fixed("ML204", before, run_hinted_flatten(finding["hint"], path))


# ML301 storage-bloat


def test_ml301_save_a_clone_of_the_slice(tmp_path: Path) -> None:
    path = save_state(models.sliced_bloat_state(), tmp_path / "model.pt")
    finding, before = finding_of("ML301", path)
    assert "save `.clone()` of the slice" in finding["hint"]
    state = {name: t.clone() for name, t in torch.load(path).items()}
    assert_fixed("ML301", before, save_state(state, tmp_path / "fixed.pt"))


def test_ml301_run_memlayout_flatten(tmp_path: Path) -> None:
    path = save_state(models.sliced_bloat_state(), tmp_path / "model.pt")
    finding, before = finding_of("ML301", path)
    assert_fixed("ML301", before, run_hinted_flatten(finding["hint"], path))


# ML401 rnn-not-flat


def test_ml401_run_memlayout_flatten(tmp_path: Path) -> None:
    path = save_state(torch.nn.LSTM(32, 32, num_layers=2).state_dict(), tmp_path / "model.pt")
    finding, before = finding_of("ML401", path)
    assert_fixed("ML401", before, run_hinted_flatten(finding["hint"], path))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ml401_flatten_parameters_after_loading_onto_cuda(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save(torch.nn.LSTM(32, 32, num_layers=2), path)  # a pickled module: its layout survives map_location
    finding, before = finding_of("ML401", path)
    assert "call `module.flatten_parameters()` after loading onto CUDA" in finding["hint"]
    lstm = torch.load(path, weights_only=False, map_location="cuda")  # the test wrote it: trusted
    lstm.flatten_parameters()
    with warnings.catch_warnings():
        # cuDNN's WEIGHT_FORMAT_WARN: what the finding says would happen on every call.
        warnings.filterwarnings("error", message=".*not part of single contiguous chunk.*")
        lstm(torch.randn(5, 3, 32, device="cuda"))
    torch.save(lstm, tmp_path / "fixed.pt")
    assert_fixed("ML401", before, tmp_path / "fixed.pt")


# ML501 mixed-device


def save_with_one_storage_on(device: str, state: dict[str, torch.Tensor], odd: str, path: Path) -> Path:
    """torch.save as on a machine where `state[odd]` lived on `device`: the same bytes, no GPU needed.

    torch.save records each storage's device as the string `location_tag` returns;
    that string is all that differs in a file written on a GPU machine.
    """
    odd_storage = state[odd].untyped_storage()
    real_tag = torch.serialization.location_tag

    def tag(storage: Any) -> str:
        same = getattr(storage, "data_ptr", None) and storage.data_ptr() == odd_storage.data_ptr()
        return device if same else real_tag(storage)

    with mock.patch.object(torch.serialization, "location_tag", tag):
        torch.save(state, path)
    return path


def test_ml501_load_a_checkpoint_with_map_location(tmp_path: Path) -> None:
    state = {"weight": torch.randn(8, 8), "bias": torch.randn(8)}
    path = save_with_one_storage_on("cuda:0", state, "bias", tmp_path / "model.pt")
    finding, before = finding_of("ML501", path)
    assert "`map_location`" in finding["hint"]
    fixed = save_state(torch.load(path, map_location="cpu"), tmp_path / "fixed.pt")
    assert_fixed("ML501", before, fixed)


def test_ml501_on_the_meta_device_names_what_works(tmp_path: Path) -> None:
    # A meta tensor holds no values: map_location cannot move it anywhere, so a hint
    # that sends the user to map_location would leave the finding in place.
    path = save_state({"weight": torch.zeros(8, 8), "bias": torch.zeros(8, device="meta")}, tmp_path / "model.pt")
    finding, before = finding_of("ML501", path)
    reloaded = torch.load(path, map_location="cpu")
    assert reloaded["bias"].is_meta  # what torch does with map_location here
    assert "load with `map_location`" not in finding["hint"] and "meta device" in finding["hint"]
    assert "`model.to_empty(device=...)`" in finding["hint"]
    model = nn.Linear(8, 8, device="meta")
    model.to_empty(device="cpu")
    model.load_state_dict({"weight": reloaded["weight"], "bias": torch.zeros(8)})
    assert_fixed("ML501", before, save_state(model.state_dict(), tmp_path / "fixed.pt"))


# ML502 mixed-dtype


def test_ml502_cast_the_odd_ones(tmp_path: Path) -> None:
    model = models.mixed_dtype_mlp()
    path = save_state(model.state_dict(), tmp_path / "model.pt")
    finding, before = finding_of("ML502", path)
    assert "`module.to(dtype)`" in finding["hint"]
    model = model.to(torch.float32)
    assert_fixed("ML502", before, save_state(model.state_dict(), tmp_path / "fixed.pt"))


# ML503 non-finite


def test_ml503_restore_an_earlier_checkpoint(tmp_path: Path) -> None:
    earlier = save_state({"weight": torch.randn(64, 64)}, tmp_path / "step_100.pt")
    path = save_state(models.nan_state(), tmp_path / "step_200.pt")
    finding, before = finding_of("ML503", path, "--deep")
    assert "restore an earlier checkpoint" in finding["hint"]
    assert_fixed("ML503", before, earlier, "--deep")


# ML601 unsafe-pickle: the hint, and what the message says torch.load(weights_only=...) does


def write_pickled_module(path: Path) -> Path:
    torch.save(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), path)
    return path


def test_ml601_resave_the_state_dict_which_weights_only_reads(tmp_path: Path) -> None:
    path = write_pickled_module(tmp_path / "model.pt")
    finding, before = finding_of("ML601", path)
    assert "re-save `model.state_dict()`" in finding["hint"]
    model = torch.load(path, weights_only=False)  # the hint: only for a file you trust, as this one
    fixed = save_state(model.state_dict(), tmp_path / "fixed.pt")
    torch.load(fixed, weights_only=True)  # what re-saving the state dict is for
    assert_fixed("ML601", before, fixed)


def test_ml601_run_the_hinted_conversion(tmp_path: Path) -> None:
    path = write_pickled_module(tmp_path / "model.pt")
    finding, before = finding_of("ML601", path)
    assert follow_every_hinted_command("ML601", finding, before, path) >= 1


def test_ml601_names_the_globals_torch_load_weights_only_refuses(tmp_path: Path) -> None:
    path = write_pickled_module(tmp_path / "model.pt")
    finding, _ = finding_of("ML601", path)
    named = re.search(r"weights_only=True\) refuses: ([^;]+);", finding["message"])
    assert named, finding["message"]
    refused = named.group(1).split(", ")
    with pytest.raises(pickle.UnpicklingError) as raised:
        torch.load(path, weights_only=True)
    # torch stops at the first global outside its allow-list and names it.
    assert any(name in str(raised.value) for name in refused), (refused, str(raised.value))
    # Allowing exactly the globals the message names is what makes weights_only=True load it.
    import importlib

    classes = []
    for name in refused:
        module, _, attribute = name.rpartition(".")
        classes.append(getattr(importlib.import_module(module), attribute))
    with torch.serialization.safe_globals(classes):
        torch.load(path, weights_only=True)


def test_ml601_does_not_fire_on_what_weights_only_loads(tmp_path: Path) -> None:
    path = save_state(nn.Linear(4, 4).state_dict(), tmp_path / "model.pt")
    torch.load(path, weights_only=True)
    assert "ML601" not in {f["code"] for f in inspect_findings(path)}


# ML602 legacy-format


LEGACY = FIXTURES / "formats" / "legacy_state_dict.pt"
LEGACY_TAR = FIXTURES / "formats" / "legacy_tar_state_dict.pt"


def cloned_where_the_hint_says(hint: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state after the hint's "`.clone()` of each tensor that shares memory (a, b)" and
    "`.contiguous()` of each tensor that is not contiguous (c)", done as it says."""
    def named(step: str) -> set[str]:
        found = re.search(re.escape(step) + r" \(([^)]*)\)", hint)
        return set(found.group(1).split(", ")) if found else set()

    cloned = named("`.clone()` of each tensor that shares memory")
    packed = named("`.contiguous()` of each tensor that is not contiguous")
    state = {name: t.clone() if name in cloned else t for name, t in state.items()}
    return {name: t.contiguous() if name in packed else t for name, t in state.items()}


@pytest.mark.parametrize("fixture", [LEGACY, LEGACY_TAR], ids=["non-zip", "tar"])
def test_ml602_run_each_hinted_command(fixture: Path, tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(fixture.read_bytes())
    finding, before = finding_of("ML602", path)
    assert follow_every_hinted_command("ML602", finding, before, path) >= 1


@pytest.mark.parametrize("resave", ["torch.save", "safetensors"])
def test_ml602_tar_resave_in_a_current_format(resave: str, tmp_path: Path) -> None:
    # No conversion reads the tar format without running it: the hint names the re-save.
    path = tmp_path / "model.pt"
    path.write_bytes(LEGACY_TAR.read_bytes())
    finding, before = finding_of("ML602", path)
    assert "re-save it with a current torch.save (zip format) or as safetensors" in finding["hint"]
    state = torch.load(path, weights_only=False)  # tar needs it (test_weights_only_claims.py); a fixture we trust
    fixed: Path
    if resave == "torch.save":
        fixed = save_state(state, tmp_path / "fixed.pt")
    else:
        fixed = tmp_path / "fixed.safetensors"
        save_file(cloned_where_the_hint_says(finding["hint"], state), fixed)
    assert_fixed("ML602", before, fixed)


def test_ml602_hint_says_what_safetensors_needs_of_shared_tensors(tmp_path: Path) -> None:
    # The tar fixture's window is a view of its embedding; save_file refuses it as it stands.
    state = torch.load(LEGACY_TAR, weights_only=False)
    with pytest.raises(RuntimeError, match="share memory"):
        save_file(state, tmp_path / "as_is.safetensors")
    path = tmp_path / "model.pt"
    path.write_bytes(LEGACY_TAR.read_bytes())
    finding, _ = finding_of("ML602", path)
    assert "`.clone()` of each tensor that shares memory" in finding["hint"]
    # Its projection is transposed: save_file refuses it, and .clone() keeps its strides.
    with pytest.raises(ValueError, match="non contiguous"):
        save_file({"proj.weight": state["proj.weight"].clone()}, tmp_path / "cloned.safetensors")
    assert "`.contiguous()` of each tensor that is not contiguous (proj.weight)" in finding["hint"]


# ML603 polyglot


def test_ml603_run_the_hinted_conversion(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save({"weight": torch.randn(4, 4)}, path, _use_new_zipfile_serialization=False)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("notes.txt", "looks like any zip")
    finding, before = finding_of("ML603", path)
    assert follow_every_hinted_command("ML603", finding, before, path) >= 1


# ML604 misleading-name


@pytest.mark.parametrize("fix", ["rename it after what it is", "re-save it in the format its name claims"])
def test_ml604_rename_or_resave(fix: str, tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    state = {"weight": torch.randn(4, 4)}
    torch.save(state, path)  # a torch.save zip under a safetensors name
    finding, before = finding_of("ML604", path)
    assert fix.split(" it ")[0] in finding["hint"] and "model.safetensors is named like a safetensors file" in \
        finding["message"]
    with pytest.raises(Exception, match="header"):  # safetensors, chosen by the name, cannot read it
        load_file(path)
    if fix.startswith("rename"):
        assert "(a torch.save zip as `.pt`)" in finding["hint"]
        fixed = path.rename(tmp_path / "model.pt")
    else:
        save_file(state, path)
        fixed = path
    assert_fixed("ML604", before, fixed)


# Every finding on the real files of the corpus and the fixtures, every command its hint names


CORPUS = [
    *sorted((FIXTURES.parent / "tests" / "corpus" / "seeds").iterdir()),
    *sorted((FIXTURES / "formats").iterdir()),
    FIXTURES / "demo_checkpoint.pt",
]


def copy_source(source: Path, folder: Path) -> Path:
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    target = folder / source.name
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copyfile(source, target)
    return target


@pytest.mark.parametrize("source", CORPUS, ids=[p.name for p in CORPUS])
def test_every_command_a_hint_names_on_the_corpus_clears_its_finding(source: Path, tmp_path: Path) -> None:
    path = copy_source(source, tmp_path / "original")
    findings = inspect_findings(path)
    for number, finding in enumerate(findings):
        for command in (c for c in hinted_commands(finding["hint"]) if c[:2] == ["memlayout", "flatten"]):
            copy = copy_source(source, tmp_path / f"{finding['code']}_{number}_{'_'.join(command[2:]) or 'plain'}")
            assert_fixed(finding["code"], findings, run_flatten_command(command, copy))


def test_ml201_on_a_view_of_another_tensor_make_it_contiguous(tmp_path: Path) -> None:
    path = copy_source(FIXTURES.parent / "tests" / "corpus" / "seeds" / "views.pt", tmp_path)
    finding, before = finding_of("ML201", path)
    assert "`p.data = p.data.contiguous()`" in finding["hint"] and not hinted_commands(finding["hint"])
    state = {n: t.contiguous() if n in finding["tensors"] else t for n, t in torch.load(path).items()}
    assert_fixed("ML201", before, save_state(state, tmp_path / "fixed.pt"))


def test_ml203_on_a_view_of_another_tensor_clone_it(tmp_path: Path) -> None:
    path = copy_source(LEGACY, tmp_path)
    finding, before = finding_of("ML203", path)
    assert "`.clone()` the tensor" in finding["hint"] and not hinted_commands(finding["hint"])
    state = {n: t.clone() if n in finding["tensors"] else t for n, t in torch.load(path).items()}
    assert_fixed("ML203", before, save_state(state, tmp_path / "fixed.pt"))


def test_ml401_on_safetensors_says_the_files_layout_never_reaches_cudnn(tmp_path: Path) -> None:
    path = copy_source(FIXTURES.parent / "tests" / "corpus" / "seeds" / "model.safetensors", tmp_path)
    finding, _ = finding_of("ML401", path)
    assert "safetensors' loaders give each tensor its own memory" in finding["hint"]
    assert not hinted_commands(finding["hint"]), finding["hint"]  # flatten cannot put it at element 0
    from safetensors import safe_open

    state = load_file(path)
    assert len({t.untyped_storage().data_ptr() for t in state.values()}) == len(state)
    with safe_open(path, framework="pt") as opened:  # type: ignore[no-untyped-call]
        tensors = [opened.get_tensor(name) for name in opened.keys()]  # noqa: SIM118 - safe_open has no __iter__
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == len(tensors)


def test_every_rule_a_file_can_trigger_has_a_journey() -> None:
    from memlayout.rules import RULES

    not_on_files = {"ML302", "ML303", "ML402"}  # see the module's docstring
    followed = {name[len("test_") :][:5].upper() for name in globals() if re.match(r"test_ml\d{3}_", name)}
    assert followed == set(RULES) - not_on_files
