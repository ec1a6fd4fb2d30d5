"""CUDA figures for `memlayout flatten`, all in one call; skips with a message without CUDA.

Usage: python benchmarks/gpu/bench_flatten_gpu.py [--size-mib 1024] [--tensors 400] [--repeat 3]

- Host-to-device: one pinned flat buffer copied at once, against per-tensor copies
  of pageable tensors, against a plain pinned copy of the same bytes (the limit).
- Streaming a checkpoint file to CUDA: peak `torch.cuda.max_memory_allocated`
  over the flat bytes (goal: at most 1.02x).
- A 2-layer bidirectional LSTM's forward+backward after `flatten_parameters()`
  (the peer), after `memlayout.flatten(device="cuda")` (which hands the RNN to
  cuDNN), with its weights packed by `memlayout.core.cudnn_layout` alone, and with
  every weight in its own storage (what ML401 flags), and whether cuDNN warned
  that it copies the weights.

Prints a ratio table and writes raw numbers to benchmarks/results/gpu/flatten_gpu.json (beside the
other GPU records, which docs/gpu.md quotes; the harness results one folder up are rendered whole).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results" / "gpu"


def cuda_time(run: Any, repeat: int) -> float:
    import torch

    best = float("inf")
    for _ in range(repeat):
        torch.cuda.synchronize()
        started = time.perf_counter()
        run()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--tensors", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("bench_flatten_gpu: no CUDA device here; skipped (run it on a GPU machine)")
        return 0

    from benchmarks.speed.bench_flatten import make_checkpoint
    from memlayout.flatten.files import FlattenOptions, flatten_path
    from memlayout.flatten.live import flatten_object
    from tests.cudnn.record_cudnn_layouts import pack_by_layout_module

    path = make_checkpoint(args.size_mib, args.tensors)
    state = torch.load(path, weights_only=True)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())

    pinned_plain = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    limit = cuda_time(lambda: pinned_plain.to("cuda", non_blocking=True), args.repeat)
    per_tensor = cuda_time(lambda: [t.to("cuda") for t in state.values()], args.repeat)
    flat_state = {k: v.detach() for k, v in state.items()}
    handle = flatten_object(flat_state, pin_memory=True)
    flat = cuda_time(lambda: [g.data.to("cuda", non_blocking=True) for g in handle.groups], args.repeat)

    out = path.with_name("flatten_gpu_out.pt")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    started = time.perf_counter()
    result = flatten_path(str(path), FlattenOptions(out=str(out), device="cuda"))
    stream_seconds = time.perf_counter() - started
    peak_ratio = (torch.cuda.max_memory_allocated() - base) / result.bytes_after
    out.unlink(missing_ok=True)

    lstm_times = {}
    warned = {}
    tokens = torch.randn(64, 32, 512, device="cuda")
    variants = (
        "flatten_parameters()", "memlayout.flatten", "memlayout.core.cudnn_layout, no hand-over", "separate storages",
    )
    for how in variants:
        torch.manual_seed(0)
        # Two bidirectional layers: the case where parameter-name order and cuDNN's differ.
        lstm = torch.nn.LSTM(512, 512, num_layers=2, bidirectional=True)
        if how == "memlayout.flatten":
            flatten_object(lstm, device="cuda")
        elif how == "memlayout.core.cudnn_layout, no hand-over":
            lstm = lstm.cuda()
            pack_by_layout_module(lstm)
        else:
            lstm = lstm.cuda()
            lstm.flatten_parameters()
            if how == "separate storages":
                # What ML401 flags: every weight its own storage, so cuDNN copies them each call.
                with torch.no_grad():
                    for weight in lstm._flat_weights:
                        weight.data = weight.data.clone()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lstm_times[how] = cuda_time(lambda m=lstm: m(tokens)[0].sum().backward(), args.repeat * 3)
        warned[how] = any("contiguous chunk" in str(w.message) for w in caught)

    rows = [
        ("H2D plain pinned copy (limit)", limit, 1.0),
        ("H2D per-tensor pageable", per_tensor, limit / per_tensor),
        ("H2D memlayout pinned flat buffers", flat, limit / flat),
    ]
    print(f"flatten GPU benchmark: {torch.cuda.get_device_name()}, {args.tensors} tensors, {args.size_mib} MiB")
    print(f"{'measure':40} {'seconds':>9} {'vs limit':>9}")
    for name, seconds, ratio in rows:
        print(f"{name:40} {seconds:9.4f} {ratio:8.2f}x")
    print(f"{'stream file -> CUDA, peak / flat bytes':40} {stream_seconds:9.3f} {peak_ratio:8.3f}x")
    base_lstm = lstm_times["flatten_parameters()"]
    for how, seconds in lstm_times.items():
        print(f"{'LSTM fwd+bwd after ' + how:40} {seconds:9.4f} {base_lstm / seconds:8.2f}x  cuDNN copy warning: "
              f"{warned[how]}")

    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {
        "device": torch.cuda.get_device_name(),
        "size_mib": args.size_mib,
        "tensors": args.tensors,
        "h2d_seconds": {"pinned_plain": limit, "per_tensor_pageable": per_tensor, "memlayout_pinned_flat": flat},
        "stream_to_cuda": {"seconds": stream_seconds, "peak_over_flat_bytes": peak_ratio},
        "lstm_fwd_bwd_seconds": lstm_times,
        "cudnn_copy_warning": warned,
    }
    (RESULTS / "flatten_gpu.json").write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
