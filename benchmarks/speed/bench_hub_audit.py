"""A hub's worth of audits: `memlayout inspect` of 1,000 Hub repositories in one command, against huggingface_hub.

Usage: python benchmarks/speed/bench_hub_audit.py [--quick] [--repos N]

The Hub is `benchmarks/harness/fake_hub.py` on 127.0.0.1: the tree, info and resolve
endpoints, HEAD, LFS files redirected (302) to a second host as the Hub's CDN,
TCP_NODELAY, and a latency added to every request: 0 ms, and 50 ms as from a
cloud machine to the real Hub. Its 1,000 repositories are small transformers
models of three kinds in turn, as transformers writes them: one-file safetensors
(GPT-2), 3-5 safetensors shards with an index (Llama), and a `pytorch_model.bin`
(BERT), each with its config.json; each kind in two sizes.

For each latency, in the same run:
- memlayout: `memlayout inspect --format jsonl --paths-from LIST -o OUT` (its
  default `--jobs 16`), a process of its own started under `ulimit -n 256`;
- the peer: huggingface_hub's `get_safetensors_metadata` over the same
  repositories from 16 threads (a `.bin` repository is its NotASafetensorsRepoError).
Figures: wall and CPU time, peak RSS and the most descriptors open at once (read
from /proc every 20 ms), requests and body bytes as the Hub counted them. The
goals: memlayout's wall time at most 2x the peer's at 50 ms, peak RSS under 300
MiB, fewer than 200 descriptors, bytes at most 1.2x what the configs, indexes,
safetensors headers and zip directories (end records, central directory, local
headers, data.pkl) hold, and every repository reported, its report the same as
the local copy's. The time for 10,000 repositories at 50 ms is extrapolated from
the run's throughput once started.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import Row, compile_bytecode, quick_requested, write_results  # noqa: E402
from benchmarks.harness.fake_hub import running_fake_hub  # noqa: E402

DATA = ROOT / ".bench-data" / "hub-audit"
KINDS = ("onefile", "sharded", "bin")
SIZES = (("small", 2), ("large", 4))
"""Each kind in two sizes: (name, layers)."""
FD_LIMIT = 256
LATENCIES_S = (0.0, 0.05)
THREADS = 16
SKIPPED_REMOTELY = ("ML102",)
"""Rules a remote read skips without --deep (they read tensor bytes); the local reports leave them out too."""

PEER = """
import sys, time
from concurrent.futures import ThreadPoolExecutor
from huggingface_hub import get_safetensors_metadata
from huggingface_hub.utils import disable_progress_bars

disable_progress_bars()
def one(repo):
    try:
        return len(get_safetensors_metadata(repo).files_metadata)
    except Exception as error:
        return type(error).__name__
with ThreadPoolExecutor(int(sys.argv[1])) as pool:
    answers = list(pool.map(one, sys.argv[2:]))
print(sum(isinstance(a, int) for a in answers), sorted({a for a in answers if isinstance(a, str)}))
"""


def make_templates() -> dict[str, Path]:
    """The six model folders, written once into .bench-data/hub-audit by transformers."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    folders = {}
    for kind in KINDS:
        for size, layers in SIZES:
            folder = DATA / f"{kind}-{size}"
            folders[f"{kind}-{size}"] = folder
            if (folder / "config.json").exists():
                continue
            torch.manual_seed(layers)
            if kind == "onefile":
                config = transformers.GPT2Config(n_layer=layers, n_embd=64, n_head=2, vocab_size=512, n_positions=64)
                transformers.GPT2LMHeadModel(config).save_pretrained(folder)
            elif kind == "sharded":
                config = transformers.LlamaConfig(
                    num_hidden_layers=layers, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                    num_key_value_heads=2, vocab_size=512, tie_word_embeddings=False,
                )
                transformers.LlamaForCausalLM(config).save_pretrained(folder, max_shard_size="200KB")
            else:
                config = transformers.BertConfig(
                    num_hidden_layers=layers, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                    vocab_size=512,
                )
                folder.mkdir(parents=True, exist_ok=True)
                torch.save(transformers.BertModel(config).state_dict(), folder / "pytorch_model.bin")
                config.save_pretrained(folder)
            (folder / "generation_config.json").unlink(missing_ok=True)
    return folders


