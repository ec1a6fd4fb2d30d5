"""What to try when nothing fits: the settings a request did not already use, the lowest-cost first, each with the
figure its step would give.

The cost is what the user gives up, in this order: bf16 weights (`dtype=bf16`: the same step, in half the
bytes, at the precision most training runs in today), LoRA adapters (only they train: another fine-tune),
QLoRA (LoRA on a 4-bit base, which the step dequantizes), then more ranks (more GPUs). A checkpoint plan,
which costs a rerun of the forward, comes between bf16 and LoRA, but both questions that end here
(`budget`'s search, and `fit`'s at size 1) have already searched one: its lowest figure is the error's own.

Each figure is the step with that setting alone, traced once, without a plan, at the smallest size the
command asked about: what following the hint gives before any plan. A setting whose step fails is named
without a figure, with why. More ranks are named without one: predicting them builds the sharded model
afresh and traces a rank under DTensor (8 FSDP ranks of llama-tiny at batch 1: 1.8 to 2.0 s, against 1.0 to 1.5 s
for one plain prediction), as much as the other figures together, and `budget`'s error is raised in the
analysis, a layer under the ranks' (pyproject's import contract).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memlayout.errors import Alternative, MemlayoutError, SettingError
from memlayout.format_bytes import human_bytes

if TYPE_CHECKING:
    from memlayout.activations.request.step_request import StepRequest

LORA_RANK = 16
"""The adapters' rank the hint proposes: a common default (peft's examples, torchtune's recipes use 8 to 64)."""
MORE_RANKS = 8
"""The ranks the hint proposes to a step on one device: one node of 8 GPUs."""


@dataclass(frozen=True)
class Option:
    """One setting the hint may name."""

    name: str
    """What it is, in words: "bf16", "LoRA"."""
    changes: Mapping[str, Any]
    """The request's settings it sets, in the order its text names them."""
    figure: bool = True
    """Whether the hint predicts its step (see the module's docstring: more ranks are not)."""

    @property
    def setting(self) -> str:
        """The settings as a Python caller writes them, in backquotes: "`lora=16` with `quantize=nf4`"."""
        return " with ".join(f"`{name}={value}`" for name, value in self.changes.items())


def untried(request: StepRequest) -> tuple[Option, ...]:
    """The options the request did not already use, the lowest-cost first (see the module's docstring)."""
    options = []
    if request.dtype not in ("bf16", "fp16") and request.autocast not in ("bf16", "fp16"):
        options.append(Option("bf16", {"dtype": "bf16"}))
    if request.step == "train":
        if request.lora is None and not request.dora:
            options.append(Option("LoRA", {"lora": LORA_RANK}))
        if request.quantize is None:
            options.append(Option("QLoRA", {"lora": request.lora or LORA_RANK, "quantize": "nf4"}))
        ranks = {"world_size": MORE_RANKS, "fsdp": True} if request.world_size is None \
            else {"world_size": 2 * request.world_size}
        options.append(Option("more ranks", ranks, figure=False))
    return tuple(option for option in options if _allowed(request, option))


def _allowed(request: StepRequest, option: Option) -> bool:
    """Whether the request's rules take the option (LoRA is not traced across ranks yet): a hint never names a
    setting the command would refuse. The question it asks is read off the settings again (more ranks are the
    ranks' own)."""
    try:
        dataclasses.replace(request, pipeline=None, **option.changes)
    except SettingError:
        return False
    return True


def predicted(request: StepRequest, measure: Callable[[StepRequest], int]) -> tuple[Alternative, ...]:
    """Each untried option with its figure: `measure` of the request with it applied (`dataclasses.replace`).

    `measure` traces that request once, without a plan, at the smallest size, and returns the figure the budget
    is compared with; a step that fails, or settings that do not go together, leave the option without one.
    """
    alternatives = []
    for option in untried(request):
        if not option.figure:
            alternatives.append(Alternative(option.setting, None, "no figure here (predict its ranks to see one)",
                                            option.name))
            continue
        try:
            figure = measure(dataclasses.replace(request, **option.changes))
        except MemlayoutError as exc:
            alternatives.append(Alternative(option.setting, None, f"no figure, its step failed: {exc.message}",
                                            option.name))
        else:
            alternatives.append(Alternative(option.setting, figure, None, option.name))
    return tuple(alternatives)


def hint(alternatives: tuple[Alternative, ...], where: str, tail: list[str]) -> str:
    """The hint's text: each alternative with its figure (`where`: "at batch 1"), then `tail`'s other remedies."""
    tries = []
    for alternative in alternatives:
        said = f"{alternative.name} ({alternative.setting})" if alternative.name else alternative.setting
        if alternative.bytes is None:
            tries.append(f"{said}: {alternative.why}")
        else:
            tries.append(f"{said}: {human_bytes(alternative.bytes)} ({alternative.bytes} bytes)")
    head = f"try, the lowest-cost first (each figure: the step with that setting alone, {where}, before any plan): " \
        if any(alternative.bytes is not None for alternative in alternatives) else "try, the lowest-cost first: "
    return head + "; ".join([*tries, *tail])

