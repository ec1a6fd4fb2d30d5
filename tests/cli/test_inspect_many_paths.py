"""`inspect --paths-from`, `--shard`, `--jobs` and `--format jsonl` on local files, as a user runs them."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import torch
from referencing import Registry, Resource

import memlayout
from tests.remote.reports import REPO
from tests.remote.reports import memlayout as run_memlayout

SCHEMAS = Path(memlayout.__file__).parent / "report"
LINE_SCHEMA = json.loads((SCHEMAS / "schema_jsonl_v1.json").read_text())
REPORT_SCHEMA = json.loads((SCHEMAS / "schema_v1.json").read_text())


def validate_line(line: dict[str, object]) -> None:
    registry = Registry().with_resource(REPORT_SCHEMA["$id"], Resource.from_contents(REPORT_SCHEMA))
    jsonschema.Draft202012Validator(LINE_SCHEMA, registry=registry).validate(line)


@pytest.fixture
def checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Seven small checkpoints and one broken file, by relative path."""
    monkeypatch.chdir(tmp_path)
    names = []
    for i in range(7):
        torch.save({"w": torch.randn(4, i + 1)}, f"m{i}.pt")
        names.append(f"m{i}.pt")
    Path("broken.pt").write_bytes(b"\x13" + bytes(range(100)))
    return [*names, "broken.pt"]


def lines_of(text: str) -> list[dict[str, object]]:
    assert text.endswith("\n")
    lines = [json.loads(line) for line in text.splitlines()]
    for line in lines:
        validate_line(line)
    return lines


def test_json_lines_name_each_path_with_its_report_or_error_and_exit_2(checkpoints: list[str], tmp_path: Path) -> None:
    run = run_memlayout("inspect", "--format", "jsonl", *checkpoints, cwd=tmp_path)
    assert run.code == 2
    lines = lines_of(run.stdout)
    assert sorted(str(line["path"]) for line in lines) == sorted(checkpoints)
    (broken,) = [line for line in lines if line["report"] is None]
    assert broken["path"] == "broken.pt" and "broken.pt is not a checkpoint format" in str(broken["error"])
    assert run.stderr.splitlines() == [f"memlayout: error: {broken['error']}"]


def test_shards_split_the_list_without_overlap_and_concatenate_into_the_whole(
    checkpoints: list[str], tmp_path: Path
) -> None:
    listing = tmp_path / "paths.txt"
    listing.write_text("\n".join(checkpoints) + "\n")
    whole = run_memlayout("inspect", "--format", "jsonl", "--paths-from", str(listing), "-o", "all.jsonl", cwd=tmp_path)
    assert whole.code == 2
    for k in (1, 2, 3):
        run_memlayout("inspect", "--format", "jsonl", "--paths-from", "paths.txt", "--shard", f"{k}/3",
                      "-o", f"part{k}.jsonl", cwd=tmp_path)
    parts = "".join((tmp_path / f"part{k}.jsonl").read_text() for k in (1, 2, 3))
    assert sorted(parts.splitlines()) == sorted((tmp_path / "all.jsonl").read_text().splitlines())
    # Shard 1 of 3 takes every third path; JSON lines come as each path finishes, so not in the list's order.
    assert sorted(json.loads(line)["path"] for line in (tmp_path / "part1.jsonl").read_text().splitlines()) == [
        "m0.pt", "m3.pt", "m6.pt",
    ]


def test_paths_from_stdin_join_the_paths_given(checkpoints: list[str], tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "memlayout", "inspect", "--format", "json", "--fail-on", "never", "m0.pt",
         "--paths-from", "-"],
        input="# more\nm1.pt\n\nm2.pt\n", capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    assert [r["path"] for r in json.loads(done.stdout)["reports"]] == ["m0.pt", "m1.pt", "m2.pt"]


