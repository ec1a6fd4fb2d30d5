"""A folder walk accounts for every file: read with its findings, recognized as data, or unreadable with why.

And it never stops: a file that fails is an entry of its own, a model folder whose
model cannot be read still has each of its files audited, and a file's name never
decides how it is read.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from memlayout.cli.app import app
from memlayout.pipeline.batch import inspect_paths
from memlayout.pipeline.folder_walk import folder_entries


def _inspect(*args: str) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(app, ["inspect", *args, "--format", "json"])
    return result.exit_code, json.loads(result.stdout) if result.stdout else {}, result.stderr


def _outcomes(report: dict[str, Any]) -> dict[str, str]:
    return {Path(r["path"]).name: "report" if r["report"] else "data" if r["data"] else "error"
            for r in report["reports"]}


def test_special_files_and_broken_links_are_listed_as_unreadable(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")  # opening a pipe would block: it is never opened
    (tmp_path / "dangling").symlink_to(tmp_path / "gone.pt")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    (tmp_path / "model.pt").write_bytes(pickle.dumps({"w": 1}))
    try:
        entries = {Path(e.path).name: (e.kind, e.what) for e in folder_entries(str(tmp_path))}
        code, report, err = _inspect(str(tmp_path))
    finally:
        server.close()
    assert entries["pipe"] == ("unreadable", "a named pipe, not a file: memlayout reads files and folders")
    assert entries["sock"][1].startswith("a socket, not a file")
    assert entries["dangling"] == ("unreadable", f"a symbolic link to {tmp_path / 'gone.pt'}, which does not exist")
    assert _outcomes(report) == {"dangling": "error", "model.pt": "report", "pipe": "error", "sock": "error"}
    assert code == 2 and err.count("memlayout: error:") == 3


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file whatever its mode")
def test_a_file_that_cannot_be_opened_is_listed_with_the_reason(tmp_path: Path) -> None:
    locked = tmp_path / "locked.pt"
    locked.write_bytes(b"x")
    locked.chmod(0)
    (kind, what), = [(e.kind, e.what) for e in folder_entries(str(tmp_path))]
    assert kind == "unreadable" and "Permission denied" in what


def test_a_model_folder_whose_weights_lie_about_their_format_is_walked_file_by_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    torch.save({"w": torch.zeros(2)}, tmp_path / "model.safetensors")  # a torch zip, named as safetensors
    (tmp_path / "tokenizer.pkl").write_bytes(pickle.dumps({"vocab": ["a"]}))
    code, report, _ = _inspect(str(tmp_path))
    assert _outcomes(report) == {"config.json": "data", "model.safetensors": "report", "tokenizer.pkl": "report"}
    lying = next(r["report"] for r in report["reports"] if r["path"].endswith("model.safetensors"))
    assert lying["source"]["format"] == "torch-zip" and "ML604" in {f["code"] for f in lying["findings"]}
    assert code == 1


def test_a_model_folder_whose_model_fails_still_has_its_other_files_audited(tmp_path: Path) -> None:
    save_file({"w": torch.zeros(4)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").write_bytes((tmp_path / "model.safetensors").read_bytes()[:-8])  # truncated
    (tmp_path / "config.json").write_text("{}")

    class Hook:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return os.system, ("true",)

    (tmp_path / "extra.pkl").write_bytes(pickle.dumps(Hook()))
    batch = inspect_paths([str(tmp_path)])
    by_name = {Path(p.path).name: p for p in batch.paths}
    assert by_name[tmp_path.name].failed  # the model folder: one entry, its error
    assert by_name["extra.pkl"].report is not None and by_name["config.json"].data == "JSON text"
    assert "ML601" in {f.code for f in by_name["extra.pkl"].report.findings}
    assert by_name["model.safetensors"].failed  # read on its own too: it is the damaged one
    assert batch.exit_code() == 2


def test_a_folder_of_only_data_given_by_name_says_so(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("# notes\n")
    code, report, err = _inspect(str(tmp_path))
    assert code == 2 and "directory with no model" in err
    assert _outcomes(report) == {tmp_path.name: "error", "notes.md": "data"}


def test_a_sub_folder_of_only_data_is_data_and_no_error(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "README.md").write_text("hello")
    (tmp_path / "model.pkl").write_bytes(pickle.dumps([1, 2]))
    code, report, _ = _inspect(str(tmp_path))
    assert code == 0 and _outcomes(report) == {"README.md": "data", "model.pkl": "report"}
    assert report["summary"]["data"] == 1


def test_the_table_and_markdown_count_the_data_files(tmp_path: Path) -> None:
    for index in range(3):
        (tmp_path / f"n{index}.txt").write_text("text")
    (tmp_path / "model.pkl").write_bytes(pickle.dumps([1]))
    table = CliRunner().invoke(app, ["inspect", str(tmp_path)]).stdout
    assert "4 paths: 1 inspected, 3 recognized as data, 0 failed to load" in table
    assert "data (no pickle, no checkpoint): text (3)" in table
    markdown = CliRunner().invoke(app, ["inspect", str(tmp_path), "-f", "markdown"]).stdout
    assert "; 3 recognized as data" in markdown and "#### Recognized as data (3)" in markdown
    junit = CliRunner().invoke(app, ["inspect", str(tmp_path), "-f", "junit"]).stdout
    assert junit.count('message="data: text"') == 3
    lines = [json.loads(line) for line in CliRunner().invoke(app, ["inspect", str(tmp_path), "-f", "jsonl"]).stdout
             .splitlines()]
    assert sorted(line["data"] or "" for line in lines) == ["", "text", "text", "text"]


def test_a_model_folder_alone_keeps_its_one_path_report_and_lists_its_data_files(tmp_path: Path) -> None:
    save_file({"w": torch.zeros(4, 4)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "generation_config.json").write_text("{}")
    code, report, _ = _inspect(str(tmp_path))
    assert report["schema"] == 1 and report["source"]["format"] == "hf-safetensors"
    assert report["data_files"] == [{"path": str(tmp_path / "generation_config.json"), "data": "JSON text"}]
    assert code == 0
