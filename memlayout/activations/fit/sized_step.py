"""The request's step built once and traced at any size of its batch or sequence: what `--fit` and `--sweep` share.

The model is built once (`prepare_step`); each size re-makes the `--input` specs with
the scaled dimensions set to it (`specs_at`) and traces the step again on fake (or meta)
tensors. Every trace of the plain step joins the step's size laws (size_laws.py), from
which a size between traced ones may be evaluated instead of traced.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

from memlayout.activations.analysis import (
    ActivationReport,
    PreparedStep,
    _step_failed,
    prepare_step,
    roofline_text,
)
from memlayout.activations.facts import Trace
from memlayout.activations.fit.size_laws import SizeLaws
from memlayout.activations.generate_summary import summarize_generation
from memlayout.activations.model.adapters import parameter_split
from memlayout.activations.model.input_specs import InputSpec, position_limit
from memlayout.activations.request.step_request import StepRequest
from memlayout.activations.step.generate import generation_of
from memlayout.activations.step.run import torch_dtype
from memlayout.activations.summary import Summary, module_facts, summarize
from memlayout.errors import MemlayoutError

KEPT_TRACES = 3
"""Traces of the plain step kept for the plan search and the report; older ones are traced again if needed."""


class ScaledDim(NamedTuple):
    """One input dimension the search scales."""

    input: str
    """The input's spec as given (`input_ids=int64[4,128]<32000`)."""
    dim: int


def specs_at(specs: Sequence[InputSpec], dims: Sequence[ScaledDim], size: int) -> list[InputSpec]:
    """The specs with every scaled dimension set to `size`."""
    by_input = {d.input: d.dim for d in dims}
    out = []
    for spec in specs:
        dim = by_input.get(spec.describe())
        if dim is not None:
            shape = list(spec.shape)
            shape[dim] = size
            spec = dataclasses.replace(spec, shape=tuple(shape))
        out.append(spec)
    return out


class SizedStep:
    """The request's model built once in its tensor world, traced at any size of the scaled dimensions."""

    def __init__(self, request: StepRequest, specs: list[InputSpec], dims: tuple[ScaledDim, ...]) -> None:
        self.request, self.specs, self.dims = request, specs, dims
        self.prepared: PreparedStep = prepare_step(request, inputs=specs,
                                                   mode="meta" if request.device == "meta" else "fake")
        self.step = self.prepared.world
        self.cuda = self.step.device.startswith("cuda")
        self.size: int | None = None
        self.traced: dict[int, tuple[Trace, Summary]] = {}
        """size -> (trace, summary) of the plain step, the latest KEPT_TRACES of them."""
        self.summaries: dict[int, Summary] = {}
        """size -> the plain step's summary at every size traced, kept when its trace is not."""
        self.laws = SizeLaws(cuda=self.cuda)
        """What the plain step's traces say about the sizes between them (size_laws.py)."""

    @property
    def given_size(self) -> int:
        """The size the scaled dimensions have in the specs as given."""
        first = self.dims[0]
        return self.specs[[s.describe() for s in self.specs].index(first.input)].shape[first.dim]

    def at(self, size: int) -> None:
        """The step's inputs made at `size` (the model is left as it is)."""
        if self.size == size:
            return
        self.step.make_inputs(specs_at(self.specs, self.dims, size), None)
        if self.request.dtype is not None:
            self.step.cast_inputs(torch_dtype(self.request.dtype))
        self.size = size

    def trace(self, size: int) -> tuple[Trace, Summary]:
        """The plain step traced at `size`, and its summary.

        Raises:
            UsageError: the model's forward refused this size.
        """
        self.at(size)
        if size not in self.traced:
            try:
                trace = self.step.trace()
            except MemlayoutError:
                raise
            except Exception as exc:  # the model's forward refused this size
                raise _step_failed(exc, self.step) from exc
            self.traced[size] = (trace, summarize(trace, cuda=self.cuda))
            self.summaries[size] = self.traced[size][1]
            self.laws.add(size, trace)
            while len(self.traced) > KEPT_TRACES:  # a 7B model's trace is tens of MB of records
                del self.traced[next(iter(self.traced))]
        return self.traced[size]

    def traced_summary(self, size: int) -> Summary | None:
        """The plain step's summary at `size` where it was traced; None where it was not."""
        return self.summaries.get(size)

    def evaluated(self, size: int) -> Summary | None:
        """The plain step's summary at `size` evaluated from the traced sizes (size_laws.py), without its FLOPs
        and times; None where the laws do not cover `size`."""
        if size in self.laws.samples:
            return None
        return self.laws.summary(size)

    def report(self, size: int) -> ActivationReport:
        """The plain step's report at `size`, as one prediction there gives it (without a plan), from a trace."""
        trace, summary = self.trace(size)
        step, request, prepared = self.step, self.request, self.prepared
        generation = generation_of(request)
        return ActivationReport(
            target=prepared.target_text, target_kind=prepared.kind, model_class=type(step.model).__name__,
            inputs=step.descriptions, device=step.device, mode=step.mode, loss=trace.loss,
            optimizer=request.step_optimizer, summary=summary, modules=module_facts(trace), plan=None,
            notes=tuple(prepared.notes), trace=trace, autocast=request.autocast, dtype=request.dtype,
            step=request.step, class_chosen_by=prepared.class_chosen_by, roofline=roofline_text(step),
            parameters=parameter_split(step.model), adapted=step.adapted,
            generation=summarize_generation(trace, generation) if generation is not None else None,
        )

    def position_limit(self) -> tuple[str, int] | None:
        """(what, positions): the longest sequence the model takes, where its config says; None where it does not.
        Fake tensors do not check an index against a table's size, so a longer one would trace where the real step
        fails."""
        limit = position_limit(self.step.model)
        generation = generation_of(self.request)
        if limit is None or generation is None:
            return limit
        # The prompt and the tokens generated after it share the model's positions.
        name, positions = limit
        return f"{name} less --new-tokens {generation.new_tokens}", positions - generation.new_tokens