def needed_bytes(folder: Path) -> int:
    """What an inspection must read of a folder: config, index, safetensors headers, zip directories and pickles.

    A zip's directory is its end records (22 + 20 + 56 bytes as torch writes them),
    its central directory, and each record's local header, which is 30 bytes and
    the record's name and extra field (APPNOTE.TXT 4.3.7; torch's extra field is
    its alignment padding), for data.pkl and every storage record.
    """
    needed = 0
    for path in folder.iterdir():
        if path.suffix == ".json":
            needed += path.stat().st_size
        elif path.suffix == ".safetensors":
            needed += 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]
        elif path.suffix == ".bin":
            raw = path.read_bytes()
            with zipfile.ZipFile(path) as archive:
                entries = archive.infolist()
            directory = sum(46 + len(e.filename.encode()) + len(e.extra) + len(e.comment) for e in entries)
            needed += 22 + 20 + 56 + directory
            for entry in entries:
                if "/data/" in entry.filename or entry.filename.endswith("/data.pkl"):
                    name_length, extra_length = struct.unpack_from("<HH", raw, entry.header_offset + 26)
                    needed += 30 + name_length + extra_length
                if entry.filename.endswith("/data.pkl"):
                    needed += entry.compress_size
    return needed


def local_reports(folders: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Each template's report from disk, as the remote one should read, less where the file was read from."""
    from memlayout.pipeline.batch import inspect_paths
    from memlayout.report.json_report import report_dict

    batch = inspect_paths([str(f) for f in folders.values()], ignore=SKIPPED_REMOTELY)
    return {name: comparable(report_dict(p.report)) for name, p in zip(folders, batch.paths, strict=True)
            if p.report is not None}


def comparable(report: dict[str, Any]) -> dict[str, Any]:
    out = {key: value for key, value in report.items() if key not in ("source", "skipped_rules")}
    out["format"] = report["source"]["format"]
    return out


def watched(command: list[str], env: dict[str, str], tmp: Path) -> dict[str, Any]:
    """A child's wall and CPU time, peak RSS and most descriptors open at once, run under `ulimit -n FD_LIMIT`.

    RSS is the kernel's high-water mark of the child's own memory (VmHWM), read with
    its descriptors every 20 ms: `ru_maxrss` would start from this process's, which
    imported torch to write the models.
    """
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))

    out_path, err_path = tmp / "child.out", tmp / "child.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        started = time.perf_counter()
        process = subprocess.Popen(command, env=env, stdout=out, stderr=err, preexec_fn=limit)
        peak_fds = peak_rss_kib = 0
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            try:
                peak_fds = max(peak_fds, len(os.listdir(f"/proc/{process.pid}/fd")))
                for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak_rss_kib = max(peak_rss_kib, int(line.split()[1]))
            except (OSError, ValueError):
                pass
            time.sleep(0.02)
        seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    return {
        "seconds": seconds,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "max_rss_mib": peak_rss_kib / 1024,
        "peak_fds": peak_fds,
        "exit": process.returncode,
        "stdout": out_path.read_text()[-2000:],
        "stderr": err_path.read_text()[-2000:],
    }


def audit(count: int, latency: float, folders: dict[str, Path], local: dict[str, dict[str, Any]],
          tmp: Path) -> dict[str, Any]:
    names = list(folders)
    repos = {f"audit-org/model-{i:05d}": folders[names[i % len(names)]] for i in range(count)}
    template_of = {repo: names[i % len(names)] for i, repo in enumerate(repos)}
    listing = tmp / "repos.txt"
    listing.write_text("".join(f"hf://{repo}\n" for repo in repos))
    output = tmp / f"audit-{latency}.jsonl"
    result: dict[str, Any] = {"repos": count, "latency_ms": latency * 1000}
    with running_fake_hub(repos, latency_s=latency) as hub:
        env = {**os.environ, **hub.environment(), "HF_HOME": str(tmp / "hf-home"), "PYTHONPATH": str(ROOT)}
        hub.stats.reset()
        peer = watched([sys.executable, "-c", PEER, str(THREADS), *repos], env, tmp)
        result["peer"] = {**peer, "requests": hub.stats.total, "bytes": hub.stats.body_bytes,
                          "by_kind": dict(hub.stats.requests)}
        hub.stats.reset()
        ours = watched([sys.executable, "-m", "memlayout", "inspect", "--format", "jsonl", "--fail-on", "never",
                        "--paths-from", str(listing), "-o", str(output)], env, tmp)
        result["memlayout"] = {**ours, "requests": hub.stats.total, "bytes": hub.stats.body_bytes,
                               "by_kind": dict(hub.stats.requests)}
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    wrong = [
        line["path"] for line in lines
        if line["report"] is None or comparable(line["report"]) != local[template_of[line["path"][len("hf://"):]]]
    ]
    result["reported"] = len(lines)
    result["wrong"] = wrong[:10]
    result["wrong_count"] = len(wrong)
    result["needed_bytes"] = sum(needed_bytes(folders[template_of[repo]]) for repo in repos)
    return result


