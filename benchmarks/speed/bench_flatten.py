"""CPU figures for `memlayout flatten`: throughput against the machine limit and other flatteners, and peak RSS.

Usage: python benchmarks/speed/bench_flatten.py [--size-mib 1024] [--tensors 400] [--repeat 5] [--quick]

Throughput: the same tensors, already in memory, flattened by
  - the machine limit: a freshly allocated buffer, its pages faulted in on every
    intra-op thread (memlayout.flatten.populate), then one copy of each tensor;
  - the same copy into a fresh buffer whose pages the copy itself faults in (the
    limit as the flatten issue first defined it);
  - memlayout (plan, allocate, copy, re-point every tensor);
  - torch.cat, torch._utils._flatten_dense_tensors, parameters_to_vector, and
    tensordict's consolidate() when tensordict is installed.
Each is the best of --repeat round-robin rounds; a fresh buffer each run, as flattening really does.

End to end, file to file, each a fresh process, in the same round-robin rounds:
  - `memlayout flatten IN -o OUT --device cpu` (verified and fsynced), the CLI;
  - the naive peer: `torch.load(IN, mmap=True)`, `torch.cat`, views of the flat
    buffer under IN's names, `torch.save(OUT)`: no verification, no fsync;
  - `cp IN OUT` and a bare `python -c "import torch"`: the stretch goal is
    memlayout <= 2 x cp + import torch.
In process (torch already imported), `flatten_path` against the naive peer's same
steps, and the stages of memlayout's best run (plan: load IN's metadata, facts
and plan; rebuild: IN's tree from its pickle on stand-in storages; pickle:
data.pkl; copy: the kernel's copy, with OUT read back and CRC-checked beside it;
verify: what is left of that, the layout and torch.load checks; fsync: the commit).

Memory: peak RSS (VmHWM) of `memlayout flatten IN -o OUT` on the checkpoint file, in a
subprocess, minus the peak RSS of a bare `import torch`, divided by the model's
bytes; next to the same for mmap-load-and-cat (the naive way).

Prints a ratio table and writes raw numbers to benchmarks/results/flatten.json.
The checkpoint is generated once into /.bench-data/ (gitignored).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / ".bench-data"
RESULTS = ROOT / "benchmarks" / "results"

# VmHWM is the peak RSS of this process image: unlike ru_maxrss, which a child
# inherits from the parent at fork, it starts afresh at exec.
_PEAK = """
for line in open('/proc/self/status'):
    if line.startswith('VmHWM:'):
        print('PEAK', int(line.split()[1]) * 1024)
"""
CHILD_BARE = "import torch\n" + _PEAK
CHILD_MEMLAYOUT = """
import sys
import torch
from memlayout.flatten.files import FlattenOptions, flatten_path
flatten_path(sys.argv[1], FlattenOptions(out=sys.argv[2], device="cpu"))
""" + _PEAK
CHILD_NAIVE = """
import sys
import torch
state = torch.load(sys.argv[1], mmap=True, weights_only=True)
flat = torch.cat([t.reshape(-1) for t in state.values()])
""" + _PEAK
# The naive way to flatten a file: no verification, no fsync.
NAIVE_FILE_TO_FILE = """
import sys
import torch

def naive(source, target):
    state = torch.load(source, mmap=True, weights_only=True)
    flat = torch.cat([t.reshape(-1) for t in state.values()])
    views, at = {}, 0
    for name, tensor in state.items():
        views[name] = flat[at : at + tensor.numel()].view(tensor.shape)
        at += tensor.numel()
    torch.save(views, target)

if __name__ == "__main__":
    naive(sys.argv[1], sys.argv[2])
