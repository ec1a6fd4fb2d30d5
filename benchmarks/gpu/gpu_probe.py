"""What a real GPU does that memlayout predicts or describes, recorded as JSON in one run.

Usage: python benchmarks/gpu/gpu_probe.py OUT.json [SNAPSHOT.pickle]

Each section is independent: one that fails records its error and the rest still run.

- device: `torch.cuda.get_device_properties(0)`, torch, CUDA and cuDNN versions (the
  `--gpu` table is tested against these fields).
- context: what the CUDA context and the first cuBLAS call take outside and inside
  the caching allocator (`torch.cuda.mem_get_info` against `memory_reserved`).
- sdpa: which kernels `F.scaled_dot_product_attention` runs, forward and backward,
  for each dtype and head size, read from the profiler's kernel names.
- steps: a steady-state AdamW step of small models and of a 1B-parameter Llama at 2k
  tokens, in float32, under bf16 autocast and in pure bf16: `max_memory_allocated`,
  `max_memory_reserved`, and memlayout's fake-CUDA prediction beside them. The 1B
  autocast step's allocator history (no stacks) goes to SNAPSHOT.pickle, so that a
  model of the caching allocator can be replayed against it on a machine with no GPU.
- cudnn_copies: for each way an RNN reaches CUDA, whether cuDNN warns that its weights
  are not one chunk (what ML401 claims), and how many storages the weights use.
"""

from __future__ import annotations

import json
import pickle
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

NOT_ONE_CHUNK = "not part of single contiguous chunk"


def device_section() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(0)
    fields = {}
    for name in dir(props):
        if name.startswith("_"):
            continue
        value = getattr(props, name)
        if isinstance(value, (int, float, str, bool)):
            fields[name] = value
    free, total = torch.cuda.mem_get_info()
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "properties": fields,
        "mem_get_info": {"free": free, "total": total},
    }


def context_section() -> dict[str, Any]:
    import torch

    torch.cuda.init()
    torch.cuda.synchronize()
    free0, total = torch.cuda.mem_get_info()
    record: dict[str, Any] = {
        "driver_used_after_init": total - free0,
        "reserved_after_init": torch.cuda.memory_reserved(),
    }
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a = torch.randn(256, 256, device="cuda", dtype=dtype)
        allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        free1, _ = torch.cuda.mem_get_info()
        b = a @ a
        torch.cuda.synchronize()
        free2, _ = torch.cuda.mem_get_info()
        record[f"first_matmul_{str(dtype).removeprefix('torch.')}"] = {
            "allocated_delta_beyond_output": torch.cuda.memory_allocated() - allocated - b.untyped_storage().nbytes(),
            "reserved_delta": torch.cuda.memory_reserved() - reserved,
            "driver_used_delta": free1 - free2,
        }
        del a, b
    # A bias-add matmul goes through cuBLASLt, which may take a workspace of its own.
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(256, 256, device="cuda", dtype=dtype)
        bias = torch.randn(256, device="cuda", dtype=dtype)
        allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        out = torch.nn.functional.linear(a, a, bias)
        torch.cuda.synchronize()
        record[f"first_linear_with_bias_{str(dtype).removeprefix('torch.')}"] = {
            "allocated_delta_beyond_output": torch.cuda.memory_allocated() - allocated - out.untyped_storage().nbytes(),
            "reserved_delta": torch.cuda.memory_reserved() - reserved,
        }
        del a, bias, out
    stats = torch.cuda.memory_stats()
    record["allocator_stats_keys_sample"] = sorted(k for k in stats
                                                   if k.startswith(("segment", "num_", "reserved_bytes.all")))
    record["driver_used_at_end"] = total - torch.cuda.mem_get_info()[0]
    record["reserved_at_end"] = torch.cuda.memory_reserved()
    return record


def sdpa_section() -> list[dict[str, Any]]:
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    rows = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for head_dim in (64, 128, 256):
            for causal in (True, False):
                q, k, v = (torch.randn(2, 8, 1024, head_dim, device="cuda", dtype=dtype, requires_grad=True)
                           for _ in range(3))
                F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()  # warm-up
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    forward_peak = torch.cuda.max_memory_allocated() - base
                    out.sum().backward()
                    torch.cuda.synchronize()
                kernels = sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})
                attention = [n for n in kernels
                             if any(s in n.lower() for s in ("flash", "fmha", "attention", "cudnn", "mem_eff", "sdpa"))]
                rows.append({
                    "dtype": str(dtype).removeprefix("torch."), "head_dim": head_dim, "causal": causal,
                    "attention_kernels": attention[:12], "kernel_count": len(kernels),
                    "forward_peak_over_base": forward_peak,
                    "step_peak_over_base": torch.cuda.max_memory_allocated() - base,
                })
                del q, k, v, out
    return rows


def _llama(hidden: int, layers: int, heads: int, kv_heads: int, inter: int, vocab: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                         max_position_embeddings=4096, attn_implementation="sdpa")
    return LlamaForCausalLM(config).train()


def _tokens(batch: int, length: int, vocab: int) -> dict[str, Any]:
    import torch

    ids = torch.randint(0, vocab, (batch, length))
    return {"input_ids": ids, "labels": ids.clone()}


