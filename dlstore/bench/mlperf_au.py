"""MLPerf Storage's accounting: accelerator utilisation (AU) by its rule, the ranks' aggregate, and the
search for the most accelerators a storage feeds.

- **AU of one rank in one epoch** (DLIO's ``compute_metrics_train``): the emulated computation time
  of every step but the first, over the epoch's wall time less the first step's time. The
  computation time counted is the configured ``computation_time`` per step (what the accelerator
  would compute), not the measured sleep. The **whole-epoch figure** counts every step over the
  whole wall time: the first step (the pipeline's start, the first reads) included.
- **Over ranks and epochs**: the mean of the ranks' AU in each epoch, then the mean over epochs
  (DLIO's ``end_run``). Samples/s is the sum over ranks of each rank's samples over its own epoch
  time (DLIO sums the ranks' throughputs); MiB/s the bytes delivered over the same times.
- **When step 1 holds the reading**: MLPerf's rule leaves step 1 out as the pipeline's warm-up. Where
  a rank must read most of its epoch before its first batch can come out (a shuffle buffer that
  holds its whole share: ``first_step_read_pct`` >= :data:`FIRST_STEP_READ_LIMIT_PCT`), that step
  holds the storage's work and the rule would measure the accelerators' sleep alone; such a run is
  decided on the whole-epoch AU, which counts it (:func:`decisive_au`).
- **The search**: accelerator counts 1, 2, 4, ... while the AU stays at or above the threshold,
  then halving the interval between the last count that passed and the first that failed.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

from dlstore.bench.ranks import mean_known

__all__ = ["FIRST_STEP_READ_LIMIT_PCT", "epoch_au", "rank_epoch", "decisive_au", "decide", "aggregate",
           "search_accelerators"]

MiB = 1 << 20

#: Where step 1 must read this much of a rank's epoch (percent of its records) or more, MLPerf's AU,
#: which leaves step 1 out, would leave most of the storage's work out: the whole-epoch AU decides.
FIRST_STEP_READ_LIMIT_PCT = 50.0


def epoch_au(step_seconds: Sequence[float], computation_time: float) -> Dict[str, Optional[float]]:
    """AU of one rank's epoch from its steps' durations (each from the end of the previous step, the
    first from the epoch's start, so that they add up to the epoch's wall time).

    Returns
    -------
    dict
        ``au_pct``: MLPerf's rule, ``100 * (n - 1) * computation_time / (wall - first step)``; None
        with fewer than two steps. ``au_whole_pct``: ``100 * n * computation_time / wall``.
    """
    n = len(step_seconds)
    wall = float(sum(step_seconds))
    rest = wall - float(step_seconds[0]) if n else 0.0
    return {"au_pct": 100.0 * (n - 1) * computation_time / rest if n > 1 and rest > 0 else None,
            "au_whole_pct": 100.0 * n * computation_time / wall if n and wall > 0 else None}


def rank_epoch(measured: Dict[str, Any], computation_time: float) -> Dict[str, Any]:
    """One rank's epoch from :func:`dlstore.bench.steps.run_steps` run with one batch per step: its
    step log (seconds, samples, bytes per step), AU by both rules, samples/s and MiB/s."""
    steps = [{"step": s["step"], "seconds": s["seconds"], "samples": s["samples"], "bytes": s["bytes"],
              "slept": s["compute_seconds"]} for s in measured["steps"]]
    seconds = sum(s["seconds"] for s in steps)
    samples = sum(s["samples"] for s in steps)
    nbytes = measured["bytes"]
    out = {"steps": steps, "seconds": seconds, "samples": samples, "bytes": nbytes,
           "samples_per_s": samples / seconds if seconds > 0 else None,
           "mib_per_s": nbytes / MiB / seconds if seconds > 0 else None,
           "busiest_core_pct": measured.get("busiest_core_pct"),
           "other_processes_cores": measured.get("other_processes_cores")}
    out.update(epoch_au([s["seconds"] for s in steps], computation_time))
    return out


def decisive_au(figures: Dict[str, Any]) -> str:
    """The AU that decides a run (:func:`aggregate`'s figures): ``"au_pct"`` (MLPerf's rule), or
    ``"au_whole_pct"`` where step 1 reads at least :data:`FIRST_STEP_READ_LIMIT_PCT` of a rank's epoch."""
    first = figures.get("first_step_read_pct")
    return "au_whole_pct" if first is not None and first >= FIRST_STEP_READ_LIMIT_PCT else "au_pct"


