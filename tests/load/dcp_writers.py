"""torch.distributed.checkpoint directories written by DCP's own writer on two real gloo ranks.

A replicated DTensor whose ranks' values drifted apart (rank r holds r + 1
everywhere), saved with DCP's `DefaultSavePlanner` (which keeps one replica) and
with a subclass that keeps every rank's replica, as a planner may: DCP's writer
then writes both copies and lists the chunk twice in `.metadata`. DCP's own
global-plan check would refuse that ("overlapping chunks"), so the subclass
builds the global plan without it.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import ChainMap
from pathlib import Path
from typing import Any

SHAPE = (4, 3)


def _keep_every_replica_planner() -> Any:
    from torch.distributed.checkpoint.default_planner import (
        DefaultSavePlanner,
        create_default_global_save_plan,
    )

    class KeepEveryReplica(DefaultSavePlanner):
        """Every rank writes its replica (what `dedup_replicated_tensors=False` once asked for), unchecked."""

        def _dedup_save_plans(self, all_plans: Any) -> Any:
            return all_plans

        def _create_global_plan(self, all_plans: Any) -> Any:
            # DefaultSavePlanner's own, less _validate_global_plan, which refuses overlapping chunks.
            global_plan, metadata = create_default_global_save_plan(all_plans)
            merged = dict(ChainMap(*[plan.planner_data for plan in global_plan]))
            return global_plan, dataclasses.replace(metadata, planner_data=merged)

    return KeepEveryReplica()


def _rank(rank: int, world_size: int, folder: str, rendezvous: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate

    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world_size)
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        local = torch.full(SHAPE, float(rank + 1))
        state = {"w": DTensor.from_local(local, mesh, [Replicate()], run_check=False)}
        dcp.save(state, checkpoint_id=str(Path(folder, "default")))
        dcp.save(state, checkpoint_id=str(Path(folder, "every-replica")), planner=_keep_every_replica_planner())
    finally:
        dist.destroy_process_group()


def save_replicas(folder: Path) -> tuple[Path, Path]:
    """Save two ranks' drifted replicas of "w" twice under `folder`, in one pair of processes.

    Returns:
        (the directory DCP's own planner wrote, the one the planner keeping every replica wrote).
    """
    import torch.multiprocessing as mp

    folder.mkdir(parents=True, exist_ok=True)
    rendezvous = folder / "rendezvous"
    mp.start_processes(_rank, args=(2, str(folder), str(rendezvous)), nprocs=2, start_method="spawn")
    return folder / "default", folder / "every-replica"


def _overlapping_rows_planner(rows: list[tuple[int, int]], drift: float, validate: bool) -> Any:
    import torch
    from torch.distributed.checkpoint.default_planner import (
        DefaultSavePlanner,
        create_default_global_save_plan,
    )
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        MetadataIndex,
        TensorProperties,
    )
    from torch.distributed.checkpoint.planner import (
        SavePlan,
        TensorWriteData,
        WriteItem,
        WriteItemType,
    )

    class OverlappingRows(DefaultSavePlanner):
        """Writes "w" as chunks of the given rows, each later chunk's values drifted by `drift`."""

        def create_local_plan(self) -> Any:
            w = self.state_dict["w"]
            self.plan = SavePlan([
                WriteItem(
                    index=MetadataIndex("w", torch.Size([start, 0])),
                    type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=ChunkStorageMetadata(torch.Size([start, 0]), torch.Size([end - start, w.shape[1]])),
                        properties=TensorProperties.create_from_tensor(w),
                        size=w.size(),
                    ),
                )
                for start, end in rows
            ], planner_data=self.mappings)
            return self.plan

        def resolve_data(self, write_item: Any) -> Any:
            start = write_item.index.offset[0]
            end = start + write_item.tensor_data.chunk.sizes[0]
            return self.state_dict["w"][start:end] + (drift if start else 0.0)

        def _create_global_plan(self, all_plans: Any) -> Any:
            if validate:
                return super()._create_global_plan(all_plans)
            return create_default_global_save_plan(all_plans)

    return OverlappingRows()


def save_overlapping_rows(directory: Path, weight: Any, rows: list[tuple[int, int]], drift: float = 100.0,
                          validate: bool = False) -> Path:
    """dcp.save of {"w": weight} in one process, as chunks of `rows` (which may overlap), by DCP's own writer.

    With `validate`, DCP's global-plan check runs as DefaultSavePlanner runs it (and refuses an overlap).
    """
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": weight}, checkpoint_id=str(directory), planner=_overlapping_rows_planner(rows, drift, validate))
    return directory
