"""What `memlayout activations --world-size N` finds: each rank's peak, the plan, the whole report.

Plain frozen data, read by the planner (plan.py) and the reporter
(report/ranks.py); the tracing that makes it is rank_step.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from memlayout.activations.device.cuda_runtime import CudaRuntime
from memlayout.activations.device.gpus import GpuSpec
from memlayout.activations.ranks.ddp import DdpLayout
from memlayout.activations.ranks.parallel import Sharding
from memlayout.activations.summary import PeakAt, Summary


@dataclass(frozen=True)
class RankReserved:
    """What the CUDA caching allocator's model reads for one rank's steps (ranks/allocations.py)."""

    allocated_bytes: int
    """`torch.cuda.max_memory_allocated()`: the peak of the allocated blocks."""
    reserved_bytes: int
    """`torch.cuda.max_memory_reserved()`: the peak of the segments, every stream's pool together."""
    reserved_by_stream: tuple[tuple[str, int], ...]
    """(stream, bytes of its segments) at the reserved peak: what each of FSDP2's streams' pools held."""
    events: int
    """Allocations and frees of one step, replayed."""


@dataclass(frozen=True)
class RankPeak:
    """One rank's peak over a steady-state training step, as FSDPMemTracker counts it.

    The kinds add up to `peak_bytes`: they are what is alive at the peak.
    """

    rank: int
    same_layout: tuple[tuple[int, int], ...]
    """The ranks whose shards have this rank's shapes (its step is theirs), as inclusive ranges."""
    peak_bytes: int
    parameter_bytes: int
    """This rank's shards, plus the parameters gathered whole for the module running at the peak."""
    buffer_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    """Tensors made in forward (and in a checkpointed module's rerun) that are alive at the peak."""
    temporary_bytes: int
    """Tensors made in backward and the loss that are alive at the peak (gradients of activations)."""
    input_bytes: int
    communication_bytes: int
    """All-gather and reduce-scatter buffers alive at the peak."""
    peak_at: PeakAt
    shard_bytes: int
    """Bytes of this rank's parameter shards, padding excluded."""
    tracker: Mapping[str, int]
    """The accounting's own categories at the peak, as it names them: FSDPMemTracker's under FSDP2, memlayout's
    trace's (summary.Summary.at_peak) under DDP."""
    forward_flops: int
    reserved: RankReserved | None = None
    """The caching allocator's model fed by this rank's own allocations, on CUDA; None on the CPU."""
    compared_bytes: int | None = None
    """On CUDA: the reserved peak plus what the CUDA runtime holds beside the step (context, cuBLAS, workspaces;
    device/cuda_runtime.py): what must fit the card, and what a budget is compared with. None on the CPU."""

    @property
    def judged_bytes(self) -> int:
        """What a budget is compared with: `compared_bytes` on CUDA, the peak of live tensors on the CPU."""
        return self.peak_bytes if self.compared_bytes is None else self.compared_bytes

    @classmethod
    def of_trace(cls, summary: Summary, world_size: int, shard_bytes: int, peak_at: PeakAt) -> RankPeak:
        """A rank traced by memlayout's own tracer (DDP, tensor-parallel serving), every rank alike: its summary's
        peak in the report's kinds (they add up to the peak), `peak_at` named as the user holds the model."""
        at = summary.at_peak
        return cls(
            rank=0,
            same_layout=((0, world_size - 1),),
            peak_bytes=summary.peak_bytes,
            parameter_bytes=at["parameters"],
            buffer_bytes=at["buffers"],
            gradient_bytes=at["gradients"],
            optimizer_bytes=at["optimizer_state"],
            activation_bytes=at["saved_activations"],
            temporary_bytes=at["other"],
            input_bytes=at["inputs"],
            communication_bytes=at.get("communication", 0),
            peak_at=peak_at,
            shard_bytes=shard_bytes,
            tracker=dict(at),
            forward_flops=summary.forward_flops,
        )


@dataclass(frozen=True)
class RanksCard:
    """The GPU ranks are traced for, and what the CUDA runtime holds beside each rank's step on it."""

    gpu: GpuSpec
    runtime: CudaRuntime
    expandable_segments: bool
    """Whether the allocator was modelled with `expandable_segments:True` (PYTORCH_CUDA_ALLOC_CONF)."""
    unmodelled: tuple[str, ...] = ()
    """PYTORCH_CUDA_ALLOC_CONF settings the allocator's model does not follow."""


@dataclass(frozen=True)
class RankLayout:
    """Ranks whose parameter shards have the same shapes."""

    ranks: tuple[int, ...]
    shard_bytes: int


