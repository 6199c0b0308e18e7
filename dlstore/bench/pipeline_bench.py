"""What ``python -m dlstore.bench resnet50`` and ``... bert`` share: tiers, steps, jobs, accelerator emulation.

The benchmark runs a whole input pipeline as training runs it (records read through a shuffled
:class:`dlstore.Dataset`, ``--shuffle``, this rank's share; decoded or parsed, batched by
:class:`dlstore.pipeline.Loader`) and reports it the way the Graphcore IPU-POD64 + DDN AI400X2
reference architecture does:

- **Tiers**, side by side in one run, on the same step plan:

  - ``page-cache``: the baseline data read once first (untimed) so that it sits in the page cache,
    checked with ``mincore``; then read through the page cache (``buffered``, or ``mmap`` when
    asked for).
  - ``local-cold``: the same files, the page cache dropped (root) or the files evicted
    (``posix_fadvise``) just before; the report says which.
  - ``target``: the ``--data`` files (the storage under test), made cold the same way.

  The baseline data is the generated synthetic set (or ``--local``), on the local disk that
  holds the dlstore cache directory.
- **Steps**: a step is a fixed number of batches, ``step_batches`` (a training step's worth of
  data, as the paper's "images per second" of training steps 1..9). By default the baseline
  set's batches are dealt into ``--steps`` (9) near-equal steps, so one tier reads the set once;
  ``--step-batches`` fixes it. The rate of a step is the samples of its batches over the wall
  time from the end of the previous step to the end of its last batch, so step 1 includes the
  pipeline's start (threads started, first reads), as a training job's first step does. Every
  tier, the target included, follows the same plan; a tier whose data ends early has fewer steps.
- **Jobs** (``--jobs N``): rows 1..N; row ``n`` runs ``n`` loader processes at once, each one
  an independent job reading *the same* files (its own loader, its own shuffle: job ``j`` uses
  seed ``--seed + j``, so concurrent jobs do not read the same place at the same moment), each
  for ``--jobs-steps`` steps of the plan (the paper's jobs table is the first
  training step). The cache is prepared as for the tier named by ``--jobs-tier`` before each row.
  Aggregate rate = all samples of all jobs over the time from the common start to the last
  finish.
- **Accelerator emulation** (``--compute a100|h100|...|MS``), as MLPerf Storage does: after each
  batch the consumer sleeps the accelerator's time per batch while the loader keeps prefetching.
  Accelerator utilisation (AU) = time spent computing / wall time; "storage sustains X% of what N
  accelerators need" = delivered rate / (N x one accelerator's rate).
- **CPU**: ``/proc/stat`` per core, sampled at every step boundary and over each tier; the
  busiest core's utilisation is the bottleneck signal of the Dell EMC Isilon reference
  architecture (system-wide, not only this process), beside the process's own CPU time.
- **MB/s** counts the record bytes the loader's source delivered (payload, without framing)
  over wall time.

Under MPI (``mpi4py`` importable and a launcher's world size > 1) every rank runs the tiers on
its share of the records (its Dataset's: ranks are consumers of one epoch plan) at the same time,
synchronised by a barrier before each tier, and rank 0 prints one table per rank and the aggregate.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from dlstore import settings
from dlstore._progress import Progress
from dlstore.io import pagecache as cache_control
from dlstore.bench import report, sysinfo
from dlstore.io.select import ENGINES
from dlstore.placement.sharding import SHUFFLES
from dlstore.synthetic import PRESETS

__all__ = [
    "TIERS", "ComputePreset", "Compute", "Workload", "LoaderSpec", "CountingSource",
    "resolve_compute", "plan_steps", "fit_batch_size", "run_steps", "warm_up", "run_tier", "read_share",
    "summarize_jobs", "run_jobs", "aggregate_ranks", "build_document", "format_report", "markdown_report",
    "add_common_arguments", "run_workload",
]

TIERS = ("page-cache", "local-cold", "target")
DEFAULT_STEPS = 9  # the paper's table has steps 1..9
DEFAULT_STEP_BATCHES = 10  # when the record count is not known beforehand
AU_THRESHOLD_PCT = 90.0  # MLPerf Storage counts a run as feeding its accelerators at AU >= 90%


# ---- accelerator emulation ----------------------------------------------------------------------

@dataclass(frozen=True)
class ComputePreset:
    """One accelerator's training rate (samples/s), per variant (BERT: sequence length), and where it comes from."""

    name: str
    rates: Dict[Optional[int], float]
    source: str


@dataclass(frozen=True)
class Compute:
    """The emulated accelerator: seconds of computation per batch, and what they stand for."""

    seconds_per_batch: float
    label: str
    source: str
    name: str = "accelerator"

    def samples_per_s(self, batch_size: int) -> float:
        """Samples per second one emulated accelerator consumes."""
        return batch_size / self.seconds_per_batch


