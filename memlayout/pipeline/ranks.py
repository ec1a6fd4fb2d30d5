"""`memlayout inspect` under torchrun: every rank reads its own pieces of a sharded model, and they share them.

`torchrun --nproc_per_node N -m memlayout inspect pkg.module:build` starts N
processes. Each joins the default process group, then builds the model (the
builder shards it: FSDP2, DTensor, and may ask the group its size), reads
the facts of its own pieces, and the ranks share what they hold
(`all_gather_object`), so that every rank sees every rank's pieces and the rules
that compare ranks (ML302, ML303) run on all of them. Rank 0 writes the one
report; the others write nothing, and every rank exits with rank 0's status.

The collectives stay in step whatever fails: each rank shares exactly once per
import spec, its facts or the one-line error it hit, and a path that failed on
any rank fails on all of them, naming the rank.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from memlayout.core.facts import Facts
from memlayout.core.shards import rank_record
from memlayout.errors import RankFailedError
from memlayout.load.records import RankRecord

_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class RankExchange:
    """This process's place among the ranks torchrun started, and the sharing of facts between them."""

    rank: int
    world_size: int
    local_rank: int
    pending: bool = False
    """This rank has started a path and not yet shared its outcome."""

    @classmethod
    def from_environment(cls) -> RankExchange | None:
        """The ranks a launcher (torchrun) started, from the variables it sets; None for one process."""
        if not all(name in os.environ for name in _LAUNCHER_VARIABLES):
            return None
        try:
            rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            local_rank = int(os.environ["LOCAL_RANK"])
        except ValueError:
            return None
        return cls(rank, world_size, local_rank) if world_size > 1 else None

    @property
    def first(self) -> bool:
        return self.rank == 0

    def ensure_group(self) -> None:
        """Join the default process group, if nobody has: nccl where CUDA is, gloo elsewhere."""
        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            return
        backend = "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)
            backend = "nccl"
        dist.init_process_group(backend)

    def _gather(self, mine: Any) -> list[Any]:
        import torch.distributed as dist

        self.ensure_group()
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        self.pending = False
        return gathered

    def begin(self) -> None:
        """This rank starts a path that builds a model: join the group first.

        A builder asks the group for its size or rank to make its device mesh, as a
        training script does (`dist.get_world_size()`), so the group must exist before
        the builder runs, not only when the ranks first share their facts.
        """
        self.ensure_group()
        self.pending = True

    def share_facts(self, facts: Facts) -> Facts:
        """This rank's facts with every rank's record attached.

        Raises:
            RankFailedError: another rank failed on this path.
        """
        gathered: list[tuple[RankRecord | None, str | None]] = self._gather((rank_record(facts), None))
        failed = [(rank, error) for rank, (_, error) in enumerate(gathered) if error is not None]
        if failed:
            rank, error = failed[0]
            raise RankFailedError(f"on rank {rank}: {error}", "")
        records = tuple(record for record, _ in gathered if record is not None)
        return replace(facts, ranks=records, world_size=len(records))

    def share_failure(self, error: str) -> None:
        """Tell the other ranks this rank failed on the path (they fail it too)."""
        if self.pending:
            self._gather((None, error))

    def agree(self, code: int) -> int:
        """Rank 0's exit status, on every rank; rank 0 has written everything by then."""
        import torch.distributed as dist

        self.ensure_group()
        shared = [code]
        dist.broadcast_object_list(shared, src=0)
        return int(shared[0])

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """Ranks other than 0 print nothing: rank 0 speaks for all of them."""
        if self.first:
            yield
            return
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
