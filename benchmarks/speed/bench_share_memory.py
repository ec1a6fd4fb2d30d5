"""Sharing a model with worker processes: per-tensor `share_memory()` vs one flat buffer.

The Hogwild pattern sends a shared model to workers. torch shares each storage as
its own shared-memory segment and passes one file descriptor per storage when the
model is pickled to another process. `memlayout.flatten(model, share_memory=True)`
puts each group in one segment, so the model crosses with a handful of
descriptors. Measured here, in one run: time to move the model into shared memory,
segments created, and the round trip of sending the model to a live worker
process and getting an acknowledgement back.

Usage: python benchmarks/speed/bench_share_memory.py [--quick]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.multiprocessing as mp
from harness import Row, best_of, ms, print_table, quick_requested, write_results

import memlayout


def build_model(layers: int, width: int) -> torch.nn.Module:
    """Transformer-like: per layer 4 square projections, 2 MLP matrices, 2 norms (8 tensors + biases)."""
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width) for _ in range(4)]
        blocks += [torch.nn.Linear(width, 2 * width), torch.nn.Linear(2 * width, width)]
        blocks += [torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)]
    return torch.nn.Sequential(*blocks)


def segments(model: torch.nn.Module) -> int:
    """Distinct shared storages behind the model's tensors."""
    return len({t.untyped_storage()._cdata for t in model.state_dict().values() if t.is_shared()})


def worker(inbox: Any, outbox: Any) -> None:
    while True:
        model = inbox.get()
        if model is None:
            return
        outbox.put(sum(1 for _ in model.parameters()))


def round_trip(model: torch.nn.Module, inbox: Any, outbox: Any, expected: int) -> None:
    inbox.put(model)
    assert outbox.get() == expected


def share_time(share: Any, layers: int, width: int, repeat: int) -> float:
    """Best time of `share` alone on freshly built models (building is not timed)."""
    best = float("inf")
    for _ in range(repeat):
        model = build_model(layers, width)
        start = time.perf_counter()
        share(model)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    quick = quick_requested(sys.argv[1:] if argv is None else argv)
    layers, width, repeat = (4, 128, 3) if quick else (25, 256, 7)
    torch.manual_seed(0)
    context = mp.get_context("spawn")
    inbox, outbox = context.Queue(), context.Queue()
    process = context.Process(target=worker, args=(inbox, outbox), daemon=True)
    process.start()
    try:
        per_tensor = build_model(layers, width).share_memory()
        flat = build_model(layers, width)
        memlayout.flatten(flat, share_memory=True)
        count = sum(1 for _ in per_tensor.parameters())
        # Untimed: the worker imports torch, and both ways pay their one-off set-up.
        round_trip(per_tensor, inbox, outbox, count)
        round_trip(flat, inbox, outbox, count)
        per_tensor_share = share_time(lambda model: model.share_memory(), layers, width, repeat)
        flat_share = share_time(lambda model: memlayout.flatten(model, share_memory=True), layers, width, repeat)
        per_tensor_send = best_of(lambda: round_trip(per_tensor, inbox, outbox, count), repeat)
        flat_send = best_of(lambda: round_trip(flat, inbox, outbox, count), repeat)
        per_tensor_segments, flat_segments = segments(per_tensor), segments(flat)
    finally:
        inbox.put(None)
        process.join(timeout=30)
    nbytes = sum(t.nbytes for t in flat.state_dict().values())
    rows = [
        Row("shared segments", str(flat_segments), f"per-tensor share_memory() {per_tensor_segments}",
            flat_segments / per_tensor_segments, "fewer", flat_segments < per_tensor_segments),
        Row("send model to a worker and back", ms(flat_send), f"per-tensor {ms(per_tensor_send)}",
            flat_send / per_tensor_send, "<= 1x", flat_send <= per_tensor_send),
        # Both ways copy every byte into shared memory once; only the segment count differs.
        Row("move into shared memory", ms(flat_share), f"per-tensor {ms(per_tensor_share)}",
            flat_share / per_tensor_share, "(info)", True),
    ]
    print_table(f"share_memory: {count} parameters, {nbytes / 2**20:.0f} MiB, spawn worker", rows)
    raw = {
        "parameters": count, "bytes": nbytes, "layers": layers, "width": width,
        "segments": {"per_tensor": per_tensor_segments, "flat": flat_segments},
        "send_seconds": {"per_tensor": per_tensor_send, "flat": flat_send},
        "share_seconds": {"per_tensor": per_tensor_share, "flat": flat_share},
    }
    write_results("share_memory", rows, raw, quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
