"""`--lora 16` and `--dora` over the zoo's architectures: the prediction against a real peft step's allocator events.

For each architecture of the zoo catalog (benchmarks/accuracy/zoo/catalog.py, the models of
transformers' and diffusers' registries built from tiny configs), in a fresh process
with a timeout, and for LoRA and then DoRA:
- the real step: peft's `get_peft_model(model, LoraConfig(r=16, ...))` on the model built
  for real, one steady-state AdamW step, its peak by the CPU allocator's own events
  (tests/activations/measure.py's allocator_peak_step);
- memlayout's prediction, `analyze(model, ..., lora=LoraOptions(16, ...))`, which applies peft
  itself on fake tensors.

The targets are peft's default for the model type where peft has one (its own table) and
`all-linear` elsewhere, the same on both sides. A record is within 2% when the two peaks are.

Then QLoRA on the Llama the tests use, saved as a directory: `--quantize nf4 --lora 16`
against `from_pretrained(quantization_config=BitsAndBytesConfig(load_in_4bit=True,
bnb_4bit_quant_type="nf4"))` and peft on the CPU, its 4-bit state (packed weights, absmax,
code) against what bitsandbytes allocated for the real model.

Prints each ratio and the share within 2%, and writes benchmarks/results/lora_sweep.json.

Usage:
    python -m benchmarks.accuracy.lora_sweep --sample 30 --seed 38 --jobs 2
    python -m benchmarks.accuracy.lora_sweep --arch MistralForCausalLM --arch T5ForConditionalGeneration
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "lora_sweep.json"
TOLERANCE = 0.02
RANK = 16
TUNED_ON = ("LlamaForCausalLM", "GPT2LMHeadModel", "BertForMaskedLM")
"""The architectures the tests check (tests/activations/model/test_lora.py): left out of a drawn sample."""


def default_targets(model: Any) -> tuple[str, ...] | None:
    """peft's default targets for the model's type; None where peft has none (the sweep then adapts all-linear)."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    found = TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type) if model_type else None
    return None if found is None else ((found,) if isinstance(found, str) else tuple(found))


def check_one(name: str) -> dict[str, Any]:
    """One architecture's record: built, adapted and measured for real, predicted, for LoRA then DoRA."""
    import peft

    import memlayout.activations as act
    from benchmarks.accuracy.zoo.check import (
        memlayout_error,
        one_line,
        seed_other_generators,
        sweep_start,
    )
    from memlayout.activations.model.adapters import ALL_LINEAR, LoraOptions
    from tests.activations.measure import allocator_peak_step

    arch, built, record = sweep_start(name)
    if built is None:
        return record
    defaults = default_targets(built.model)
    targets = (ALL_LINEAR,) if defaults is None else None
    record["targets"] = "peft's default: " + ",".join(defaults) if defaults else ALL_LINEAR
    for kind, dora in (("lora", False), ("dora", True)):
        config = {"r": RANK, "use_dora": dora, **({"target_modules": ALL_LINEAR} if targets else {})}
        try:
            seed_other_generators()
            real = peft.get_peft_model(arch.build().model, peft.LoraConfig(**config))
            measured = allocator_peak_step(real, tuple(built.args), dict(built.kwargs)).peak_bytes
        except Exception as exc:
            record[kind] = {"status": "unsupported", "reason": f"the real step fails: {one_line(exc)}"[:300]}
            continue
        try:
            report = act.analyze(arch.build().model, list(built.args), kwargs=built.kwargs,
                                 lora=LoraOptions(RANK, targets=targets, dora=dora))
        except Exception as exc:
            record[kind] = {"status": "failed", "measured_peak_bytes": measured,
                            "reason": f"no prediction: {memlayout_error(exc)}"[:300]}
            continue
        predicted = report.summary.peak_bytes
        record[kind] = {"status": "ok", "measured_peak_bytes": measured, "predicted_peak_bytes": predicted,
                        "ratio": round(predicted / measured, 4),
                        "within_2pct": abs(predicted - measured) <= TOLERANCE * measured,
                        "trainable_bytes": report.parameters.trainable_bytes if report.parameters else None}
    statuses = {record[kind]["status"] for kind in ("lora", "dora") if kind in record}
    if statuses == {"unsupported"}:
        record["status"] = "unsupported"
    elif "failed" in statuses:
        record["status"] = "failed"
    return record


