"""Which mount point each rank reads each shard through.

A dataset is relative shard paths plus mount points; a :class:`Layout` records which mounts hold
which shards (found by :func:`dlstore.sources.layout.scan_layout`). Ranks are given mounts by a policy
of :data:`ASSIGNMENTS`; a shard is then read through one of the rank's mounts that holds it,
chosen by the shard's index alone, so the same shard goes through the same mount on every epoch
(and its page cache, which mounts do not share, stays useful); the other holders are its
failover order. :func:`dlstore.placement.rank.plan_rank` puts this together with the epoch's plan.
Pure functions: nothing here touches a file.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from dlstore.errors import PlacementError
from dlstore.placement.sharding import expand_runs
from dlstore.placement.world import World

__all__ = ["Layout", "LAYOUT_KINDS", "ASSIGNMENTS", "assign_mounts", "assign_rank_mounts", "assign_all_mounts",
           "mount_for", "mounts_for", "replicated_mounts", "interleave_by_mount", "read_in_turns"]

LAYOUT_KINDS = ("replicated", "striped", "mixed")


@dataclass(frozen=True)
class Layout:
    """Shards (relative paths) and the mounts holding each.

    Parameters
    ----------
    mounts : sequence of str
        Mount point directories.
    shards : sequence of str
        Shard paths relative to a mount.
    holders : sequence of sequence of int
        For each shard, the indices of the mounts that hold it (at least one).
    sizes : sequence of int, optional
        Size of each shard in bytes.
    """

    mounts: Tuple[str, ...]
    shards: Tuple[str, ...]
    holders: Tuple[Tuple[int, ...], ...]
    sizes: Optional[Tuple[int, ...]] = None

    def __post_init__(self):
        set_ = functools.partial(object.__setattr__, self)
        set_("mounts", tuple(str(m) for m in self.mounts))
        set_("shards", tuple(str(s) for s in self.shards))
        norm: Dict[Any, Tuple[int, ...]] = {}  # shards held alike share one tuple: normalised once
        set_("holders", tuple(norm.get(h) or norm.setdefault(h, tuple(sorted({int(m) for m in h})))
                              for h in (tuple(h) for h in self.holders)))
        if self.sizes is not None:
            set_("sizes", tuple(int(s) for s in self.sizes))
            if len(self.sizes) != len(self.shards):
                raise PlacementError(f"{len(self.sizes)} sizes for {len(self.shards)} shards")
        if not self.mounts:
            raise PlacementError("a layout needs at least one mount")
        if len(self.holders) != len(self.shards):
            raise PlacementError(f"{len(self.holders)} holder lists for {len(self.shards)} shards")
        if len(set(self.shards)) != len(self.shards):
            raise PlacementError("a shard is listed twice in the layout")
        for shard, held in zip(self.shards, self.holders):
            if not held:
                raise PlacementError(f"shard {shard} is on no mount (looked in {', '.join(self.mounts)})", path=shard)
            if held[0] < 0 or held[-1] >= len(self.mounts):
                raise PlacementError(f"shard {shard}: mount index outside 0..{len(self.mounts) - 1} in {held}")

    @classmethod
    def replicated(cls, mounts: Sequence[str], shards: Sequence[str]) -> "Layout":
        """Every mount holds every shard (e.g. several NFS mounts of one export)."""
        return cls(tuple(mounts), tuple(shards), tuple(tuple(range(len(mounts))) for _ in shards))

    @classmethod
    def striped(cls, mounts: Sequence[str], shards: Sequence[str]) -> "Layout":
        """Shard ``i`` on mount ``i % len(mounts)`` only."""
        return cls(tuple(mounts), tuple(shards), tuple((i % len(mounts),) for i in range(len(shards))))

    @property
    def kind(self) -> str:
        """``replicated`` (every mount holds every shard), ``striped`` (every shard on one mount)
        or ``mixed``. One mount is ``replicated``."""
        if self.everywhere:
            return "replicated"
        if all(len(h) == 1 for h in self.holders):
            return "striped"
        return "mixed"

    @functools.cached_property
    def everywhere(self) -> bool:
        """Whether every mount holds every shard."""
        everywhere = len(self.mounts)
        return all(len(h) == everywhere for h in self.holders)

    @functools.cached_property
    def holder_matrix(self) -> np.ndarray:
        """``[shard, mount]`` booleans: whether the mount holds the shard."""
        matrix = np.zeros((len(self.shards), len(self.mounts)), dtype=bool)
        for s, held in enumerate(self.holders):
            matrix[s, list(held)] = True
        return matrix

    def shard_index(self, shard: Union[int, str]) -> int:
        """The index of a shard given by index or relative path."""
        if isinstance(shard, str):
            try:
                return self.shards.index(shard)
            except ValueError:
                raise PlacementError(f"{shard} is not a shard of this layout", path=shard) from None
        if not 0 <= shard < len(self.shards):
            raise PlacementError(f"shard {shard} is outside 0..{len(self.shards) - 1}")
        return int(shard)

    def replicas(self, shard: Union[int, str]) -> Tuple[int, ...]:
        """Indices of the mounts holding ``shard`` (index or relative path), ascending."""
        return self.holders[self.shard_index(shard)]

    def path(self, shard: Union[int, str], mount: int) -> str:
        """The file of ``shard`` on ``mount`` (a path join; nothing is checked on disk)."""
        return os.path.join(self.mounts[mount], self.shards[self.shard_index(shard)])

    def describe(self) -> str:
        text = f"{self.kind}: {len(self.shards)} shards on {len(self.mounts)} mounts"
        if self.sizes is not None:
            total = sum(self.sizes)
            text += f", {total / 1e9:.2f} GB" if total >= 1e9 else f", {total / 1e6:.1f} MB"
        if self.kind == "mixed":
            copies = sorted({len(h) for h in self.holders})
            text += f" ({'-'.join(map(str, (copies[0], copies[-1])))} copies per shard)"
        return text


# ---- rank -> mounts --------------------------------------------------------------------------------

def _consecutive(index: int, num_mounts: int, per_rank: int) -> List[int]:
    start = index * per_rank
    return [(start + i) % num_mounts for i in range(per_rank)]


def _by_rank(num_mounts: int, ranks: np.ndarray, local_ranks: np.ndarray, per_rank: int,
             throughput: Optional[np.ndarray]) -> List[List[int]]:
    """Rank ``r`` reads mounts ``r*k .. r*k+k-1`` (mod the mount count): Dell EMC Isilon's round robin."""
    return [_consecutive(int(r), num_mounts, per_rank) for r in ranks]


