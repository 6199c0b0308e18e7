"""Failing over between replica mounts: what failed in a pass, and where to read a block from next.

A :class:`dlstore.Dataset` reads an epoch's plan with one C++ reader. When a read fails (EIO, ESTALE,
a vanished file, an open or read past ``read_timeout``), it records the failure here and restarts the
plan at the first record not yet handed out (:meth:`dlstore.placement.sharding.EpochPlan.read_plan`),
each block of a shard read from the place :meth:`MountHealth.choose` gives: a mount that has not
failed; else one where this shard has not failed; else, a bounded number of times, the same place
again after a growing delay. So no record is lost or repeated, and a dead mount costs a bounded number
of attempts; without any place left the error names the mount, the file and the offset.

A record that fails its frame or CRC check marks that shard's copy on that mount bad for the rest of
the pass (:meth:`MountHealth.corrupt`): the plan restarts at the batch under way with the shard read
from another holder, and only when every copy of the record is bad does the dataset's ``on_error``
decide (:mod:`dlstore.sources.replicas`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

__all__ = ["FailoverStats", "MountHealth"]


@dataclass
class FailoverStats:
    """Counts a pass keeps: reads restarted on a replica, retries in place, bad copies read around, and why."""

    failovers: int = 0
    retries: int = 0
    events: List[str] = field(default_factory=list)
    failed_mounts: List[str] = field(default_factory=list)
    corrupt_copies: int = 0
    #: One line per bad copy found: ``"<mount>: <file>: at byte N: what"``.
    bad_copies: List[str] = field(default_factory=list)

    def as_dict(self) -> Dict[str, object]:
        return {"failovers": self.failovers, "retries": self.retries, "failover_events": list(self.events),
                "failed_mounts": list(self.failed_mounts), "corrupt_copies": self.corrupt_copies,
                "bad_copies": list(self.bad_copies)}


class MountHealth:
    """The failures of one pass over an epoch, and the place each block is read from after them.

    Places are mount indices (a dataset without mounts has one place, 0, per shard).

    Parameters
    ----------
    names : sequence of str
        Each mount's name, for the stats and messages.
    max_retries : int
        Failures a mount may have, and a shard on it, before it is not tried again.
    retry_delay : float
        Seconds before a retry in place; doubled for each further one.
    """

    def __init__(self, names: Sequence[str], max_retries: int, retry_delay: float = 0.2):
        self.names = list(names)
        self.max_retries = int(max_retries)
        self.retry_delay = float(retry_delay)
        self.stats = FailoverStats()
        self._failed: List[int] = []  # mounts, in the order of their first failure
        self._mount_failures: Dict[int, int] = {}
        self._shard_failures: Dict[Tuple[int, int], int] = {}
        self._bad: Set[Tuple[int, int]] = set()  # (shard, mount): a copy holding a corrupt record
        self._bad_records: Dict[Tuple[int, int], Set[int]] = {}  # (shard, record): mounts it was bad on
        self._pinned: Dict[int, int] = {}  # shard: the mount read when every copy holds a bad record

    @property
    def failed(self) -> List[int]:
        """Mounts that failed at least once in this pass, first failure first."""
        return list(self._failed)

    @property
    def avoid(self) -> List[int]:
        """Mounts whose planned reads must be placed again (:meth:`choose`): those that failed, and those
        holding a copy found bad (only the reads of that shard move; the others stay where they are)."""
        return self._failed + sorted({m for _, m in self._bad} - set(self._failed))

    def usable(self, mount: int) -> bool:
        """Whether a block chosen for ``mount`` may stay there (it has not failed)."""
        return mount not in self._mount_failures

    def fail(self, shard: int, mount: int) -> None:
        """A read of ``shard`` through ``mount`` failed."""
        if mount not in self._mount_failures:
            self._failed.append(mount)
            self.stats.failed_mounts.append(self.names[mount])
        self._mount_failures[mount] = self._mount_failures.get(mount, 0) + 1
        self._shard_failures[(shard, mount)] = self._shard_failures.get((shard, mount), 0) + 1

    def corrupt(self, shard: int, record: int, mount: int, where: str) -> bool:
        """Record ``record`` of ``shard`` failed its check on ``mount`` (``where``: mount, file, offset,
        what): the shard is read from a holder without a bad copy for the rest of the pass, where
        there is one (:meth:`next_copy` says where this record is read next).

        Returns False when this copy of the record was found bad before in this pass: the plan came
        back to it because no other copy could be read, and going on would go round in circles.
        """
        seen = self._bad_records.setdefault((shard, record), set())
        if mount in seen:
            return False
        seen.add(mount)
        self._bad.add((shard, mount))
        self.stats.corrupt_copies += 1
        self.stats.bad_copies.append(where)
        return True

    def bad_for(self, shard: int, record: int) -> List[int]:
        """The mounts whose copy of ``record`` of ``shard`` was found bad in this pass, in mount order."""
        return sorted(self._bad_records.get((shard, record), ()))

    def next_copy(self, shard: int, record: int, candidates: Sequence[int]) -> Optional[int]:
        """Where to read ``record`` of ``shard`` after a bad copy: None when every candidate had it bad."""
        tried = self._bad_records.get((shard, record), set())
        # A copy not known bad but on a mount that failed past its retries cannot be read either.
        left = [m for m in candidates if m not in tried and self._choose(shard, [m]) is not None]
        if not left:
            return None
        chosen = self.choose(shard, candidates)
        if chosen is None or chosen in tried:  # every copy holds some bad record: keep to one good for this one
            chosen = left[0]
            self._pinned[shard] = chosen
        return chosen

    def choose(self, shard: int, candidates: Sequence[int]) -> Optional[int]:
        """Where to read ``shard`` from, among ``candidates`` (best first): None when nowhere is left.

        A mount that has not failed and whose copy of the shard is not known bad; else one that failed
        for other shards but not for this one (a file missing on one mount says nothing of the
        others); else one already tried, at most ``max_retries`` more times for the mount and for the
        shard on it. A bad copy comes last: its other records may be good (when every copy is bad,
        the caller leaves out the record that none holds good, and the rest is read as before).
        """
        good = [m for m in candidates if (shard, m) not in self._bad]
        chosen = self._choose(shard, good) if good else None
        if chosen is None and self._pinned.get(shard) in candidates:
            chosen = self._choose(shard, [self._pinned[shard]])
        return chosen if chosen is not None else self._choose(shard, candidates)

    def _choose(self, shard: int, candidates: Sequence[int]) -> Optional[int]:
        for m in candidates:
            if m not in self._mount_failures:
                return m
        limit = self.max_retries
        for m in candidates:
            if self._shard_failures.get((shard, m), 0) == 0 and self._mount_failures[m] <= limit:
                return m
        for m in candidates:
            if self._shard_failures.get((shard, m), 0) <= limit and self._mount_failures[m] <= limit:
                return m
        return None

    def record(self, shard: int, failed: int, chosen: int, where: str, error: BaseException) -> float:
        """Counts what follows the failure of ``shard`` on ``failed``: a failover to ``chosen``, or a
        retry on the same mount; returns the seconds to wait before it."""
        if chosen != failed:
            self.stats.failovers += 1
            self.stats.events.append(f"{self.names[failed]} -> {self.names[chosen]} at {where}: {error}")
            return 0.0
        self.stats.retries += 1
        attempt = self._shard_failures[(shard, failed)]
        self.stats.events.append(f"retry {attempt} on {self.names[failed]} at {where}: {error}")
        return self.retry_delay * (2 ** (attempt - 1))
