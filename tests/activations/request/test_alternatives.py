"""What a nothing-fits hint names: the settings a request did not use, the lowest-cost first, each with a figure."""

from __future__ import annotations

from memlayout.activations.request.alternatives import hint, predicted, untried
from memlayout.activations.request.step_request import StepRequest
from memlayout.errors import Alternative, UsageError

SPECS = ("int64[1,64]<500", "labels=int64[1,64]<500")


def test_a_training_step_is_offered_bf16_lora_qlora_then_more_ranks() -> None:
    options = untried(StepRequest("pkg.mod:build", input=SPECS))
    assert [(o.name, o.setting) for o in options] == [
        ("bf16", "`dtype=bf16`"), ("LoRA", "`lora=16`"), ("QLoRA", "`lora=16` with `quantize=nf4`"),
        ("more ranks", "`world_size=8` with `fsdp=True`")]


def test_what_the_request_already_does_is_not_offered() -> None:
    options = untried(StepRequest("pkg.mod:build", input=SPECS, autocast="bf16", lora=8))
    # LoRA is not traced across ranks (request/rules.py): a hint names nothing the command would refuse
    assert [o.setting for o in options] == ["`lora=8` with `quantize=nf4`"]
    assert [o.setting for o in untried(StepRequest("pkg.mod:build", input=SPECS, dtype="bf16", world_size=4,
                                                   fsdp=True))] == ["`world_size=8`"]
    assert [o.name for o in untried(StepRequest("pkg.mod:build", input=SPECS, step="inference"))] == ["bf16"]


def test_an_option_whose_step_fails_is_named_without_a_figure_and_says_why() -> None:
    def measure(request: StepRequest) -> int:
        if request.quantize is not None:
            raise UsageError("bitsandbytes is not installed")
        return 1000 if request.lora is None else 500

    alternatives = predicted(StepRequest("pkg.mod:build", input=SPECS), measure)
    assert [a.bytes for a in alternatives] == [1000, 500, None, None]
    assert alternatives[2].why == "no figure, its step failed: bitsandbytes is not installed"
    text = hint(alternatives, "at batch 1", ["raise `budget`"])
    assert text.startswith("try, the lowest-cost first (each figure: the step with that setting alone, at batch 1")
    assert "bf16 (`dtype=bf16`): 1000 B (1000 bytes); LoRA (`lora=16`): 500 B (500 bytes); QLoRA" in text
    assert text.endswith("; raise `budget`")


def test_a_command_line_error_names_the_alternatives_as_flags() -> None:
    from memlayout.cli.activations_options import flag
    from memlayout.errors import NothingFitsError

    error = NothingFitsError("batch", 10, 20, "try `dtype=bf16`", (Alternative("`lora=16` with `quantize=nf4`", 5),))
    error.respell(flag)
    assert error.alternatives[0].setting == "--lora 16 with --quantize nf4" and error.hint == "try --dtype bf16"