"""


def make_checkpoint(size_mib: int, count: int) -> Path:
    """A state dict of `count` float32 tensors totalling `size_mib` MiB, sizes varied ~10x."""
    import torch

    path = DATA / f"flatten_{size_mib}mib_{count}.pt"
    if path.exists():
        return path
    DATA.mkdir(exist_ok=True)
    weights = [1 + (i * 7919) % 10 for i in range(count)]
    total = size_mib * (1 << 20) // 4
    numels = [total * w // sum(weights) for w in weights]
    numels[-1] += total - sum(numels)
    generator = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(n, generator=generator) for i, n in enumerate(numels)}
    temporary = path.with_suffix(".tmp")
    torch.save(state, temporary)
    os.replace(temporary, path)
    return path


def best_time(run: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - started)
        del result
    return best


def throughput(path: Path, repeat: int) -> dict[str, float]:
    """Seconds per method on the in-memory tensors."""
    import torch
    from torch.nn.utils import parameters_to_vector

    from memlayout.flatten.live import flatten_object
    from memlayout.flatten.populate import populate

    state = torch.load(path, weights_only=True)
    tensors = list(state.values())
    total = sum(t.numel() for t in tensors)

    def copy_each(flat: Any) -> Any:
        cursor = 0
        for tensor in tensors:
            flat[cursor : cursor + tensor.numel()].copy_(tensor.reshape(-1))
            cursor += tensor.numel()
        return flat

    def machine_limit() -> Any:
        # The fastest way known here to fill a fresh buffer, with none of flatten's
        # planning or re-pointing: faulting inside the copy (as torch.cat does) is slower.
        flat = torch.empty(total, dtype=torch.float32)
        populate(flat)
        return copy_each(flat)

    def plain_copy() -> Any:
        # The limit as first defined: one copy of each tensor into a fresh buffer,
        # every page faulted in by the copy itself. Kept as a peer for comparison.
        return copy_each(torch.empty(total, dtype=torch.float32))

    def memlayout_flatten() -> Any:
        # Fresh tensor objects over the same storages: flatten re-points the objects
        # it is given, and the originals must stay scattered for the next run.
        return flatten_object({name: t.detach() for name, t in state.items()}, device="cpu")

    methods: dict[str, Callable[[], Any]] = {
        "machine limit (populate fresh buffer, copy)": machine_limit,
        "memlayout.flatten": memlayout_flatten,
        "copy into fresh buffer (pages faulted by the copy)": plain_copy,
        "torch.cat": lambda: torch.cat([t.reshape(-1) for t in tensors]),
        "torch._utils._flatten_dense_tensors": lambda: torch._utils._flatten_dense_tensors(tensors),
        "parameters_to_vector": lambda: parameters_to_vector(tensors),
    }
    try:
        from tensordict import TensorDict

        source = TensorDict(dict(state), batch_size=[])
        methods["tensordict consolidate()"] = lambda: source.consolidate()
    except ImportError:
        print("tensordict not installed: its consolidate() is left out", file=sys.stderr)
    # Round-robin rounds, best per method: a burst of load from elsewhere on the
    # machine then costs every method a round instead of one method all its runs.
    best = dict.fromkeys(methods, float("inf"))
    for _ in range(repeat):
        for name, run in methods.items():
            best[name] = min(best[name], best_time(run, 1))
    return best


def _run(command: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
    return time.perf_counter() - started


def end_to_end(path: Path, repeat: int) -> dict[str, float]:
    """Best wall seconds of each file-to-file contender, fresh processes, round-robin rounds."""
    cli = Path(sys.executable).parent / "memlayout"
    memlayout = [str(cli)] if cli.exists() else [sys.executable, "-m", "memlayout"]
    outs = {name: DATA / f"e2e_{name}.pt" for name in ("memlayout", "naive", "cp")}
    commands = {
        "memlayout flatten (CLI, verified, fsynced)": [*memlayout, "flatten", str(path), "-o", str(outs["memlayout"]),
                                                       "--device", "cpu"],
        "naive: torch.load(mmap) + cat + torch.save": [sys.executable, "-c", NAIVE_FILE_TO_FILE, str(path),
                                                       str(outs["naive"])],
        "cp": ["cp", str(path), str(outs["cp"])],
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    }
    best = dict.fromkeys(commands, float("inf"))
    try:
        for _ in range(repeat):
            for name, command in commands.items():
                for out in outs.values():
                    out.unlink(missing_ok=True)
                best[name] = min(best[name], _run(command))
    finally:
        for out in outs.values():
            out.unlink(missing_ok=True)
    return best


def in_process(path: Path, repeat: int) -> tuple[dict[str, float], dict[str, float]]:
    """Best seconds of flatten_path and of the naive steps in this process, and memlayout's stages."""
    from memlayout.flatten.files import FlattenOptions, flatten_path

    namespace: dict[str, Any] = {}
    exec(NAIVE_FILE_TO_FILE, namespace)
    out = DATA / "inproc_out.pt"
    best = {"memlayout flatten_path (verified, fsynced)": float("inf"), "naive steps": float("inf")}
    stages: dict[str, float] = {}
    try:
        for _ in range(repeat):
            out.unlink(missing_ok=True)
            started = time.perf_counter()
            result = flatten_path(str(path), FlattenOptions(out=str(out), device="cpu"))
            took = time.perf_counter() - started
            if took < best["memlayout flatten_path (verified, fsynced)"]:
                best["memlayout flatten_path (verified, fsynced)"] = took
                stages = dict(result.stages)
            out.unlink(missing_ok=True)
            started = time.perf_counter()
            namespace["naive"](str(path), str(out))
            best["naive steps"] = min(best["naive steps"], time.perf_counter() - started)
    finally:
        out.unlink(missing_ok=True)
    return best, stages


