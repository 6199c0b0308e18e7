"""Steps: a plan of batches per step, and the runner that times each step of a loader (rate, CPU per
core, accelerator utilisation) as a training job's steps would be timed."""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from dlstore.bench import sysinfo
from dlstore.sources.source import SourceWrapper


__all__ = ["DEFAULT_STEPS", "DEFAULT_STEP_BATCHES", "plan_steps", "fit_batch_size", "CountingSource", "run_steps"]

DEFAULT_STEPS = 9  # the paper's table has steps 1..9
DEFAULT_STEP_BATCHES = 10  # when the record count is not known beforehand


def plan_steps(total_batches: Optional[int], steps: int = DEFAULT_STEPS,
               step_batches: Optional[int] = None) -> List[int]:
    """Batches in each step.

    ``step_batches`` given: ``steps`` steps of that many. Else, with the batch count of the data
    known, the batches dealt into ``steps`` near-equal steps (sizes differ by at most one; fewer
    steps when there are fewer batches). Else ``steps`` of :data:`DEFAULT_STEP_BATCHES`.
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, not {steps}")
    if step_batches is not None:
        if step_batches < 1:
            raise ValueError(f"step_batches must be at least 1, not {step_batches}")
        return [step_batches] * steps
    if total_batches is None:
        return [DEFAULT_STEP_BATCHES] * steps
    if total_batches < 1:
        raise ValueError("the data holds less than one batch")
    k = min(steps, total_batches)
    return [(i + 1) * total_batches // k - i * total_batches // k for i in range(k)]


def fit_batch_size(records: Optional[int], batch_size: int, steps: int,
                   step_batches: Optional[int] = None, epochs: int = 1,
                   holder: str = "the data") -> Tuple[int, Optional[str]]:
    """The batch size to use, lowered so that ``epochs`` passes over ``records`` make at least ``steps``
    batches (``steps`` x ``step_batches`` when that is given); and a note when lowered, saying ``holder``
    holds the records (under MPI, e.g. "the smallest rank's share")."""
    batches = steps * (step_batches or 1)
    samples = None if records is None else records * epochs
    if samples is None or samples >= batch_size * batches:
        return batch_size, None
    fitted = max(1, samples // batches)
    asked = (f"{steps} steps of batch {batch_size}" if step_batches is None else
             f"{steps} steps of {step_batches} batches of {batch_size}")
    held = f"{records} records" + (f" x {epochs} epochs" if epochs > 1 else "")
    note = f"batch size lowered from {batch_size} to {fitted}: {holder} holds {held}, too few for {asked}"
    if samples < batches:
        if step_batches is None:  # plan_steps deals the batches into fewer steps
            note += f"; {samples} steps of batch 1, not {steps}: more data makes more steps"
        else:
            note += f"; the data ends after {samples} batches"
    return fitted, note


def _batch_len(batch: Any) -> int:
    """Samples in a batch: a dict of arrays (the loader's), an array, or anything sized."""
    if isinstance(batch, dict):
        return len(next(iter(batch.values())))
    return len(batch)


class CountingSource(SourceWrapper):
    """A source that counts the record bytes and batches it delivers; all else goes to the wrapped one.

    The loader reads its source ahead (prefetch), so bytes counted during a step are what the
    storage delivered in that time, not exactly the bytes of the step's own samples.
    """

    def __init__(self, source: Any):
        super().__init__(source)
        self.bytes = 0
        self.records = 0

    def batches(self) -> Iterable:
        for batch in self._source.batches():
            self.bytes += batch.nbytes
            self.records += batch.num_records
            yield batch


def run_steps(batches: Iterable, plan: Sequence[int], *, compute_s: float = 0.0,
              counter: Optional[Any] = None, progress: Optional[Callable[[int], None]] = None,
              on_step: Optional[Callable[[Dict[str, Any]], None]] = None,
              clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
              cpu_ticks: Callable[[], List[tuple]] = sysinfo.per_core_cpu_ticks) -> Dict[str, Any]:
    """Consumes ``batches`` step by step as ``plan`` says; times each step.

    The clock starts before the iterator is created, so step 1 includes the pipeline's start.
    With ``compute_s`` the consumer sleeps that long after each batch (the emulated accelerator)
    while the loader prefetches. Stops when the plan is done or the batches end.

    Parameters
    ----------
    batches : iterable
        Batches: dicts of arrays, or anything with ``len``. When it has a ``synchronize()`` (a
        :class:`dlstore.pipeline.Loader`), it is called at the end of each step, before the clock is read,
        so that a GPU loader's step counts the copies of its batches to the GPU.
    plan : sequence of int
        Batches per step (:func:`plan_steps`).
    compute_s : float
        Emulated computation per batch, in seconds.
    counter : object with ``bytes``, optional
        Read at step boundaries for MB/s (a :class:`CountingSource`).
    progress : callable, optional
        Called with the samples of each batch.
    on_step : callable, optional
        Called with each step's figures as the step completes (live metrics).

    Returns
    -------
    dict
        ``steps``: per step ``step``, ``batches``, ``samples``, ``bytes``, ``seconds``, ``rate``
        (samples/s), ``mb_per_s``, ``busiest_core_pct``, ``compute_seconds`` and
        ``accelerator_util_pct`` (None without emulation); and the totals ``batches``,
        ``samples``, ``bytes``, ``seconds``, ``rate``, ``mb_per_s``, ``compute_seconds``,
        ``accelerator_util_pct``, ``busiest_core_pct``, ``cores_pct`` (each core's
        utilisation), ``process_cpu_pct`` (this process's CPU time over wall time, 200 = two
        cores), ``other_processes_cores`` (cores other processes kept busy meanwhile, on average)
        and ``ended_early`` (the data ended before the plan).
    """
    ticks_start = cpu_ticks()
    cpu_start = sysinfo.process_cpu_seconds()
    t_start = clock()
    bytes_start = counter.bytes if counter is not None else 0
    it = iter(batches)
    synchronize = getattr(batches, "synchronize", None)  # Loader.synchronize(); lists and test doubles lack it
    steps: List[Dict[str, Any]] = []
    ended = False
    t_prev, ticks_prev, bytes_prev = t_start, ticks_start, bytes_start
    try:
        for number, n_batches in enumerate(plan, 1):
            samples = done = 0
            computing = 0.0
            for _ in range(n_batches):
                try:
                    batch = next(it)
                except StopIteration:
                    ended = True
                    break
                n = _batch_len(batch)
                del batch  # the loader reuses its buffers: hold nothing past the step
                if compute_s > 0:
                    c0 = clock()
                    sleep(compute_s)
                    computing += clock() - c0
                samples += n
                done += 1
                if progress is not None:
                    progress(n)
            if done == 0:
                break
            if synchronize is not None:
                synchronize()  # a GPU loader's last copies finished: the step ends when its data has arrived
            t_now = clock()
            ticks_now = cpu_ticks()
            nbytes = (counter.bytes if counter is not None else 0) - bytes_prev
            seconds = t_now - t_prev
            cores = sysinfo.per_core_percent(ticks_prev, ticks_now)
            steps.append({
                "step": number, "batches": done, "samples": samples, "bytes": nbytes, "seconds": seconds,
                "rate": samples / seconds if seconds > 0 else None,
                "mb_per_s": nbytes / 1e6 / seconds if seconds > 0 else None,
                "busiest_core_pct": max((c for c in cores if c is not None), default=None),
                "compute_seconds": computing if compute_s > 0 else None,
                "accelerator_util_pct": 100.0 * computing / seconds if compute_s > 0 and seconds > 0 else None,
            })
            if on_step is not None:
                on_step(steps[-1])
            t_prev, ticks_prev = t_now, ticks_now
            bytes_prev += nbytes
            if ended:
                break
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    seconds = t_prev - t_start
    cpu = sysinfo.process_cpu_seconds() - cpu_start
    cores = sysinfo.per_core_percent(ticks_start, ticks_prev)
    samples = sum(s["samples"] for s in steps)
    nbytes = bytes_prev - bytes_start
    computing = sum(s["compute_seconds"] or 0.0 for s in steps)
    return {
        "steps": steps,
        "batches": sum(s["batches"] for s in steps),
        "samples": samples,
        "bytes": nbytes,
        "seconds": seconds,
        "rate": samples / seconds if seconds > 0 else None,
        "mb_per_s": nbytes / 1e6 / seconds if seconds > 0 else None,
        "compute_seconds": computing if compute_s > 0 else None,
        "accelerator_util_pct": 100.0 * computing / seconds if compute_s > 0 and seconds > 0 else None,
        "busiest_core_pct": max((c for c in cores if c is not None), default=None),
        "cores_pct": cores,
        "process_cpu_pct": 100.0 * cpu / seconds if seconds > 0 else None,
        "other_processes_cores": sysinfo.other_processes_cores(ticks_start, ticks_prev, cpu, seconds),
        "ended_early": ended and sum(s["batches"] for s in steps) < sum(plan),
    }
