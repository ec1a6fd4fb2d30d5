"""Inspecting malicious pickles executes nothing and names every dangerous global (ML601)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from memlayout.errors import CorruptCheckpointError
from memlayout.load import load_path
from memlayout.pipeline.inspection import run_inspection
from tests.load import malicious
from tests.load.conftest import assert_one_line_error, run_cli

WRAPPERS = {
    "bare-pickle": lambda body: body,
    "torch-zip": malicious.torch_zip,
    "legacy": malicious.legacy,
    "legacy-tar": malicious.legacy_tar,
}


@pytest.fixture(autouse=True)
def no_execution_traces(marker: Path) -> Iterator[None]:
    """Every test here ends with neither trace a payload would leave."""
    os.environ.pop(malicious.ENV_VAR, None)
    yield
    assert not marker.exists(), "a payload ran: the marker file exists"
    assert malicious.ENV_VAR not in os.environ, "a payload ran: the environment variable is set"


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
@pytest.mark.parametrize("payload", malicious.PAYLOADS, ids=lambda p: p.name)
def test_payload_is_inspected_not_executed_and_named_by_ml601(
    tmp_path: Path, marker: Path, payload: malicious.Payload, wrapper: str
) -> None:
    path = _write(tmp_path, "checkpoint.pt", WRAPPERS[wrapper](payload.build(str(marker))))
    report = run_inspection(str(path))
    (finding,) = [f for f in report.findings if f.code == "ML601"]
    for dotted in payload.globals:
        assert dotted in finding.message
    assert "weights_only=False" in finding.message


@pytest.mark.parametrize("payload", malicious.PAYLOADS[:4], ids=lambda p: p.name)
def test_cli_fails_on_the_unsafe_pickle_without_running_it(tmp_path: Path, marker: Path,
                                                           payload: malicious.Payload) -> None:
    path = _write(tmp_path, "model.pt", malicious.torch_zip(payload.build(str(marker))))
    result = run_cli("inspect", str(path), "--format", "json")
    assert result.exit_code == 1
    assert "ML601" in result.stdout
    assert "can run arbitrary code" in result.stdout


def test_refused_codec_trick_is_a_one_line_error(tmp_path: Path, marker: Path) -> None:
    (payload,) = malicious.REFUSED
    path = _write(tmp_path, "model.pt", malicious.torch_zip(payload.build(str(marker))))
    assert_one_line_error(run_cli("inspect", str(path)), f"{path}: the pickle archive/data.pkl could not be read")


def test_payload_in_a_persistent_id_is_refused(tmp_path: Path, marker: Path) -> None:
    path = _write(tmp_path, "model.pt", malicious.torch_zip(malicious.in_persistent_id(str(marker))))
    with pytest.raises(CorruptCheckpointError):
        load_path(str(path))


def test_payload_in_the_legacy_header_pickles_is_not_executed(tmp_path: Path, marker: Path) -> None:
    path = _write(tmp_path, "legacy.pt", malicious.legacy_poisoned_header(str(marker)))
    # The header must be the plain dict torch writes; a REDUCE there is damage.
    result = run_cli("inspect", str(path))
    assert result.exit_code in (1, 2)
    assert "Traceback" not in result.stderr


def test_inspect_refuses_trust_and_its_hint_works(tmp_path: Path, marker: Path) -> None:
    # inspect never runs code, so --trust would only mislead: it is refused with
    # one line, and following the hint (dropping it) inspects the file inertly.
    path = _write(tmp_path, "model.pt", malicious.torch_zip(malicious.PAYLOADS[0].build(str(marker))))
    assert_one_line_error(run_cli("inspect", "--trust", str(path)), "inspect takes no --trust", "drop --trust")
    assert "--trust" not in run_cli("inspect", "--help").stdout
    followed = run_cli("inspect", str(path), "--format", "json")
    assert followed.exit_code == 1
    assert "ML601" in followed.stdout
    assert not marker.exists()


def test_user_classes_are_named_but_not_flagged_as_code_execution(tmp_path: Path, marker: Path) -> None:
    (payload,) = [p for p in malicious.PAYLOADS if p.name == "newobj-user-class"]
    path = _write(tmp_path, "model.pt", malicious.torch_zip(payload.build(str(marker))))
    (finding,) = [f for f in run_inspection(str(path)).findings if f.code == "ML601"]
    assert "evil_pkg.models.Backdoor" in finding.message
    assert "import evil_pkg.models" in finding.message
    assert "arbitrary code" not in finding.message


def test_payload_in_a_tar_storage_record_is_refused_not_executed(tmp_path: Path, marker: Path) -> None:
    path = _write(tmp_path, "old.pt", malicious.legacy_tar_poisoned_record(str(marker), "storages"))
    assert_one_line_error(run_cli("inspect", str(path)), "not a torch storage")


def test_payload_in_a_tar_tensor_record_is_named_not_executed(tmp_path: Path, marker: Path) -> None:
    path = _write(tmp_path, "old.pt", malicious.legacy_tar_poisoned_record(str(marker), "tensors"))
    (finding,) = [f for f in run_inspection(str(path)).findings if f.code == "ML601"]
    assert "os.system" in finding.message