def peak_rss(code: str, *args: str) -> int:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=True)
    return int(next(line.split()[1] for line in result.stdout.splitlines() if line.startswith("PEAK")))


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the shared harness, benchmarks/harness
    from harness import QUICK_ENV, Row, print_table, write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=None, help="checkpoint size (1024; 64 with --quick)")
    parser.add_argument("--tensors", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=None, help="rounds (5; 2 with --quick)")
    parser.add_argument("--quick", action="store_true", help=f"small and fast (or {QUICK_ENV}=1)")
    args = parser.parse_args(argv)
    quick = args.quick or os.environ.get(QUICK_ENV, "") not in ("", "0")
    size_mib = args.size_mib or (64 if quick else 1024)
    repeat = args.repeat or (2 if quick else 5)

    path = make_checkpoint(size_mib, args.tensors)
    model_bytes = size_mib << 20
    seconds = throughput(path, repeat)
    limit_name, ours_name = "machine limit (populate fresh buffer, copy)", "memlayout.flatten"
    limit, ours = seconds[limit_name], seconds[ours_name]

    out = DATA / "flatten_out.pt"
    bare = peak_rss(CHILD_BARE)
    with_memlayout = peak_rss(CHILD_MEMLAYOUT, str(path), str(out))
    naive = peak_rss(CHILD_NAIVE, str(path))
    out.unlink(missing_ok=True)
    files = end_to_end(path, max(2, repeat - 2))
    library, stages = in_process(path, max(2, repeat - 2))

    def rate(value: float) -> str:
        return f"{model_bytes / value / 1e9:.2f} GB/s"

    rows = []
    cli_name, naive_name = "memlayout flatten (CLI, verified, fsynced)", "naive: torch.load(mmap) + cat + torch.save"
    cli, peer = files[cli_name], files[naive_name]
    copy, bare_import = files["cp"], files["python -c 'import torch'"]
    rows.append(Row("flatten IN -o OUT, end to end", f"{cli:.2f} s", f"naive peer {peer:.2f} s", cli / peer,
                    "<= 0.5x", cli / peer <= 0.5))
    stretch = 2 * copy + bare_import
    rows.append(Row("same", f"{cli:.2f} s", f"2 x cp {copy:.2f} s + import torch {bare_import:.2f} s = {stretch:.2f} s",
                    cli / stretch, "<= 1x (stretch)", cli / stretch <= 1.0))
    ours_lib, naive_lib = library["memlayout flatten_path (verified, fsynced)"], library["naive steps"]
    rows.append(Row("flatten_path in process (torch imported)", f"{ours_lib:.2f} s", f"naive steps {naive_lib:.2f} s",
                    ours_lib / naive_lib, "(info)", True))
    rows.append(Row("same", f"{ours_lib:.2f} s", f"cp {copy:.2f} s", ours_lib / copy, "(info)", True))
    rows.append(Row("flatten throughput", rate(ours), f"machine limit {rate(limit)}", limit / ours, ">= 0.8x",
                    limit / ours >= 0.8))
    for name, value in seconds.items():
        if name not in (limit_name, ours_name):
            rows.append(Row(f"flatten vs {name}", rate(ours), f"{name} {rate(value)}", value / ours, ">= 1x",
                            value / ours >= 1.0))
    ours_rss, naive_rss = (with_memlayout - bare) / model_bytes, (naive - bare) / model_bytes
    rows.append(Row("peak RSS flattening from disk", f"{(with_memlayout - bare) >> 20} MiB above import torch",
                    f"model {size_mib} MiB", ours_rss, "<= 1.3x", ours_rss <= 1.3))
    rows.append(Row("peak RSS of torch.load(mmap) + torch.cat", f"{(naive - bare) >> 20} MiB above import torch",
                    f"model {size_mib} MiB", naive_rss, "(peer)", True))
    print_table(f"flatten: {args.tensors} float32 tensors, {size_mib} MiB, best of {repeat} interleaved rounds", rows)
    total = sum(stages.values())
    stage_rows = [Row(f"stage: {name}", f"{value * 1e3:.0f} ms", f"of flatten_path {total * 1e3:.0f} ms",
                      value / total if total else 0.0, "(info)", True) for name, value in stages.items()]
    print_table("flatten_path stages, its best run in process (copy includes reading OUT back beside it)", stage_rows)
    rows += stage_rows
    raw = {
        "size_mib": size_mib,
        "tensors": args.tensors,
        "repeat": repeat,
        "model_bytes": model_bytes,
        "seconds": seconds,
        "file_to_file_seconds": files,
        "in_process_seconds": library,
        "stages_seconds": stages,
        "peak_rss_bytes": {"bare_import_torch": bare, "memlayout_flatten_file": with_memlayout, "mmap_load_cat": naive},
    }
    write_results("flatten", rows, raw, quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
