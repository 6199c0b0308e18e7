"""Concurrent jobs: rows 1..N of loader processes reading the same files at once, each an independent
job, and the aggregate of each row."""
from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence

from dlstore._progress import Progress
from dlstore.bench import sysinfo
from dlstore.bench.compute import Compute
from dlstore.bench.ranks import mean_known
from dlstore.bench.steps import run_steps
from dlstore.bench.tiers import LoaderSpec, close_loader

__all__ = ["run_jobs", "summarize_jobs"]


def _job_main(spec: LoaderSpec, plan: List[int], compute_s: float, index: int, ready, start, results) -> None:
    """One job's process: builds its loader, says it is ready, waits for the common start, runs, reports."""
    try:
        loader, source = spec.open()
        ready.put(index)
        start.wait()
        t0 = time.monotonic()  # CLOCK_MONOTONIC: comparable across the processes of one host
        try:
            measured = run_steps(loader, plan, compute_s=compute_s, counter=source, clock=time.monotonic)
        finally:
            close_loader(loader)
        # The job ends at its last batch, as its own time and the tiers' do: not after its loader's shutdown
        # (which waits for a read under way, seconds on slow storage).
        measured.update(job=index, start=t0, end=t0 + measured["seconds"])
        results.put((index, measured, None))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it with the job's number
        ready.put(index)
        results.put((index, None, traceback.format_exc()))


def summarize_jobs(n: int, jobs: Sequence[Dict[str, Any]], start: float, cores_pct: Sequence[Optional[float]],
                   compute: Optional[Compute] = None, batch_size: int = 1) -> Dict[str, Any]:
    """One row of the jobs table from each job's :func:`run_steps` result (with its ``start``/``end``).

    The aggregate rate is every job's samples over the time from the common ``start`` to the last
    job's end; per-job rates are each job's samples over its own time.
    """
    end = max(j["end"] for j in jobs)
    wall = end - start
    samples = sum(j["samples"] for j in jobs)
    nbytes = sum(j["bytes"] for j in jobs)
    per_job = [j["rate"] for j in jobs if j["rate"] is not None]
    row = {
        "jobs": n,
        "samples": samples,
        "bytes": nbytes,
        "seconds": wall,
        "rate": samples / wall if wall > 0 else None,
        "per_job_rate_mean": sum(per_job) / len(per_job) if per_job else None,
        "per_job_rate_min": min(per_job) if per_job else None,
        "mb_per_s": nbytes / 1e6 / wall if wall > 0 else None,
        "busiest_core_pct": max((c for c in cores_pct if c is not None), default=None),
        "accelerator_util_pct": None,
        "sustained_pct": None,
        "per_job": [{k: j[k] for k in ("job", "samples", "bytes", "seconds", "rate", "accelerator_util_pct")}
                    for j in sorted(jobs, key=lambda j: j["job"])],
    }
    if compute is not None:
        row["accelerator_util_pct"] = mean_known(j["accelerator_util_pct"] for j in jobs)
        need = n * compute.samples_per_s(batch_size)
        row["sustained_pct"] = 100.0 * row["rate"] / need if row["rate"] else None
    return row


def run_jobs(spec: LoaderSpec, max_jobs: int, plan: Sequence[int], *, prepare: Callable[[], str],
             compute: Optional[Compute] = None, quiet: bool = True, timeout: float = 600.0) -> Dict[str, Any]:
    """The jobs table: for n in 1..max_jobs, n loader processes at once (see the module's docstring).

    ``prepare()`` readies the cache before each row (after the jobs have built their loaders, before
    they start) and returns what it did.
    """
    # spawn, not fork: this process runs C++ reader threads, and a forked child inherits none of
    # them but may inherit their locks held.
    ctx = mp.get_context("spawn")
    rows = []
    method = None
    bar = Progress(max_jobs * (max_jobs + 1) // 2, "jobs", unit="job", enabled=False if quiet else None)
    try:
        for n in range(1, max_jobs + 1):
            ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
            compute_s = compute.seconds_per_batch if compute else 0.0
            procs = [ctx.Process(target=_job_main, args=(spec.for_job(j), list(plan), compute_s, j, ready, start,
                                                         results), name=f"dlstore-bench-job{j}", daemon=True)
                     for j in range(n)]
            for p in procs:
                p.start()
            try:
                for _ in range(n):
                    ready.get(timeout=timeout)
                method = prepare()
                ticks0 = sysinfo.per_core_cpu_ticks()
                t0 = time.monotonic()
                start.set()
                got: Dict[int, Dict[str, Any]] = {}
                deadline = t0 + timeout
                while len(got) < n:
                    try:
                        index, measured, error = results.get(timeout=1.0)
                    except queue_module.Empty:
                        dead = [p for p in procs if p.exitcode not in (None, 0)]
                        if dead:
                            raise RuntimeError(f"job process {dead[0].name} died with exit code "
                                               f"{dead[0].exitcode}") from None
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"the {n} jobs did not finish within {timeout:.0f} s") from None
                        continue
                    if error is not None:
                        raise RuntimeError(f"job {index} of {n} failed:\n{error}")
                    got[index] = measured
                    bar.update()
                cores = sysinfo.per_core_percent(ticks0, sysinfo.per_core_cpu_ticks())
            finally:
                for p in procs:
                    p.join(timeout=30)
                    if p.is_alive():
                        p.kill()
                        p.join()
            rows.append(summarize_jobs(n, list(got.values()), t0, cores, compute, spec.batch_size))
    finally:
        bar.close()
    return {"rows": rows, "cache_method": method, "steps_per_job": len(plan), "batches_per_job": sum(plan),
            "shards": "every job reads the same files, job j shuffled with seed + j"}
