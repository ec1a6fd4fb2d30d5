"""`memlayout flatten` on the command line: exit codes, refusals, summary."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memlayout.cli.app import main
from tests.flatten.models import LstmLM


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.pt"
    torch.save(LstmLM().state_dict(), path)
    return path


def test_check_passes_findings_below_fail_on_and_says_why_flatten_would_still_rewrite(
    state_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An LSTM state dict: ML204 and ML401 are info (loading it into a built module lays the
    # weights out for cuDNN), below the default --fail-on warning.
    assert main(["flatten", str(state_file), "--check"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{state_file}: passes (torch.save state dict); flatten would still rewrite it: ")
    assert "storages become" in line and "ML204 fragmented" in line and "below --fail-on warning" in line


def test_check_exits_1_at_fail_on_info_and_says_what_would_change(
    state_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["flatten", str(state_file), "--check", "--fail-on", "info"]) == 1
    out = capsys.readouterr().out
    assert f"{state_file}: would change" in out and "storages become" in out
    assert "  ML204 info fragmented: " in out
    assert state_file.exists()


def test_fail_on_is_for_the_check(state_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["flatten", str(state_file), "-o", str(tmp_path / "flat.pt"), "--fail-on", "info"]) == 2
    assert "--fail-on judges findings, which only --check does" in capsys.readouterr().err
    assert not (tmp_path / "flat.pt").exists()


def test_check_exits_0_on_flat_output(state_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "flat.pt"
    assert main(["flatten", str(state_file), "-o", str(out), "--device", "cpu"]) == 0
    summary = capsys.readouterr().out
    assert "storages" in summary and "->" in summary and "padding" in summary
    assert main(["flatten", str(out), "--check"]) == 0
    assert "already flat" in capsys.readouterr().out


def test_check_writes_nothing(state_file: Path, tmp_path: Path) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    main(["flatten", str(state_file), "--check", "-o", str(tmp_path / "x.pt")])
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_auto_device_says_which(state_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["flatten", str(state_file), "-o", str(tmp_path / "flat.pt"), "--device", "auto"]) == 0
    assert "auto:" in capsys.readouterr().out


def test_the_default_device_says_it_kept_them(state_file: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["flatten", str(state_file), "-o", str(tmp_path / "flat.pt")]) == 0
    assert "device    cpu (kept:" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--align", "48"], "not a power of two"),
        (["--device", "tpu"], "device"),
        ([], "no output given"),
    ],
)
def test_bad_options_exit_2_with_one_line(
    state_file: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = [] if message == "no output given" else ["-o", str(state_file.with_name("o.pt"))]
    assert main(["flatten", str(state_file), *extra, *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_output_equal_to_input_exits_2(state_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["flatten", str(state_file), "-o", str(state_file)]) == 2
    assert "--in-place" in capsys.readouterr().err


def test_module_pickle_without_trust_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "module.pt"
    torch.save(LstmLM(), path)
    assert main(["flatten", str(path), "-o", str(tmp_path / "out.pt")]) == 2
    err = capsys.readouterr().err
    assert "--trust" in err and err.count("\n") == 1
    assert not (tmp_path / "out.pt").exists()


def test_missing_and_corrupt_inputs_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["flatten", str(tmp_path / "nope.pt"), "-o", str(tmp_path / "o.pt")]) == 2
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"PK\x03\x04 not really a zip")
    assert main(["flatten", str(junk), "-o", str(tmp_path / "o.pt")]) == 2
    assert not (tmp_path / "o.pt").exists()


def test_in_place_rewrites_and_then_checks_flat(state_file: Path) -> None:
    assert main(["flatten", str(state_file), "--in-place", "--device", "cpu"]) == 0
    assert main(["flatten", str(state_file), "--check"]) == 0


def test_flatten_command_does_not_import_torch_at_cli_import() -> None:
    import subprocess
    import sys

    code = "import sys, memlayout.cli.app; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_a_small_copy_prints_no_rate_and_counts_in_the_singular(tmp_path: Path) -> None:
    """A 16-byte file flattened in 0.1 s is not "0.00 GB/s copied", and one buffer is "1 flat buffer"."""
    import dataclasses

    from memlayout.flatten.files import flatten_path
    from memlayout.flatten.options import FlattenOptions
    from memlayout.flatten.summary import MIN_RATE_BYTES, render_summary

    source = tmp_path / "one.pt"
    torch.save({"a": torch.zeros(4), "b": torch.ones(4)}, source)
    result = flatten_path(str(source), FlattenOptions(out=str(tmp_path / "flat.pt"), device="cpu"))
    summary = render_summary(result)
    assert "GB/s" not in summary
    assert "2 storages become 1 flat buffer\n" in summary
    large = dataclasses.replace(result, bytes_copied=MIN_RATE_BYTES * 16, seconds=0.5)
    assert f"({MIN_RATE_BYTES * 16 / 0.5 / 1e9:.2f} GB/s copied)" in render_summary(large)