def _tokens_from(inputs: tuple[tuple[Any, ...], dict[str, Any]]) -> dict[str, Any]:
    (ids,), extra = inputs
    return {"input_ids": ids, **extra}


def real_step(build: Callable[[], Any], kwargs: dict[str, Any], precision: str,
              snapshot: Path | None = None) -> dict[str, Any]:
    """Two AdamW steps on CUDA; the second's peaks, as memlayout's steady state counts them."""
    import torch

    from memlayout.activations.step.run import run_step

    with torch.device("cuda"):  # a 1B model initialises in seconds on the GPU, minutes on the CPU
        model = build()
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    kwargs = {k: v.cuda() for k, v in kwargs.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = precision == "autocast-bf16"

    def step(model: Any, kwargs: dict[str, Any], optimizer: Any) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            run_step(model, (), kwargs)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(model, kwargs, optimizer)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before_allocated, before_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    if snapshot is not None:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=400_000)
    step(model, kwargs, optimizer)
    torch.cuda.synchronize()
    if snapshot is not None:
        snapshot.write_bytes(pickle.dumps(torch.cuda.memory._snapshot()))
        torch.cuda.memory._record_memory_history(enabled=None)
    stats = torch.cuda.memory_stats()
    optimizer_bytes = sum(
        v.untyped_storage().nbytes() for state in optimizer.state.values() for v in state.values()
        if isinstance(v, torch.Tensor) and v.is_cuda
    )
    record = {
        "precision": precision,
        "optimizer_bytes": optimizer_bytes,
        "parameter_bytes": sum(p.untyped_storage().nbytes() for p in model.parameters()),
        "input_bytes": sum(v.untyped_storage().nbytes() for v in kwargs.values()),
        "allocated_before_step": before_allocated,
        "reserved_before_step": before_reserved,
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "segments_large_peak": stats.get("segment.large_pool.peak"),
        "segments_small_peak": stats.get("segment.small_pool.peak"),
        "reserved_small_pool_peak": stats.get("reserved_bytes.small_pool.peak"),
        "reserved_large_pool_peak": stats.get("reserved_bytes.large_pool.peak"),
        "allocated_small_pool_peak": stats.get("allocated_bytes.small_pool.peak"),
        "inactive_split_peak": stats.get("inactive_split_bytes.all.peak"),
        "requested_bytes_peak": stats.get("requested_bytes.all.peak"),
    }
    # The step's peak with the model, its optimizer state and inputs counted, as memlayout counts it:
    # what else was allocated before the step (workspaces, the probe's earlier sections) is left out.
    record["step_peak_as_memlayout_counts"] = (
        record["max_memory_allocated"] - before_allocated + record["parameter_bytes"] + record["input_bytes"]
        + optimizer_bytes
    )
    del model, optimizer, kwargs
    torch.cuda.empty_cache()
    return record


def predicted(build: Callable[[], Any], kwargs: dict[str, Any], precision: str) -> dict[str, Any]:
    import memlayout.activations as act

    options = {"autocast-bf16": {"autocast": "bf16"}, "bf16": {"dtype": "bf16"}}.get(precision, {})
    report = act.analyze(build(), [], kwargs=kwargs, device="cuda", **options)
    return {"peak_bytes": report.summary.peak_bytes, "allocator_peak_bytes": report.summary.allocator_peak_bytes,
            "reserved_peak_bytes": report.summary.reserved_peak_bytes}


def steps_section(snapshot: Path | None) -> list[dict[str, Any]]:
    import torch

    from tests.activations import models

    cases: list[tuple[str, Callable[[], Any], dict[str, Any]]] = [
        ("gpt2-tiny 8x128", models.gpt2, _tokens_from(models.token_inputs(8, 128, 500))),
        ("llama-small 4x512", lambda: _llama(512, 4, 8, 4, 1376, 8000), _tokens(4, 512, 8000)),
        ("llama-1B 1x2048", lambda: _llama(2048, 16, 32, 8, 8192, 32000), _tokens(1, 2048, 32000)),
    ]
    rows = []
    for name, build, kwargs in cases:
        for precision in ("fp32", "autocast-bf16", "bf16"):
            row: dict[str, Any] = {"model": name}
            try:
                take = snapshot if (name.startswith("llama-1B") and precision == "autocast-bf16") else None
                row.update(real_step(build, kwargs, precision, take))
                if not name.startswith("llama-1B"):
                    row["memlayout_fake_cuda"] = predicted(build, kwargs, precision)
                    row["predicted_over_measured"] = round(
                        row["memlayout_fake_cuda"]["peak_bytes"] / row["step_peak_as_memlayout_counts"], 4)
            except Exception as exc:  # a section's failure is a finding, not the end of the run
                row["error"] = f"{type(exc).__name__}: {exc}"[:500]
            rows.append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
    return rows