_MLPERF = "MLPerf Storage v1.0 workload"
COMPUTE_PRESETS: Dict[str, Dict[str, ComputePreset]] = {
    "resnet50": {
        # mlcommons/storage configs/dlio/workload/resnet50_{a100,h100}.yaml: batch_size 400,
        # computation_time 0.435 s (A100) and 0.224 s (H100): 920 and 1,786 images/s.
        "a100": ComputePreset("a100", {None: 400 / 0.435},
                              f"{_MLPERF} resnet50_a100.yaml: 0.435 s per batch of 400"),
        "h100": ComputePreset("h100", {None: 400 / 0.224},
                              f"{_MLPERF} resnet50_h100.yaml: 0.224 s per batch of 400"),
    },
    "bert": {
        # No MLPerf Storage figure exists for BERT on these GPUs: order-of-magnitude estimates of
        # BERT-Large pretraining with mixed precision, sequences/s per GPU at seq 128 and 384.
        "a100": ComputePreset("a100", {128: 800.0, 384: 250.0},
                              "rough estimate (BERT-Large, mixed precision), not a measurement; "
                              "pass --compute MS with your own step time"),
        "h100": ComputePreset("h100", {128: 1600.0, 384: 500.0},
                              "rough estimate (about 2x A100), not a measurement; "
                              "pass --compute MS with your own step time"),
        # The Graphcore IPU-POD64 + DDN AI400X2 reference architecture, BERT-Large, items/s per Poplar
        # host (8 IPUs of an IPU-POD64).
        "pod64-host": ComputePreset("pod64-host", {128: 3708.0, 384: 1054.0},
                                    "Graphcore IPU-POD64 + DDN AI400X2 paper, BERT-Large items/s per host"),
    },
}


def resolve_compute(text: Optional[str], workload: str, batch_size: int,
                    variant: Optional[int] = None) -> Optional[Compute]:
    """``--compute``: a preset name (``a100``, ``h100``, ...) or milliseconds per batch; None: no emulation.

    A preset's rate is turned into seconds per batch of ``batch_size``.

    Raises
    ------
    ValueError
        For an unknown preset, a variant the preset has no figure for, or a non-positive time.
    """
    if text is None:
        return None
    try:
        ms: Optional[float] = float(text)
    except ValueError:
        ms = None
    if ms is not None:
        if not 0 < ms < float("inf"):
            raise ValueError(f"--compute must be a positive number of milliseconds per batch, not {text}")
        return Compute(ms / 1e3, f"{ms:g} ms per batch of {batch_size} "
                                 f"({batch_size / (ms / 1e3):,.0f} samples/s per accelerator)",
                       "given on the command line", f"{ms:g} ms/batch")
    presets = COMPUTE_PRESETS.get(workload, {})
    if text not in presets:
        raise ValueError(f"--compute {text!r}: not a number of milliseconds per batch nor a preset for "
                         f"{workload} ({', '.join(presets) or 'none'})")
    preset = presets[text]
    rate = preset.rates.get(variant, preset.rates.get(None))
    if rate is None:
        raise ValueError(f"--compute {text}: no figure for {workload} at {variant} "
                         f"(has {', '.join(str(k) for k in preset.rates)})")
    seconds = batch_size / rate
    return Compute(seconds, f"{text}: {seconds * 1e3:.0f} ms per batch of {batch_size} "
                            f"({rate:,.0f} samples/s per accelerator)", preset.source, text)


# ---- steps ----------------------------------------------------------------------------------------

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


def fit_batch_size(records: Optional[int], batch_size: int, steps: int) -> Tuple[int, Optional[str]]:
    """The batch size to use, lowered so that ``records`` make at least ``steps`` batches; and a note when lowered."""
    if records is None or records >= batch_size * steps:
        return batch_size, None
    fitted = max(1, records // steps)
    return fitted, (f"batch size lowered from {batch_size} to {fitted}: the data holds {records} records, "
                    f"too few for {steps} steps of batch {batch_size}")


def _batch_len(batch: Any) -> int:
    """Samples in a batch: a dict of arrays (the loader's), an array, or anything sized."""
    if isinstance(batch, dict):
        return len(next(iter(batch.values())))
    return len(batch)


class CountingSource:
    """A source that counts the record bytes and batches it delivers; all else goes to the wrapped one.

    The loader reads its source ahead (prefetch), so bytes counted during a step are what the
    storage delivered in that time, not exactly the bytes of the step's own samples.
    """

    def __init__(self, source: Any):
        self._source = source
        self.bytes = 0
        self.records = 0

    def batches(self) -> Iterable:
        for batch in self._source.batches():
            self.bytes += batch.nbytes
            self.records += batch.num_records
            yield batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)


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
        Batches: dicts of arrays, or anything with ``len``.
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


