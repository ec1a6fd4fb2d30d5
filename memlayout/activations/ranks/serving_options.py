"""What tensor-parallel serving ranks (`--step inference` or `generate`, `--world-size K --tp K`) accept: checked
with the other sharding options (parallel.py), before anything is built."""

from __future__ import annotations

from typing import Any, Protocol

from memlayout.errors import UsageError


class ServingOptions(Protocol):
    """The sharding options serving ranks are checked on (parallel.py's ShardingOptions, frozen: read-only)."""

    @property
    def serving(self) -> str | None: ...
    @property
    def world_size(self) -> int: ...
    @property
    def tp(self) -> int: ...
    @property
    def fsdp(self) -> bool: ...
    @property
    def ddp(self) -> Any: ...
    @property
    def param_dtype(self) -> str | None: ...
    @property
    def reduce_dtype(self) -> str | None: ...


def check_serving(options: ServingOptions) -> None:
    """Raises UsageError for serving ranks asked with what they do not run: --fsdp or --ddp (they shard a training
    step), a --tp that is not --world-size, or FSDP2's dtypes."""
    said, world_size, tp = f"--step {options.serving}", options.world_size, options.tp
    training_flag = "--ddp" if options.ddp is not None else "--fsdp" if options.fsdp else None
    fsdp_dtypes = {"--param-dtype": options.param_dtype, "--reduce-dtype": options.reduce_dtype}
    if training_flag is not None:
        raise UsageError(f"{said} with --world-size is traced as tensor-parallel serving, and {training_flag} shards "
                         "a training step", f"give --world-size {world_size} --tp {world_size} alone")
    if tp != world_size:
        raise UsageError(f"{said} with --world-size {world_size} needs --tp {world_size}: the ranks are one "
                         "tensor-parallel group (each replica of a server is a group of its own)",
                         f"give --tp {world_size}, or --world-size {tp} for groups of {tp}" if tp > 1 else
                         f"give --tp {world_size}")
    for name, value in fsdp_dtypes.items():
        if value is not None:
            raise UsageError(f"{name} is FSDP2's, and {said} ranks run no FSDP2",
                             f"leave {name} out; --dtype casts the model")
