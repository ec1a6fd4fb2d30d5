"""Where flatten writes: existing folders, --force, modes, owners, devices, two writers at once."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from memlayout.cli.app import main
from tests.flatten.models import LstmLM

IS_ROOT = os.geteuid() == 0


def make_model_folder(path: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    """A minimal Hugging Face folder: config, one safetensors file, a tokenizer file."""
    torch.manual_seed(seed)
    state = {f"layer.{i}.weight": torch.randn(16, 8) for i in range(3)} | {"head.bias": torch.randn(4)}
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "toy", "seed": seed}))
    (path / "tokenizer.json").write_text("{}")
    save_file(state, path / "model.safetensors")
    return state


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def test_a_non_empty_output_folder_is_refused_with_one_line_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_model_folder(tmp_path / "model")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    assert main(["flatten", str(tmp_path / "model"), "-o", str(out), "--device", "cpu"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("memlayout: error:")
    assert "--force" in error and "new or empty folder" in error
    assert listing(out) == ["notes.txt"] and (out / "notes.txt").read_text() == "my notes"
    assert listing(tmp_path) == ["model", "out"]


def test_force_replaces_only_the_files_flatten_writes(tmp_path: Path) -> None:
    state = make_model_folder(tmp_path / "model")
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(out, 0o750)
    (out / "notes.txt").write_text("my notes")
    (out / "config.json").write_text("stale")
    notes = os.stat(out / "notes.txt")
    # What --force was told to do is what the refusal's hint says it does.
    assert main(["flatten", str(tmp_path / "model"), "-o", str(out), "--device", "cpu", "--force"]) == 0
    assert listing(out) == ["config.json", "model.safetensors", "notes.txt", "tokenizer.json"]
    assert (out / "notes.txt").read_text() == "my notes"
    assert os.stat(out / "notes.txt").st_ino == notes.st_ino  # the same file, not a copy
    assert json.loads((out / "config.json").read_text())["model_type"] == "toy"
    written = load_file(out / "model.safetensors")
    assert all(torch.equal(written[name], tensor) for name, tensor in state.items())
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o750
    assert listing(tmp_path) == ["model", "out"]


def test_an_empty_output_folder_is_used_and_new_files_follow_the_umask(tmp_path: Path) -> None:
    make_model_folder(tmp_path / "model")
    os.chmod(tmp_path / "model" / "tokenizer.json", 0o600)  # copies are new files, as with cp
    out = tmp_path / "out"
    out.mkdir()
    assert main(["flatten", str(tmp_path / "model"), "-o", str(out), "--device", "cpu"]) == 0
    mask = current_umask()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert stat.S_IMODE(os.stat(out / name).st_mode) == 0o666 & ~mask, name
    fresh = tmp_path / "fresh"
    assert main(["flatten", str(tmp_path / "model"), "-o", str(fresh), "--device", "cpu"]) == 0
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o777 & ~mask


def test_a_file_into_an_existing_folder_is_one_line_touches_nothing_and_its_hint_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "model.pt"
    torch.save(LstmLM().state_dict(), source)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["flatten", str(source), "-o", str(out), "--device", "cpu"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("memlayout: error:") and error.count("\n") == 1
    assert "existing folder" in error and "unexpected" not in error and "Traceback" not in error
    assert listing(out) == ["notes.txt"]

    # Follow the hint: the -o it suggests is a file inside that folder.
    suggested = re.search(r"e\.g\. (-o .+)\)$", error.strip())
    assert suggested is not None
    assert main(["flatten", str(source), *shlex.split(suggested.group(1)), "--device", "cpu"]) == 0
    assert listing(out) == ["model.pt", "notes.txt"]
    flat = torch.load(out / "model.pt", weights_only=True)
    original = torch.load(source, weights_only=True)
    assert flat.keys() == original.keys()
    assert all(torch.equal(flat[k], original[k]) for k in original)


def test_in_place_keeps_the_mode_and_owner(tmp_path: Path) -> None:
    source = tmp_path / "model.pt"
    torch.save(LstmLM().state_dict(), source)
    os.chmod(source, 0o644)
    if IS_ROOT:
        os.chown(source, 1234, 4321)
    before = os.stat(source)
    assert main(["flatten", str(source), "--in-place", "--device", "cpu"]) == 0
    after = os.stat(source)
    assert after.st_ino != before.st_ino  # replaced, not written into
    assert (stat.S_IMODE(after.st_mode), after.st_uid, after.st_gid) == (0o644, before.st_uid, before.st_gid)
    assert listing(tmp_path) == ["model.pt"]


def test_flatten_through_a_symlink_replaces_the_target_and_keeps_the_link(tmp_path: Path) -> None:
    source = tmp_path / "model.pt"
    torch.save(LstmLM().state_dict(), source)
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "flat.pt").write_bytes(b"old")
    (tmp_path / "flat.pt").symlink_to("store/flat.pt")
    assert main(["flatten", str(source), "-o", str(tmp_path / "flat.pt"), "--device", "cpu"]) == 0
    assert os.path.islink(tmp_path / "flat.pt")
    assert main(["flatten", str(tmp_path / "store" / "flat.pt"), "--check"]) == 0
    assert listing(tmp_path / "store") == ["flat.pt"]


@pytest.mark.skipif(not IS_ROOT, reason="making a device node needs root")
def test_flatten_to_a_device_writes_into_it_and_says_it_was_not_re_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "model.pt"
    torch.save(LstmLM().state_dict(), source)
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    assert main(["flatten", str(source), "-o", str(null), "--device", "cpu"]) == 0
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    assert "skipped (OUT is a device or pipe, which cannot be re-read)" in capsys.readouterr().out
    assert listing(tmp_path) == ["model.pt", "null"]


_FLATTEN = [sys.executable, "-m", "memlayout", "flatten", "--device", "cpu"]


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_two_flattens_into_one_out_at_once_leave_one_complete_out(tmp_path: Path, kind: str) -> None:
    # Two different inputs, so a mix of the two would show.
    sources = []
    for seed in (1, 2):
        if kind == "folder":
            make_model_folder(tmp_path / f"model{seed}", seed)
            sources.append(tmp_path / f"model{seed}")
        else:
            torch.manual_seed(seed)
            torch.save(LstmLM().state_dict(), tmp_path / f"model{seed}.pt")
            sources.append(tmp_path / f"model{seed}.pt")
    out = tmp_path / ("out" if kind == "folder" else "out.pt")
    runs = [subprocess.Popen([*_FLATTEN, str(source), "-o", str(out)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for source in sources]
    outcomes = [(run.wait(timeout=300), run.stderr.read() if run.stderr else "") for run in runs]
    assert any(code == 0 for code, _ in outcomes), outcomes
    for code, error in outcomes:  # the loser of a folder race says so in one line
        assert code == 0 or (code == 2 and error.count("\n") == 1 and "already holds files" in error), outcomes
    if kind == "folder":
        written = load_file(out / "model.safetensors")
        seed = json.loads((out / "config.json").read_text())["seed"]
        expected = load_file(tmp_path / f"model{seed}" / "model.safetensors")
        assert listing(out) == ["config.json", "model.safetensors", "tokenizer.json"]
    else:
        written = torch.load(out, weights_only=True)
        candidates = [torch.load(source, weights_only=True) for source in sources]
        expected = next(c for c in candidates if torch.equal(c["embed.weight"], written["embed.weight"]))
    assert written.keys() == expected.keys()
    assert all(torch.equal(written[name], expected[name]) for name in expected)
    assert not [name for name in listing(tmp_path) if name.startswith(".memlayout-")]


def test_an_existing_output_file_is_replaced_because_o_names_it(tmp_path: Path) -> None:
    """The one rule for OUT: flatten replaces what -o names. A file OUT is replaced (as cp
    does); a folder OUT names the folder, not its files, so those need --force (the tests
    above). The help says the same, so the rule is not a surprise."""
    source = tmp_path / "model.pt"
    state = LstmLM().state_dict()
    torch.save(state, source)
    out = tmp_path / "flat.pt"
    out.write_text("an older output")
    assert main(["flatten", str(source), "-o", str(out), "--device", "cpu"]) == 0
    reloaded = torch.load(out, weights_only=True)
    assert all(torch.equal(reloaded[name], tensor) for name, tensor in state.items())
    helped = subprocess.run([sys.executable, "-m", "memlayout", "flatten", "--help"], capture_output=True, text=True,
                            env={**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"}, check=True).stdout
    words = " ".join(helped.replace("│", " ").split())
    assert "an existing file OUT is replaced" in words
    assert "an existing folder OUT that holds files is refused without --force" in words