def _by_local_rank(num_mounts: int, ranks: np.ndarray, local_ranks: np.ndarray, per_rank: int,
                   throughput: Optional[np.ndarray]) -> List[List[int]]:
    """The same round robin by local rank: each host spreads its ranks over all its mounts."""
    return [_consecutive(int(r), num_mounts, per_rank) for r in local_ranks]


def _weighted(num_mounts: int, ranks: np.ndarray, local_ranks: np.ndarray, per_rank: int,
              throughput: Optional[np.ndarray]) -> List[List[int]]:
    """Ranks spread over mounts in proportion to each mount's measured throughput.

    A smooth weighted round robin over ranks ``0..max(ranks)``: each pick adds every mount's
    weight to its credit and takes the mount with the most credit (lowest index on a tie) among
    those the rank does not have yet, which then pays the total weight. A mount of throughput 0
    is never picked.
    """
    assert throughput is not None
    weights = throughput.astype(np.float64)
    total = float(weights.sum())
    credit = np.zeros(num_mounts)
    eligible = weights > 0
    per = []
    for _ in range(int(ranks.max()) + 1 if len(ranks) else 0):
        mine: List[int] = []
        for _ in range(per_rank):
            credit += weights
            masked = np.where(eligible, credit, -np.inf)
            masked[mine] = -np.inf
            j = int(np.argmax(masked))
            credit[j] -= total
            mine.append(j)
        per.append(mine)
    return [per[int(r)] for r in ranks]


#: Rank -> mounts policies by name: ``(num_mounts, ranks, local_ranks, per_rank, throughput) -> mounts per rank``.
ASSIGNMENTS: Dict[str, Callable[..., List[List[int]]]] = {
    "rank": _by_rank,
    "local_rank": _by_local_rank,
    "weighted": _weighted,
}


