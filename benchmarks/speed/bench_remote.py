"""Inspect of a 100-shard safetensors model over HTTP: bytes fetched and time, against its headers and the disk.

Usage: python benchmarks/speed/bench_remote.py [--quick]

A model directory as transformers writes one: config.json, an index, and 100
safetensors shards of 40 tensors each (a transformer's projections, norms and
biases; data zeros, so the files are sparse). Debian's nginx serves it on
127.0.0.1 (tests/remote/nginx.py, the tests' own config). Figures:
- bytes: what nginx's access log says it sent for `memlayout inspect URL-of-index`,
  against the bytes the inspection needs: the index and every shard's 8-byte
  length and header (config.json, fetched too, counts on our side). Goal <= 1.1x.
- time: `memlayout inspect URL` against `memlayout inspect DIRECTORY` of the
  same files from disk, each a whole process as a user runs it, best of N in
  round-robin rounds, both with the same rules (ML102, skipped remotely, is
  ignored on both sides). Goal <= 2x.
Requests are logged too: 1 per shard (as many first bytes as its tensor names in
the index make a header of, a little over), all shards in flight at once.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import Row, ms, print_table, quick_requested, round_robin, write_results  # noqa: E402
from tests.remote.nginx import NginxMissing, running_nginx  # noqa: E402

SHARDS = 100
LAYER = (  # (suffix, shape) of one transformer layer's tensors, bf16
    ("self_attn.q_proj.weight", (1024, 1024)), ("self_attn.k_proj.weight", (256, 1024)),
    ("self_attn.v_proj.weight", (256, 1024)), ("self_attn.o_proj.weight", (1024, 1024)),
    ("mlp.gate_proj.weight", (2816, 1024)), ("mlp.up_proj.weight", (2816, 1024)),
    ("mlp.down_proj.weight", (1024, 2816)), ("input_layernorm.weight", (1024,)),
    ("post_attention_layernorm.weight", (1024,)), ("self_attn.q_proj.bias", (1024,)),
)
LAYERS_PER_SHARD = 4
# Both sides run the same rules: the ones a remote read skips (ML102 reads tensor
# bytes, which it does not fetch without --deep) are left out on disk too, or the
# disk side would time a content scan of 9 GB the HTTP side never does.
SAME_RULES = ("--ignore", "ML102")


def write_model(folder: Path, shards: int) -> int:
    """The directory; returns the bytes the inspection needs (index plus every shard's length and header)."""
    folder.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    needed = 0
    for shard in range(shards):
        name = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        cursor = 0
        for layer in range(shard * LAYERS_PER_SHARD, (shard + 1) * LAYERS_PER_SHARD):
            for suffix, shape in LAYER:
                count = 1
                for dim in shape:
                    count *= dim
                tensor = f"model.layers.{layer}.{suffix}"
                header[tensor] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [cursor, cursor + 2 * count]}
                weight_map[tensor] = name
                cursor += 2 * count
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with open(folder / name, "wb") as out:
            out.write(struct.pack("<Q", len(raw)) + raw)
            out.truncate(8 + len(raw) + cursor)
        needed += 8 + len(raw)
    index = json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}).encode()
    (folder / "model.safetensors.index.json").write_bytes(index)
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False}
    (folder / "config.json").write_text(json.dumps(config))
    return needed + len(index)


def inspect(target: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "memlayout", "inspect", "--format", "json", "--fail-on", "never", *SAME_RULES, target],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"inspect {target} failed: {done.stderr.strip()}")


def main(argv: list[str]) -> int:
    quick = quick_requested(argv)
    repeat = 3 if quick else 7
    with tempfile.TemporaryDirectory(prefix="memlayout-bench-remote-") as tmp:
        try:
            server_context = running_nginx(Path(tmp))
            server = server_context.__enter__()
        except NginxMissing as exc:
            print(f"skipped: {exc}")
            return 0
        try:
            folder = server.root / "files" / "model"
            needed = write_model(folder, SHARDS)
            disk_bytes = sum(p.stat().st_size for p in folder.iterdir())
            url = f"{server.url}/files/model/model.safetensors.index.json"
            mark = server.log_mark()
            inspect(url)
            logged = server.requests_since(mark)
            fetched = sum(r.body_bytes for r in logged)
            times = round_robin({"disk": lambda: inspect(str(folder)), "http": lambda: inspect(url)}, repeat)
        finally:
            server_context.__exit__(None, None, None)
    byte_ratio = fetched / needed
    time_ratio = times["http"] / times["disk"]
    rows = [
        Row("bytes fetched over HTTP (nginx's log)", f"{fetched:,} B in {len(logged)} requests",
            f"index + headers {needed:,} B", byte_ratio, "<= 1.1x", byte_ratio <= 1.1),
        Row("inspect over HTTP, whole process", ms(times["http"]), f"from disk {ms(times['disk'])}",
            time_ratio, "<= 2x", time_ratio <= 2.0),
    ]
    print_table(f"inspect of a {SHARDS}-shard safetensors model over localhost HTTP (nginx)", rows)
    raw = {
        "shards": SHARDS, "needed_bytes": needed, "fetched_bytes": fetched, "requests": len(logged),
        "model_bytes_on_disk": disk_bytes, "seconds": times, "repeat": repeat,
    }
    write_results("remote", rows, raw, quick)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
