"""Is the job input-bound, and why: the consumer's wait for each batch, split into storage and decode.

The :class:`~dlstore.pipeline.Loader` times, per step, how long the consumer waited in ``next()`` for
its batch, and its background thread keeps running totals of its seconds waiting for the source
(storage: the reader had not read the records yet) and in the pipeline (parsing, decoding,
augmenting). A wait is split between the two by what the thread did during that wait, as
DS-Analyzer (Mohan et al., VLDB 2021) splits data stalls into *fetch* stalls and *prep* stalls;
here live, from the running job, with no second run.

A step *stalled* when its wait exceeds :data:`STALL_THRESHOLD_S`; a stalled step is a storage
stall or a decode stall by the larger part of its wait. Everything is a handful of additions per
batch; nothing per record.
"""
from __future__ import annotations

import bisect
from typing import Any, Dict, Tuple

__all__ = ["StallMeter", "STALL_THRESHOLD_S", "WAIT_BUCKETS_S"]

#: A step whose consumer waited longer than this for its batch counts as stalled (a ready batch is
#: handed over in microseconds).
STALL_THRESHOLD_S = 1e-3

#: Upper bounds (seconds) of the wait histogram's buckets; the last, infinity, takes every wait.
WAIT_BUCKETS_S: Tuple[float, ...] = (1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                                     2.5, 5.0, 10.0, float("inf"))

_COUNTS = ("steps", "stalled_steps", "storage_steps", "decode_steps")
_SECONDS = ("wait_s", "wall_s", "storage_wait_s", "decode_wait_s")


class StallMeter:
    """Per-step waits of one consumer, summed, split and bucketed.

    Attributes
    ----------
    buckets : list of int
        Steps per bucket of :data:`WAIT_BUCKETS_S` (not cumulative).
    """

    def __init__(self):
        self.steps = self.stalled_steps = self.storage_steps = self.decode_steps = 0
        self.wait_s = self.wall_s = self.storage_wait_s = self.decode_wait_s = 0.0
        self.buckets = [0] * len(WAIT_BUCKETS_S)

    def step(self, wait: float, interval: float, source_s: float, pipeline_s: float) -> None:
        """One batch handed over: the consumer waited ``wait`` s of a step of ``interval`` s (from the
        last batch handed over); meanwhile the background thread spent ``source_s`` s waiting for
        records and ``pipeline_s`` s in the pipeline."""
        self.steps += 1
        self.wall_s += interval
        if wait < 1e-4:  # the batch was ready: the common case of a loop that is not input-bound
            self.buckets[0] += 1
            self.wait_s += wait
            return
        self.wait_s += wait
        self.buckets[bisect.bisect_left(WAIT_BUCKETS_S, wait)] += 1
        cost = source_s + pipeline_s
        storage = wait * source_s / cost if cost > 0 else 0.0
        decode = wait * pipeline_s / cost if cost > 0 else 0.0
        self.storage_wait_s += storage
        self.decode_wait_s += decode
        if wait > STALL_THRESHOLD_S:
            self.stalled_steps += 1
            if storage >= decode:
                self.storage_steps += 1
            else:
                self.decode_steps += 1

    @property
    def totals(self) -> Dict[str, float]:
        """The counts and seconds summed so far, by name."""
        return {k: getattr(self, k) for k in _COUNTS + _SECONDS}

    def add(self, totals: Dict[str, float]) -> None:
        """Adds another meter's :attr:`totals` (its buckets aside)."""
        for k, v in totals.items():
            setattr(self, k, getattr(self, k) + v)

    def snapshot(self) -> Dict[str, float]:
        """The totals now (for a report over an interval: :func:`report` of the difference)."""
        return self.totals

    def report(self, since: Dict[str, float] = None) -> Dict[str, Any]:
        """See :func:`stall_report`; over the meter's life, or since the snapshot ``since``."""
        return stall_report({k: v - (since or {}).get(k, 0) for k, v in self.totals.items()})


def stall_report(t: Dict[str, float]) -> Dict[str, Any]:
    """The figures of :meth:`dlstore.pipeline.Loader.stall_report` from summed totals.

    Keys: ``steps``, ``stalled_steps`` (waits over :data:`STALL_THRESHOLD_S`), ``storage_steps`` and
    ``decode_steps`` (stalled steps by the larger part of their wait); ``stalled_fraction``,
    ``storage_fraction`` and ``decode_fraction`` of the steps; ``wait_s`` and ``wall_s`` (seconds
    waited, seconds of the steps), ``wait_fraction`` (of the time); ``storage_wait_s`` and
    ``decode_wait_s``, and ``storage_share`` and ``decode_share`` of the time waited (None without a
    wait); ``threshold_s``; and ``line``, the figures in words.
    """
    steps = int(t["steps"])
    out: Dict[str, Any] = {k: int(t[k]) for k in _COUNTS}
    out.update({k: float(t[k]) for k in _SECONDS})
    for what in ("stalled", "storage", "decode"):
        out[f"{what}_fraction"] = out[f"{what}_steps"] / steps if steps else 0.0
    out["wait_fraction"] = out["wait_s"] / out["wall_s"] if out["wall_s"] > 0 else 0.0
    waited = out["storage_wait_s"] + out["decode_wait_s"]
    out["storage_share"] = out["storage_wait_s"] / waited if waited > 0 else None
    out["decode_share"] = out["decode_wait_s"] / waited if waited > 0 else None
    out["threshold_s"] = STALL_THRESHOLD_S
    out["line"] = (f"waited for data in {100 * out['stalled_fraction']:.0f}% of {steps} steps: storage "
                   f"{100 * out['storage_fraction']:.0f}%, decode {100 * out['decode_fraction']:.0f}% "
                   f"({100 * out['wait_fraction']:.0f}% of the time waiting"
                   + (f", {100 * out['storage_share']:.0f}% of it for storage)" if waited > 0 else ")"))
    return out