@dataclass(frozen=True)
class RanksPlan:
    """A plan for a budget and what tracing the ranks with it applied measured."""

    budget_bytes: int
    sharding: Sharding
    """The sharding with the plan applied; `sharding.code()` applies it."""
    resharded: tuple[str, ...]
    """Wrapped modules the plan turns `reshard_after_forward` on for."""
    offload: bool
    ranks: tuple[RankPeak, ...]
    """Each traced rank layout with the plan applied."""
    estimated_peak_bytes: int | None
    """The single-device planner's estimate for the checkpoint part, moved by the sharding's own bytes."""
    recompute_flops: int
    """Forward FLOPs the checkpointed modules rerun in backward, as one device runs them (with
    tensor parallel each rank reruns its share)."""
    checks: int
    """Plans traced to find this one."""
    pitfalls: tuple[str, ...]
    excluded: tuple[tuple[str, str], ...] = ()
    """(module, why) for the modules the checkpoint search left out: they cannot be checkpointed."""

    @property
    def peak_bytes(self) -> int:
        return max(r.peak_bytes for r in self.ranks)

    @property
    def judged_bytes(self) -> int:
        """The largest rank's figure the budget was compared with (`RankPeak.judged_bytes`)."""
        return max(r.judged_bytes for r in self.ranks)

    @property
    def empty(self) -> bool:
        return not (self.resharded or self.offload or self.sharding.checkpoint or self.sharding.sequential)


@dataclass(frozen=True)
class RanksReport:
    """Everything `memlayout activations --world-size N --fsdp` (or `--ddp`) reports."""

    target: str | None
    target_kind: str
    model_class: str
    inputs: tuple[str, ...]
    device: str
    loss: str
    optimizer: str
    sharding: Sharding
    ranks: tuple[RankPeak, ...]
    """One per traced layout, the largest shards first (rank 0)."""
    layouts: int
    """Distinct rank layouts; more than `len(ranks)` when some were not traced."""
    notes: tuple[str, ...]
    plan: RanksPlan | None = None
    """The plan for `--budget`, when one was given."""
    autocast: str | None = None
    """bf16 or fp16 when each rank's forward and loss ran under `torch.autocast`; None otherwise."""
    dtype: str | None = None
    """bf16, fp16 or fp32 when the model was cast before sharding (`--dtype`); None: as built."""
    optimizer_state_dtype: str | None = None
    """The dtype of the optimizer's state as torch made it on the traced rank (bfloat16, float32, ...), None
    without state: torch's optimizers keep it in their parameters' dtype, so a sharded bf16 model's is bf16."""
    class_chosen_by: str = ""
    """Why the model is a `model_class` (as `ActivationReport.class_chosen_by`)."""
    ddp: DdpLayout | None = None
    """Under DDP, the Reducer's gradient buckets the traced step reduced, in their order; None under FSDP2."""
    step: str = "train"
    """train, or inference for tensor-parallel serving (`sharding.serving`)."""
    card: RanksCard | None = None
    """On CUDA: the GPU the ranks were traced for and what each rank's figures are compared with there."""
    recipe: tuple[str, ...] = ()
    """The training recipe's choices, in words (optimizer implementation, clipping, checkpointing)."""

    @property
    def largest(self) -> RankPeak:
        return max(self.ranks, key=lambda r: (r.judged_bytes, r.peak_bytes, -r.rank))

    @property
    def summary(self) -> Summary:
        """The largest rank's figures, in the single-device report's terms."""
        r = self.largest
        return Summary(
            peak_bytes=r.peak_bytes,
            allocator_peak_bytes=r.reserved.allocated_bytes if r.reserved is not None else None,
            reserved_peak_bytes=r.reserved.reserved_bytes if r.reserved is not None else None,
            activation_bytes=r.activation_bytes,
            parameter_bytes=r.parameter_bytes,
            buffer_bytes=r.buffer_bytes,
            gradient_bytes=r.gradient_bytes,
            input_bytes=r.input_bytes,
            optimizer_bytes=r.optimizer_bytes,
            peak_at=r.peak_at,
            at_peak={
                "parameters": r.parameter_bytes, "buffers": r.buffer_bytes, "inputs": r.input_bytes,
                "gradients": r.gradient_bytes, "optimizer_state": r.optimizer_bytes,
                "saved_activations": r.activation_bytes, "other": r.temporary_bytes,
                "communication": r.communication_bytes,
            },
            forward_flops=r.forward_flops,
            recompute_flops=0,
        )