def _check_assignment(num_mounts: int, policy: str, mounts_per_rank: int, throughput) -> Optional[np.ndarray]:
    if policy not in ASSIGNMENTS:
        raise PlacementError(f"unknown mount policy {policy!r}; choose one of {sorted(ASSIGNMENTS)}")
    if not 1 <= mounts_per_rank <= num_mounts:
        raise PlacementError(f"mounts_per_rank must be 1..{num_mounts} (the number of mounts), not {mounts_per_rank}")
    if policy != "weighted":
        return None
    if throughput is None:
        raise PlacementError("the weighted policy needs throughput= (one measured figure per mount)")
    weights = np.asarray(throughput, dtype=np.float64)
    if weights.shape != (num_mounts,) or not np.all(np.isfinite(weights)) or np.any(weights < 0):
        raise PlacementError(f"throughput must give one finite figure >= 0 for each of the {num_mounts} mounts, "
                             f"not {throughput!r}")
    if int(np.count_nonzero(weights)) < mounts_per_rank:
        raise PlacementError(f"only {int(np.count_nonzero(weights))} mounts have a throughput above 0, fewer than "
                             f"mounts_per_rank={mounts_per_rank}")
    return weights


def assign_all_mounts(layout: Layout, size: int, policy: str = "rank", mounts_per_rank: int = 1,
                      throughput: Optional[Sequence[float]] = None,
                      local_size: Optional[int] = None) -> List[List[int]]:
    """The mounts of every rank of a world of ``size`` ranks, ``local_size`` per host (block placement:
    ``local_rank = rank % local_size``; default one host)."""
    weights = _check_assignment(len(layout.mounts), policy, mounts_per_rank, throughput)
    ranks = np.arange(size)
    local_ranks = ranks % (local_size or size)
    return ASSIGNMENTS[policy](len(layout.mounts), ranks, local_ranks, mounts_per_rank, weights)


def assign_mounts(layout: Layout, world: World, policy: str = "rank", mounts_per_rank: int = 1,
                  throughput: Optional[Sequence[float]] = None) -> List[int]:
    """The mount indices this rank reads through.

    Parameters
    ----------
    layout : Layout
    world : World
        Its ``rank`` (``local_rank`` for the ``local_rank`` policy) picks the mounts.
    policy : {"rank", "local_rank", "weighted"}
        ``rank``: rank ``r`` gets mounts ``r*k .. r*k+k-1`` modulo the mount count (what the
        Dell EMC Isilon reference architecture's ``round_robin_mpi.py`` does for ``k = 1``);
        ``local_rank``: the same by local rank; ``weighted``: ranks spread in proportion to ``throughput``.
    mounts_per_rank : int
        ``k``: mounts one rank reads at once.
    throughput : sequence of float, optional
        Measured throughput of each mount (any unit), for ``weighted``.

    Raises
    ------
    PlacementError
        On an unknown policy, ``mounts_per_rank`` outside ``1..len(mounts)``, or bad throughput.
    """
    return assign_rank_mounts(len(layout.mounts), world.rank, world.local_rank, policy, mounts_per_rank, throughput)


def assign_rank_mounts(num_mounts: int, rank: int, local_rank: int, policy: str = "rank", mounts_per_rank: int = 1,
                       throughput: Optional[Sequence[float]] = None) -> List[int]:
    """:func:`assign_mounts` from the number of mounts alone (a dataset planned from counts)."""
    weights = _check_assignment(num_mounts, policy, mounts_per_rank, throughput)
    return [int(m) for m in ASSIGNMENTS[policy](num_mounts, np.array([rank]), np.array([local_rank]),
                                                 mounts_per_rank, weights)[0]]


# ---- shard -> mount --------------------------------------------------------------------------------

