# Over 500 lines: one scenario, its passes, the reader threads' barrier, the kvikio comparison and its report.
"""``python -m dlstore.bench storage``: a read-only storage benchmark, beside fio.

Records are read through one I/O engine with CRCs checked, and nothing else is done with them: the
figure is what the storage and the reader can deliver to a training job. The measured loop only
touches batches (one per chunk read); framing and CRC run in C++, off the GIL.

- An untimed warm-up pass first; then ``--cache cold``: before each timed pass the page cache is
  dropped (root) or the files are evicted (``posix_fadvise``), and the report says which;
  ``warm``: not; ``both`` (default): cold, then warm.
- ``--readers N`` splits the files among N readers running at once; ``--sync`` makes them wait for
  each other after every batch, as the Dell EMC Isilon reference architecture's TensorFlow
  storage benchmark synchronises its readers, so the slowest reader sets the pace as it does in synchronous training.
- With fio installed, fio reads the same files with ``direct=1``, bs 1 MiB and as many jobs as
  dlstore has reading threads, interleaved with the passes; the ratio is printed and stored.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from dlstore import settings
from dlstore._console import positive_int
from dlstore._progress import Progress
from dlstore.bench import report, sysinfo
from dlstore.bench.fio import FioError, fio_missing_reason, run_fio
from dlstore.errors import DlstoreError, GdsUnavailableError
from dlstore.io import pagecache as cache_control
from dlstore.io import cuda  # cuda.cuda_facts looked up at each call: tests stand in for the machine
from dlstore.io.cuda import gds_verdict
from dlstore.io.memory import PinnedPool, check_device
from dlstore.io.select import ENGINES, gds_device
from dlstore.placement.world import detect_world
from dlstore.sources.reader import expand_paths, open_records
from dlstore.synthetic import (
    PRESETS,  # light: pillow is imported only when a set is generated
    cached_dataset,
)

__all__ = ["SIZES", "add_arguments", "run", "dataset_paths", "open_readers", "count_records",
           "measure_passes", "timed_passes", "run_storage", "rates"]

SIZES = tuple(PRESETS["imagenet"])  # the generated ImageNet-like set's sizes: tiny, small, default, 3gb
CACHE_MODES = ("cold", "warm", "both")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of the ``storage`` scenario."""

    p.add_argument("--data", metavar="GLOB",
                   help="files to read (a glob, directory or file); default: a generated ImageNet-like "
                        "TFRecord set of real JPEGs, cached under the dlstore cache directory")
    p.add_argument("--size", choices=SIZES, default="default",
                   help="size of the generated set when --data is not given: tiny ~4 MB, small ~300 MB, "
                        "default ~1 GB, 3gb ~3 GB (default: %(default)s)")
    p.add_argument("--io", choices=("auto",) + ENGINES + ("gds",), default=None,
                   help=settings.SETTINGS["io"].help + f" Default: ${settings.SETTINGS['io'].env}, else auto.")
    p.add_argument("--device", metavar="cuda:N",
                   help="deliver the records to this GPU: with --io gds they are read into its memory; with a "
                        "host engine each batch is staged in pinned memory and copied. kvikio's own "
                        "CuFile.pread of the same files is measured beside it (skipped, saying so, without "
                        "kvikio). Without a GPU or CuPy: exit 2, saying what is missing")
    p.add_argument("--cache", choices=CACHE_MODES, default="both",
                   help="cold: the page cache dropped (root) or the files evicted before every timed "
                        "pass; warm: not; both: cold, then warm (default). Each starts with an untimed "
                        "pass")
    p.add_argument("--repeat", type=int, default=3, metavar="N",
                   help="timed passes per cache state; the median and spread are reported "
                        "(default: %(default)s)")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="do not check TFRecord CRCs (checked by default)")
    p.add_argument("--readers", type=int, default=1, metavar="N",
                   help="readers running at once, the files dealt among them, at most one reader per file (the "
                        "header and the JSON's readers say how many ran) (default: %(default)s)")
    p.add_argument("--sync", action="store_true",
                   help="readers wait for each other after every batch (with --readers > 1)")
    p.add_argument("--no-fio", dest="fio", action="store_false", help="do not run fio beside dlstore")
    p.add_argument("--fio-ioengine", default="psync", choices=("psync", "libaio", "io_uring"),
                   help="fio's ioengine (default: %(default)s; psync has one request in flight per job, a "
                        "reference rather than the device's ceiling)")
    p.add_argument("--fio-iodepth", type=positive_int, default=1, metavar="N",
                   help="fio's iodepth, for the asynchronous engines (default: %(default)s)")
    p.add_argument("--json", metavar="FILE",
                   help="write the results as JSON: the top-level keys describe the first cache state "
                        "(cold with --cache both), and 'runs' holds every state")
    p.add_argument("--markdown", metavar="FILE", help="write the results table as markdown")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