# ---- one loader ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    """What differs between ``resnet50`` and ``bert``: names, units, data, pipeline and presets.

    ``pipeline`` names a class of :mod:`dlstore.pipeline` built with the keyword arguments that
    ``pipeline_kwargs(args)`` returns; ``--size`` picks a preset of :data:`dlstore.synthetic.PRESETS`
    for ``dataset_kind`` (``default`` unless given) and ``dataset_overrides(args)`` adds generator arguments.
    """

    name: str
    unit: str  # "images" or "samples": the JSON key is f"{unit}_per_s"
    dataset_kind: str
    pipeline: str
    default_batch_size: int
    pipeline_kwargs: Callable[[argparse.Namespace], Dict[str, Any]]
    dataset_overrides: Callable[[argparse.Namespace], Dict[str, Any]] = field(default=lambda args: {})
    variant: Callable[[argparse.Namespace], Optional[int]] = field(default=lambda args: None)
    describe: Callable[[argparse.Namespace], str] = field(default=lambda args: "")
    #: The --size preset of the generated baseline set: large enough that a tier lasts seconds.
    default_size: str = "default"
    size_help: str = ""

    @property
    def rate_key(self) -> str:
        return f"{self.unit}_per_s"


@dataclass(frozen=True)
class LoaderSpec:
    """Everything needed to build one loader, in this process or in a job's (picklable).

    The loader reads a :class:`dlstore.Dataset`: this rank's share of the records (rank and size from
    the launcher, so under mpirun each rank reads its own), in ``shuffle`` order, as training reads.
    """

    pipeline: str
    pipeline_kwargs: Dict[str, Any]
    paths: Tuple[str, ...]  # the files (what the cache is dropped or warmed for)
    batch_size: int
    io: str = "auto"
    verify: bool = True
    prefetch: int = 2
    threads: Optional[int] = None
    epochs: int = 1
    mounts: Tuple[str, ...] = ()  # with mounts: the Dataset reads `shards`, relative to them
    shards: Tuple[str, ...] = ()
    shuffle: str = "block"
    seed: int = 0

    def dataset(self):
        """This rank's :class:`dlstore.Dataset` of the spec's data."""
        from dlstore.sources.dataset import Dataset

        if self.mounts:
            where: Dict[str, Any] = dict(shards=list(self.shards), mounts=list(self.mounts))
        else:
            where = dict(shards=list(self.paths))
        return Dataset(**where, io=self.io, verify=self.verify, shuffle=self.shuffle, seed=self.seed,
                       remainder="uneven", batch_size=self.batch_size)

    def open(self) -> Tuple[Any, CountingSource]:
        """``(loader, source)``: a :class:`dlstore.pipeline.Loader` over a counting :meth:`dataset`."""
        from dlstore.pipeline import Loader

        pipeline_cls = getattr(importlib.import_module("dlstore.pipeline"), self.pipeline)
        source = CountingSource(self.dataset())
        loader = Loader(source, pipeline_cls(**self.pipeline_kwargs), self.batch_size, prefetch=self.prefetch,
                        last_batch="DROP", threads=self.threads, epochs=self.epochs, seed=self.seed)
        return loader, source

    def for_job(self, job: int) -> "LoaderSpec":
        """The spec of concurrent job ``job``: its own seed, so jobs read the shared files in different orders."""
        return dataclasses.replace(self, seed=self.seed + job)


def _close(loader: Any) -> None:
    close = getattr(loader, "close", None)
    if close is not None:
        close()


def warm_up(spec: LoaderSpec, batches: int = 1) -> None:
    """Draws ``batches`` batches from a loader of ``spec``, untimed, then closes it.

    The first loader of a process pays one-off costs (imports, thread pools, the decoder's
    tables); without this the first tier would carry them and look slower than the others.
    """
    loader, _ = spec.open()
    try:
        for i, _batch in enumerate(loader, 1):
            if i >= batches:
                break
    finally:
        _close(loader)


def run_tier(tier: str, spec: LoaderSpec, plan: Sequence[int], *, cold: bool, compute_s: float = 0.0,
             quiet: bool = True, log: Callable[[str], None] = print, unit: str = "images",
             metrics: Optional[Any] = None) -> Dict[str, Any]:
    """One tier: the cache prepared (warm: read once; cold: dropped or evicted), then :func:`run_steps`.

    ``metrics`` (a :class:`dlstore.bench.metrics.BenchMetrics`) gets each step as it completes.

    Returns
    -------
    dict
        :func:`run_steps`' figures plus ``tier``, ``io``, ``io_reason``, ``cache``,
        ``cache_method`` and ``cached_before`` (fraction of the files in the page cache when
        the tier started), and the loader's ``loader_stats`` when it has them.
    """
    paths = list(spec.paths)
    method = None if cold else cache_control.make_warm(paths)
    loader, source = spec.open()
    try:
        if cold:
            method = cache_control.make_cold(paths)
        resident = cache_control.resident_fraction(paths)
        if not cold and resident is not None and resident < 0.95:
            log(f"note: {tier}: only {100 * resident:.0f}% of the data stayed in the page cache: the warm tier "
                "is partly cold")
        bar = Progress(sum(plan) * spec.batch_size, tier, unit=unit, enabled=False if quiet else None)
        on_step = None
        if metrics is not None:
            metrics.begin(tier, source.engine)

            def on_step(step: Dict[str, Any]) -> None:
                metrics.step(tier, source.engine, step, records=source.records)
        try:
            measured = run_steps(loader, plan, compute_s=compute_s, counter=source,
                                 progress=bar.update if bar.enabled else None, on_step=on_step)
        finally:
            bar.close()
        stats = loader.stats() if hasattr(loader, "stats") else None
    finally:
        _close(loader)
    return dict(measured, tier=tier, io=source.engine, io_reason=source.engine_reason,
                cache="cold" if cold else "warm", cache_method=method, cached_before=resident,
                read_share_pct=read_share(stats), loader_stats=stats)


def read_share(stats: Optional[Dict[str, Any]]) -> Optional[float]:
    """Of the loader's producer time, the percentage spent waiting for the source (reading) rather than
    decoding: near 100 the storage is the limit, near 0 the CPU is. None when the loader does not say."""
    if not stats:
        return None
    reading, decoding = stats.get("source_s"), stats.get("pipeline_s")
    if reading is None or decoding is None or reading + decoding <= 0:
        return None
    return 100.0 * reading / (reading + decoding)


# ---- jobs ------------------------------------------------------------------------------------------

def _job_main(spec: LoaderSpec, plan: List[int], compute_s: float, index: int, ready, start, results) -> None:
    """One job's process: builds its loader, says it is ready, waits for the common start, runs, reports."""
    try:
        loader, source = spec.open()
        ready.put(index)
        start.wait()
        t0 = time.monotonic()  # CLOCK_MONOTONIC: comparable across the processes of one host
        try:
            measured = run_steps(loader, plan, compute_s=compute_s, counter=source)
        finally:
            _close(loader)
        measured.update(job=index, start=t0, end=time.monotonic())
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
        row["accelerator_util_pct"] = _mean_known(j["accelerator_util_pct"] for j in jobs)
        need = n * compute.samples_per_s(batch_size)
        row["sustained_pct"] = 100.0 * row["rate"] / need if row["rate"] else None
    return row


