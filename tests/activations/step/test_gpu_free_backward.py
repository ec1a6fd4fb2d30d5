"""memlayout's own backward loop (gpu_free_backward.py) against torch's engine.

It replaces torch's engine only for fake CUDA tensors without a GPU, but nothing in it
is CUDA's: on CPU tensors, where torch's engine runs too, both must give the same
gradients and, on fake tensors, the same memory over time.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import memlayout.activations as act
from memlayout.activations.step import autograd_graph, gpu_free_backward
from memlayout.activations.step.run import give_first_gradients
from tests.activations import models


class _Square(torch.autograd.Function):
    """A custom Function whose forward takes a non-tensor argument too."""

    @staticmethod
    def forward(ctx, x, scale):  # type: ignore[no-untyped-def, override]
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * x * scale

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        (x,) = ctx.saved_tensors
        return 2 * x * grad * ctx.scale, None


class _Branches(nn.Module):
    """Splits, broadcasting, a reused layer, a custom Function and a dtype change: what the loop must sum and cast."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(8, 8)
        self.bias = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        left, right = self.a(x).split(8, dim=-1)
        shared = self.b(left) + self.b(right) + self.bias
        return (_Square.apply(shared, 0.5).double().sum(-1) + left.mean()).float()


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def test_the_loop_gives_the_gradients_torchs_engine_gives() -> None:
    torch.manual_seed(0)
    model = _Branches()
    x = torch.randn(4, 8)
    model(x).sum().backward()
    expected = _grads(model)
    model.zero_grad(set_to_none=True)
    gpu_free_backward.run_backward([model(x).sum()])
    for got, want in zip(_grads(model), expected, strict=True):
        torch.testing.assert_close(got, want)


def test_on_the_tested_torch_a_custom_functions_node_outlives_its_parent_while_python_holds_it() -> None:
    # torch 2.11 (the GPU machines' image) frees it; on 2.13 and 2.14 the loop needs to keep nothing alive.
    assert gpu_free_backward._custom_nodes_die_with_their_parent() is False


def test_where_torch_frees_a_custom_functions_node_early_the_loop_keeps_its_parents_and_still_agrees(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_free_backward, "_custom_nodes_die_with_their_parent", lambda: True)
    test_the_loop_gives_the_gradients_torchs_engine_gives()


def test_the_loop_runs_the_hooks_of_parameters() -> None:
    model = nn.Linear(3, 3)
    seen: list[str] = []
    model.weight.register_hook(lambda grad: seen.append("hook") or grad * 2)
    model.weight.register_post_accumulate_grad_hook(lambda p: seen.append("post"))
    gpu_free_backward.run_backward([model(torch.ones(2, 3)).sum()])
    assert seen == ["hook", "post"]
    torch.testing.assert_close(model.weight.grad, torch.full((3, 3), 4.0))


def test_a_tensor_that_needs_no_grad_is_refused_as_torch_refuses_it() -> None:
    with pytest.raises(RuntimeError, match="does not require grad"):
        gpu_free_backward.run_backward([torch.ones(())])


def _peaks() -> tuple[int, int, int]:
    """The step's peak and activation bytes, and the lowest peak a checkpoint plan reaches (it reruns forward
    inside backward)."""
    args, kwargs = models.token_inputs(2, 32, 500)
    report = act.analyze(models.gpt2(), list(args), kwargs=kwargs)
    with pytest.raises(act.BudgetUnreachableError) as lowest:
        act.analyze(models.gpt2(), list(args), kwargs=kwargs, budget=1)
    return report.summary.peak_bytes, report.summary.activation_bytes, lowest.value.lowest.peak_bytes


def test_a_fake_step_with_the_loop_has_the_peaks_of_torchs_engine() -> None:
    # Saved tensors must die as each node runs (the engine's release_variables); a loop that kept the graph
    # alive to the end would report forward's whole activation memory on top of backward's.
    engine = _peaks()
    with gpu_free_backward.backward_in_python():
        loop = _peaks()
    assert loop == engine


@pytest.mark.gpu
def test_on_a_gpu_the_loop_frees_memory_as_torchs_engine_does() -> None:
    # Real CUDA memory, by the caching allocator's own count: the loop's backward must peak where the engine's does.
    model = models.gpt2(dropout=0.0).cuda()
    (ids,), _ = models.token_inputs(8, 128, 500)
    ids = ids.cuda()

    def backward_peak(loop: bool) -> int:
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss = model(ids, labels=ids).loss
        if loop:
            holder = [loss]
            del loss
            gpu_free_backward.run_backward(holder)
        else:
            loss.backward()
            del loss
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    for loop in (False, True):  # cuBLAS takes a workspace per thread on first use: not what is compared
        backward_peak(loop)
    engine, by_loop = backward_peak(False), backward_peak(True)
    assert by_loop == pytest.approx(engine, rel=0.02)


class _PartlyUsed(nn.Module):
    """A used, an unused, a frozen and a shared parameter, and an embedding's: what a first backward touches."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.used = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        return self.head(self.frozen(self.used(self.embed(ids))) * extra).sum()


def test_the_leaves_reached_are_those_torchs_backward_gives_a_gradient() -> None:
    model = _PartlyUsed()
    ids, extra = torch.tensor([[1, 2, 3]]), torch.ones(4, requires_grad=True)
    loss = model(ids, extra)
    reached = {id(leaf) for leaf in autograd_graph.leaves_reached(loss.grad_fn)}
    loss.backward()
    given = {id(t) for t in [*model.parameters(), extra] if t.grad is not None}
    assert reached == given
    assert id(extra) in given and id(model.unused.weight) not in given and id(model.frozen.weight) not in given


def test_a_first_step_without_backward_gives_the_optimizer_the_state_a_real_first_step_does() -> None:
    def state_shapes(first_step: str) -> list[tuple[str, tuple[int, ...]]]:
        torch.manual_seed(0)
        model = _PartlyUsed()
        optimizer = torch.optim.AdamW(model.parameters())
        ids, extra = torch.tensor([[1, 2, 3]]), torch.ones(4)
        if first_step == "backward":
            model(ids, extra).backward()
        else:
            give_first_gradients(model, (ids, extra), {})
        optimizer.step()
        names = {id(p): n for n, p in model.named_parameters()}
        return sorted((names[id(p)], tuple(v.shape)) for p, state in optimizer.state.items()
                      for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)

    assert state_shapes("walk") == state_shapes("backward")
    assert any(name.startswith("used.") for name, _ in state_shapes("walk"))
