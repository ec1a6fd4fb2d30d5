"""What a fake step assumes where shapes follow values the weights decide (trace/fake_step.py applies them).

Torch-free, so that reporters can name them without importing torch.
"""

from __future__ import annotations

POLICIES = ("typical", "least", "most")
"""How data-dependent shapes are decided: the stated assumption, and the two extremes of the range."""

ASSUMPTIONS = {
    "routing": "indices a top-k, argmax or max picks from values the weights decide are spread evenly (balanced "
               "routing: each expert gets the same share of tokens); the range runs to every row picking the same k",
    "mask": "a mask computed from values the weights decide keeps half of its elements; the range runs from none "
            "to all",
    "random": "small uniform random draws that decide the step (layer drop: torch.rand([]) < p skips a layer) come "
              "out high, so every layer runs; the range runs to every draw low (every droppable layer dropped)",
}
"""kind -> the assumption, as the report states it."""