def run_jobs(spec: LoaderSpec, max_jobs: int, plan: Sequence[int], *, prepare: Callable[[], str],
             compute: Optional[Compute] = None, quiet: bool = True, timeout: float = 600.0) -> Dict[str, Any]:
    """The jobs table: for n in 1..max_jobs, n loader processes at once (see the module's docstring).

    ``prepare()`` readies the cache before each row (after the jobs have built their loaders, before
    they start) and returns what it did.
    """
    import multiprocessing as mp
    import queue as queue_module

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


# ---- MPI -------------------------------------------------------------------------------------------

def _sum_known(values: Iterable[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _mean_known(values: Iterable[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def aggregate_ranks(per_rank: Sequence[Sequence[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """The aggregate of each tier over ranks: samples and bytes summed, over the slowest rank's time.

    A step's aggregate rate is the sum of the ranks' rates for that step (the ranks run the same
    plan at the same time); the busiest core is the busiest over all ranks' hosts.
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
                                                   if s["busiest_core_pct"] is not None), default=None)})
        out.append(dict(
            tier=tiers[0]["tier"], io=tiers[0]["io"], io_reason=tiers[0]["io_reason"], cache=tiers[0]["cache"],
            cache_method=tiers[0]["cache_method"], ranks=len(tiers), samples=samples, bytes=nbytes, seconds=seconds,
            rate=samples / seconds if seconds > 0 else None, mb_per_s=nbytes / 1e6 / seconds if seconds > 0 else None,
            steps=steps, busiest_core_pct=max((t["busiest_core_pct"] for t in tiers
                                               if t["busiest_core_pct"] is not None), default=None),
            accelerator_util_pct=_mean_known(t.get("accelerator_util_pct") for t in tiers),
            batches=sum(t["batches"] for t in tiers),
            process_cpu_pct=_sum_known(t.get("process_cpu_pct") for t in tiers),
            cached_before=_mean_known(t.get("cached_before") for t in tiers),
            read_share_pct=_mean_known(t.get("read_share_pct") for t in tiers)))
    return out


# ---- the document, the tables ------------------------------------------------------------------------

def _tier_entry(t: Dict[str, Any], rate_key: str, compute: Optional[Compute], batch_size: int,
                accelerators: int = 1) -> Dict[str, Any]:
    """A tier as the JSON holds it: the agreed keys first, then the details."""
    entry = {
        "tier": t["tier"],
        "io": t["io"],
        rate_key: t["rate"],
        "mb_per_s": t["mb_per_s"],
        "steps": [s["rate"] for s in t["steps"]],
        "cpu_busiest_core_pct": t["busiest_core_pct"],
    }
    entry.update({k: v for k, v in t.items() if k not in ("rate", "busiest_core_pct", "steps")})
    entry["step_details"] = t["steps"]
    entry["bytes_per_sample"] = t["bytes"] / t["samples"] if t["samples"] else None
    if compute is not None:
        need = compute.samples_per_s(batch_size)
        entry["required_mb_per_s_per_accelerator"] = (need * entry["bytes_per_sample"] / 1e6
                                                      if entry["bytes_per_sample"] else None)
        entry["sustained_pct"] = 100.0 * t["rate"] / (accelerators * need) if t["rate"] else None
    return entry


def build_document(workload: Workload, tiers: Sequence[Dict[str, Any]], *, info: Dict[str, Any],
                   config: Dict[str, Any], compute: Optional[Compute], batch_size: int,
                   jobs: Optional[Dict[str, Any]] = None, ranks: Optional[List[List[Dict[str, Any]]]] = None,
                   notes: Sequence[str] = (), warnings: Sequence[str] = ()) -> Dict[str, Any]:
    """The JSON document: ``benchmark``, ``unit``, ``sysinfo`` (the header), ``config``, ``tiers``
    (per tier ``tier``, ``io``, ``<unit>_per_s``, ``mb_per_s``, ``steps``, ``cpu_busiest_core_pct``
    and details), ``jobs``, ``compute``, ``verdict``, ``notes``, ``warnings`` (why a figure may not
    be trusted: :func:`dlstore.bench.sysinfo.trust_warnings`); under MPI ``ranks`` (each rank's
    tiers) and the tiers are the aggregate."""
    world = len(ranks) if ranks else 1
    doc: Dict[str, Any] = {
        "benchmark": workload.name,
        "unit": workload.unit,
        "sysinfo": info,
        "config": dict(config, batch_size=batch_size),
        "tiers": [_tier_entry(t, workload.rate_key, compute, batch_size, world) for t in tiers],
        "jobs": jobs,
        "compute": None if compute is None else {
            "name": compute.name, "seconds_per_batch": compute.seconds_per_batch, "label": compute.label,
            "source": compute.source,
            "samples_per_s_per_accelerator": compute.samples_per_s(batch_size)},
        "notes": list(notes),
        "warnings": list(warnings),
    }
    if ranks:
        doc["world_size"] = world
        doc["ranks"] = [[_tier_entry(t, workload.rate_key, compute, batch_size) for t in r] for r in ranks]
    doc["verdict"] = _verdict(doc, workload, compute, batch_size, world)
    return doc


def _verdict(doc: Dict[str, Any], workload: Workload, compute: Optional[Compute], batch_size: int,
             world: int) -> List[str]:
    """Lines naming what the storage sustains, against the emulated accelerators when there are some."""
    key = workload.rate_key
    unit = workload.unit
    by_name = {t["tier"]: t for t in doc["tiers"]}
    lines = []
    base = by_name.get("page-cache")
    for name in ("local-cold", "target"):
        t = by_name.get(name)
        if t is not None and base is not None and t[key] and base[key]:
            lines.append(f"{name}: {t[key]:,.0f} {unit}/s = {100 * t[key] / base[key]:.0f}% of the page-cache tier "
                         f"({base[key]:,.0f} {unit}/s)")
    if compute is None:
        lines.append("no accelerator emulated: add --compute a100 (or h100, or ms per batch) for accelerator "
                     "utilisation and the MB/s each accelerator needs")
        return lines
    need = compute.samples_per_s(batch_size)
    judged = by_name.get("target") or by_name.get("local-cold") or (doc["tiers"][0] if doc["tiers"] else None)
    if judged is not None and judged.get("sustained_pct") is not None:
        au = judged.get("accelerator_util_pct")
        req = judged.get("required_mb_per_s_per_accelerator")
        acc = f"{world} accelerators ({compute.name}) need" if world > 1 else f"1 accelerator ({compute.name}) needs"
        au_text = "-" if au is None else f"{au:.0f}%"
        meets = "meets" if au is not None and au >= AU_THRESHOLD_PCT else "below"
        req_text = "-" if req is None else f"{req:,.1f}"
        lines.append(f"{judged['tier']}: storage sustains {judged['sustained_pct']:.0f}% of what {acc}: "
                     f"{judged[key]:,.0f} of {world * need:,.0f} {unit}/s; "
                     f"accelerator utilisation {au_text} ({meets} MLPerf Storage's {AU_THRESHOLD_PCT:.0f}%); "
                     f"each accelerator needs {req_text} MB/s")
    jobs = doc.get("jobs")
    if jobs and jobs.get("rows"):
        fed = 0  # the most jobs for which every row up to it kept its accelerators busy enough
        for r in jobs["rows"]:
            if (r.get("accelerator_util_pct") or 0) < AU_THRESHOLD_PCT:
                break
            fed = r["jobs"]
        last = jobs["rows"][-1]
        reach = (f"AU >= {AU_THRESHOLD_PCT:.0f}% with up to {fed} {'job' if fed == 1 else 'jobs'}" if fed else
                 f"AU below {AU_THRESHOLD_PCT:.0f}% already with 1 job")
        lines.append(f"jobs: {last['jobs']} emulated accelerators at once get {last['sustained_pct']:.0f}% of what "
                     f"they need (mean AU {last['accelerator_util_pct']:.0f}%); {reach}")
    return lines


def _rate_fmt(v: float) -> str:
    return f"{v:,.0f}"


def _pct_fmt(v: float) -> str:
    return f"{v:.0f}%"


def step_table(tiers: Sequence[Dict[str, Any]], unit: str) -> Tuple[List[Dict[str, Any]], List[report.Column]]:
    """The per-step table, tiers side by side as the paper's (Step | NVMe | AI400X2), with each tier's busiest core."""
    columns = [report.Column("step", "step", align="<")]
    n = max((len(t["step_details"]) for t in tiers), default=0)
    rows: List[Dict[str, Any]] = [{"step": i + 1} for i in range(n)]
    for t in tiers:
        name = t["tier"]
        columns.append(report.Column(f"{name}:rate", f"{name} {unit}/s", _rate_fmt))
        columns.append(report.Column(f"{name}:mb", "MB/s", "{:,.0f}"))
        columns.append(report.Column(f"{name}:cpu", "core%", "{:.0f}"))
        if any(s.get("accelerator_util_pct") is not None for s in t["step_details"]):
            columns.append(report.Column(f"{name}:au", "AU", _pct_fmt))
        for i, s in enumerate(t["step_details"]):
            rows[i].update({f"{name}:rate": s["rate"], f"{name}:mb": s["mb_per_s"],
                            f"{name}:cpu": s["busiest_core_pct"], f"{name}:au": s.get("accelerator_util_pct")})
    return rows, columns


def tier_table(tiers: Sequence[Dict[str, Any]], rate_key: str, unit: str) -> Tuple[List[Dict], List[report.Column]]:
    """One summary row per tier."""
    columns = [
        report.Column("tier", "tier", align="<"),
        report.Column("io", "io", align="<"),
        report.Column(rate_key, f"{unit}/s", _rate_fmt),
        report.Column("mb_per_s", "MB/s", "{:,.1f}"),
        report.Column("cpu_busiest_core_pct", "busiest core", _pct_fmt),
        report.Column("process_cpu_pct", "process CPU", _pct_fmt),
        report.Column("seconds", "seconds", "{:.2f}"),
        report.Column("cached_before", "cached before", lambda v: f"{100 * v:.0f}%"),
        report.Column("read_share_pct", "reading", _pct_fmt),
    ]
    if any(t.get("accelerator_util_pct") is not None for t in tiers):
        columns += [report.Column("accelerator_util_pct", "AU", _pct_fmt),
                    report.Column("sustained_pct", "sustains", _pct_fmt),
                    report.Column("required_mb_per_s_per_accelerator", "needed MB/s per accel.", "{:,.1f}")]
    return list(tiers), columns


def jobs_table(jobs: Dict[str, Any], unit: str) -> Tuple[List[Dict], List[report.Column]]:
    """One row per number of concurrent jobs."""
    columns = [
        report.Column("jobs", "jobs", align="<"),
        report.Column("rate", f"aggregate {unit}/s", _rate_fmt),
        report.Column("per_job_rate_mean", f"per job {unit}/s", _rate_fmt),
        report.Column("per_job_rate_min", "slowest job", _rate_fmt),
        report.Column("mb_per_s", "MB/s", "{:,.1f}"),
        report.Column("busiest_core_pct", "busiest core", _pct_fmt),
    ]
    if any(r.get("accelerator_util_pct") is not None for r in jobs["rows"]):
        columns += [report.Column("accelerator_util_pct", "AU", _pct_fmt),
                    report.Column("sustained_pct", "sustains", _pct_fmt)]
    return jobs["rows"], columns


def _sections(doc: Dict[str, Any]) -> List[Tuple[str, Tuple[List[Dict], List[report.Column]]]]:
    unit = doc["unit"]
    rate_key = f"{unit}_per_s"
    per = "all ranks, " if doc.get("ranks") else ""
    out = [(f"{unit}/s per step ({per}a step = {doc['config']['step_batches_text']})", step_table(doc["tiers"], unit)),
           ("tiers", tier_table(doc["tiers"], rate_key, unit))]
    for r, tiers in enumerate(doc.get("ranks") or []):
        out.append((f"rank {r}: {unit}/s per step", step_table(tiers, unit)))
    if doc.get("jobs"):
        j = doc["jobs"]
        out.append((f"concurrent jobs ({j['shards']}; each runs {j['steps_per_job']} "
                    f"{'step' if j['steps_per_job'] == 1 else 'steps'}, {j['batches_per_job']} batches; "
                    f"cache: {j['cache_method']})", jobs_table(j, unit)))
    return out


def format_report(doc: Dict[str, Any]) -> str:
    """The tables and the verdict as terminal text."""
    lines = []
    for title, (rows, columns) in _sections(doc):
        lines += [report.text_table(rows, columns, title=title), ""]
    for t in doc["tiers"]:
        lines.append(f"{t['tier']:<10} io={t['io']} ({t['io_reason']}); cache: {t['cache_method']}")
    decoders = {(t.get("loader_stats") or {}).get("decoder") for t in doc["tiers"]} - {None}
    for d in sorted(decoders):
        lines.append(f"decoder: {d}")
    if any(t.get("read_share_pct") is not None for t in doc["tiers"]):
        lines.append("reading: the loader's time waiting for records, as a share of its time reading + decoding "
                     "(near 100%: storage-bound; near 0%: CPU-bound)")
    for note in doc["notes"]:
        lines.append(f"note: {note}")
    if doc.get("compute"):
        c = doc["compute"]
        lines.append(f"accelerator emulated: {c['label']}; source: {c['source']}")
    lines += [""] + [f"verdict: {v}" for v in doc["verdict"]]
    lines += [f"warning: {w}" for w in doc.get("warnings", [])]
    return "\n".join(lines)


def markdown_report(doc: Dict[str, Any]) -> str:
    """The same tables as markdown, with the header's facts and the verdict."""
    info = doc["sysinfo"]
    out = [f"## dlstore.bench {doc['benchmark']}", "",
           f"{info.get('cpu')}, {info.get('cores')} cores; {info.get('kernel')}; data on {info.get('filesystem', '?')}",
           ""]
    for title, (rows, columns) in _sections(doc):
        out += [f"**{title}**", "", report.markdown_table(rows, columns)]
    out += [f"- {v}" for v in doc["verdict"]]
    out += [f"- warning: {w}" for w in doc.get("warnings", [])]
    return "\n".join(out) + "\n"


# ---- the command line ------------------------------------------------------------------------------

def add_common_arguments(p: argparse.ArgumentParser, workload: Workload) -> None:
    """Options both pipeline scenarios take."""

    unit = workload.unit
    p.add_argument("--data", metavar="GLOB",
                   help="the storage under test (a glob, directory or file): adds the 'target' tier. With "
                        "--mounts, shard paths relative to each mount point")
    p.add_argument("--mounts", nargs="+", metavar="DIR",
                   help="mount points holding the --data shards (placement across mounts)")
    p.add_argument("--local", metavar="GLOB",
                   help="data for the page-cache and local-cold baselines (default: a generated "
                        f"{workload.dataset_kind} set of --size, cached under the dlstore cache directory)")
    p.add_argument("--size", choices=tuple(PRESETS[workload.dataset_kind]), default=workload.default_size,
                   help=f"size of the generated baseline set (default: %(default)s{workload.size_help}; tiny is "
                        "for smoke tests)")
    p.add_argument("--tiers", default=None, metavar="LIST",
                   help=f"comma-separated tiers to run, of {', '.join(TIERS)} (default: page-cache,local-cold, "
                        "and target with --data)")
    p.add_argument("--io", choices=("auto",) + ENGINES, default=None,
                   help=settings.SETTINGS["io"].help + " The page-cache tier reads with buffered (or mmap) I/O. "
                        f"Default: ${settings.SETTINGS['io'].env}, else auto.")
    p.add_argument("--no-verify", dest="verify", action="store_false", help="do not check TFRecord CRCs")
    p.add_argument("--shuffle", choices=tuple(SHUFFLES), default="block",
                   help="the record shuffle of the Dataset each tier reads, as training reads (default: "
                        "%(default)s: blocks read whole in a seeded order through a shuffle buffer; none, buffer, "
                        "or global: a full permutation)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the shuffle and the augmentation")
    p.add_argument("--batch-size", type=int, default=workload.default_batch_size, metavar="N",
                   help=f"{unit} per batch (default: %(default)s; lowered, saying so, when the data is too small "
                        "for the steps)")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="K",
                   help="steps per tier (default: %(default)s, as in the per-step table of the Graphcore "
                        "IPU-POD64 + DDN AI400X2 reference architecture)")
    p.add_argument("--step-batches", type=int, default=None, metavar="B",
                   help="batches per step (default: the baseline set's batches dealt into --steps steps, so a "
                        f"tier reads it once; {DEFAULT_STEP_BATCHES} when its size is unknown)")
    p.add_argument("--epochs", type=int, default=1, metavar="E",
                   help="passes over the data per tier (default: %(default)s). A cold tier is cold in its first "
                        "epoch only: later ones come from the page cache, as the Graphcore + DDN "
                        "reference architecture's later steps do")
    p.add_argument("--jobs", type=int, default=0, metavar="N",
                   help="also run the jobs table: 1..N concurrent loader processes")
    p.add_argument("--jobs-steps", type=int, default=1, metavar="S",
                   help="steps each job runs in the jobs table (default: %(default)s: the first training step, as "
                        "in the Graphcore + DDN reference architecture's jobs table)")
    p.add_argument("--jobs-tier", choices=TIERS, default=None,
                   help="cache state and data of the jobs table (default: target with --data, else local-cold)")
    p.add_argument("--compute", metavar="PRESET|MS",
                   help="emulate an accelerator that takes this long per batch, as MLPerf Storage does: a preset ("
                        + ", ".join(COMPUTE_PRESETS[workload.name]) + ") or milliseconds per batch")
    p.add_argument("--prefetch", type=int, default=2, metavar="N", help="batches the loader prepares ahead "
                   "(default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="loader threads (default: the loader's choice)")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--markdown", metavar="FILE", help="write the tables as markdown")
    p.add_argument("--plot", metavar="FILE.png", help="plot the per-step and jobs figures (needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _tiers_wanted(args: argparse.Namespace) -> List[str]:
    if args.tiers is None:
        return ["page-cache", "local-cold"] + (["target"] if args.data else [])
    wanted = [t.strip() for t in args.tiers.split(",") if t.strip()]
    unknown = [t for t in wanted if t not in TIERS]
    if unknown or not wanted:
        raise ValueError(f"--tiers: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(TIERS)}")
    if "target" in wanted and not args.data:
        raise ValueError("--tiers target needs --data (the storage under test)")
    return [t for t in TIERS if t in wanted]


def target_paths(data: str, mounts: Optional[Sequence[str]]) -> List[str]:
    """The target tier's files: ``--data`` expanded; with ``--mounts``, every copy of the shards on them.

    With ``--mounts``, ``--data`` is a shard path or glob relative to each mount point; the files
    returned are what the cache is dropped or evicted for, while the tier itself reads through a
    :class:`dlstore.Dataset` over the mounts (:meth:`LoaderSpec.open`).
    """
    from dlstore.sources.reader import expand_paths

    if not mounts:
        return expand_paths(data)
    from dlstore.sources.layout import scan_layout

    layout = scan_layout(list(mounts), [data])
    return [layout.path(s, m) for s in range(len(layout.shards)) for m in layout.holders[s]]


def _baseline_paths(workload: Workload, args: argparse.Namespace) -> List[str]:
    from dlstore.bench.storage import dataset_paths

    return dataset_paths(args.local, args.size, workload.dataset_kind, progress=not args.quiet,
                         **workload.dataset_overrides(args))


def run_workload(workload: Workload, args: argparse.Namespace) -> int:
    """Entry point shared by ``python -m dlstore.bench resnet50`` and ``... bert``."""
    for name in ("batch_size", "steps", "jobs_steps", "prefetch", "epochs"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.jobs < 0:
        raise ValueError("--jobs must be at least 0")
    if args.mounts and not args.data:
        raise ValueError("--mounts needs --data (the shard paths relative to each mount point)")
    args.io = settings.get("io", args.io)
    if args.io not in ("auto",) + ENGINES:
        raise ValueError(f"io={args.io!r} (from {settings.SETTINGS['io'].env}) is for bench storage; "
                         f"this bench reads with one of auto, {', '.join(ENGINES)}")
    wanted = _tiers_wanted(args)
    if args.jobs and args.jobs_tier == "target" and not args.data:
        raise ValueError("--jobs-tier target needs --data")
    from dlstore.distributed import mpi_comm

    comm = mpi_comm()
    rank, world = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
    quiet = args.quiet or rank != 0
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if rank == 0 else (lambda s: None)
    notes: List[str] = []
    warnings: List[str] = []  # why a figure may not be trusted: a tier too short, other processes busy

    baseline = _baseline_paths(workload, args) if {"page-cache", "local-cold"} & set(wanted) else []
    target = target_paths(args.data, args.mounts) if "target" in wanted else []
    # Every tier reads a dlstore.Dataset, which gives each rank (from the launcher) its share of the
    # records, in the --shuffle order.
    spec_common = dict(pipeline=workload.pipeline, pipeline_kwargs=workload.pipeline_kwargs(args),
                       verify=args.verify, prefetch=args.prefetch, threads=args.threads, epochs=args.epochs,
                       shuffle=args.shuffle, seed=args.seed)
    # The page-cache tier reads from RAM: buffered, or mmap when asked for or when a global shuffle
    # reads record by record (what io="auto" picks for data that fits in the page cache).
    page_io = "mmap" if args.io == "mmap" or (args.io == "auto" and args.shuffle == "global") else "buffered"

    def specs_for(batch: int) -> Dict[str, LoaderSpec]:
        return {"page-cache": LoaderSpec(paths=tuple(baseline), io=page_io, batch_size=batch, **spec_common),
                "local-cold": LoaderSpec(paths=tuple(baseline), io=args.io, batch_size=batch, **spec_common),
                "target": LoaderSpec(paths=tuple(target), io=args.io, mounts=tuple(args.mounts or ()),
                                     shards=(args.data,) if args.mounts else (), batch_size=batch, **spec_common)}

    # The step plan comes from the baseline set (this rank's records), and every tier follows it, so
    # the tiers' steps hold the same samples.
    first = specs_for(args.batch_size)
    probe = first["target" if target else "local-cold"].dataset()  # what the header says is read, and how
    records = None
    if baseline and args.step_batches is None:
        records = len(probe if not target else first["local-cold"].dataset())
    if comm is not None:  # one plan for every rank: the smallest share decides
        counts = [c for c in comm.allgather(records) if c is not None]
        records = min(counts) if counts else None
    batch_size, lowered = fit_batch_size(records, args.batch_size, args.steps)
    if lowered:
        notes.append(lowered)
    plan = plan_steps(args.epochs * (records // batch_size) if records is not None else None, args.steps,
                      args.step_batches)
    compute = resolve_compute(args.compute, workload.name, batch_size, workload.variant(args))
    step_text = (f"{plan[0]} batch{'es' if plan[0] != 1 else ''} of {batch_size} {workload.unit}"
                 if len(set(plan)) == 1 else
                 f"{min(plan)}-{max(plan)} batches of {batch_size} {workload.unit}")

    probe_paths = target or baseline
    info = sysinfo.collect(probe_paths, probe.engine, probe.engine_reason)
    data_lines = []
    if baseline:
        data_lines.append(("baseline", f"{len(baseline)} files, {report.fmt_bytes(sum(map(os.path.getsize, baseline)))}"
                                        f"{f', {records:,} records' if records is not None else ''} in "
                                        f"{os.path.dirname(baseline[0])}"))
    if target:
        where = (f"on {len(args.mounts)} mounts ({', '.join(args.mounts)}), read through dlstore.Dataset"
                 if args.mounts else f"in {os.path.dirname(target[0])}")
        data_lines.append(("target", f"{len(target)} files, {report.fmt_bytes(sum(map(os.path.getsize, target)))} "
                                      f"{where}"))
    extra = [("workload", f"{workload.name} ({workload.describe(args)}), batch {batch_size}, prefetch "
                          f"{args.prefetch}, CRC {'checked' if args.verify else 'not checked'}")]
    extra += data_lines
    extra.append(("shuffle", f"{probe.describe_shuffle()}; seed {args.seed}"))
    del probe
    epochs = f"{args.epochs} epochs" if args.epochs > 1 else "1 epoch"
    extra.append(("step", f"{step_text}; {len(plan)} steps per tier over {epochs}; the rate of a step is its "
                          f"{workload.unit} "
                          "over its wall time, step 1 including the pipeline's start"))
    if compute is not None:
        extra.append(("compute", f"{compute.label}, slept per batch while the loader prefetches ({compute.source})"))
    if comm is not None:
        extra.append(("MPI", f"{world} ranks, each reading its share of the records (dlstore.Dataset)"))
    if rank == 0:
        print(sysinfo.format_header(info, extra=extra) + "\n", flush=True)

    specs = specs_for(batch_size)
    compute_s = compute.seconds_per_batch if compute else 0.0
    metrics = getattr(args, "metrics", None)  # --metrics-port: live figures (dlstore.bench.metrics)
    warm_up(specs[wanted[0]])  # before any cache is prepared: the cold tiers undo what it read
    results = []
    for tier in wanted:
        if comm is not None:
            comm.Barrier()
        results.append(run_tier(tier, specs[tier], plan, cold=tier != "page-cache", compute_s=compute_s,
                                quiet=quiet, log=log, unit=workload.unit, metrics=metrics))
        if metrics is not None:
            entry = _tier_entry(results[-1], workload.rate_key, compute, batch_size)
            metrics.end(tier, results[-1]["io"], entry.get("required_mb_per_s_per_accelerator"))
        if results[-1]["ended_early"]:
            notes.append(f"{tier}: the data ended after {results[-1]['batches']} of {sum(plan)} batches")
        warnings += sysinfo.trust_warnings(f"tier {tier}" + (f" (rank {rank})" if comm is not None else ""),
                                           results[-1]["seconds"], results[-1]["other_processes_cores"])

    jobs = None
    if args.jobs:
        if comm is not None:
            notes.append("--jobs is not run under MPI: the ranks are the concurrent jobs")
        else:
            jobs_tier = args.jobs_tier or ("target" if target else "local-cold")
            spec = specs[jobs_tier]
            paths = list(spec.paths)
            make = cache_control.make_warm if jobs_tier == "page-cache" else cache_control.make_cold
            prepare = functools.partial(make, paths)
            jobs = run_jobs(spec, args.jobs, plan[:args.jobs_steps], prepare=prepare, compute=compute, quiet=quiet)
            jobs["tier"] = jobs_tier

    ranks = None
    if comm is not None:
        gathered = comm.gather(results, root=0)
        warnings = [w for mine in comm.gather(warnings, root=0) or [] for w in mine]
        if rank != 0:
            return 0
        ranks = gathered
        results = aggregate_ranks(gathered)

    config = {"tiers": wanted, "io": args.io, "verify": args.verify, "shuffle": args.shuffle, "seed": args.seed,
              "steps": len(plan), "plan": plan,
              "epochs": args.epochs,
              "step_batches_text": step_text, "prefetch": args.prefetch, "threads": args.threads,
              "size": None if args.local else args.size, "baseline": baseline, "target": target,
              "mounts": args.mounts, "pipeline": workload.pipeline, "pipeline_kwargs": workload.pipeline_kwargs(args)}
    doc = build_document(workload, results, info=info, config=config, compute=compute, batch_size=batch_size,
                         jobs=jobs, ranks=ranks, notes=notes, warnings=warnings)
    doc["command"] = ["python", "-m", "dlstore.bench"] + sys.argv[1:]
    print(format_report(doc), flush=True)
    if args.json:
        report.write_json(args.json, doc)
        print(f"\nwrote {args.json}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown_report(doc))
        print(f"wrote {args.markdown}")
    if args.plot:
        from dlstore.bench.plot import MatplotlibMissing, plot_document

        try:
            plot_document(doc, args.plot)
            print(f"wrote {args.plot}")
        except MatplotlibMissing as e:
            print(f"--plot: {e}", file=sys.stderr)
    return 0
