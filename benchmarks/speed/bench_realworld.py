"""memlayout on the real-world corpus against the loader each file's users call.

Usage: python benchmarks/speed/bench_realworld.py [--quick]

For every corpus file (tests/realworld/corpus.py, downloaded on first use) and
every file generated in the run (transformers, DCP, torch.export), times in the
same process, best of N in interleaved rounds:
- `memlayout.inspect(path)`: load, facts and every rule, without torch;
- the peer: the loader users call (`torch.load(weights_only=True)`, with mmap for
  zip files; `torch.jit.load`; `safetensors.safe_open`; `torch.export.load`;
  DCP's metadata reader), which reads less (no rules) but builds real tensors;
- `memlayout flatten` into a scratch file, against the peer plus its writer
  (`torch.save`, `torch.jit.save`, ...), where flatten rewrites the format.
Prints one ratio table and writes benchmarks/results/realworld.json. Skips with
one line when the package registry is unreachable.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import Row, ms, print_table, quick_requested, round_robin, write_results  # noqa: E402


def _peer_load(path: Path, fmt: str) -> Callable[[], Any]:
    import torch

    from tests.realworld.oracle import _STAND_INS

    if fmt in ("torch-zip", "torch-legacy"):
        mmap = fmt == "torch-zip"

        def load() -> Any:
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
            except Exception:  # a module pickle: torch's unpickler with the project's classes stood in
                return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap, pickle_module=_STAND_INS)

        return load
    if fmt == "torchscript":
        return lambda: torch.jit.load(str(path), map_location="cpu")
    if fmt in ("safetensors", "hf-safetensors"):
        from safetensors.torch import load_file

        files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
        return lambda: [load_file(f) for f in files]
    if fmt == "hf-pytorch":
        files = sorted(path.glob("*.bin"))
        return lambda: [torch.load(f, map_location="cpu", weights_only=True, mmap=True) for f in files]
    if fmt == "torch-export":
        return lambda: torch.export.load(path)
    if fmt == "dcp":
        from torch.distributed.checkpoint import FileSystemReader

        return lambda: FileSystemReader(str(path)).read_metadata()
    raise ValueError(fmt)


def _peer_rewrite(path: Path, fmt: str, out: Path) -> Callable[[], Any] | None:
    """Load and save again with the format's own writer: the least a rewrite costs."""
    import torch

    load = _peer_load(path, fmt)
    if fmt in ("torch-zip", "torch-legacy"):
        return lambda: torch.save(load(), out)
    if fmt == "torchscript":
        return lambda: torch.jit.save(load(), str(out))
    if fmt == "safetensors":
        from safetensors.torch import save_file

        return lambda: save_file(load()[0], out)
    if fmt == "torch-export":
        return lambda: torch.export.save(load(), out)
    return None


def main(argv: list[str]) -> int:
    quick = quick_requested(argv)
    repeat = 3 if quick else 7
    import memlayout
    from memlayout.flatten.files import FlattenOptions, flatten_path
    from tests.realworld.corpus import CORPUS, RegistryUnreachable, fetch
    from tests.realworld.expected import EXPECTED, GENERATED_EXPECTED
    from tests.realworld.generated import GENERATED

    scratch = Path(tempfile.mkdtemp(prefix="memlayout-realworld-"))
    rows: list[Row] = []
    raw: dict[str, Any] = {}
    try:
        files: dict[str, Path] = {}
        try:
            for entry in CORPUS:
                files[entry.name] = fetch(entry)
        except RegistryUnreachable as exc:
            print(f"bench_realworld: skipped, package registry unreachable: {exc}")
            return 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name, build in GENERATED.items():
                files[name] = build(scratch)
        expected = {**EXPECTED, **GENERATED_EXPECTED}
        for name, path in files.items():
            fmt = expected[name].format
            flatten = expected[name].flatten
            out = scratch / ("flat-" + name + ("" if path.is_dir() else path.suffix))
            peer_out = scratch / ("peer-" + name + ("" if path.is_dir() else path.suffix))

            def ours_flatten(path: Path = path, out: Path = out, trust: bool = flatten.trust) -> None:
                if out.is_dir():
                    shutil.rmtree(out)
                flatten_path(str(path), FlattenOptions(out=str(out), device="cpu", trust=trust, force=True))

            functions: dict[str, Callable[[], object]] = {
                "inspect": lambda path=path: memlayout.inspect(str(path)),
                "peer_load": _peer_load(path, fmt),
            }
            rewrite = _peer_rewrite(path, fmt, peer_out)
            if flatten.outcome != "refused" and flatten.code is None and rewrite is not None:
                functions["flatten"] = ours_flatten
                functions["peer_rewrite"] = rewrite
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                best = round_robin(functions, repeat)
            raw[name] = {"format": fmt, **best}
            rows.append(Row(f"inspect {name}", ms(best["inspect"]), f"load {ms(best['peer_load'])}",
                            best["inspect"] / best["peer_load"], "(record)", True))
            if "flatten" in best:
                rows.append(Row(f"flatten {name}", ms(best["flatten"]), f"load+save {ms(best['peer_rewrite'])}",
                                best["flatten"] / best["peer_rewrite"], "(record)", True))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_table("memlayout on the real-world corpus vs the loader and writer each format's users call", rows)
    print(f"results: {write_results('realworld', rows, raw, quick)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