# ---- data --------------------------------------------------------------------------------------

def dataset_paths(data: Optional[str], size: str = "default", kind: str = "imagenet", progress: bool = True,
                  **overrides: Any) -> List[str]:
    """The files to read: ``data`` expanded, or the cached generated set of ``kind`` and ``size``
    (made the first time; ``overrides`` go to the generator, see :func:`dlstore.synthetic.cached_dataset`).

    Raises
    ------
    DlstoreError
        When ``data`` matches nothing.
    """

    if data:
        return expand_paths(data)

    return expand_paths(cached_dataset(kind, size, progress=progress, **overrides))


# ---- one pass ----------------------------------------------------------------------------------

def open_readers(paths: Sequence[str], io: str = "auto", verify: bool = True, readers: int = 1,
                 device: Optional[int] = None) -> list:
    """One :class:`~dlstore.RecordReader` per reader, the files dealt round-robin among them.

    The engine is resolved once over the whole dataset (``io="auto"`` compares all of it with the
    page cache), and every reader uses it and reports that reason. ``device``: the GPU ``io="gds"``
    reads into (a host engine's batches are copied to it by the bench, not read there).
    """
    gpu = f"cuda:{device}" if device is not None and io == "gds" else None
    whole = open_records(list(paths), io=io, verify=verify, device=gpu)
    n = max(1, min(int(readers), len(paths)))
    if n == 1:
        return [whole]
    # The other readers get the resolved engine by name; keep the whole dataset's reason on each.
    out = [open_records(list(paths[i::n]), io=whole.engine, verify=verify, device=gpu) for i in range(n)]
    for r in out:
        r.choice = whole.choice
    return out


class _BatchBarrier:
    """Readers wait here after every batch until all of them got there; a finished reader leaves,
    so readers with fewer files do not hang the others (``threading.Barrier`` cannot shrink)."""

    def __init__(self, parties: int):
        self._cond = threading.Condition()
        self._parties = parties
        self._waiting = 0
        self._generation = 0

    def wait(self) -> None:
        with self._cond:
            generation = self._generation
            self._waiting += 1
            if self._waiting >= self._parties:
                self._release()
                return
            while generation == self._generation:
                self._cond.wait()

    def leave(self) -> None:
        with self._cond:
            self._parties -= 1
            if self._parties > 0 and self._waiting >= self._parties:
                self._release()

    def _release(self) -> None:
        self._waiting = 0
        self._generation += 1
        self._cond.notify_all()