def decide(figures: Dict[str, Any], threshold_pct: float) -> None:
    """Sets ``figures["decided_on"]`` (:func:`decisive_au`) and ``figures["passed"]``: that AU at or above
    ``threshold_pct``."""
    figures["decided_on"] = decisive_au(figures)
    au = figures[figures["decided_on"]]
    figures["passed"] = au is not None and au >= threshold_pct


def aggregate(ranks: Sequence[Sequence[Dict[str, Any]]], threshold_pct: float) -> Dict[str, Any]:
    """The figures of one run: ``ranks[r][e]`` is rank ``r``'s epoch ``e`` (:func:`rank_epoch`).

    Returns
    -------
    dict
        ``accelerators``; per epoch ``au_pct`` and ``au_whole_pct`` (mean over ranks),
        ``samples_per_s`` and ``mib_per_s`` (sums over ranks); their means over epochs under the same
        names at the top; ``au_per_rank_pct`` (each rank's mean over epochs); ``samples`` (all
        ranks, all epochs); ``first_step_read_pct`` (the most any rank's step 1 read of its epoch,
        where the ranks say it); ``decided_on`` (:func:`decisive_au`) and ``passed`` (that AU
        ``>= threshold_pct``).
    """
    epochs = []
    for e in range(min(len(r) for r in ranks)):
        mine = [r[e] for r in ranks]
        epochs.append({"epoch": e + 1,
                       "au_pct": mean_known(m["au_pct"] for m in mine),
                       "au_whole_pct": mean_known(m["au_whole_pct"] for m in mine),
                       "samples_per_s": sum(m["samples_per_s"] or 0.0 for m in mine),
                       "mib_per_s": sum(m["mib_per_s"] or 0.0 for m in mine),
                       "seconds": max(m["seconds"] for m in mine),
                       "samples": sum(m["samples"] for m in mine)})
    firsts = [ep["first_step_read_pct"] for r in ranks for ep in r if ep.get("first_step_read_pct") is not None]
    out = {"accelerators": len(ranks), "epochs": epochs, "au_pct": mean_known(e["au_pct"] for e in epochs),
           "au_whole_pct": mean_known(e["au_whole_pct"] for e in epochs),
           "samples_per_s": mean_known(e["samples_per_s"] for e in epochs),
           "mib_per_s": mean_known(e["mib_per_s"] for e in epochs),
           "au_per_rank_pct": [mean_known(ep["au_pct"] for ep in r) for r in ranks],
           "samples": sum(e["samples"] for e in epochs),
           "first_step_read_pct": max(firsts) if firsts else None}
    decide(out, threshold_pct)
    return out


def search_accelerators(measure: Callable[[int], Dict[str, Any]], max_accelerators: int,
                        start: int = 1) -> Dict[str, Any]:
    """The most accelerators for which ``measure(n)["passed"]``: doubling from ``start``, then bisecting.

    Parameters
    ----------
    measure : callable
        ``n -> figures`` with a ``passed`` key (:func:`aggregate`'s); called once per count tried.
    max_accelerators : int
        The largest count tried.

    Returns
    -------
    dict
        ``best``: the largest count found to pass (0 when
        ``start`` fails); ``tried``: the counts in the order measured; ``runs``: count -> figures.
    """
    if max_accelerators < start or start < 1:
        raise ValueError(f"max_accelerators ({max_accelerators}) must be at least start ({start}) >= 1")
    runs: Dict[int, Dict[str, Any]] = {}
    tried: List[int] = []

    def passed(n: int) -> bool:
        if n not in runs:
            runs[n] = measure(n)
            tried.append(n)
        return bool(runs[n]["passed"])

    good, n = 0, start
    while n <= max_accelerators and passed(n):
        good, n = n, n * 2
    bad = n if n <= max_accelerators else None
    if bad is None:  # every doubling passed: the last step is up to the cap
        if good < max_accelerators and passed(max_accelerators):
            return {"best": max_accelerators, "tried": tried, "runs": runs, "capped": True}
        bad = max_accelerators if good < max_accelerators else None
    if bad is not None:
        while bad - good > 1:
            mid = (good + bad) // 2
            if passed(mid):
                good = mid
            else:
                bad = mid
    return {"best": good, "tried": tried, "runs": runs, "capped": good == max_accelerators}