def test_the_report_keeps_the_order_of_the_paths_whatever_finishes_first(checkpoints: list[str],
                                                                         tmp_path: Path) -> None:
    run = run_memlayout("inspect", "--format", "json", "--jobs", "4", *reversed(checkpoints), cwd=tmp_path)
    assert [r["path"] for r in json.loads(run.stdout)["reports"]] == list(reversed(checkpoints))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "no path to inspect: none was given"),
        (["--paths-from", "empty.txt"], "--paths-from empty.txt lists none"),
        (["--paths-from", "missing.txt"], "--paths-from missing.txt: no such file"),
        (["m0.pt", "--shard", "5/4"], "--shard 5/4: K must be between 1 and N"),
        (["m0.pt", "--format", "jsonl", "--html", "map.html"], "--format jsonl writes each path as it finishes"),
        (["m0.pt", "--format", "jsonl", "--write-baseline", "b.json"], "and --write-baseline needs the whole run"),
    ],
)
def test_what_cannot_run_is_one_line(checkpoints: list[str], tmp_path: Path, args: list[str], says: str) -> None:
    (tmp_path / "empty.txt").write_text("# nothing yet\n")
    run = run_memlayout("inspect", *args, cwd=tmp_path)
    assert run.code == 2 and run.stdout == ""
    (line,) = run.stderr.splitlines()
    assert line.startswith("memlayout: error: ") and says in line
    assert not (tmp_path / "map.html").exists() and not (tmp_path / "b.json").exists()


def test_the_jsonl_hint_is_followed_with_json(checkpoints: list[str], tmp_path: Path) -> None:
    refused = run_memlayout("inspect", "m0.pt", "--format", "jsonl", "--html", "map.html", cwd=tmp_path)
    assert "use --format json with --html" in refused.stderr
    followed = run_memlayout("inspect", "m0.pt", "--format", "json", "--html", "map.html", cwd=tmp_path)
    assert followed.code in (0, 1) and (tmp_path / "map.html").exists()


def test_a_shard_that_takes_no_path_writes_nothing_and_passes(checkpoints: list[str], tmp_path: Path) -> None:
    run = run_memlayout("inspect", "--format", "jsonl", "m0.pt", "--shard", "2/2", cwd=tmp_path)
    assert run.code == 0 and run.stdout == ""
    assert "takes none of the paths" in run.stderr


def test_jsonl_replaces_the_output_file_and_refuses_an_unwritable_one(checkpoints: list[str], tmp_path: Path) -> None:
    (tmp_path / "out.jsonl").write_text("old content that is no json\n" * 100)
    run = run_memlayout("inspect", "--format", "jsonl", "-o", "out.jsonl", "m0.pt", "m1.pt", cwd=tmp_path)
    assert run.code in (0, 1)
    assert len(lines_of((tmp_path / "out.jsonl").read_text())) == 2
    blocked = run_memlayout("inspect", "--format", "jsonl", "-o", "no-such-folder/out.jsonl", "m0.pt", cwd=tmp_path)
    assert blocked.code == 2 and len(blocked.stderr.splitlines()) == 1
    assert "cannot write no-such-folder/out.jsonl" in blocked.stderr


def stderr_on_a_terminal(args: list[str], cwd: Path) -> str:
    main, side = pty.openpty()
    subprocess.run([sys.executable, "-m", "memlayout", *args], stdout=subprocess.DEVNULL, stderr=side, cwd=cwd,
                   env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100", "TERM": "xterm"})
    os.close(side)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    return b"".join(chunks).decode(errors="replace")


def test_many_paths_draw_a_bar_on_a_terminal_and_nothing_in_a_pipe(checkpoints: list[str], tmp_path: Path) -> None:
    args = ["inspect", "--format", "jsonl", "-o", "out.jsonl", *checkpoints]
    drawn = stderr_on_a_terminal(args, tmp_path)
    assert "paths" in drawn and "1 failed" in drawn and "\x1b[" in drawn
    assert "memlayout: error: broken.pt" in drawn  # the error line above the bar
    piped = run_memlayout(*args, cwd=tmp_path)
    assert piped.stderr.splitlines() == [line for line in piped.stderr.splitlines()
                                         if line.startswith("memlayout: error:")]
    assert "\x1b[" not in piped.stderr