def check_qlora() -> dict[str, Any]:
    """QLoRA on a Llama directory: the prediction against a real CPU step, and the 4-bit state against bitsandbytes'."""
    import tempfile

    import torch

    import memlayout.activations as act
    from memlayout.activations.analysis import prepare_step
    from memlayout.activations.request.step_request import StepRequest
    from tests.activations import lora_models

    torch.set_num_threads(1)
    inputs = ["int64[4,32]<500", "labels=int64[4,32]<500"]
    with tempfile.TemporaryDirectory(prefix="memlayout-qlora-") as folder:
        directory = lora_models.saved("llama", Path(folder))
        real = lora_models.with_lora(lora_models.quantized_from(directory, "nf4"), r=RANK)
        measured = lora_models.real_peak(real)
        report = act.analyze(str(directory), inputs, lora=RANK, quantize="nf4")
        step, *_ = prepare_step(StepRequest(str(directory), input=tuple(inputs), optimizer="adamw", lora=RANK,
                                            quantize="nf4"))
    packed = sum(p.untyped_storage().nbytes() for p in step.model.parameters() if p.dtype == torch.uint8)
    split = report.parameters
    assert split is not None
    return {"model": "tests.activations.models:llama, saved with save_pretrained", "inputs": inputs,
            "measured_peak_bytes": measured, "predicted_peak_bytes": report.summary.peak_bytes,
            "ratio": round(report.summary.peak_bytes / measured, 4),
            "packed_bytes": {"bitsandbytes": lora_models.storage_bytes(lora_models.quantized_weights(real)),
                             "predicted": packed},
            "state_bytes": {"bitsandbytes": lora_models.storage_bytes(lora_models.quantization_state(real)),
                            "predicted": split.quantization_state_bytes},
            "trainable_bytes": split.trainable_bytes, "frozen_bytes": split.frozen_bytes}


def run_child(name: str, timeout: float) -> dict[str, Any]:
    """`check_one` in a fresh process (benchmarks/accuracy/zoo/check.py's `run_check_in_child`)."""
    from benchmarks.accuracy.zoo.check import run_check_in_child

    return run_check_in_child("benchmarks.accuracy.lora_sweep", name, timeout)


def tally(records: list[dict[str, Any]], kind: str) -> tuple[int, int]:
    """(within 2%, runnable) of one kind's checks."""
    runnable = [r[kind] for r in records if isinstance(r.get(kind), dict) and r[kind]["status"] != "unsupported"]
    return sum(1 for check in runnable if check.get("within_2pct")), len(runnable)


def main(argv: list[str]) -> int:
    from benchmarks.accuracy.zoo.check import drawn, sweep_parser

    options = sweep_parser("benchmarks.accuracy.lora_sweep", __doc__.splitlines()[0], timeout=600.0).parse_args(argv)
    if options.one:
        print(json.dumps(check_qlora() if options.one == "qlora" else check_one(options.one)))
        return 0
    from benchmarks.accuracy.zoo.catalog import by_name

    names = drawn(lambda: sorted(name for name in by_name() if name not in TUNED_ON), options)
    started = time.perf_counter()
    with ThreadPoolExecutor(options.jobs) as pool:
        records = list(pool.map(lambda name: run_child(name, options.timeout), [*names, "qlora"]))
    qlora = records.pop()
    from benchmarks.accuracy.zoo.run import versions

    for record in records:
        ratios = " ".join(f"{kind} {record[kind]['ratio']:.4f}" if "ratio" in record.get(kind, {}) else f"{kind} -"
                          for kind in ("lora", "dora"))
        reasons = "; ".join(record[kind]["reason"] for kind in ("lora", "dora") if "reason" in record.get(kind, {}))
        print(f"{record['architecture']}: {record['status']}, predicted/measured {ratios} "
              f"{record.get('reason', '')}{reasons}")
    summary = {kind: dict(zip(("within_2pct", "runnable"), tally(records, kind), strict=True))
               for kind in ("lora", "dora")}
    print(f"QLoRA (nf4, r {RANK}) on a Llama directory: predicted/measured {qlora.get('ratio', '-')} "
          f"{qlora.get('reason', '')}")
    for kind, counts in summary.items():
        print(f"{kind}: within 2% of the allocator's peak: {counts['within_2pct']} of {counts['runnable']} runnable "
              f"({len(records)} drawn)")
    result = {"command": shlex.join(["python", "-m", "benchmarks.accuracy.lora_sweep", *argv]), "versions": versions(),
              "rank": RANK, "wall_seconds": round(time.perf_counter() - started, 1), "architectures": len(records),
              **summary, "qlora": qlora, "records": records}
    from memlayout.io.atomic_write import write_text

    write_text(str(RESULTS), json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
