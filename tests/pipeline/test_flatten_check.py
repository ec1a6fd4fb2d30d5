"""`flatten --check`'s verdict: what it judges, the exit code, and the line each path gets.

The judgement is tested on findings and plans built in memory (every branch: a
fixable finding at and below --fail-on, one flatten does not fix, an alignment
asked for, --device, --to); the command itself on real files in tests/flatten,
tests/test_pre_commit_hooks.py and the corpus.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from memlayout.cli.app import main
from memlayout.core.flatten_support import FLATTEN_FIXES
from memlayout.flatten.files import FlattenResult
from memlayout.flatten.options import FlattenOptions
from memlayout.pipeline.flatten_check import CheckBatch, CheckedPath, Verdict, exit_status, judge
from memlayout.report.flatten_check import render_summary, render_verdict
from memlayout.rules import RULES, Finding
from memlayout.severity import FailOn
from tests import models

CHECK = FlattenOptions(out=None, check=True)


def finding(code: str, message: str = "what is wrong") -> Finding:
    return RULES[code].finding(("w",), message)


def plan(*changes: str) -> FlattenResult:
    return FlattenResult(
        source="m.pt", out=None, format="torch.save state dict", device=None, device_reason="check only",
        storages_before=4, storages_after=1 if changes else 4, bytes_before=64, bytes_after=64, padding_bytes=0,
        bytes_copied=0, seconds=0.0, already_flat=not changes, changes=changes, notes=(), verified=False,
    )


def test_a_fixable_finding_at_fail_on_fails_when_flatten_would_change_the_file() -> None:
    checked = judge("m.pt", [finding("ML301")], plan("4 storages become 1 flat buffer"), FailOn.WARNING, CHECK)
    assert checked.verdict is Verdict.WOULD_CHANGE and [f.code for f in checked.failing] == ["ML301"]


def test_a_fixable_finding_below_fail_on_passes_and_is_why_flatten_would_still_rewrite() -> None:
    checked = judge("m.pt", [finding("ML204")], plan("4 storages become 1 flat buffer"), FailOn.WARNING, CHECK)
    assert checked.verdict is Verdict.PASSES and [f.code for f in checked.below] == ["ML204"]
    assert render_verdict(checked, FailOn.WARNING) == (
        "m.pt: passes (torch.save state dict); flatten would still rewrite it: 4 storages become 1 flat buffer, "
        "for ML204 fragmented (info, below --fail-on warning)\n"
    )
    assert judge("m.pt", [finding("ML204")], plan("x"), FailOn.INFO, CHECK).verdict is Verdict.WOULD_CHANGE


def test_a_finding_flatten_does_not_fix_never_fails_the_check_and_its_line_says_who_reports_it() -> None:
    checked = judge("m.pt", [finding("ML103", "a lost tie")], plan("2 storages become 1 flat buffer"),
                    FailOn.WARNING, CHECK)
    assert checked.verdict is Verdict.PASSES and [f.code for f in checked.unfixed] == ["ML103"]
    text = render_verdict(checked, FailOn.WARNING)
    assert "which no finding asks for" in text
    assert "  note: ML103 error broken-tie: a lost tie; flatten does not fix it here, `memlayout inspect` reports it" in text


def test_a_file_flatten_would_not_change_is_already_flat_whatever_its_findings() -> None:
    # A view of another tensor's bytes stays a view: its ML201 stays after flatten, so it cannot fail the check.
    checked = judge("m.pt", [finding("ML201")], plan(), FailOn.WARNING, CHECK)
    assert checked.verdict is Verdict.ALREADY_FLAT and [f.code for f in checked.unfixed] == ["ML201"]
    assert render_verdict(checked, FailOn.WARNING).startswith("m.pt: already flat (4 storages)\n  note: ML201")


def test_an_asked_alignment_fails_ml203_whatever_its_severity() -> None:
    misaligned = [finding("ML203")]
    section = plan("the data section starts at byte 136, only 8-byte aligned")
    assert judge("m.pt", misaligned, section, FailOn.WARNING, CHECK).verdict is Verdict.PASSES
    asked = replace(CHECK, align=64)
    assert judge("m.pt", misaligned, section, FailOn.WARNING, asked).verdict is Verdict.WOULD_CHANGE
    assert judge("m.pt", misaligned, section, FailOn.NEVER, asked).verdict is Verdict.WOULD_CHANGE


def test_mixed_devices_are_flatten_s_to_fix_only_when_device_moves_every_tensor() -> None:
    mixed = [finding("ML501")]
    assert judge("m.pt", mixed, plan("x"), FailOn.WARNING, CHECK).verdict is Verdict.PASSES
    moved = replace(CHECK, device="cpu")
    assert judge("m.pt", mixed, plan("x"), FailOn.WARNING, moved).verdict is Verdict.WOULD_CHANGE


def test_a_conversion_is_judged_by_what_it_would_write() -> None:
    to = replace(CHECK, to="safetensors")
    assert judge("m.pt", [], plan("the format changes"), FailOn.WARNING, to).verdict is Verdict.WOULD_CHANGE
    assert judge("m.pt", [], plan(), FailOn.WARNING, to).verdict is Verdict.ALREADY_FLAT


def test_the_fixes_are_rules_and_each_one_s_hint_offers_flatten() -> None:
    for code in FLATTEN_FIXES:
        assert code in RULES
        assert "memlayout flatten" in RULES[code].hint or code == "ML602", code


@pytest.mark.parametrize(
    ("verdicts", "code"),
    [
        ([Verdict.ALREADY_FLAT, Verdict.PASSES], 0),
        ([Verdict.PASSES, Verdict.WOULD_CHANGE], 1),
        ([Verdict.ALREADY_FLAT, Verdict.NOT_CHECKED], 1),
        ([Verdict.NOT_CHECKED, Verdict.NOT_CHECKED], 2),
        ([], 2),
        # A file read as data (a config, a tokenizer) fails nothing, and is nothing checked.
        ([Verdict.ALREADY_FLAT, Verdict.DATA], 0),
        ([Verdict.WOULD_CHANGE, Verdict.DATA], 1),
        ([Verdict.DATA, Verdict.DATA], 2),
        ([Verdict.NOT_CHECKED, Verdict.DATA], 2),
    ],
)
def test_the_exit_code(verdicts: list[Verdict], code: int) -> None:
    paths = [CheckedPath(f"{n}.pt", v) for n, v in enumerate(verdicts)]
    assert exit_status(paths) == code
    assert CheckBatch(tuple(paths), FailOn.WARNING).exit_code() == code


def test_the_summary_counts_every_verdict() -> None:
    paths = tuple(CheckedPath(f"{n}.pt", v) for n, v in enumerate(
        [Verdict.ALREADY_FLAT, Verdict.PASSES, Verdict.PASSES, Verdict.WOULD_CHANGE, Verdict.NOT_CHECKED]))
    assert render_summary(CheckBatch(paths, FailOn.INFO)) == (
        "5 paths checked at --fail-on info: 1 already flat, 2 pass as written, 1 would change, 1 not checked\n"
    )


# --- the command, on files -------------------------------------------------------------


def test_a_folder_and_paths_from_are_read_as_inspect_reads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "checkpoints"
    (folder / "nested").mkdir(parents=True)
    torch.save(models.sliced_bloat_state(), folder / "bloated.pt")
    torch.save({"scale": torch.randn(16)}, folder / "nested" / "clean.pt")  # 64 bytes: a flat buffer as it is
    (folder / "notes.txt").write_text("no checkpoint")
    (folder / "damaged.pt").write_bytes(b"PK\x03\x04 not really")
    listed = tmp_path / "paths.txt"
    listed.write_text(f"# checkpoints\n{folder / 'nested' / 'clean.pt'}\n")
    monkeypatch.chdir(tmp_path)

    assert main(["flatten", "--check", "checkpoints", "--paths-from", str(listed)]) == 1
    captured = capsys.readouterr()
    lines = [line for line in captured.out.splitlines() if not line.startswith(" ")]
    assert lines[0].startswith("checkpoints/bloated.pt: would change")
    assert lines[1] == "checkpoints/nested/clean.pt: already flat (1 storage)"
    assert lines[2] == f"{folder / 'nested' / 'clean.pt'}: already flat (1 storage)"
    # notes.txt is accounted for, as inspect accounts for it, and fails nothing.
    assert lines[3] == ("4 paths checked at --fail-on warning: 2 already flat, 0 pass as written, 1 would change, "
                        "1 not checked; 1 other file read as data, nothing to flatten: text (1)")
    (error,) = captured.err.splitlines()
    assert error.startswith("memlayout: error: checkpoints/damaged.pt")
    # One path that could not be checked alone is exit 2, as flatten itself.
    assert main(["flatten", "--check", "checkpoints/damaged.pt"]) == 2
    assert main(["flatten", "--check", "--paths-from", str(tmp_path / "missing.txt")]) == 2
    assert "--paths-from" in capsys.readouterr().err


def test_a_folder_of_flat_models_and_their_data_files_passes_and_a_folder_of_data_alone_is_not_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    torch.save({"scale": torch.randn(16)}, model / "weights.pt")
    (model / "tokenizer.json").write_text('{"version": "1.0"}')
    (model / "README.md").write_text("# a model\n")
    monkeypatch.chdir(tmp_path)

    assert main(["flatten", "--check", "model"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.splitlines() == [
        "model/weights.pt: already flat (1 storage)",
        "1 path checked at --fail-on warning: 1 already flat, 0 pass as written, 0 would change, 0 not checked; "
        "2 other files read as data, nothing to flatten: JSON text (1), text (1)",
    ]
    (model / "weights.pt").unlink()
    # Nothing left to check: the folder is likely not the one meant, as inspect says of it.
    assert main(["flatten", "--check", "model"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("memlayout: error: model is a directory with no model memlayout can read")


def test_the_project_s_settings_reach_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.save(models.sliced_bloat_state(), tmp_path / "bloated.pt")
    monkeypatch.chdir(tmp_path)
    assert main(["flatten", "--check", "bloated.pt"]) == 1
    (tmp_path / "pyproject.toml").write_text('[tool.memlayout]\nfail-on = "error"\n')
    assert main(["flatten", "--check", "bloated.pt"]) == 0
    assert "below --fail-on error" in capsys.readouterr().out
    assert main(["flatten", "--check", "bloated.pt", "--fail-on", "warning"]) == 1
    assert main(["flatten", "--check", "bloated.pt", "--isolated"]) == 1
    (tmp_path / "pyproject.toml").write_text('[tool.memlayout]\nalignment = 48\n')
    assert main(["flatten", "--check", "bloated.pt"]) == 2
    assert "alignment must be a power of two" in capsys.readouterr().err
