"""What a request asks for, answered: one function for the five pipelines a `StepRequest` names.

`memlayout activations` is one command whose settings ask one of five questions
(request/vocabulary.py's `Pipeline`): the weights alone, one step on one device, each
rank of a sharded step, the largest size that fits, or the step at each size of a
sweep. `predict` answers the one the request asks; `analyze`, `analyze_ranks`, `fit`
and `weights_report` each answer one.
"""

from __future__ import annotations

from typing import assert_never

from memlayout.activations.analysis import ActivationReport, predict_step
from memlayout.activations.fit.size_search import FitReport, predict_fit
from memlayout.activations.fit.sweep import SweepReport, predict_sweep
from memlayout.activations.ranks import predict_ranks
from memlayout.activations.ranks.facts import RanksReport
from memlayout.activations.request.step_request import StepRequest
from memlayout.activations.request.vocabulary import Pipeline
from memlayout.activations.weights import WeightsReport, predict_weights

Prediction = WeightsReport | ActivationReport | RanksReport | FitReport | SweepReport
"""What `predict` returns: one report per pipeline."""


def predict(request: StepRequest) -> Prediction:
    """The answer to the request's pipeline.

    Raises:
        BudgetUnreachableError, RanksBudgetUnreachableError, NothingFitsError: no plan, or no size, fits the budget.
        SettingError, UsageError: the model cannot be built or stepped as asked.

    Example:
        >>> from memlayout.activations import StepRequest, predict  # doctest: +SKIP
        >>> report = predict(StepRequest("gpt2/", input=("int64[8,1024]<50257",), fit="batch", gpu="h100"))
        >>> report.with_plan.size  # the largest batch a checkpoint plan fits on an H100
    """
    pipeline = request.pipeline
    if pipeline is Pipeline.WEIGHTS:
        return predict_weights(request)
    if pipeline is Pipeline.STEP:
        return predict_step(request)
    if pipeline is Pipeline.RANKS:
        return predict_ranks(request)
    if pipeline is Pipeline.FIT:
        return predict_fit(request)
    if pipeline is Pipeline.SWEEP:
        return predict_sweep(request)
    if pipeline is None:  # __post_init__ reads it off the settings
        raise AssertionError("a StepRequest always has its pipeline")
    assert_never(pipeline)
