"""Small transformers model folders of the three kinds a Hub audit meets, and a child process watched while it reads
them.

- one-file: GPT-2 as `save_pretrained` writes it (model.safetensors, config.json, tied);
- sharded: Llama in 3 or more safetensors shards with their index;
- bin: BERT's state dict in `pytorch_model.bin`, as older transformers wrote it.
The fake Hub (benchmarks/harness/fake_hub.py) serves them as many repositories as a test
names, each its own copy's report when read from disk.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from tests.remote.reports import REPO

KINDS = ("onefile", "sharded", "bin")


def write_model_folders(root: Path) -> dict[str, Path]:
    """The three folders under `root`, by kind."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    folders = {kind: root / kind for kind in KINDS}
    gpt2 = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=32)
    transformers.GPT2LMHeadModel(gpt2).save_pretrained(folders["onefile"])
    llama = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=128, tie_word_embeddings=False,
    )
    transformers.LlamaForCausalLM(llama).save_pretrained(folders["sharded"], max_shard_size="20KB")
    bert = transformers.BertConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                   vocab_size=128)
    folders["bin"].mkdir(parents=True)
    torch.save(transformers.BertModel(bert).state_dict(), folders["bin"] / "pytorch_model.bin")
    bert.save_pretrained(folders["bin"])
    for folder in folders.values():
        (folder / "generation_config.json").unlink(missing_ok=True)
    assert len(list(folders["sharded"].glob("*.safetensors"))) >= 3
    return folders


def repositories(folders: dict[str, Path], count: int, prefix: str = "audit/model") -> dict[str, Path]:
    """`count` repository ids, the kinds in turn."""
    kinds = list(folders)
    return {f"{prefix}-{i:04d}": folders[kinds[i % len(kinds)]] for i in range(count)}


def comparable(report: dict[str, Any]) -> dict[str, Any]:
    """A report less where it was read from (path, notes) and the rules a remote read skips."""
    out = {key: value for key, value in report.items() if key not in ("source", "skipped_rules")}
    out["format"] = report["source"]["format"]
    return out


def local_reports(folders: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Each folder's report from disk, without ML102 (tensor bytes, which a remote read does not fetch)."""
    from memlayout.pipeline.batch import inspect_paths
    from memlayout.report.json_report import report_dict

    batch = inspect_paths([str(folder) for folder in folders.values()], ignore=["ML102"])
    reports = {}
    for kind, path in zip(folders, batch.paths, strict=True):
        assert path.report is not None, path.error
        reports[kind] = comparable(json.loads(json.dumps(report_dict(path.report))))
    return reports


class Watched(NamedTuple):
    """A finished child: its status, output, wall time, and the most descriptors and memory it held."""

    code: int
    stdout: str
    stderr: str
    seconds: float
    peak_fds: int
    peak_rss_mib: float


def watched(args: Iterable[str], env: dict[str, str], fd_limit: int | None = None, stdin: str | None = None,
            timeout: float = 240) -> Watched:
    """`python -m memlayout ARGS`, its descriptors and memory high-water mark (VmHWM) read every 20 ms.

    With `fd_limit`, the child runs under that `ulimit -n` (soft and hard), as a
    shell's `ulimit -n` would start it.
    """
    def limit() -> None:
        if fd_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "memlayout", *args], env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, preexec_fn=limit,
    )
    peak_fds = peak_rss = 0
    if stdin is not None:
        assert process.stdin is not None
        process.stdin.write(stdin)
        process.stdin.close()
    import threading

    outputs: dict[str, str] = {}

    def drain(name: str, stream: Any) -> None:
        outputs[name] = stream.read()

    readers = [threading.Thread(target=drain, args=(n, s))
               for n, s in (("out", process.stdout), ("err", process.stderr))]
    for reader in readers:
        reader.start()
    while process.poll() is None:
        if time.monotonic() - started > timeout:
            process.kill()
            break
        try:
            peak_fds = max(peak_fds, len(os.listdir(f"/proc/{process.pid}/fd")))
            for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak_rss = max(peak_rss, int(line.split()[1]))
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    for reader in readers:
        reader.join()
    return Watched(process.wait(), outputs["out"], outputs["err"], time.monotonic() - started, peak_fds,
                   peak_rss / 1024)