def main(argv: list[str]) -> int:
    quick = quick_requested(argv)
    count = int(argv[argv.index("--repos") + 1]) if "--repos" in argv else (100 if quick else 1000)
    compile_bytecode()
    folders = make_templates()
    local = local_reports(folders)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="memlayout-bench-hub-") as tmp:
        for latency in LATENCIES_S:
            runs[latency] = audit(count, latency, folders, local, Path(tmp))
            ours, peer = runs[latency]["memlayout"], runs[latency]["peer"]
            print(f"{count} repos at {latency * 1000:.0f} ms: memlayout {ours['seconds']:.1f} s "
                  f"(exit {ours['exit']}), peer {peer['seconds']:.1f} s ({peer['stdout'].strip()})", flush=True)
    slow, fast = runs[0.05], runs[0.0]
    ours, peer = slow["memlayout"], slow["peer"]
    # Throughput once running: the start (imports, the first requests) is paid once whatever the count.
    start_s = 1.0
    per_repo = max(ours["seconds"] - start_s, 0.0) / count
    ten_thousand = start_s + per_repo * 10_000
    byte_ratio = ours["bytes"] / slow["needed_bytes"]
    rows = [
        Row(f"wall, {count} repos at 50 ms", f"{ours['seconds']:.1f} s",
            f"peer, {THREADS} threads {peer['seconds']:.1f} s",
            ours["seconds"] / peer["seconds"], "<= 2x", ours["seconds"] <= 2 * peer["seconds"]),
        Row(f"wall, {count} repos at 0 ms", f"{fast['memlayout']['seconds']:.1f} s",
            f"peer {fast['peer']['seconds']:.1f} s", fast["memlayout"]["seconds"] / fast["peer"]["seconds"],
            "(information)", True),
        Row("CPU, at 50 ms", f"{ours['cpu_seconds']:.1f} s", f"peer {peer['cpu_seconds']:.1f} s",
            ours["cpu_seconds"] / peer["cpu_seconds"], "(information)", True),
        Row("peak RSS", f"{max(ours['max_rss_mib'], fast['memlayout']['max_rss_mib']):.0f} MiB", "limit 300 MiB",
            max(ours["max_rss_mib"], fast["memlayout"]["max_rss_mib"]) / 300, "< 1x",
            max(ours["max_rss_mib"], fast["memlayout"]["max_rss_mib"]) < 300),
        Row(f"descriptors open at once (ulimit -n {FD_LIMIT})",
            f"{max(ours['peak_fds'], fast['memlayout']['peak_fds'])}", f"peer {peer['peak_fds']}; limit 200",
            max(ours["peak_fds"], fast["memlayout"]["peak_fds"]) / 200, "< 1x",
            max(ours["peak_fds"], fast["memlayout"]["peak_fds"]) < 200),
        Row("body bytes fetched", f"{ours['bytes']:,} B",
            f"needed {slow['needed_bytes']:,} B; peer {peer['bytes']:,} B",
            byte_ratio, "<= 1.2x", byte_ratio <= 1.2),
        Row("requests", f"{ours['requests']:,}", f"peer {peer['requests']:,}", ours["requests"] / peer["requests"],
            "(information)", True),
        Row("repos reported, same as the local copy", f"{slow['reported'] - slow['wrong_count']} of {count}",
            f"{count} repos", (slow["reported"] - slow["wrong_count"]) / count, ">= 1x",
            slow["reported"] == count and slow["wrong_count"] == 0 and fast["wrong_count"] == 0),
        Row("10,000 repos at 50 ms, extrapolated", f"{ten_thousand / 60:.1f} min",
            f"{per_repo * 1000:.1f} ms a repo after a {start_s:.0f} s start", ten_thousand / (10 * ours["seconds"]),
            "(information)", True),
    ]
    from benchmarks.harness import print_table

    print_table(f"memlayout inspect of {count} Hub repositories in one command, against get_safetensors_metadata", rows)
    for run in runs.values():
        for side in ("memlayout", "peer"):
            run[side].pop("stdout" if side == "memlayout" else "stderr", None)
    write_results("hub_audit", rows, {"runs": {f"{k * 1000:.0f}ms": v for k, v in runs.items()}}, quick)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
