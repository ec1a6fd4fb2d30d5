"""What a generate step's trace says beside the peak: the weights, the key/value cache, and what the peak holds.

A pure function of a `Trace` whose `generation` a generate step recorded
(trace/tracer.py, step/generate.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from memlayout.activations.facts import StorageKind, Trace
from memlayout.activations.step.generate import Generation
from memlayout.activations.summary import alive_at, live_curve

LARGEST_SHOWN = 3
"""How many of the temporaries live at the peak the summary names."""


@dataclass(frozen=True)
class Temporary:
    """Temporaries live at the peak that one module call made (attention's scores, the logits)."""

    module: str | None
    """The innermost module's path that allocated them ("" the model itself); None: generate's own loop."""
    class_name: str | None
    nbytes: int


@dataclass(frozen=True)
class GenerateSummary:
    """A generate step's parts."""

    new_tokens: int
    cache: str
    """dynamic or static (step/generate.py)."""
    forwards: int
    """Forwards of the model itself: the prompt's, then one for each new token but the last."""
    weight_bytes: int
    """Parameters and buffers."""
    cache_bytes: int
    """The key/value cache after the last forward: what a server holds for these sequences at the end."""
    peak_forward: int | None
    """Which forward the peak is in: 0 the prompt's (the prefill), k the one that reads new token k; None outside
    every forward of the model (an encoder generate runs on its own, or generate's loop)."""
    cache_at_peak_bytes: int
    """The cache's storages live at the peak."""
    temporary_at_peak_bytes: int
    """Everything the step made that is live at the peak and is not the cache (activations, logits, ids)."""
    largest_temporaries: tuple[Temporary, ...]
    """The modules whose temporaries live at the peak are largest, largest first (at most LARGEST_SHOWN)."""


def summarize_generation(trace: Trace, generation_asked: Generation) -> GenerateSummary | None:
    """The generate step's parts; None for a trace that is not a generate step's."""
    import numpy as np

    generation = trace.generation
    if generation is None:
        return None
    curve = live_curve(trace)
    peak_event = int(np.argmax(curve)) if len(curve) else 0
    in_cache = set(generation.cache_storages)
    cache_at_peak = temporaries = 0
    by_call: dict[int | None, int] = {}
    for index in alive_at(trace, peak_event):
        storage = trace.storages[index]
        if index in in_cache:
            cache_at_peak += storage.nbytes
        elif storage.kind is StorageKind.STEP:
            temporaries += storage.nbytes
            by_call[storage.call] = by_call.get(storage.call, 0) + storage.nbytes
    by_module: dict[tuple[str | None, str | None], int] = {}
    for call, nbytes in by_call.items():
        key = (None, None) if call is None else (trace.calls[call].path, trace.calls[call].class_name)
        by_module[key] = by_module.get(key, 0) + nbytes
    largest = sorted(by_module.items(), key=lambda item: -item[1])[:LARGEST_SHOWN]
    peak_forward = next((i for i, (start, end) in enumerate(generation.forwards) if start < peak_event <= end), None)
    return GenerateSummary(
        new_tokens=generation_asked.new_tokens,
        cache=generation_asked.cache,
        forwards=len(generation.forwards),
        weight_bytes=sum(s.nbytes for s in trace.storages if s.kind in (StorageKind.PARAMETER, StorageKind.BUFFER)),
        cache_bytes=sum(trace.storages[i].nbytes for i in generation.final_cache),
        peak_forward=peak_forward,
        cache_at_peak_bytes=cache_at_peak,
        temporary_at_peak_bytes=temporaries,
        largest_temporaries=tuple(Temporary(path, class_name, nbytes) for (path, class_name), nbytes in largest),
    )
