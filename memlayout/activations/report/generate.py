"""A generate step's part of the activations report: the weights, the key/value cache, what the peak holds.

Rows for the table's summary grid and the `generate` object of the JSON (schema 1); never printed here.
"""

from __future__ import annotations

from typing import Any

from memlayout.activations.generate_summary import GenerateSummary
from memlayout.format_bytes import human_bytes

STEP_TEXT = "none (model.generate under torch.inference_mode, the model in eval mode: no gradients)"


def peak_forward_text(g: GenerateSummary) -> tuple[str, str]:
    """Where the peak is (a forward of the model), and what that is, in words."""
    if g.peak_forward is None:
        return "generate", "outside the model's forwards: an encoder generate runs first, or its own loop"
    which = f"forward {g.peak_forward + 1} of {g.forwards}"
    if g.peak_forward == 0:
        return which, "the prompt's (the prefill)"
    return which, f"the one reading new token {g.peak_forward}"


def _temporaries_text(g: GenerateSummary) -> str:
    named = ", ".join(f"{'generate' if t.module is None else t.module or 'the model'} {human_bytes(t.nbytes)}"
                      for t in g.largest_temporaries)
    return f"{human_bytes(g.temporary_at_peak_bytes)}" + (f" (largest: {named})" if named else "")


def add_generate_rows(grid: Any, g: GenerateSummary) -> None:
    """The table's rows for a generate step: weights and cache, then where the peak is and what it holds."""
    grid.add_row("weights", human_bytes(g.weight_bytes), "KV cache",
                 f"{human_bytes(g.cache_bytes)} at the end ({g.cache} cache, {g.new_tokens} new tokens)")
    where, what = peak_forward_text(g)
    grid.add_row("peak in", where, "that is", what)
    grid.add_row("cache there", human_bytes(g.cache_at_peak_bytes), "temporaries", _temporaries_text(g))


def generate_dict(g: GenerateSummary | None) -> dict[str, Any] | None:
    """`generate`: the generate step's parts; None for other steps."""
    if g is None:
        return None
    return {
        "new_tokens": g.new_tokens,
        "cache": g.cache,
        "forwards": g.forwards,
        "weight_bytes": g.weight_bytes,
        "cache_bytes": g.cache_bytes,
        "peak_forward": g.peak_forward,
        "cache_at_peak_bytes": g.cache_at_peak_bytes,
        "temporary_at_peak_bytes": g.temporary_at_peak_bytes,
        "largest_temporaries": [{"module": t.module, "class": t.class_name, "bytes": t.nbytes}
                                for t in g.largest_temporaries],
    }