def _nth_true(rows: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Column of the ``n[i]``-th True of each row of ``rows`` (every row has more than ``n[i]``)."""
    hit = (np.cumsum(rows, axis=1) == (n + 1)[:, None]) & rows
    return np.argmax(hit, axis=1)


def mounts_for(layout: Layout, shards: Sequence[int], rank_mounts: Sequence[int],
               blocks: Optional[Sequence[int]] = None) -> np.ndarray:
    """:func:`mount_for`'s choice for many shards (or blocks of shards) at once, without the fallbacks."""
    shards = np.asarray(shards, dtype=np.int64)
    pick = shards if blocks is None else shards + np.asarray(blocks, dtype=np.int64)
    rank_mounts = np.asarray(rank_mounts, dtype=np.int64)
    if len(rank_mounts) and (rank_mounts.min() < 0 or rank_mounts.max() >= len(layout.mounts)):
        raise PlacementError(f"rank mounts {rank_mounts.tolist()} outside 0..{len(layout.mounts) - 1}")
    if layout.everywhere and len(rank_mounts):
        return replicated_mounts(pick, rank_mounts)
    held = layout.holder_matrix[shards]
    mine = held[:, rank_mounts] if len(rank_mounts) else np.zeros((len(shards), 0), bool)
    mine_count = mine.sum(axis=1)
    chosen = np.empty(len(shards), dtype=np.int64)
    ok = mine_count > 0
    if ok.any():
        chosen[ok] = rank_mounts[_nth_true(mine[ok], pick[ok] % mine_count[ok])]
    if (~ok).any():
        other = held[~ok]
        chosen[~ok] = _nth_true(other, pick[~ok] % other.sum(axis=1))
    return chosen


def replicated_mounts(picks: np.ndarray, rank_mounts: Sequence[int]) -> np.ndarray:
    """:func:`mounts_for` when every mount holds every shard: the ``pick % k``-th of the rank's ``k``
    mounts, for each ``pick`` (a shard index plus its block number). No layout needed."""
    rank_mounts = np.asarray(rank_mounts, dtype=np.int64)
    return rank_mounts[np.asarray(picks, dtype=np.int64) % len(rank_mounts)]


def mount_for(layout: Layout, shard: Union[int, str], rank_mounts: Sequence[int],
              block: int = 0) -> Tuple[int, Tuple[int, ...]]:
    """The mount a rank reads ``shard`` (or block ``block`` of it) through, and the failover order.

    Among the rank's mounts that hold the shard, the ``((shard + block) % count)``-th in the rank's
    order; when none of them holds it, the same pick among all its holders. A function of the
    shard, the block number and the rank's mounts only, never of the epoch, so a shard (a block)
    is read through the same mount on every epoch, while consecutive blocks of one shard spread
    over the rank's mounts.

    Returns
    -------
    (int, tuple of int)
        The mount, and the shard's other holders in failover order: first the rank's own mounts,
        then the rest starting after the chosen mount (so failovers from one mount spread out).
    """
    s = layout.shard_index(shard)
    chosen = int(mounts_for(layout, [s], rank_mounts, [block])[0])
    num = len(layout.mounts)
    mine = set(int(m) for m in rank_mounts)
    others = sorted((m for m in layout.holders[s] if m != chosen), key=lambda m: (m not in mine, (m - chosen) % num))
    return chosen, tuple(others)


def interleave_by_mount(mounts: Sequence[int]) -> np.ndarray:
    """The order to read runs in so that consecutive reads alternate between mounts.

    ``mounts[i]`` is the mount run ``i`` is read through. Runs keep their order per mount; the mounts
    take turns in the order each first appears. Returns indices into ``mounts``.
    """
    mounts = np.asarray(mounts, dtype=np.int64)
    if len(mounts) == 0 or np.all(mounts == mounts[0]):
        return np.arange(len(mounts))
    _, first, which = np.unique(mounts, return_index=True, return_inverse=True)
    which = which.reshape(-1)
    turn = np.argsort(np.argsort(first))[which]  # mounts numbered by first appearance
    by_mount = np.argsort(which, kind="stable")
    counts = np.bincount(which)
    nth = np.empty(len(mounts), dtype=np.int64)  # each run's place in its mount's queue
    nth[by_mount] = expand_runs(np.zeros(len(counts), dtype=np.int64), counts)
    return np.lexsort((turn, nth))


def read_in_turns(shards: np.ndarray, records: np.ndarray, blocks: np.ndarray, mounts: np.ndarray) -> np.ndarray:
    """The order to read a sequence of records in so that a rank's mounts take turns.

    Record ``i`` is ``records[i]`` of ``shards[i]``, in block ``blocks[i]`` of its shard, read through
    ``mounts[i]``. The sequence's runs (neighbouring records of one block) keep their records together
    and their order per mount (:func:`interleave_by_mount`), so every mount has reads in flight where
    the sequence's own order would leave all but one idle. Returns indices into the sequence.
    """
    if len(shards) == 0:
        return np.zeros(0, dtype=np.int64)
    new_run = np.ones(len(shards), dtype=bool)
    new_run[1:] = (shards[1:] != shards[:-1]) | (blocks[1:] != blocks[:-1]) | (records[1:] != records[:-1] + 1)
    starts = np.flatnonzero(new_run)
    lengths = np.diff(np.append(starts, len(shards)))
    turns = interleave_by_mount(mounts[starts])
    return expand_runs(starts[turns], lengths[turns])
