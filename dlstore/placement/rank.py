"""One consumer's epoch, planned: the records it reads, in which order, the block of each and the mount
each is read through, and the order it hands them out in. The one planner: :class:`dlstore.Dataset`
reads its plan, ``dlstore plan`` prints it and ``dlstore plan --simulate`` runs it over counts alone.

It composes the epoch's plan (:meth:`~dlstore.placement.sharding.EpochPlan.read_plan`) with the mount
of each block (:func:`~dlstore.placement.mounts.mounts_for`, or
:func:`~dlstore.placement.mounts.replicated_mounts` when every mount holds every shard) and, for a
rank with several mounts, the order in which those mounts take turns
(:func:`~dlstore.placement.mounts.read_in_turns`). Its cost grows with the consumer's own share of the
epoch, not with the dataset or the world. Pure: no file is touched.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np

from dlstore.placement.mounts import Layout, mounts_for, read_in_turns, replicated_mounts
from dlstore.placement.sharding import EpochPlan

__all__ = ["RankPlan", "plan_rank"]


class RankPlan(NamedTuple):
    """What one consumer reads of an epoch from a point on, as arrays in reading order.

    Attributes
    ----------
    shards, records, blocks : numpy.ndarray
        Per record read: its shard, its index in the shard and its block of the shard (int64).
    mounts : numpy.ndarray
        Per record read: the mount it is read through (an index into the layout's mounts; 0
        without mounts).
    emit : numpy.ndarray or None
        The order records are handed out in, as indices into the arrays above; None: as read.
    """

    shards: np.ndarray
    records: np.ndarray
    blocks: np.ndarray
    mounts: np.ndarray
    emit: Optional[np.ndarray]


#: ``(shards, blocks) -> mounts``: where the blocks of a failed mount are read instead.
Remap = Callable[[np.ndarray, np.ndarray], np.ndarray]


def plan_rank(plan: EpochPlan, consumer: int, rank_mounts: Sequence[int] = (), *, layout: Optional[Layout] = None,
              emitted: int = 0, failed: Sequence[int] = (), remap: Optional[Remap] = None) -> RankPlan:
    """The reads of ``consumer`` in ``plan``'s epoch after it has handed out ``emitted`` samples.

    Parameters
    ----------
    plan : EpochPlan
        The epoch, the same on every rank.
    consumer : int
        ``world.consumer``.
    rank_mounts : sequence of int
        The mounts this rank reads through (:func:`~dlstore.placement.mounts.assign_mounts`); empty
        when the shards are plain files.
    layout : Layout, optional
        Which mounts hold which shards; None with ``rank_mounts``: every mount holds every shard.
    emitted : int
        Samples already handed out this epoch (a resume, a restart after a failover).
    failed, remap
        Mounts that failed in this pass, and where the blocks planned on them are read instead.

    Notes
    -----
    Block ``j`` of a shard is always read through the same mount, whichever epoch and consumer. With
    several mounts, runs of a block are read with the mounts taking turns; the turns follow the blocks'
    mounts without failures, so that every restart of the epoch sees the same sequence.
    """
    shards, records = plan.read_sequence(consumer)
    blocks = records // plan.block_records
    if not len(rank_mounts):
        mounts = np.zeros(len(shards), dtype=np.int64)
    elif layout is None:
        mounts = replicated_mounts(shards + blocks, rank_mounts)
    else:
        mounts = mounts_for(layout, shards, rank_mounts, blocks)
    turns = read_in_turns(shards, records, blocks, mounts) if len(rank_mounts) > 1 else None
    order = plan.read_plan(consumer, emitted, reorder=turns)
    if turns is not None:
        blocks, mounts = blocks[turns], mounts[turns]
    skipped = len(shards) - len(order.shards)
    blocks, mounts = blocks[skipped:], mounts[skipped:]
    if len(failed) and remap is not None:
        moved = np.isin(mounts, np.asarray(failed, dtype=np.int64))
        if moved.any():
            mounts = mounts.copy()
            mounts[moved] = remap(order.shards[moved], blocks[moved])
    return RankPlan(order.shards, order.records, blocks, mounts, order.emit)
