"""Bad input: one clear line on stderr, exit 2, never a traceback (unless --debug)."""

from __future__ import annotations

import json
import random
import zipfile
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from memlayout.cli.app import app

runner = CliRunner()


def write_truncated_checkpoint(path: Path) -> None:
    torch.save({"w": torch.randn(64, 64)}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def write_truncated_tar_checkpoint(path: Path) -> None:
    # torch.save's original tar format, which no installable torch writes: the
    # committed fixture, cut in half.
    data = (Path(__file__).resolve().parents[2] / "fixtures" / "formats" / "legacy_tar_state_dict.pt").read_bytes()
    path.write_bytes(data[: len(data) // 2])


def write_random_bytes(path: Path) -> None:
    # Seeded, and starting with a byte no format's magic begins with, so the case
    # is the same on every run (random bytes that happen to start like a pickle
    # are a damaged pickle, a different case).
    path.write_bytes(b"\x17" + random.Random(20261121).randbytes(4095))


def write_text_file(path: Path) -> None:
    path.write_text("these are not the weights you are looking for\n")


def write_zip_without_pickle(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes/readme.txt", "hello")


def write_pickle_missing_a_record(path: Path) -> None:
    torch.save({"w": torch.randn(4)}, path)
    with zipfile.ZipFile(path) as source:
        entries = [(info, source.read(info)) for info in source.infolist()]
    with zipfile.ZipFile(path, "w") as target:
        for info, data in entries:
            if not info.filename.endswith("/data/0"):
                target.writestr(info, data)


def write_plain_pickle(path: Path) -> None:
    import pickle

    path.write_bytes(pickle.dumps({"epoch": 3, "lr": [0.1, 0.01]}))


CASES = {
    "missing": (None, "no such file or directory"),
    "empty": (lambda p: p.write_bytes(b""), "is empty"),
    "truncated.pt": (write_truncated_checkpoint, ""),
    "truncated_tar.pt": (write_truncated_tar_checkpoint, "cut short"),
    "random.bin": (write_random_bytes, "not a checkpoint format"),
    "notes.xyz": (write_text_file, "not a checkpoint format"),
    "plain.zip": (write_zip_without_pickle, "no pickle or checkpoint inside"),
    "missing_record.pt": (write_pickle_missing_a_record, "lacks"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, name: str) -> None:
    make, expected = CASES[name]
    path = tmp_path / name
    if make is not None:
        make(path)
    result = runner.invoke(app, ["inspect", str(path)])
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("memlayout: error: ")
    assert expected in lines[0]
    # The message and its hint say different things: one parenthetical (the hint),
    # and "truncated" (or "cut short") at most once.
    said = lines[0].replace(str(path), "FILE")
    assert said.count(" (") <= 1, said
    assert said.count("truncated") + said.count("cut short") <= 1, said
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stdout == ""


def test_a_pickle_of_plain_data_is_a_cleared_report_not_an_error(tmp_path: Path) -> None:
    # An audit reads every pickle: one that imports nothing is reported as cleared, and
    # the note says what it holds (it was refused with exit 2, as text is, before).
    path = tmp_path / "plain.pkl"
    write_plain_pickle(path)
    result = runner.invoke(app, ["inspect", str(path), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["findings"] == []
    assert report["source"]["notes"][0] == (
        "a pickle of a dict of 2 items with no tensors, not a checkpoint; it imports nothing outside the allow-list"
    )


def test_directory_without_a_model(tmp_path: Path) -> None:
    (tmp_path / "README.txt").write_text("nothing to see")
    result = runner.invoke(app, ["inspect", str(tmp_path)])
    assert result.exit_code == 2
    assert "directory with no model" in result.stderr


def test_bad_input_leaves_an_existing_output_file_alone(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_text("previous report")
    result = runner.invoke(app, ["inspect", str(tmp_path / "missing.pt"), "-o", str(report)])
    assert result.exit_code == 2
    assert report.read_text() == "previous report"


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    path = tmp_path / "random.bin"
    write_random_bytes(path)
    result = runner.invoke(app, ["inspect", str(path), "--debug"])
    assert result.exit_code != 0
    assert result.exception is not None
    assert type(result.exception).__name__ == "UnrecognizedFormatError"