def count_records(readers: Sequence, sync: bool = False,
                  progress: Optional[Callable[[int], None]] = None,
                  sink: Optional[Callable[[Any], None]] = None) -> Tuple[int, int]:
    """Reads every record of ``readers`` once (at the same time when several): ``(records, bytes)``.

    Only batches reach Python, one per chunk read; with ``sync`` the readers wait for each other
    after every batch. ``sink(batch)``, when given, takes each batch where it goes (a GPU).
    """
    counts = [(0, 0)] * len(readers)
    errors: List[BaseException] = []
    barrier = _BatchBarrier(len(readers)) if sync and len(readers) > 1 else None

    def consume(i: int) -> None:
        records = nbytes = 0
        try:
            for batch in readers[i].batches():
                if sink is not None:
                    sink(batch)
                records += batch.num_records
                nbytes += batch.nbytes
                if progress is not None:
                    progress(batch.nbytes)
                if barrier is not None:
                    barrier.wait()
        except BaseException as e:  # noqa: BLE001 - handed to the caller, which re-raises it
            errors.append(e)
        finally:
            if barrier is not None:
                barrier.leave()
            counts[i] = (records, nbytes)

    if len(readers) == 1:
        consume(0)
    else:
        threads = [threading.Thread(target=consume, args=(i,), name=f"dlstore-bench-reader{i}")
                   for i in range(len(readers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def rates(result: Dict) -> Dict:
    """Adds ``gb_per_s``, ``records_per_s`` and ``cpu_seconds_per_gb`` to a pass result (GB = 1e9 B)."""
    s, gb = result["seconds"], result["bytes"] / 1e9
    result["gb_per_s"] = gb / s if s > 0 else None
    result["records_per_s"] = result["records"] / s if s > 0 else None
    result["cpu_seconds_per_gb"] = result["cpu_seconds"] / gb if gb > 0 else None
    return result


def measure_passes(prepare: Callable[[], Callable[[], Tuple[int, int]]], paths: Sequence[str], *,
                   cache: str = "cold", repeat: int = 3, after_pass: Optional[Callable[[int], None]] = None,
                   log: Callable[[str], None] = print, on_pass: Optional[Callable[[Dict], None]] = None) -> Dict:
    """Times ``repeat`` passes of any reader over ``paths`` in one cache state.

    ``prepare()`` builds a pass (a pipeline, an iterator: untimed) and returns the function that
    runs it and returns ``(records, bytes)``. One untimed warm-up pass runs first; then ``cold``
    drops the cache or evicts the files after preparing and before each pass, and ``warm`` does
    not. ``after_pass(i)`` runs after pass ``i``, outside the timing (fio is interleaved that way);
    ``on_pass(result)`` gets each timed pass's figures (live metrics).
    The same function measures dlstore and its peers, so they are timed alike.

    Returns
    -------
    dict
        ``cache_method`` and ``passes``: per pass ``records``, ``bytes``, ``seconds``,
        ``cpu_seconds`` (process user + system over all threads), ``busiest_core_pct``
        (system-wide, /proc/stat), ``other_processes_cores`` (cores other processes kept busy
        meanwhile, on average), ``cached_before`` (fraction of the data in the page cache just
        before the pass) and the :func:`rates`.
    """
    if cache not in ("cold", "warm"):
        raise ValueError(f"cache must be 'cold' or 'warm', not {cache!r}")
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, not {repeat}")
    method = "one untimed pass first"
    if cache == "warm":
        file_bytes = sum(os.path.getsize(p) for p in paths)
        available = cache_control.free_page_cache_bytes()
        if available and file_bytes > available:
            log(f"note: {report.fmt_bytes(file_bytes)} of data exceed the {report.fmt_bytes(available)} the "
                "page cache can use: a warm pass is partly cold")
    # Warm-up in both states: the first pass of a process pays for thread start-up and buffer
    # allocation, for dlstore and its peers alike; cold passes then drop the cache it filled.
    prepare()()
    passes: List[Dict] = []
    for i in range(repeat):
        one_pass = prepare()
        if cache == "cold":
            method = cache_control.make_cold(paths)
        resident = cache_control.resident_fraction(paths)
        ticks0 = sysinfo.per_core_cpu_ticks()
        cpu0 = sysinfo.process_cpu_seconds()
        t0 = time.perf_counter()
        records, nbytes = one_pass()
        seconds = time.perf_counter() - t0
        cpu = sysinfo.process_cpu_seconds() - cpu0
        ticks1 = sysinfo.per_core_cpu_ticks()
        result = rates({"records": records, "bytes": nbytes, "seconds": seconds, "cpu_seconds": cpu,
                        "busiest_core_pct": sysinfo.busiest_core_percent(ticks0, ticks1),
                        "other_processes_cores": sysinfo.other_processes_cores(ticks0, ticks1, cpu, seconds),
                        "cached_before": resident})
        if passes and (records, nbytes) != (passes[0]["records"], passes[0]["bytes"]):
            raise DlstoreError(f"pass {i + 1} read {records} records ({nbytes} bytes), pass 1 read "
                               f"{passes[0]['records']} ({passes[0]['bytes']} bytes): the data changed")
        passes.append(result)
        if on_pass is not None:
            on_pass(result)
        if after_pass is not None:
            after_pass(i)
    return {"cache_method": method, "passes": passes}


def timed_passes(paths: Sequence[str], *, io: str = "auto", cache: str = "cold", repeat: int = 3,
                 verify: bool = True, readers: int = 1, sync: bool = False, quiet: bool = True,
                 after_pass: Optional[Callable[[int], None]] = None,
                 log: Callable[[str], None] = print, sink: Optional[Callable[[Any], None]] = None,
                 metrics: Optional[Any] = None, device: Optional[int] = None) -> Dict:
    """dlstore's passes through :func:`measure_passes`, with fresh readers for every pass (``device``: the
    GPU ``io="gds"`` reads into).

    ``metrics`` (a :class:`dlstore.bench.metrics.BenchMetrics`) gets each pass as it completes,
    labelled with the cache state as the tier.

    Returns
    -------
    dict
        What :func:`measure_passes` returns, plus ``engine``, ``engine_reason`` and ``notes``
        (per-file fallbacks such as a file refusing O_DIRECT).
    """
    file_bytes = sum(os.path.getsize(p) for p in paths)
    held: Dict = {"readers": None, "n": 0}

    def prepare() -> Callable[[], Tuple[int, int]]:
        # Fresh readers for every pass, the previous ones released first: a reader keeps its last
        # files mapped (mmap), and mapped pages survive drop_caches, so a cold pass would be warm.
        held["readers"] = None
        held["readers"] = rs = open_readers(paths, io=io, verify=verify, readers=readers, device=device)
        held["n"] += 1
        if metrics is not None and held["n"] == 1:  # the untimed warm-up pass: the cache state starts
            metrics.begin(cache, rs[0].engine)
        bar = Progress(file_bytes, f"{cache} {rs[0].engine} {held['n']}", unit="B",
                       enabled=False if quiet else None)

        def one_pass() -> Tuple[int, int]:
            try:
                return count_records(rs, sync=sync, progress=bar.update if bar.enabled else None, sink=sink)
            finally:
                bar.close()
        return one_pass

    def on_pass(result: Dict) -> None:
        metrics.step(cache, held["readers"][0].engine, result)

    measured = measure_passes(prepare, paths, cache=cache, repeat=repeat, after_pass=after_pass, log=log,
                              on_pass=on_pass if metrics is not None else None)
    rs = held["readers"]
    if metrics is not None:
        metrics.end(cache, rs[0].engine)
    measured["engine"] = rs[0].engine
    measured["engine_reason"] = rs[0].engine_reason
    measured["notes"] = sorted({n for r in rs for n in r.stats().get("notes", [])})
    held["readers"] = None
    return measured


# ---- into GPU memory ---------------------------------------------------------------------------------
# None of this has run on a GPU yet (docs/gpu.md); without one, run() exits 2 before reaching it.

def check_gpu_request(io: str, device: Optional[str]) -> Optional[int]:
    """The CUDA device index of ``--device`` (0 for ``--io gds`` without one; ``cuda:local``: the
    launcher's local rank), or None for host memory.

    Raises
    ------
    GdsUnavailableError, DlstoreError, ValueError
        One line naming what is missing, before any data is generated or read.
    """
    local_rank = detect_world().local_rank
    if io == "gds":
        index = gds_device(device, local_rank)  # --device cpu asks for host memory: refused
        verdict = gds_verdict(cuda.cuda_facts(), index)
        if verdict.missing:
            raise GdsUnavailableError(verdict.missing)
        return index
    return check_device(device, local_rank)  # a host engine's batches copied to the GPU: the loader's check


def delivery_fields(io: str, index: int) -> Dict[str, Any]:
    """The device fields (:func:`dlstore.bench.sysinfo.device_fields`) of records delivered to GPU ``index``."""
    if io == "gds":
        return sysinfo.device_fields(index, "read into GPU memory (gds)", pinned=False)
    return sysinfo.device_fields(index, "host batches staged in pinned memory, then copied to the GPU")


def pinned_copy_sink(index: int, chunk_bytes: int) -> Callable[[Any], None]:
    """``sink(batch)``: a host batch copied into a pinned staging buffer, then to GPU ``index`` on a
    stream (waited for, so the pass counts the copy). Each reader thread (``--readers N``) has its own
    staging buffer, device buffer and stream."""
    import cupy

    pool = PinnedPool(device=index)
    mine = threading.local()  # this thread's staging buffer, device buffer and stream

    def sink(batch: Any) -> None:
        if getattr(batch, "on_gpu", False):
            return
        view = memoryview(batch).cast("B")
        n = len(view)
        if getattr(mine, "staging", None) is None or n > mine.staging.capacity:
            if getattr(mine, "staging", None) is not None:
                pool.release(mine.staging)
            mine.staging = pool.acquire(max(n, chunk_bytes))
            with cupy.cuda.Device(index):
                mine.stream = getattr(mine, "stream", None) or cupy.cuda.Stream(non_blocking=True)
                mine.target = cupy.empty(mine.staging.capacity, dtype=cupy.uint8)
        host = mine.staging.array[:n]
        host[:] = np.frombuffer(view, dtype=np.uint8)
        mine.target[:n].set(host, stream=mine.stream)
        mine.stream.synchronize()

    sink.pool = pool  # type: ignore[attr-defined]  # kept alive with the sink
    return sink


def kvikio_passes(paths: Sequence[str], index: int, chunk_bytes: int, *, cache: str, repeat: int,
                  log: Callable[[str], None] = print) -> Dict:
    """kvikio's own ``CuFile.pread`` of the same files into one GPU buffer, ``chunk_bytes`` at a time:
    the reference the gds engine is compared with. Timed by :func:`measure_passes`, like dlstore."""
    import cupy
    import kvikio

    with cupy.cuda.Device(index):
        buf = cupy.empty(chunk_bytes, dtype=cupy.uint8)

    def prepare() -> Callable[[], Tuple[int, int]]:
        def one_pass() -> Tuple[int, int]:
            total = 0
            for path in paths:
                size = os.path.getsize(path)
                with kvikio.CuFile(path, "r") as f:
                    for start in range(0, size, chunk_bytes):
                        n = min(chunk_bytes, size - start)
                        total += f.pread(buf[:n], n, start).get()
            return 0, total
        return one_pass

    return measure_passes(prepare, paths, cache=cache, repeat=repeat, log=log)


# ---- the scenario --------------------------------------------------------------------------------

def _summary(cache: str, io: str, measured: Dict, verify: bool, readers: int, sync: bool) -> Dict:
    passes = measured["passes"]
    out = {
        "io": measured["engine"],
        "io_requested": io,
        "io_reason": measured["engine_reason"],
        "io_notes": measured["notes"],
        "cache": cache,
        "cache_method": measured["cache_method"],
        "verify": verify,
        "readers": readers,
        "sync": sync,
        "records": passes[0]["records"],
        "bytes": passes[0]["bytes"],
    }
    for key in ("seconds", "gb_per_s", "records_per_s", "cpu_seconds_per_gb", "busiest_core_pct"):
        out[key] = report.summarize([p[key] for p in passes])["median"]
    spread = report.summarize([p["gb_per_s"] for p in passes])
    out.update(gb_per_s_min=spread["min"], gb_per_s_max=spread["max"], spread_pct=spread["spread_pct"])
    out["repeats"] = passes
    out["warnings"] = [w for i, p in enumerate(passes)
                       for w in sysinfo.trust_warnings(f"{cache} pass {i + 1}", p["seconds"],
                                                       p.get("other_processes_cores"))]
    return out


def run_storage(paths: Sequence[str], *, io: str = "auto", cache: str = "both", repeat: int = 3,
                verify: bool = True, readers: int = 1, sync: bool = False, fio: bool = True,
                fio_ioengine: str = "psync", fio_iodepth: int = 1, quiet: bool = True,
                log: Callable[[str], None] = print, device: Optional[int] = None,
                metrics: Optional[Any] = None) -> List[Dict]:
    """Runs the storage benchmark in each requested cache state; returns one result dict per state.

    fio runs ``repeat`` times, interleaved with the passes of the first state, with as many jobs as
    dlstore has reading threads (readers x ``io_threads``); every result carries its median. With a
    GPU ``device`` (``--io gds``, or a host engine whose batches are copied through pinned memory),
    kvikio's own ``CuFile.pread`` of the same files is timed in each state too (``kvikio_gb_per_s``,
    ``ratio_vs_kvikio``); without kvikio (a host engine needs none) that reference is skipped and
    ``kvikio_skipped`` says why. ``metrics`` gets each dlstore pass as it completes.
    """

    chunk = settings.get("chunk_size")
    sink = pinned_copy_sink(device, chunk) if device is not None and io != "gds" else None
    facts = cuda.cuda_facts() if device is not None else None
    kvikio_missing = "" if facts is None or facts.kvikio else (facts.kvikio_error or "kvikio is not installed")
    if kvikio_missing:
        log(f"note: no kvikio reference read ({kvikio_missing})")

    modes = ["cold", "warm"] if cache == "both" else [cache]
    fio_jobs = max(1, min(readers, len(paths))) * settings.get("io_threads")
    fio_runs: List = []
    fio_skip = fio_missing_reason() if fio else "--no-fio"
    fio_failed: List[str] = []

    def fio_after(i: int) -> None:
        if fio_skip or fio_failed:
            return
        try:
            fio_runs.append(run_fio(paths, jobs=fio_jobs, ioengine=fio_ioengine, iodepth=fio_iodepth))
        except FioError as e:
            fio_failed.append(str(e))
            log(f"fio failed: {e}")

    results = []
    for k, mode in enumerate(modes):
        measured = timed_passes(paths, io=io, cache=mode, repeat=repeat, verify=verify, readers=readers,
                                sync=sync, quiet=quiet, after_pass=fio_after if k == 0 else None, log=log,
                                sink=sink, metrics=metrics, device=device)
        if measured["passes"][0]["records"] == 0:  # no rate to report
            shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
            raise DlstoreError(f"{shown}: nothing to read: no records")
        if k == 0:  # each pass beside the fio run that followed it, for the per-pass ratio
            for p, f in zip(measured["passes"], fio_runs):
                p["fio_gb_per_s"] = f.gb_per_s
        result = _summary(mode, io, measured, verify, readers, sync)
        if device is not None:
            result.update(delivery_fields(io, device), kvikio_gb_per_s=None, ratio_vs_kvikio=None,
                          kvikio_skipped=kvikio_missing)
            if not kvikio_missing:
                ref = kvikio_passes(paths, device, chunk, cache=mode, repeat=repeat, log=log)
                kv = report.summarize([p["gb_per_s"] for p in ref["passes"]])["median"]
                result.update(kvikio_gb_per_s=kv, ratio_vs_kvikio=result["gb_per_s"] / kv if kv else None)
        results.append(result)
    for r in results:
        if fio_runs:
            fio_gb = report.summarize([f.gb_per_s for f in fio_runs])["median"]
            r["fio_gb_per_s"] = fio_gb
            r["ratio_vs_fio"] = r["gb_per_s"] / fio_gb if fio_gb else None
            fio_cpu = report.summarize([f.cpu_seconds_per_gb for f in fio_runs])["median"]
            r["fio"] = dict(fio_runs[0].to_dict(), gb_per_s=fio_gb, cpu_seconds_per_gb=fio_cpu,
                            gb_per_s_runs=[f.gb_per_s for f in fio_runs], description=fio_runs[0].describe(),
                            queue_depth_one=fio_runs[0].queue_depth_one)
        else:
            r["fio_gb_per_s"] = None
            r["ratio_vs_fio"] = None
            r["fio_skipped"] = fio_skip or "; ".join(fio_failed)
    return results


PASS_COLUMNS = [
    report.Column("cache", "cache", align="<"),
    report.Column("io", "io", align="<"),
    report.Column("pass", "pass", align="<"),
    report.Column("seconds", "seconds", "{:.2f}"),
    report.Column("gb_per_s", "GB/s", "{:.2f}"),
    report.Column("records_per_s", "records/s", "{:,.0f}"),
    report.Column("cpu_seconds_per_gb", "CPU s/GB", "{:.3f}"),
    report.Column("busiest_core_pct", "busiest core %", "{:.0f}"),
    report.Column("spread_pct", "spread", lambda v: f"{v:.0f}%"),
    report.Column("cached_before", "cached before", lambda v: f"{100 * v:.0f}%"),
    report.Column("ratio_vs_fio", "vs fio", report.fmt_ratio),
]


def table_rows(results: Sequence[Dict]) -> List[Dict]:
    """Rows of the results table: each pass, then the median row of each cache state."""
    rows = []
    for r in results:
        n = len(r["repeats"])
        for i, p in enumerate(r["repeats"]):
            fio_gb = p.get("fio_gb_per_s") or r.get("fio_gb_per_s")  # the fio run beside it, else the median
            vs_fio = p["gb_per_s"] / fio_gb if fio_gb else None
            label = {"pass": f"{i + 1}/{n}"}
            rows.append(dict(p, cache=r["cache"], io=r["io"], ratio_vs_fio=vs_fio, **label))
        rows.append(dict(r, cached_before=None, spread_pct=r["spread_pct"] if n > 1 else None,
                         **{"pass": "median"}))
    return rows


def format_results(results: Sequence[Dict]) -> str:
    """The results table and a line per cache state naming what was compared."""
    lines = [report.text_table(table_rows(results), PASS_COLUMNS)]
    first = results[0]
    if first.get("fio_gb_per_s"):
        f = first["fio"]
        lines.append(f"\nvs fio: {f['description']}: {first['fio_gb_per_s']:.2f} GB/s "
                     f"(median of {len(f['gb_per_s_runs'])}; CPU {f['cpu_seconds_per_gb']:.3f} s/GB)")
        if f.get("queue_depth_one"):
            lines.append("        one request in flight per fio job: a reference, not the device's ceiling "
                         "(--fio-ioengine io_uring --fio-iodepth 32 tries a deeper queue)")
    else:
        lines.append(f"\nfio: skipped ({first.get('fio_skipped')})")
    for r in results:
        if r.get("device") and r.get("kvikio_skipped"):
            lines.append(f"{r['cache']:<5} into {r['device']}: {r['device_path']}; no kvikio reference read "
                         f"({r['kvikio_skipped']})")
        elif r.get("device"):
            lines.append(f"{r['cache']:<5} into {r['device']}: {r['device_path']}; kvikio CuFile.pread of the same "
                         f"files {r['kvikio_gb_per_s']:.2f} GB/s, dlstore {r['ratio_vs_kvikio']:.2f}x that")
    for r in results:
        ratio = f" = {r['ratio_vs_fio']:.2f}x fio" if r.get("ratio_vs_fio") else ""
        lines.append(f"{r['cache']:<5} io={r['io']}: {r['gb_per_s']:.2f} GB/s{ratio}, "
                     f"{r['records_per_s']:,.0f} records/s, CPU {r['cpu_seconds_per_gb']:.3f} s/GB "
                     f"(CRC {'checked' if r['verify'] else 'not checked'}); cache: {r['cache_method']}")
        for note in r["io_notes"]:
            lines.append(f"      note: {note}")
    lines += [f"warning: {w}" for r in results for w in r["warnings"]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``python -m dlstore.bench storage``."""
    if args.repeat < 1:
        raise ValueError("--repeat must be at least 1")
    if args.readers < 1:
        raise ValueError("--readers must be at least 1")
    world = detect_world()
    if world.size > 1:  # each rank would read every file and write the same outputs
        raise ValueError(f"bench storage runs in one process, not as rank {world.rank} of {world.size} "
                         f"({world.source}): run it without the launcher; --readers N reads the files with N "
                         "readers at once")
    args.io = settings.get("io", args.io)
    device = check_gpu_request(args.io, args.device)  # says what is missing before generating any data
    paths = dataset_paths(args.data, args.size)
    probe = open_readers(paths, io=args.io, verify=args.verify, device=device)[0]
    info = sysinfo.collect(paths, probe.engine, probe.engine_reason)
    file_bytes = sum(os.path.getsize(p) for p in paths)
    if file_bytes == 0:  # before the header, as the pipeline benches refuse data short of one batch
        raise ValueError(f"--data {args.data}: nothing to read: {len(paths)} "
                         f"{'file holds' if len(paths) == 1 else 'files hold'} 0 bytes")
    readers = min(args.readers, len(paths))  # open_readers deals whole files: at most one reader each
    sync_note = " (--sync has no effect with one reader)" if args.sync and readers == 1 else ""
    dataset_line = (f"{len(paths)} {probe.format} files, {report.fmt_bytes(file_bytes)}; "
                    f"readers {readers}"
                    + (f" (--readers {args.readers}: one per file at most)" if readers < args.readers else "")
                    + f"{', synchronised per batch' if args.sync else ''}{sync_note}; CRC "
                    f"{'checked' if args.verify else 'not checked'}")
    extra = [("dataset", dataset_line)]
    if device is not None:
        extra.append(sysinfo.device_row(delivery_fields(args.io, device)))
    print(sysinfo.format_header(info, extra=extra) + "\n", flush=True)

    results = run_storage(paths, io=args.io, cache=args.cache, repeat=args.repeat, verify=args.verify,
                          readers=readers, sync=args.sync, fio=args.fio, fio_ioengine=args.fio_ioengine,
                          fio_iodepth=args.fio_iodepth, quiet=args.quiet,
                          log=lambda s: print(s, file=sys.stderr, flush=True), device=device,
                          metrics=getattr(args, "metrics", None))
    print(format_results(results))
    if args.json:
        doc = dict(results[0])
        doc.update(runs=list(results), sysinfo=info, readers_requested=args.readers,
                   data={"paths": list(paths), "files": len(paths), "file_bytes": file_bytes,
                         "format": probe.format},
                   command=["python", "-m", "dlstore.bench"] + sys.argv[1:])
        report.write_json(args.json, doc)
        print(f"\nwrote {args.json}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report.markdown_table(table_rows(results), PASS_COLUMNS))
        print(f"wrote {args.markdown}")
    return 0
