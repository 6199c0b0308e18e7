"""Who reads what from where: rank detection, shards over mounts, and the order of each epoch.

Everything here is a pure function of (shard list, world, seed, epoch): no I/O, no global random
state. :mod:`dlstore.sources.layout` scans mounts to build a :class:`Layout`.

May import: ``errors`` and numpy only.
"""
from dlstore.placement.mounts import (ASSIGNMENTS, Layout, assign_all_mounts, assign_mounts, interleave_by_mount,
                                      mount_for, mounts_for, read_in_turns)
from dlstore.placement.rank import RankPlan, plan_rank
from dlstore.placement.sharding import (REMAINDERS, SHUFFLES, EpochPlan, Piece, ReadOrder, Restart, SamplerState,
                                        Shuffle, cut_blocks, expand_runs, shuffle_named)
from dlstore.placement.shuffle import buffer_order, global_permutation, permute, shard_order
from dlstore.placement.world import LAUNCHERS, World, detect_world

__all__ = [
    "World", "detect_world", "LAUNCHERS",
    "Piece", "Restart", "ReadOrder", "EpochPlan", "SamplerState", "REMAINDERS", "SHUFFLES", "Shuffle",
    "shuffle_named",
    "shard_order", "global_permutation", "permute", "buffer_order", "cut_blocks", "expand_runs",
    "Layout", "ASSIGNMENTS", "assign_mounts", "assign_all_mounts", "mount_for", "mounts_for",
    "interleave_by_mount", "read_in_turns", "RankPlan", "plan_rank",
]
