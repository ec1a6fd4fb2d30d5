"""Checkpoints with many tensors: `memlayout inspect` in every format against torch's own loaders, and the per-tensor
cost.

Usage: python benchmarks/speed/bench_many_tensors.py [--quick]

Sources (benchmarks/harness/many_tensors.py; --quick divides the counts by ten):
- a torch.save state dict of 40,000 small tensors, named like a mixture-of-experts
  model; and the same with every tensor transposed, so that each of the 40,000 is
  a finding (ML201) and every reporter has 40,000 findings to write;
- a Hugging Face directory of 20 safetensors shards whose index names 100,000 tensors;
- a torch.distributed.checkpoint directory of 100,000 tensor shards.

CLI rows: `memlayout inspect SOURCE --format F` for every format `--format` accepts,
and the HTML storage map (`--html`, beside the default table), each in a fresh
process, against the peer that loads the same checkpoint with torch in a fresh
process:
- torch.save: `python -c "import torch; torch.load(f, mmap=True)"`;
- Hugging Face: `import torch` and `safetensors.torch.load_file` of every shard;
- DCP: `import torch` and `torch.distributed.checkpoint`'s
  `_load_state_dict_from_keys(checkpoint_id=...)`, which loads every tensor without
  a process group (the metadata read alone, `FileSystemReader.read_metadata`, is
  shown too, for scale).
Goals: at most 0.2x of the peer's wall time, and a peak RSS under 256 MiB. Times
are the best of N round-robin rounds; the peak RSS is the command's own (see
measure_child.py), the largest over the rounds.

In-process rows: `memlayout.inspect(path)` (load, facts and every metadata rule)
divided by the tensor count, goal <= 10 us per tensor; beside it, for scale, the
same peer's load in-process per tensor and, for torch.save, CPython's C unpickler
alone on `data.pkl` with callbacks that do nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import ROOT, Row, compile_bytecode, print_table, quick_requested, write_results
from harness.many_tensors import dcp_dir, hf_sharded_dir, torch_save_file

RSS_LIMIT_MIB = 256
CLI_GOAL = 0.2
PER_TENSOR_GOAL_US = 10.0
HERE = Path(__file__).resolve().parent


class Source:
    """One checkpoint, how torch loads it (as a command and in-process), and its tensor count."""

    def __init__(self, label: str, path: Path, count: int, peer_label: str, peer_code: str) -> None:
        self.label = label
        self.path = path
        self.count = count
        self.peer_label = peer_label
        self.peer_code = peer_code
        """Python that loads `path` (bound as `PATH`) with torch."""

    def peer_command(self) -> list[str]:
        return [sys.executable, "-c", f"PATH = {str(self.path)!r}\n{self.peer_code}"]


TORCH_LOAD = "import torch\ntorch.load(PATH, mmap=True)"
HF_LOAD = (
    "import glob, os, torch\nfrom safetensors.torch import load_file\n"
    "for shard in sorted(glob.glob(os.path.join(PATH, '*.safetensors'))):\n    load_file(shard)"
)
DCP_LOAD = (
    "import warnings\nwarnings.simplefilter('ignore')\nimport torch\n"
    "from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys\n"
    "_load_state_dict_from_keys(checkpoint_id=PATH)"
)
DCP_METADATA = (
    "import torch\nfrom torch.distributed.checkpoint import FileSystemReader\nFileSystemReader(PATH).read_metadata()"
)


def sources(quick: bool) -> list[Source]:
    scale = 10 if quick else 1
    zip_count, many = 40_000 // scale, 100_000 // scale
    return [
        Source(f"torch.save, {zip_count:,} tensors", torch_save_file(zip_count), zip_count, "torch.load(mmap=True)",
               TORCH_LOAD),
        Source(
            f"torch.save, {zip_count:,} transposed tensors", torch_save_file(zip_count, transposed=True), zip_count,
            "torch.load(mmap=True)", TORCH_LOAD,
        ),
        Source(
            f"HF safetensors, 20 shards, {many:,} tensors", hf_sharded_dir(many, 20), many,
            "safetensors load_file of every shard", HF_LOAD,
        ),
        Source(f"DCP, {many:,} tensor shards", dcp_dir(many), many, "dcp _load_state_dict_from_keys", DCP_LOAD),
    ]


def _formats() -> list[str]:
    from memlayout.cli.formats import Command, formats_for

    return [fmt.value for fmt in formats_for(Command.INSPECT)]


def _has_html() -> bool:
    help_text = subprocess.run(
        [sys.executable, "-m", "memlayout", "inspect", "--help"], capture_output=True, text=True, check=False
    ).stdout
    return "--html" in help_text


def _measure(command: list[str]) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, str(HERE / "measure_child.py"), *command], capture_output=True, text=True, check=True, cwd=ROOT
    )
    figures: dict[str, Any] = json.loads(result.stdout)
    return figures


def _cli() -> list[str]:
    script = Path(sys.executable).parent / "memlayout"
    return [str(script)] if script.exists() else [sys.executable, "-m", "memlayout"]


def cli_rows(source: Source, rounds: int, scratch: Path) -> tuple[list[Row], dict[str, Any]]:
    commands: dict[str, list[str]] = {}
    for fmt in _formats():
        commands[fmt] = [*_cli(), "inspect", str(source.path), "--format", fmt, "--fail-on", "never"]
    if _has_html():
        commands["--html (and the table)"] = [
            *_cli(), "inspect", str(source.path), "--html", str(scratch / "map.html"), "--fail-on", "never",
        ]
    commands["peer"] = source.peer_command()
    best: dict[str, float] = dict.fromkeys(commands, float("inf"))
    peak: dict[str, float] = dict.fromkeys(commands, 0.0)
    for _ in range(rounds):
        for name, command in commands.items():
            figures = _measure(command)
            if name != "peer" and figures["exit"] not in (0, 1):
                raise RuntimeError(f"{' '.join(command)} exited {figures['exit']}")
            best[name] = min(best[name], figures["seconds"])
            peak[name] = max(peak[name], figures["max_rss_mib"])
    rows = []
    peer = best["peer"]
    for name in commands:
        if name == "peer":
            continue
        ratio = best[name] / peer
        rows.append(
            Row(
                f"CLI {name}: {source.label}",
                f"{best[name]:.2f} s, {peak[name]:.0f} MiB",
                f"{source.peer_label} {peer:.2f} s",
                ratio,
                f"<= {CLI_GOAL}x, < {RSS_LIMIT_MIB} MiB",
                ratio <= CLI_GOAL and peak[name] < RSS_LIMIT_MIB,
            )
        )
    return rows, {"seconds": best, "max_rss_mib": peak}


def _per_tensor(function: Callable[[], object], count: int, rounds: int) -> float:
    function()  # warm: imports and first-use caches are start-up, not per-tensor cost
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return best / count * 1e6


def _c_unpickler_floor(path: Path) -> Callable[[], object]:
    from bench_inspect import _do_nothing_unpickle

    return _do_nothing_unpickle(str(path))


def in_process_rows(source: Source, rounds: int) -> tuple[list[Row], dict[str, float]]:
    import memlayout

    namespace: dict[str, Any] = {"PATH": str(source.path)}
    peer_code = compile(source.peer_code, "<peer>", "exec")
    figures = {
        "memlayout.inspect": _per_tensor(lambda: memlayout.inspect(str(source.path)), source.count, rounds),
        "peer": _per_tensor(lambda: exec(peer_code, dict(namespace)), source.count, max(1, rounds // 2)),
    }
    rows = [
        Row(
            f"in-process memlayout.inspect per tensor: {source.label}",
            f"{figures['memlayout.inspect']:.2f} us",
            f"{source.peer_label} {figures['peer']:.2f} us/tensor",
            figures["memlayout.inspect"] / figures["peer"],
            f"<= {PER_TENSOR_GOAL_US:.0f} us",
            figures["memlayout.inspect"] <= PER_TENSOR_GOAL_US,
        )
    ]
    if source.path.suffix == ".pt":
        from memlayout import cyclic_gc

        unpickle = _c_unpickler_floor(source.path)

        def floor() -> None:
            # With the collector paused, as memlayout.inspect runs: like with like.
            with cyclic_gc.paused():
                unpickle()

        figures["C unpickler floor"] = _per_tensor(floor, source.count, rounds)
        rows.append(
            Row(
                f"floor: C unpickler alone, no-op callbacks, per tensor: {source.label}",
                f"{figures['C unpickler floor']:.2f} us",
                f"memlayout.inspect {figures['memlayout.inspect']:.2f} us",
                figures["C unpickler floor"] / figures["memlayout.inspect"],
                "(floor)",
                True,
            )
        )
    return rows, figures


def dcp_metadata_row(source: Source, rounds: int) -> tuple[Row, float]:
    # The metadata read alone: what `inspect` reads of a DCP checkpoint, for scale.
    command = [sys.executable, "-c", f"PATH = {str(source.path)!r}\n{DCP_METADATA}"]
    inspect = [*_cli(), "inspect", str(source.path), "--format", "json", "--fail-on", "never"]
    best = {"metadata": float("inf"), "inspect": float("inf")}
    for _ in range(rounds):
        best["metadata"] = min(best["metadata"], _measure(command)["seconds"])
        best["inspect"] = min(best["inspect"], _measure(inspect)["seconds"])
    ratio = best["inspect"] / best["metadata"]
    row = Row(
        f"CLI json: {source.label}", f"{best['inspect']:.2f} s", f"dcp read_metadata alone {best['metadata']:.2f} s",
        ratio, "(info)", True,
    )
    return row, best["metadata"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    compile_bytecode()
    quick = quick_requested(argv)
    rounds = 1 if quick else 3
    rows: list[Row] = []
    raw: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for source in sources(quick):
            cli, cli_raw = cli_rows(source, rounds, Path(scratch))
            in_process, in_process_raw = in_process_rows(source, rounds)
            rows += cli + in_process
            raw[source.label] = {"cli": cli_raw, "in_process_us": in_process_raw, "path": str(source.path)}
            if source.label.startswith("DCP"):
                row, seconds = dcp_metadata_row(source, rounds)
                rows.append(row)
                raw[source.label]["dcp_read_metadata_seconds"] = seconds
    print_table(f"bench_many_tensors: inspection of many tensors{' (quick)' if quick else ''}", rows)
    print(f"raw numbers: {write_results('many_tensors', rows, raw, quick).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
