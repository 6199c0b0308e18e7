"""One rank's epoch, planned alone: its records, its reads and the mount of each, at a cost that grows
with its own share of the epoch, not with the dataset or the world.

It composes what :class:`dlstore.Dataset` composes for a rank whose mounts all hold every shard
(replicated): the rank's mounts (:data:`~dlstore.placement.mounts.ASSIGNMENTS`), each consumer's read
plan (:meth:`~dlstore.placement.sharding.EpochPlan.read_plan`) and the mount of each block
(:func:`~dlstore.placement.mounts.replicated_mounts`), with the mounts taking turns. It needs record
counts only, so that a dataset of any size can be planned from numbers (``dlstore plan --simulate``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from dlstore.errors import PlacementError
from dlstore.placement.mounts import ASSIGNMENTS, _check_assignment, read_in_turns, replicated_mounts
from dlstore.placement.sharding import EpochPlan, ReadOrder, merge_runs

__all__ = ["RankPlan", "plan_rank"]


@dataclass
class RankPlan:
    """What one rank reads in one epoch.

    Attributes
    ----------
    rank : int
    mounts : list of int
        The rank's mounts.
    reads : list of ReadOrder
        Per DataLoader worker of the rank, its read plan from the start of the epoch.
    mount_of : list of numpy.ndarray
        Per worker, the mount each record of its read plan is read through.
    """

    rank: int
    mounts: List[int]
    reads: List[ReadOrder] = field(default_factory=list)
    mount_of: List[np.ndarray] = field(default_factory=list)

    @property
    def records(self) -> int:
        """Records the rank reads."""
        return sum(len(r.shards) for r in self.reads)

    @property
    def pieces(self) -> int:
        """Runs of consecutive records of one shard in the rank's reading order (reads of one piece
        each, at most)."""
        return sum(len(merge_runs(r.shards, r.records)[0]) for r in self.reads)

    def records_per_mount(self) -> Dict[int, int]:
        """Records read through each of the rank's mounts."""
        if not self.mount_of:
            return {}
        mounts, counts = np.unique(np.concatenate(self.mount_of), return_counts=True)
        return {int(m): int(c) for m, c in zip(mounts.tolist(), counts.tolist())}


def plan_rank(counts: Sequence[int], world_size: int, rank: int, *, num_mounts: int = 1, mounts_per_rank: int = 1,
              policy: str = "rank", throughput: Optional[Sequence[float]] = None, local_rank: Optional[int] = None,
              num_workers: int = 1, **order) -> RankPlan:
    """The plan of rank ``rank`` of ``world_size`` for one epoch over shards of ``counts`` records,
    on ``num_mounts`` mounts that each hold every shard.

    Parameters
    ----------
    counts : sequence of int
        Records per shard.
    world_size, rank : int
    num_mounts, mounts_per_rank, policy, throughput
        As for :func:`~dlstore.placement.mounts.assign_mounts`.
    local_rank : int, optional
        For the ``local_rank`` policy (default: ``rank``).
    num_workers : int
        DataLoader workers of each rank.
    **order
        ``seed``, ``epoch``, ``shuffle_shards``, ``shuffle``, ``buffer_size``, ``block_records``,
        ``block_window``, ``remainder``, ``batch_size`` as for :class:`EpochPlan`.
    """
    if world_size < 1 or num_workers < 1 or not 0 <= rank < world_size:
        raise PlacementError(f"rank {rank} of a world of {world_size} ranks x {num_workers} workers is not a place")
    if num_mounts < 1:
        raise PlacementError(f"a plan needs at least one mount, not {num_mounts}")
    weights = _check_assignment(num_mounts, policy, mounts_per_rank, throughput)
    local = rank if local_rank is None else local_rank
    mounts = ASSIGNMENTS[policy](num_mounts, np.array([rank]), np.array([local]), mounts_per_rank, weights)[0]
    plan = EpochPlan(counts, world_size * num_workers, **order)
    out = RankPlan(rank, [int(m) for m in mounts])
    for worker in range(num_workers):
        consumer = rank * num_workers + worker
        shards, records = plan.read_sequence(consumer)
        mount = replicated_mounts(shards + records // plan.block_records, mounts)
        turns = read_in_turns(shards, records, records // plan.block_records, mount) if len(mounts) > 1 else None
        out.reads.append(plan.read_plan(consumer, 0, reorder=turns))
        out.mount_of.append(mount if turns is None else mount[turns])
    return out
