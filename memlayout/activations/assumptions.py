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
    "token": "the token generate picks next (an argmax over logits the weights decide) is token r for sequence r, "
             "as routing's indices are spread; which token it is changes no tensor's size",
}
"""kind -> the assumption, as the report states it."""
UNRANGED = frozenset({"token"})
"""Kinds whose extremes change no size, so that no range is traced for them."""
