"""Ranks under MPI: the per-step figures of every rank summed into the aggregate rows."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence

__all__ = ["aggregate_ranks", "sum_known", "mean_known"]


def sum_known(values: Iterable[Optional[float]]) -> Optional[float]:
    """The sum of the values that are known (not None); None when none is."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def mean_known(values: Iterable[Optional[float]]) -> Optional[float]:
    """The mean of the values that are known (not None); None when none is."""
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def aggregate_ranks(per_rank: Sequence[Sequence[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """The aggregate of each tier over ranks: samples and bytes summed, over the slowest rank's time.

    A step's aggregate rate is the sum of the ranks' rates for that step (the ranks run the same
    plan at the same time); the busiest core is the busiest over all ranks' hosts; a step's AU is the
    mean of the ranks'. Per-rank details (``cores_pct``, ``loader_stats``) are None in the aggregate:
    each rank's are in its own tiers.
    """
    out = []
    for tiers in zip(*per_rank):
        seconds = max(t["seconds"] for t in tiers)
        samples = sum(t["samples"] for t in tiers)
        nbytes = sum(t["bytes"] for t in tiers)
        n_steps = max(len(t["steps"]) for t in tiers)
        steps = []
        for i in range(n_steps):
            mine = [t["steps"][i] for t in tiers if i < len(t["steps"])]
            steps.append({"step": i + 1, "samples": sum(s["samples"] for s in mine),
                          "rate": sum(s["rate"] or 0.0 for s in mine),
                          "mb_per_s": sum(s["mb_per_s"] or 0.0 for s in mine),
                          "busiest_core_pct": max((s["busiest_core_pct"] for s in mine
                                                   if s["busiest_core_pct"] is not None), default=None),
                          "accelerator_util_pct": mean_known(s.get("accelerator_util_pct") for s in mine)})
        out.append(dict(
            tier=tiers[0]["tier"], io=tiers[0]["io"], io_reason=tiers[0]["io_reason"], cache=tiers[0]["cache"],
            cache_method=tiers[0]["cache_method"], ranks=len(tiers), samples=samples, bytes=nbytes, seconds=seconds,
            rate=samples / seconds if seconds > 0 else None, mb_per_s=nbytes / 1e6 / seconds if seconds > 0 else None,
            steps=steps, busiest_core_pct=max((t["busiest_core_pct"] for t in tiers
                                               if t["busiest_core_pct"] is not None), default=None),
            accelerator_util_pct=mean_known(t.get("accelerator_util_pct") for t in tiers),
            compute_seconds=sum_known(t.get("compute_seconds") for t in tiers),
            cores_pct=None,
            other_processes_cores=max((t["other_processes_cores"] for t in tiers
                                       if t.get("other_processes_cores") is not None), default=None),
            ended_early=any(t.get("ended_early") for t in tiers),
            batches=sum(t["batches"] for t in tiers),
            read_records=sum_known(t.get("read_records") for t in tiers),
            read_bytes=sum_known(t.get("read_bytes") for t in tiers),
            process_cpu_pct=sum_known(t.get("process_cpu_pct") for t in tiers),
            cached_before=mean_known(t.get("cached_before") for t in tiers),
            read_share_pct=mean_known(t.get("read_share_pct") for t in tiers),
            loader_stats=None))
    return out
