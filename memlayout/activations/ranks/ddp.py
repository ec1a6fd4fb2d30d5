"""DistributedDataParallel: its options, its gradient buckets, and how it runs under the fake process group.

What DDP adds to one rank's step, from torch's own code (torch/nn/parallel/distributed.py
and the C++ Reducer, torch/csrc/distributed/c10d/reducer.cpp):

- Every rank holds the whole model, its gradients and its optimizer's state.
- The Reducer keeps one flat gradient buffer per bucket, allocated with `at::empty` in
  `initialize_buckets` and kept for as long as the DDP module lives: the buckets hold as
  many bytes as the trainable parameters. At construction every parameter goes into one
  bucket; in the second step's forward (`_rebuild_buckets`) the Reducer frees it and
  allocates buckets in the order the first backward made gradients ready, up to
  `bucket_cap_mb` each (25 MiB when not given; then the first bucket takes at most
  1 MiB, `dist._DEFAULT_FIRST_BUCKET_BYTES`, and with a `bucket_cap_mb` given, as much as
  the others). A bucket closes once it reaches the cap, so it may pass it by one parameter.
- In backward, as each parameter's gradient is accumulated, the Reducer's hook divides it
  into the parameter's view of its bucket (`mul_out`, no allocation); a full bucket is
  allreduced in place. Without `gradient_as_bucket_view` the reduced values are copied
  back into `.grad`, so the gradients and the buckets both stay: the step holds the
  gradient bytes twice. With it, `.grad` becomes the view, and the gradient autograd made
  is freed as soon as it is copied in (after `zero_grad()` sets `.grad` to None, as it
  does by default, backward makes a new one every step).
- gloo reduces a CPU bucket in place (ProcessGroupGloo hands it the bucket's own memory as
  input and output): nothing goes through torch's allocator, and real ranks' allocator
  events show no allreduce temporaries (tests/activations/ranks/test_ddp_real.py).
- With buffers (BatchNorm's statistics), each forward first broadcasts them from rank 0
  (`broadcast_buffers`, on by default): `_broadcast_coalesced` flattens them into one
  temporary and copies them back.

Under torch's fake process group every collective completes at once, but its work's
future holds None where the Reducer reads the reduced bucket from it
(`parseCppCommHookResult`), so DDP's default reduction stops at the end of backward. DDP's
own way to replace its reduction, a communication hook, stands in for it there
(`BucketRecorder`): it divides the bucket in place and allreduces it in place as the
default does, and returns the bucket itself, so the Reducer's buffers live and die as on a
real rank. With a hook the Reducer copies each gradient into its view (`copy_`) instead of
dividing it in (`mul_out`): neither allocates. The hook also records each bucket, which the
report lists and the trace counts from the start of the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from memlayout import _torch

MIB = 1 << 20


@dataclass(frozen=True)
class DdpOptions:
    """DistributedDataParallel's arguments that decide a rank's memory; None or False is DDP's own default."""

    bucket_cap_mb: float | None = None
    """`bucket_cap_mb`: the size buckets close at, in MiB; None for DDP's default (25 MiB, the first 1 MiB)."""
    gradient_as_bucket_view: bool = False
    """`gradient_as_bucket_view`: each `.grad` is a view of its bucket instead of a tensor of its own."""

    def arguments(self) -> str:
        """The keyword arguments to DistributedDataParallel that differ from its defaults, as Python."""
        given = []
        if self.bucket_cap_mb is not None:
            given.append(f"bucket_cap_mb={self.bucket_cap_mb:g}")
        if self.gradient_as_bucket_view:
            given.append("gradient_as_bucket_view=True")
        return "".join(f", {argument}" for argument in given)

    def caps(self) -> tuple[int, int]:
        """(the first bucket's cap, every other bucket's cap) in bytes, as DDP computes them
        (`_BucketCapacityConfig.create`): a cap given applies to the first bucket too."""
        if self.bucket_cap_mb is None:
            return _torch.ddp_first_bucket_bytes(), _torch.ddp_default_bucket_cap_mb() * MIB
        cap = int(self.bucket_cap_mb * MIB)
        return cap, cap


