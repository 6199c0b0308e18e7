"""A consumer's epoch as reads: the file, byte range and mount of every record it reads, from its
:class:`~dlstore.placement.rank.RankPlan` and the dataset's manifest. What the reader is given (as
arrays, once per pass), and what ``dlstore plan --json`` lists.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from dlstore.placement.rank import RankPlan

__all__ = ["ReaderPlan", "Places", "reader_plan", "read_runs", "merged_reads"]

#: ``(shards, records) -> (offsets, sizes)``: where each record's frame lies (a manifest's ``frames``).
Frames = Callable[[np.ndarray, np.ndarray], Tuple[np.ndarray, np.ndarray]]
#: ``(shards, mounts) -> paths``: the file of each shard on each mount.
Paths = Callable[[np.ndarray, np.ndarray], List[str]]


class Places(Sequence):
    """Per file of a plan, ``(shard, mount)``, kept as two arrays (a global plan has a file per record)."""

    def __init__(self, shards: np.ndarray, mounts: np.ndarray):
        self.shards, self.mounts = shards, mounts

    def __len__(self) -> int:
        return len(self.shards)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list(zip(self.shards[i].tolist(), self.mounts[i].tolist()))
        return int(self.shards[i]), int(self.mounts[i])

    def __iter__(self) -> Iterator[Tuple[int, int]]:
        return zip(self.shards.tolist(), self.mounts.tolist())


class ReaderPlan(NamedTuple):
    """One reader's plan: its files and, per record to read, the file, frame offset and size.

    Attributes
    ----------
    paths : list of str
        The files read, each a shard on one mount.
    device : numpy.ndarray or None
        Per file, its mount among this plan's (each read by threads of its own); None without mounts.
    file, offset, size : numpy.ndarray
        Per record, in reading order: index into ``paths``, frame offset and frame size.
    emit : numpy.ndarray or None
        The order records are handed out in (indices into the per-record arrays); None: as read.
    shards, records : numpy.ndarray
        Per record: its shard and its index there (for messages and failover).
    places : Places
        Per file: ``(shard, mount)``.
    """

    paths: List[str]
    device: Optional[np.ndarray]
    file: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    emit: Optional[np.ndarray]
    shards: np.ndarray
    records: np.ndarray
    places: Places


def reader_plan(rank: RankPlan, frames: Frames, paths_of: Paths, *, mounts: bool,
                num_shards: Optional[int] = None) -> ReaderPlan:
    """The reads of ``rank``'s plan: one file per (shard, mount) it reads through, in first-key order.

    Parameters
    ----------
    rank : RankPlan
    frames : callable
        ``(shards, records) -> (offsets, sizes)`` of their frames; called once, for these records only.
    paths_of : callable
        ``(shards, mounts) -> paths``, one per file.
    mounts : bool
        Whether the shards are on mount points (the reader then keeps each mount's reads apart).
    num_shards : int, optional
        Without mounts: the dataset's shards. When there are no more of them than records to read, the
        plan's files are all of them, in order (nothing to sort); else only those the plan reads.
    """
    offset, size = frames(rank.shards, rank.records)
    if not mounts and num_shards is not None and num_shards <= len(rank.shards):
        every = np.arange(num_shards, dtype=np.int64)
        places = Places(every, np.zeros(num_shards, dtype=np.int64))
        return ReaderPlan(paths_of(places.shards, places.mounts), None, rank.shards, np.asarray(offset, np.int64),
                          np.asarray(size, np.int64), rank.emit, rank.shards, rank.records, places)
    per = int(rank.mounts.max()) + 1 if len(rank.mounts) else 1
    keys, file = np.unique(rank.shards * per + rank.mounts, return_inverse=True)
    places = Places(keys // per, keys % per)
    device = None
    if mounts:
        _, device = np.unique(places.mounts, return_inverse=True)
        device = device.reshape(-1).astype(np.uint32)
    return ReaderPlan(paths_of(places.shards, places.mounts), device, file.reshape(-1).astype(np.int64),
                      np.asarray(offset, dtype=np.int64), np.asarray(size, dtype=np.int64), rank.emit,
                      rank.shards, rank.records, places)


def read_runs(plan: ReaderPlan, cuts: Sequence[int] = ()) -> Tuple[np.ndarray, np.ndarray]:
    """The plan's reads as runs of neighbouring frames of one file, in reading order: the first and last
    record of each (indices into the plan's per-record arrays). ``cuts``: records that start a read
    whatever precedes them (where a reader is given the next window of the plan)."""
    n = len(plan.file)
    new = np.ones(n, dtype=bool)
    new[1:] = (plan.file[1:] != plan.file[:-1]) | (plan.offset[1:] != plan.offset[:-1] + plan.size[:-1])
    new[np.asarray(cuts, dtype=np.int64)] = True
    first = np.flatnonzero(new)
    if n == 0:  # a rank with no records to read (a share of 0) has no runs
        return first, first.copy()
    return first, np.append(first[1:], n) - 1


def merged_reads(plan: ReaderPlan, mount_names: Sequence[str] = (),
                 cuts: Sequence[int] = ()) -> List[Dict[str, object]]:
    """The plan's reads in reading order (:func:`read_runs`, ``cuts`` included): per read its ``path``,
    byte range ``[start, stop)``, ``records`` and ``mount`` (its name, or None without mounts)."""
    first, last = read_runs(plan, cuts)
    stops = plan.offset[last] + plan.size[last]
    out = []
    for a, b, stop, f in zip(first.tolist(), last.tolist(), stops.tolist(), plan.file[first].tolist()):
        mount = plan.places[f][1]
        out.append({"path": plan.paths[f], "start": int(plan.offset[a]), "stop": stop, "records": b - a + 1,
                    "mount": mount_names[mount] if mount_names else None})
    return out