def cudnn_copies_section(tmp: Path) -> list[dict[str, Any]]:
    """How the RNN reached CUDA, against whether cuDNN copies its weights on each call."""
    import torch
    from torch import nn

    def make() -> nn.LSTM:
        torch.manual_seed(0)
        return nn.LSTM(16, 32, num_layers=2, bidirectional=True)

    def outcome(module: nn.LSTM) -> dict[str, Any]:
        storages = {w.untyped_storage().data_ptr() for w in module._flat_weights}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module(torch.randn(5, 3, 16, device="cuda"))[0].sum().backward()
        return {"storages": len(storages), "cudnn_copy_warning": any(NOT_ONE_CHUNK in str(w.message) for w in caught)}

    cpu_state = make().state_dict()
    torch.save(cpu_state, tmp / "sd.pt")
    torch.save(make(), tmp / "module_cpu.pt")
    flat_cuda = make().cuda()
    torch.save(flat_cuda, tmp / "module_cuda.pt")
    torch.save(flat_cuda.state_dict(), tmp / "sd_cuda.pt")

    def cuda_then_load() -> nn.LSTM:
        m = make().cuda()
        m.load_state_dict(torch.load(tmp / "sd.pt", weights_only=True))
        return m

    def load_then_cuda() -> nn.LSTM:
        m = make()
        m.load_state_dict(torch.load(tmp / "sd.pt", weights_only=True))
        return m.cuda()

    def meta_assign() -> nn.LSTM:
        with torch.device("meta"):
            m = make()
        m.load_state_dict(torch.load(tmp / "sd.pt", map_location="cuda", weights_only=True), assign=True)
        return m

    def meta_assign_flat_file() -> nn.LSTM:
        with torch.device("meta"):
            m = make()
        m.load_state_dict(torch.load(tmp / "sd_cuda.pt", map_location="cuda", weights_only=True), assign=True)
        return m

    def cuda_assign() -> nn.LSTM:
        m = make().cuda()
        m.load_state_dict(torch.load(tmp / "sd.pt", map_location="cuda", weights_only=True), assign=True)
        return m

    def pickled_cpu_module_to_cuda() -> nn.LSTM:
        return torch.load(tmp / "module_cpu.pt", map_location="cuda", weights_only=False)

    def pickled_cuda_module() -> nn.LSTM:
        return torch.load(tmp / "module_cuda.pt", map_location="cuda", weights_only=False)

    def pickled_cpu_module_then_cuda() -> nn.LSTM:
        return torch.load(tmp / "module_cpu.pt", weights_only=False).cuda()

    def replaced_after_move() -> nn.LSTM:
        m = make().cuda()
        m.weight_hh_l0 = nn.Parameter(m.weight_hh_l0.detach().clone())
        return m

    def replaced_data_after_move() -> nn.LSTM:
        m = make().cuda()
        with torch.no_grad():
            m.weight_hh_l0.data = m.weight_hh_l0.data.clone()
        return m

    def to_empty_then_load() -> nn.LSTM:
        with torch.device("meta"):
            m = make()
        m = m.to_empty(device="cuda")
        m.load_state_dict(torch.load(tmp / "sd.pt", weights_only=True))
        return m

    scenarios = {
        "build, .cuda(), load_state_dict(state dict)": cuda_then_load,
        "build, load_state_dict, then .cuda()": load_then_cuda,
        "meta build, load_state_dict(assign=True), file of separate storages": meta_assign,
        "meta build, load_state_dict(assign=True), file saved from a flat CUDA LSTM": meta_assign_flat_file,
        "build, .cuda(), load_state_dict(assign=True)": cuda_assign,
        "to_empty(device='cuda'), load_state_dict": to_empty_then_load,
        "torch.load(pickled CPU module, map_location='cuda')": pickled_cpu_module_to_cuda,
        "torch.load(pickled CUDA module, map_location='cuda')": pickled_cuda_module,
        "torch.load(pickled CPU module), then .cuda()": pickled_cpu_module_then_cuda,
        "weight replaced by a new Parameter after .cuda()": replaced_after_move,
        "weight .data replaced after .cuda()": replaced_data_after_move,
    }
    rows = []
    for name, how in scenarios.items():
        try:
            rows.append({"scenario": name, **outcome(how())})
        except Exception as exc:
            rows.append({"scenario": name, "error": f"{type(exc).__name__}: {exc}"[:500]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str]) -> int:
    import tempfile

    import torch

    if not torch.cuda.is_available():
        print("gpu_probe: no CUDA device here; nothing recorded", file=sys.stderr)
        return 2
    out = Path(argv[0])
    snapshot = Path(argv[1]) if len(argv) > 1 else None
    record: dict[str, Any] = {}

    def run(name: str, section: Callable[[], Any]) -> None:
        try:
            record[name] = section()
        except Exception:
            record[name] = {"error": traceback.format_exc()[-2000:]}
        out.write_text(json.dumps(record, indent=1, default=str) + "\n")
        print(f"gpu_probe: {name} done", flush=True)

    run("device", device_section)
    run("context", context_section)
    with tempfile.TemporaryDirectory() as tmp:
        run("cudnn_copies", lambda: cudnn_copies_section(Path(tmp)))
    run("sdpa", sdpa_section)
    run("steps", lambda: steps_section(snapshot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