class DdpBucket(NamedTuple):
    """One of the Reducer's gradient buckets, as the step's backward reduced it."""

    order: int
    """Its place in the reduction order (DDP's bucket index): bucket 0 holds the gradients backward makes first."""
    nbytes: int
    parameters: int
    """How many parameters' gradients it holds."""
    dtype: str


class DdpLayout(NamedTuple):
    """The Reducer's gradient buckets and the caps they were made under."""

    buckets: tuple[DdpBucket, ...]
    first_cap_bytes: int
    cap_bytes: int
    gradient_as_bucket_view: bool

    @property
    def nbytes(self) -> int:
        return sum(bucket.nbytes for bucket in self.buckets)


class BucketRecorder:
    """The communication hook DDP runs under the fake process group (`reduce`): DDP's default reduction, in place,
    recorded.

    `buckets` holds what the last backward reduced, by bucket index; `clear()` before a
    step so that a bucket the Reducer has since freed is not kept alive here.
    """

    def __init__(self) -> None:
        self.buckets: dict[int, tuple[Any, int]] = {}
        """index -> (the bucket's flat gradient tensor, how many parameters it holds)."""

    # Unannotated: DDP checks a hook's annotations against its own classes (`_check_comm_hook`), and this module's
    # annotations are postponed strings; it also reads the hook's `__name__`, so the hook is this bound method.
    def reduce(self, state, bucket):  # type: ignore[no-untyped-def]
        """The hook: record the bucket, average it in place, allreduce it in place, and give it back as the result."""
        import torch
        import torch.distributed as dist

        flat = bucket.buffer()
        self.buckets[bucket.index()] = (flat, len(bucket.parameters()))
        flat.div_(dist.get_world_size())  # the default hook's average, in place
        dist.all_reduce(flat, async_op=True).wait()  # the fake group's allreduce: in place, nothing to wait for
        future: torch.futures.Future[Any] = torch.futures.Future()
        future.set_result(flat)
        return future

    def clear(self) -> None:
        self.buckets.clear()

    def tensors(self) -> list[Any]:
        return [flat for flat, _ in self.buckets.values()]

    def layout(self, options: DdpOptions) -> DdpLayout:
        """The buckets the last backward reduced, with the caps `options` gave them."""
        buckets = tuple(
            DdpBucket(index, flat.numel() * flat.element_size(), count, str(flat.dtype).removeprefix("torch."))
            for index, (flat, count) in sorted(self.buckets.items())
        )
        return DdpLayout(buckets, *options.caps(), options.gradient_as_bucket_view)


def ddp_code(world_size: int, options: DdpOptions, model_dtype: str | None, checkpoint_imports: list[str],
             checkpoint_lines: list[str]) -> str:
    """Python that wraps a model in DDP as traced: `wrap(model)`, called on every rank, returns the module to train.

    Args:
        world_size: The number of ranks (said in the docstring; DDP reads it from the process group).
        options: DDP's arguments.
        model_dtype: The dtype the model is cast to first (`--dtype`), or None.
        checkpoint_imports: The imports the checkpoint lines need.
        checkpoint_lines: Lines, inside `wrap`, that checkpoint modules before the model is wrapped.
    """
    uses_torch = model_dtype or any("torch.ops." in line for line in checkpoint_imports)  # an op-level policy's ops
    lines = [*(["import functools", ""] if checkpoint_lines else []), *(["import torch"] if uses_torch else []),
             "from torch.nn.parallel import DistributedDataParallel", *checkpoint_imports, "", "",
             "def wrap(model):",
             f'    """Wrap `model` in DistributedDataParallel over {world_size} ranks; call it on every rank and train '
             'what it returns."""']
    if model_dtype:
        lines.append(f"    model.to(torch.{model_dtype})  # the parameters' own dtype, cast before wrapping")
    lines += checkpoint_lines
    lines.append(f"    return DistributedDataParallel(model{options.arguments()})")
    return "\n".join(lines) + "\n"


def run_ddp_code(code: str, model: Any) -> Any:
    """Apply DDP code (`ddp_code`) to a model, as the user's script would; the DDP module it returns."""
    namespace: dict[str, Any] = {}
    exec(compile(code, "<memlayout DDP code>", "exec"), namespace)
    return namespace["wrap"](model)
