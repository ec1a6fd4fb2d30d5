"""Raw pickles that torch.load would unpickle, in every protocol, named by ML601 and never run (issue 21, item 2).

Given a file that is neither a zip nor a tar archive, torch.load(weights_only=False)
calls pickle.load on it before it checks the legacy magic number, so whatever the
first pickle reduces has run by the time torch.load fails. pickle.load reads any
protocol, and protocols 0 and 1 do not open with PROTO. Each stream here is what
`pickle.dumps` writes for an object that reduces to a payload; a control test
shows that torch.load runs it, and memlayout must name it without running it.
"""

from __future__ import annotations

import builtins
import io
import os
import pickle
import pickletools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memlayout.load.detect import opening_opcodes
from tests.load.conftest import assert_one_line_error, run_cli

PROTOCOLS = list(range(pickle.HIGHEST_PROTOCOL + 1))


class _Reduces:
    """Pickles as `function(argument)`: what a payload in a pickle is."""

    def __init__(self, function: Callable[..., Any], argument: str) -> None:
        self.function, self.argument = function, argument

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        return self.function, (self.argument,)


def _eval_payload(marker: Path) -> _Reduces:
    return _Reduces(builtins.eval, f"open({str(marker)!r}, 'w').close()")


def _system_payload(marker: Path) -> _Reduces:
    return _Reduces(os.system, f"touch '{marker}'")


PAYLOADS = {"eval": _eval_payload, "system": _system_payload}


def _global_named(data: bytes) -> str:
    """The one global the stream names, as pickletools reads it (not as memlayout does)."""
    strings: list[str] = []
    for opcode, argument, _ in pickletools.genops(data):
        if opcode.name in ("GLOBAL", "INST"):
            return str(argument).replace(" ", ".")
        if opcode.name == "STACK_GLOBAL":
            return ".".join(strings[-2:])
        if isinstance(argument, str):
            strings.append(argument)
    raise AssertionError("the stream names no global")


def _broken_after_payload(data: bytes) -> bytes:
    # STOP becomes a byte that is no opcode: the frame (protocol 4+) stays whole, so
    # pickle.load reads up to it, calling the payload on the way, and then fails.
    assert data.endswith(b".")
    return data[:-1] + b"\xff"


def _stream(tmp_path: Path, payload: str, protocol: int, broken: bool = False) -> tuple[Path, Path, bytes]:
    """(the file, the marker its payload would create, the stream as pickle.dumps wrote it)."""
    name = f"{'broken-' if broken else ''}{payload}-protocol{protocol}"
    marker = tmp_path / f"ran-{name}"
    data = pickle.dumps(PAYLOADS[payload](marker), protocol=protocol)
    path = tmp_path / f"{name}.pt"
    path.write_bytes(_broken_after_payload(data) if broken else data)
    return path, marker, data


def test_torch_load_runs_every_stream(tmp_path: Path) -> None:
    # The premise, checked on torch itself in one child process: every stream is
    # live, whole or broken after its payload, and torch.load runs it before it
    # finds that the file is no checkpoint.
    streams = [_stream(tmp_path, payload, protocol) for payload in PAYLOADS for protocol in PROTOCOLS]
    broken = [_stream(tmp_path, "system", protocol, broken=True) for protocol in PROTOCOLS]
    code = (
        "import sys, torch\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        torch.load(path, weights_only=False)\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__)\n"
        "    else:\n"
        "        print('loaded')\n"
    )
    paths = [str(path) for path, _, _ in streams + broken]
    done = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True, timeout=300, check=True)
    outcomes = done.stdout.split()
    assert outcomes == ["RuntimeError"] * len(streams) + ["UnpicklingError"] * len(broken)  # no magic number; no STOP
    not_run = [path.name for path, marker, _ in streams + broken if not marker.exists()]
    assert not not_run, f"torch.load did not run these payloads, which then prove nothing: {not_run}"


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_every_protocol_is_named_by_ml601_and_never_run(tmp_path: Path, payload: str, protocol: int) -> None:
    path, marker, data = _stream(tmp_path, payload, protocol)
    named = _global_named(data)
    result = run_cli("inspect", str(path), "--format", "json")
    assert not marker.exists(), "memlayout ran the payload"
    assert result.exit_code == 1, result.stderr
    assert result.stderr == ""
    assert '"ML601"' in result.stdout
    assert named in result.stdout and "can run arbitrary code" in result.stdout
    assert "not a checkpoint" in result.stdout
    # ML601 is an error: only --fail-on never lets the run pass.
    assert run_cli("inspect", str(path), "--fail-on", "never").exit_code == 0
    assert not marker.exists()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_stream_broken_after_its_payload_names_it_in_the_error(tmp_path: Path, protocol: int) -> None:
    # pickle.load has imported and called the payload before it reaches the damage.
    path, marker, data = _stream(tmp_path, "system", protocol, broken=True)
    assert_one_line_error(run_cli("inspect", str(path)), "could not be read", _global_named(data), "never load it")
    assert not marker.exists()


def test_text_that_is_no_pickle_is_still_unrecognized(tmp_path: Path) -> None:
    for name, text in (("notes.txt", b"cat these notes\n"), ("list.txt", b"(lots of words)\n"), ("n.txt", b"N/A\n")):
        path = tmp_path / name
        path.write_bytes(text)
        assert_one_line_error(run_cli("inspect", str(path)), "not a checkpoint format memlayout recognizes")


def test_no_byte_left_out_of_the_opening_opcodes_can_open_a_pickle() -> None:
    # What memlayout never tries as a pickle, pickle.load refuses at its first byte,
    # whatever follows: a memo read or write, a persistent id, or no opcode at all.
    loaded = []
    for code in sorted(set(range(256)) - opening_opcodes()):
        for tail in (b"0\n.", b"\x00\x00\x00\x00.", b"N."):
            try:
                pickle.Unpickler(io.BytesIO(bytes([code]) + tail)).load()
            except Exception:  # any refusal will do, as long as nothing loads
                continue
            loaded.append(bytes([code]) + tail)
    assert not loaded
