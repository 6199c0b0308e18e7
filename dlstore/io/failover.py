"""Failing over between replica mounts: what failed in a pass, and where to read a block from next.

A :class:`dlstore.Dataset` reads an epoch's plan with one C++ reader. When a read fails (EIO, ESTALE,
a vanished file, an open or read past ``read_timeout``), it records the failure here and restarts the
plan at the first record not yet handed out (:meth:`dlstore.placement.sharding.EpochPlan.read_plan`),
each block of a shard read from the place :meth:`MountHealth.choose` gives: a mount that has not
failed; else one where this shard has not failed; else, a bounded number of times, the same place
again after a growing delay. So no record is lost or repeated, and a dead mount costs a bounded number
of attempts; without any place left the error names the mount, the file and the offset.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["FailoverStats", "MountHealth"]


@dataclass
class FailoverStats:
    """Counts a pass keeps: reads restarted on a replica, retries in place, and why."""

    failovers: int = 0
    retries: int = 0
    events: List[str] = field(default_factory=list)
    failed_mounts: List[str] = field(default_factory=list)

    def as_dict(self) -> Dict[str, object]:
        return {"failovers": self.failovers, "retries": self.retries, "failover_events": list(self.events),
                "failed_mounts": list(self.failed_mounts)}


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

    @property
    def failed(self) -> List[int]:
        """Mounts that failed at least once in this pass, first failure first."""
        return list(self._failed)

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

    def choose(self, shard: int, candidates: Sequence[int]) -> Optional[int]:
        """Where to read ``shard`` from, among ``candidates`` (best first): None when nowhere is left.

        A mount that has not failed; else one that failed for other shards but not for this one (a
        file missing on one mount says nothing of the others); else one already tried, at most
        ``max_retries`` more times for the mount and for the shard on it.
        """
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
