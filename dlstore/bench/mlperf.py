"""``python -m dlstore.bench mlperf``: MLPerf Storage's question on your storage: how many accelerators it feeds.

MLPerf Storage (through DLIO) emulates each accelerator by sleeping a fixed ``computation_time``
after every batch, and a run counts when the accelerator utilisation (AU) stays at or above the
workload's floor (90% for ResNet-50, 70% for CosmoFlow). This scenario does the same through the
path a training job runs:

- **Data**: DLIO's TFRecord layout (``--data DIR``: ``DIR/train/img_<i>_of_<n>.tfrecord``, records
  with ``image`` and ``size``), as DLIO generates it, or written so by ``--generate`` (by default
  sized to hold 1.2 times what the page cache can use, so that no epoch is served from memory).
- **Ranks**: one per emulated accelerator, each reading the files DLIO's reader gives that rank
  (every N-th of the sorted list, from its own) through a :class:`dlstore.Dataset` of them (shuffled
  unless ``--shuffle none``) and a :class:`dlstore.pipeline.Loader` that parses both features in C++
  (:class:`~dlstore.bench.mlperf_records.DlioExample`), ``batch_size`` records per step and, per
  epoch, DLIO's step count (``files x records per file / batch / ranks``, rounded down), reading its
  files again from the start when they hold fewer, as DLIO does. Where a rank's cut (or the records it
  reads twice) falls differs from DLIO's, whose read threads interleave files record by record
  (:func:`describe_records`). Ranks are processes under ``mpirun`` (``--launch mpirun``) or threads
  of this process (``--launch threads``); the header says which.
- **Compute**: after each batch the rank sleeps the workload's ``computation_time``
  (:mod:`dlstore.bench.mlperf_workloads`, with its source) while the loader reads ahead.
- **AU** by MLPerf's rule and the whole-epoch figure (:mod:`dlstore.bench.mlperf_au`); samples/s and
  MiB/s summed over ranks, as DLIO reports them.
- **Search**: 1, 2, 4, ... accelerators while the AU passes, then bisection, in each tier: ``cold``
  (the page cache dropped, as root, or the files evicted, before each run) and ``warm`` (the files
  read once before each run). ``--accelerators N`` measures N only.

Under ``mpirun -n N`` (a world of N > 1) this process is one rank of a run at N accelerators.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from dlstore._progress import Progress
from dlstore.bench import report, sysinfo
from dlstore.bench.mlperf_au import FIRST_STEP_READ_LIMIT_PCT, aggregate, decide, rank_epoch, search_accelerators
from dlstore.bench.mlperf_records import (DlioExample, files_to_outgrow_cache, generate, layout_files, promised_files,
                                          record_bytes, train_files)
from dlstore.bench.mlperf_workloads import MlperfWorkload, accelerator_names, workload, workload_names
from dlstore.bench.ranks import mean_known
from dlstore.bench.steps import CountingSource, run_steps
from dlstore.bench.tiers import HOST_IO_HELP, close_loader, host_io
from dlstore.distributed import mpi_comm
from dlstore.io import pagecache as cache_control
from dlstore.io.select import ENGINES
from dlstore.io.system import available_page_cache_bytes
from dlstore.placement.sharding import SHUFFLES
from dlstore.placement.world import World, detect_world
from dlstore.pipeline import Loader
from dlstore.settings import _size as parse_size  # the settings' '2G', '500M', bytes
from dlstore.sources.dataset import Dataset
from dlstore.sources.indexing import open_shards
from dlstore.sources.source import SourceWrapper

__all__ = ["TIERS", "RunSpec", "dlio_steps", "first_step_reads", "describe_records", "choose_tiers", "add_arguments",
           "run", "run_rank", "measure_threads", "measure_mpirun", "format_report", "markdown_report"]

TIERS = ("cold", "warm")
LAUNCHES = ("mpirun", "threads")


@dataclass(frozen=True)
class RunSpec:
    """What every rank of a run reads and how (picklable; the same for every rank).

    ``keep_records``: each epoch's figures also list the file and record index of every sample the
    rank took, in order (``records``; for tests and checks against DLIO, not for large runs).
    """

    files: Tuple[str, ...]
    workload: MlperfWorkload
    io: str = "auto"
    verify: bool = True
    shuffle: str = "block"
    seed: int = 0
    prefetch: int = 2
    threads: Optional[int] = None
    epochs: int = 1
    keep_records: bool = False

    def rank_files(self, world: World) -> List[str]:
        """The files rank ``world.rank`` reads, as DLIO's TensorFlow reader deals them: with at least as many
        files as ranks, every ``world.size``-th file of the sorted list from the rank's own (``tf.data``'s
        ``shard``); with fewer, all of them (DLIO then deals the records, see :meth:`dataset`)."""
        if len(self.files) >= world.size:
            return list(self.files[world.rank::world.size])
        return list(self.files)

    def dataset(self, world: World) -> Dataset:
        """Rank ``world.rank``'s :class:`dlstore.Dataset`: :meth:`rank_files`, read alone (a world of one) and
        whole at each pass; with fewer files than ranks, the ranks' shares of one epoch of all the files.

        ``shuffle="none"`` keeps DLIO's order: the files sorted, read ``read_threads`` at a time one record
        from each in turn, as its ``TFRecordDataset(num_parallel_reads=read_threads)`` reads them (the
        Dataset's ``interleave``); the other shuffles order files and records per epoch from ``seed``. The
        remainder of a pass short of a batch is dropped, as DLIO's reader drops it.
        """
        mine = self.rank_files(world)
        alone = len(self.files) >= world.size
        return Dataset(mine, world=detect_world(rank=0, size=1, local_rank=0, local_size=1) if alone else world,
                       shuffle=self.shuffle, shuffle_shards=self.shuffle != "none", seed=self.seed,
                       interleave=self.workload.read_threads if self.shuffle == "none" else 1,
                       remainder="drop", batch_size=self.workload.batch_size, io=self.io, verify=self.verify)

    def records(self) -> int:
        """Records in all the files (their manifest's counts): what DLIO's step count divides."""
        return int(open_shards(list(self.files)).counts.sum())


def dlio_steps(records: int, batch_size: int, ranks: int) -> int:
    """Steps per epoch of each rank, as DLIO counts them: ``floor(records / batch_size / ranks)``."""
    return records // batch_size // ranks


def first_step_reads(dataset: Dataset, epoch: int, batch_size: int) -> int:
    """Records ``dataset`` reads before its first batch of ``epoch`` can come out: the furthest read
    position among that batch's records under a shuffle buffer (it fills first), else one batch.
    Exact from the epoch's plan; the reader's chunks read a little further ahead."""
    order = dataset.plan(epoch).order(dataset.world.consumer)
    if order is None or len(order) == 0:
        return min(batch_size, len(dataset))
    return int(order[:batch_size].max()) + 1


def describe_records(wl: MlperfWorkload, shuffle: str) -> str:
    """The header's words on which records each rank reads, and where they differ from DLIO's."""
    t = wl.read_threads
    order = (f"--shuffle none: DLIO's order, its files read {t} at a time one record from each in turn (its "
             f"TFRecordDataset's num_parallel_reads, the Dataset's interleave), so the very records DLIO reads"
             if shuffle == "none" else
             f"--shuffle {shuffle}: files and records in an order seeded per epoch, so where a rank's files "
             f"hold more or fewer records than its steps take, those it leaves out or reads twice differ from "
             f"DLIO's; --shuffle none reads DLIO's")
    also = (f"; DLIO also passes the records through a seeded shuffle buffer of {wl.shuffle_size} (TensorFlow's, "
            "not reproduced)" if wl.sample_shuffle else "")
    return ("as DLIO 2.0.0's TensorFlow reader deals them: rank r of N reads files r, r+N, r+2N, ... of the sorted "
            "list (tf.data's shard), floor(records / batch / N) batches of them per epoch, starting its files "
            f"over when they hold fewer (DLIO's repeat) ({order}); with fewer files than ranks, DLIO deals "
            f"records round-robin and dlstore contiguous shares{also}")


class _RepeatedEpoch(SourceWrapper):
    """One epoch of a Dataset, read again from its start at each of a loader's passes: DLIO's ``repeat()``.

    A rank whose files hold fewer records than its steps take starts its stream over within the
    epoch, as DLIO's reader does (its batched stream is repeated); the loader numbers its passes
    0, 1, ..., and each reads the Dataset's epoch ``epoch``. All else goes to the Dataset.
    """

    def __init__(self, dataset: Dataset, epoch: int):
        super().__init__(dataset)
        self._epoch = epoch

    def set_epoch(self, epoch: int) -> None:
        self._source.set_epoch(self._epoch)


def _keeping(loader: Loader, kept: List[Tuple[np.ndarray, np.ndarray]]) -> Iterator[Dict[str, Any]]:
    """The loader's batches, the shard and record index of each sample kept (one copy per batch)."""
    for batch in loader:
        kept.append((batch["shard"].copy(), batch["record"].copy()))
        yield batch


# ---- one rank ------------------------------------------------------------------------------------

def run_rank(spec: RunSpec, world: World, ready: Callable[[], None]) -> List[Dict[str, Any]]:
    """One emulated accelerator: its epochs, each DLIO's step count of batches from this rank's Dataset.

    Each epoch is a Loader over the rank's Dataset (:meth:`RunSpec.dataset`), one batch a step, for
    ``floor(records / batch / ranks)`` steps; a rank whose files hold fewer records reads its epoch
    again from the start for the rest (DLIO's ``repeat()``). ``ready()`` is called once the first
    epoch's loader is built and returns when the run starts (every rank built, the cache prepared).
    Returns each epoch's :func:`rank_epoch` figures, with the engine that read.
    """
    wl = spec.workload
    records = spec.records()
    steps = dlio_steps(records, wl.batch_size, world.size)
    if steps < 2:
        raise ValueError(f"{len(spec.files)} files of {records} records make {steps} steps of "
                         f"{wl.batch_size} per rank at {world.size} ranks: MLPerf's AU needs at least 2 "
                         "(more data, or fewer accelerators)")
    dataset = spec.dataset(world)
    per_pass = dataset.num_batches
    if per_pass < 1:
        raise ValueError(f"rank {world.rank}: its {len(dataset.shards)} files ({dataset.shards[0]}, ...) hold "
                         f"{int(dataset.counts.sum())} records, less than a batch of {wl.batch_size}")
    passes = -(-steps // per_pass)
    # One batch drawn first, untimed, as DLIO's reader is built and TensorFlow imported before its window:
    # the loader's first use in a process pays imports and thread pools; a cold run drops what it read.
    warm = Loader(spec.dataset(world), DlioExample(), wl.batch_size, prefetch=1, threads=spec.threads, epochs=1)
    try:
        next(iter(warm))
    finally:
        close_loader(warm)
    epochs = []
    for epoch in range(spec.epochs):
        source = CountingSource(_RepeatedEpoch(dataset, epoch))
        loader = Loader(source, DlioExample(), wl.batch_size, prefetch=spec.prefetch, last_batch="DROP",
                        threads=spec.threads, epochs=passes, seed=spec.seed,
                        record_key="index" if spec.keep_records else None)
        kept: List[Tuple[np.ndarray, np.ndarray]] = []
        try:
            if epoch == 0:
                ready()
            measured = run_steps(_keeping(loader, kept) if spec.keep_records else loader, [1] * steps,
                                 compute_s=wl.computation_time, counter=source)
        finally:
            close_loader(loader)
        if measured["batches"] < steps:
            raise RuntimeError(f"rank {world.rank}: the Dataset ended after {measured['batches']} of DLIO's "
                               f"{steps} steps in epoch {epoch + 1}")
        figures = rank_epoch(measured, wl.computation_time)
        # What step 1, which MLPerf's AU leaves out, read of the epoch's records (mlperf_au.decisive_au).
        first = min(first_step_reads(dataset, epoch, wl.batch_size), steps * wl.batch_size)
        figures.update(epoch=epoch + 1, rank=world.rank, engine=dataset.engine,
                       process_cpu_pct=measured["process_cpu_pct"],
                       first_step_read_pct=100.0 * first / (steps * wl.batch_size))
        if spec.keep_records:
            shards = np.concatenate([k[0] for k in kept])
            figures["records"] = list(zip(np.asarray(dataset.shards)[shards].tolist(),
                                          np.concatenate([k[1] for k in kept]).tolist()))
        epochs.append(figures)
    return epochs


def _prepare(tier: str, files: Sequence[str]) -> Tuple[str, Optional[float]]:
    """The cache made ``tier`` for ``files``: what ran, and the fraction of the files resident after it."""
    method = cache_control.make_cold(list(files)) if tier == "cold" else cache_control.make_warm(list(files))
    return method, cache_control.resident_fraction(list(files))


# ---- launchers -----------------------------------------------------------------------------------

def measure_threads(spec: RunSpec, n: int, tier: str) -> Dict[str, Any]:
    """A run at ``n`` accelerators, one thread each in this process: ``ranks`` (per rank, per epoch) and
    ``cache_method``."""
    built, go = threading.Barrier(n + 1), threading.Barrier(n + 1)
    results: List[Optional[List[Dict[str, Any]]]] = [None] * n
    errors: List[BaseException] = []

    def ready() -> None:
        built.wait()
        go.wait()

    def rank(r: int) -> None:
        try:
            results[r] = run_rank(spec, detect_world(rank=r, size=n, local_rank=r, local_size=n), ready)
        except BaseException as e:  # noqa: BLE001 - re-raised by the caller with its rank
            errors.append(e)
            built.abort()
            go.abort()

    threads = [threading.Thread(target=rank, args=(r,), name=f"dlstore-mlperf-rank{r}") for r in range(n)]
    for t in threads:
        t.start()
    method, resident = None, None
    try:
        built.wait()
        method, resident = _prepare(tier, spec.files)
        go.wait()
    except threading.BrokenBarrierError:
        pass
    finally:
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return {"ranks": results, "cache_method": method, "resident": resident}


def _mpi_rank_run(spec: RunSpec, tier: str, out: str) -> int:
    """This process as one rank of a run under mpirun; rank 0 writes the ranks' figures to ``out``."""
    comm = mpi_comm()
    world = detect_world()
    method: List[Any] = [None, None]

    def ready() -> None:
        if comm is not None:
            comm.Barrier()
        if world.rank == 0:
            method[:] = _prepare(tier, spec.files)
        if comm is not None:
            comm.Barrier()

    mine = run_rank(spec, world, ready)
    ranks = comm.gather(mine, root=0) if comm is not None else [mine]
    if world.rank == 0:
        report.write_json(out, {"ranks": ranks, "cache_method": method[0], "resident": method[1]})
    return 0


def mpirun_command(n: int) -> List[str]:
    """The launcher's words for ``n`` processes on this host (OpenMPI's: oversubscribed, root allowed)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise FileNotFoundError("mpirun is not on PATH: install an MPI (and mpi4py), or pass --launch threads")
    cmd = [mpirun, "-n", str(n), "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if "PYTHONPATH" in os.environ:
        cmd += ["-x", "PYTHONPATH"]
    return cmd


def measure_mpirun(spec: RunSpec, n: int, tier: str, argv: Sequence[str], timeout: float = 3600.0) -> Dict[str, Any]:
    """A run at ``n`` accelerators, one process each under mpirun: this scenario again, as ranks."""
    with tempfile.TemporaryDirectory(prefix="dlstore-mlperf-") as tmp:
        out = os.path.join(tmp, "ranks.json")
        cmd = mpirun_command(n) + [sys.executable, "-m", "dlstore.bench", "mlperf", *argv,
                                   "--accelerators", str(n), "--tiers", tier, "--rank-json", out]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        if done.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-4000:]}")
        with open(out) as f:
            return json.load(f)


def _child_argv(args: argparse.Namespace, data: str, engine: str) -> List[str]:
    argv = ["--workload", args.workload, "--accelerator", args.accelerator, "--data", data, "--io", engine,
            "--shuffle", args.shuffle, "--seed", str(args.seed), "--prefetch", str(args.prefetch),
            "--epochs", str(args.epochs), "--quiet"]
    if args.batch_size is not None:
        argv += ["--batch-size", str(args.batch_size)]
    if args.threads is not None:
        argv += ["--threads", str(args.threads)]
    if not args.verify:
        argv.append("--no-verify")
    return argv


# ---- command line --------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of the ``mlperf`` scenario."""
    p.add_argument("--workload", choices=workload_names(), default="resnet50",
                   help="MLPerf Storage training workload (default: %(default)s)")
    p.add_argument("--accelerator", choices=accelerator_names(), default="h100",
                   help="emulated accelerator: its computation_time per batch and batch size (default: %(default)s)")
    p.add_argument("--data", metavar="DIR", required=True,
                   help="DLIO's data folder: DIR/train/img_<i>_of_<n>.tfrecord, as DLIO generates it")
    p.add_argument("--generate", action="store_true",
                   help="write the files first in DLIO's layout when DIR/train holds none (kept when it does)")
    p.add_argument("--size", metavar="BYTES",
                   help="with --generate: the dataset's size (e.g. 2GB); default: 1.2 times what the page cache "
                        "can use, so that an epoch is not served from memory")
    p.add_argument("--files", type=int, metavar="N", help="with --generate: this many files (overrides --size)")
    p.add_argument("--records-per-file", type=int, metavar="N",
                   help="with --generate: records per file (default: the workload's, e.g. 1251 for resnet50)")
    p.add_argument("--batch-size", type=int, metavar="N",
                   help="override the workload's batch size, its computation_time scaled to keep the samples/s "
                        "of one accelerator (for small data: smoke tests); the header says so")
    p.add_argument("--accelerators", type=int, metavar="N",
                   help="measure at N accelerators only (default: search for the most that pass)")
    p.add_argument("--max-accelerators", type=int, default=64, metavar="N",
                   help="the search's largest count (default: %(default)s)")
    p.add_argument("--tiers", default=None, metavar="LIST",
                   help="cache states to search in: cold (dropped or evicted before each run), warm (read once "
                        "before each run); default: cold,warm, or cold alone where a warm run could not be warm "
                        "(the data outgrows the page cache, or io engine direct reads around it)")
    p.add_argument("--launch", choices=LAUNCHES, default=None,
                   help="ranks as processes under mpirun or as threads of this process (default: mpirun when "
                        "on PATH, else threads)")
    p.add_argument("--repeat", type=int, default=1, metavar="R",
                   help="runs per count; the medians decide and are reported (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=1, metavar="E",
                   help="epochs per run (default: %(default)s; MLPerf Storage runs 5 over a dataset that outgrows "
                        "memory; here a cold run drops the cache once, before the first)")
    p.add_argument("--io", choices=("auto",) + ENGINES, default=None,
                   help=HOST_IO_HELP)
    p.add_argument("--shuffle", choices=tuple(SHUFFLES), default="block",
                   help="the Dataset's record shuffle (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the shuffle")
    p.add_argument("--prefetch", type=int, default=2, metavar="N",
                   help="batches each rank's loader prepares ahead (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="loader threads per rank")
    p.add_argument("--no-verify", dest="verify", action="store_false", help="do not check TFRecord CRCs")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--markdown", metavar="FILE", help="write the tables as markdown")
    p.add_argument("--quiet", action="store_true", help="no progress")
    p.add_argument("--rank-json", help=argparse.SUPPRESS)  # a rank of a run launched by the search


def _tiers(text: str) -> List[str]:
    wanted = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in wanted if t not in TIERS]
    if unknown or not wanted:
        raise ValueError(f"--tiers: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(TIERS)}")
    return [t for t in TIERS if t in wanted]


def choose_tiers(asked: Optional[str], data_bytes: int, cache_bytes: int, engine: str) -> Tuple[List[str], str]:
    """The tiers to search and the header's words on them: ``--tiers`` when given; else cold and warm, or
    cold alone where a warm run could not be warm (the data outgrows the page cache, or the engine reads
    around it)."""
    if asked is not None:
        tiers = _tiers(asked)
        return tiers, ", ".join(tiers)
    if engine == "direct":
        return ["cold"], ("cold only: io engine direct reads around the page cache, so a warm run would read as "
                          "a cold one (--tiers cold,warm runs it all the same)")
    if data_bytes > cache_bytes:
        return ["cold"], (f"cold only: the data outgrows the page cache ({report.fmt_bytes(cache_bytes)}), so a "
                          "warm run would start partly cold (--tiers cold,warm runs it all the same)")
    return list(TIERS), ", ".join(TIERS)


def _generate(args: argparse.Namespace, wl: MlperfWorkload, log: Callable[[str], None]) -> Optional[str]:
    """Writes the dataset when asked and missing, or the files an interrupted ``--generate`` left unwritten;
    returns a note on what was written, or None."""
    if not args.generate:
        return None
    there = train_files(args.data)
    per_file = args.records_per_file or wl.records_per_file
    if there:
        files = promised_files(there)
        if len(there) == files:
            return None
        why = f"{files - len(there)} of them missing, the rest kept"
    elif args.files:
        files, why = args.files, "--files"
    elif args.size:
        files, why = max(1, -(-parse_size(args.size) // (record_bytes(wl) * per_file))), f"--size {args.size}"
    else:
        files = min(wl.files, files_to_outgrow_cache(wl, records_per_file=per_file))
        why = (f"1.2x the page cache's {report.fmt_bytes(available_page_cache_bytes())}"
               + (f", capped at the workload's {wl.files} files" if files == wl.files else ""))
    total = (files - len(there)) * per_file * record_bytes(wl)
    log(f"generating {files} files x {per_file} records (~{report.fmt_bytes(total)}, {why}) in "
        f"{os.path.join(args.data, 'train')}")
    bar = Progress(total, "generate", unit="B", enabled=False if args.quiet else None, piped="lines")
    try:
        generate(args.data, wl, files, per_file, progress=bar.update if bar.enabled else None)
    finally:
        bar.close()
    return (f"generated by dlstore in DLIO's layout: {files} files x {per_file} records ({why}), "
            f"{wl.dimension}x{wl.dimension} images" + (" (sides drawn per file)" if wl.dimension_stdev else ""))


def _median_run(repeats: List[Dict[str, Any]], threshold: float) -> Dict[str, Any]:
    """The figures of a count over its repeats: the medians, each repeat kept."""
    keys = ("au_pct", "au_whole_pct", "samples_per_s", "mib_per_s", "others_cores", "first_step_read_pct")
    out: Dict[str, Any] = {"accelerators": repeats[0]["accelerators"], "repeats": repeats}
    for k in keys:
        s = report.summarize([r[k] for r in repeats if r.get(k) is not None])
        out[k] = s["median"]
        out[f"{k}_spread"] = s
    decide(out, threshold)
    n = out["accelerators"]
    out["samples_per_s_per_accelerator"] = out["samples_per_s"] / n if out["samples_per_s"] else None
    out["mib_per_s_per_accelerator"] = out["mib_per_s"] / n if out["mib_per_s"] else None
    return out


def _others_cores(ranks: Sequence[Sequence[Dict[str, Any]]], in_process: bool) -> Optional[float]:
    """Cores kept busy by processes outside the run (not its ranks), on average over the first epoch.

    Each rank measured the machine's busy cores less its own process's CPU time; ranks in one process
    (threads) all measured the run's own process, ranks under mpirun each their own.
    """
    firsts = [r[0] for r in ranks]
    if any(f.get("other_processes_cores") is None or f.get("process_cpu_pct") is None for f in firsts):
        return None
    if in_process:
        return mean_known(f["other_processes_cores"] for f in firsts)
    ours = sum(f["process_cpu_pct"] for f in firsts) / 100.0
    busy = mean_known(f["other_processes_cores"] + f["process_cpu_pct"] / 100.0 for f in firsts)
    return max(0.0, busy - ours)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``python -m dlstore.bench mlperf``."""
    wl = workload(args.workload, args.accelerator)
    if args.batch_size is not None:
        if args.batch_size < 1:
            raise ValueError("--batch-size must be at least 1")
        wl = dataclasses.replace(wl, batch_size=args.batch_size,
                                 computation_time=wl.computation_time * args.batch_size / wl.batch_size,
                                 source=f"--batch-size {args.batch_size}: computation_time scaled from "
                                        f"{wl.computation_time:g} s per {wl.batch_size}; " + wl.source)
    args.io = host_io(args.io)
    for name in ("repeat", "epochs", "prefetch", "max_accelerators"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.accelerators is not None and args.accelerators < 1:
        raise ValueError("--accelerators must be at least 1")
    tiers = _tiers(args.tiers or ",".join(TIERS))
    if args.rank_json:  # one rank of a run that a search launched under mpirun
        spec = RunSpec(tuple(layout_files(args.data)), wl, args.io, args.verify, args.shuffle, args.seed,
                       args.prefetch, args.threads, args.epochs)
        return _mpi_rank_run(spec, tiers[0], args.rank_json)
    comm = mpi_comm()
    if comm is not None:
        raise ValueError("run bench mlperf without mpirun: it launches one mpirun per accelerator count itself "
                         "(--launch mpirun), or --launch threads")
    log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    launch = args.launch or ("mpirun" if shutil.which("mpirun") else "threads")
    generated = _generate(args, wl, log)
    files = layout_files(args.data)
    spec = RunSpec(tuple(files), wl, args.io, args.verify, args.shuffle, args.seed, args.prefetch, args.threads,
                   args.epochs)
    probe = spec.dataset(detect_world(rank=0, size=1))
    # The engine resolved once, over all the files: each rank reads its own share with it (under auto, a
    # rank's share alone could resolve otherwise).
    spec = dataclasses.replace(spec, io=probe.engine)
    records = int(probe.counts.sum())
    nbytes = int(sum(os.path.getsize(f) for f in files))
    info = sysinfo.collect(files, probe.engine, probe.engine_reason)
    info["loadavg"] = os.getloadavg()
    cache = available_page_cache_bytes()
    tiers, tiers_note = choose_tiers(args.tiers, nbytes, cache, spec.io)
    extra = [("workload", wl.describe()),
             ("data", f"{len(files)} files, {records:,} records, {report.fmt_bytes(nbytes)} in "
                      f"{os.path.join(args.data, 'train')} (DLIO's layout: image bytes + size int64)"
                      + (f"; {generated}" if generated else "")
                      + (f"; {'outgrows' if nbytes > cache else 'fits in'} the page cache "
                         f"({report.fmt_bytes(cache)})")),
             ("read", f"each rank: a dlstore.Dataset of its files, Loader prefetch {args.prefetch}, C++ parse of "
                      f"image and size; CRC {'checked' if args.verify else 'not checked'}; one batch drawn untimed "
                      "per rank before the cache is prepared (imports, threads); "
                      f"DLIO's {dlio_steps(records, wl.batch_size, 1)} steps per epoch at 1 accelerator "
                      "(floor(records / batch / accelerators))"),
             ("records", describe_records(wl, args.shuffle)),
             ("shuffle", f"{probe.describe_shuffle()}; seed {args.seed}"),
             ("ranks", "one process per emulated accelerator under mpirun (" + (shutil.which("mpirun") or "-")
              + ")" if launch == "mpirun" else "one thread per emulated accelerator, in this process"),
             ("AU", f"MLPerf's rule: computation_time x (steps - 1) / (epoch wall time - first step), mean over "
                    f"ranks and epochs; pass at >= {wl.au_threshold_pct:g}%; also the whole epoch (first step "
                    f"counted), which decides instead where step 1 reads >= {FIRST_STEP_READ_LIMIT_PCT:g}% of a "
                    "rank's epoch (a shuffle buffer holding its share fills before the first batch), as MLPerf's "
                    "rule would then leave the reading out"),
             ("tiers", tiers_note),
             ("machine", f"load average {info['loadavg'][0]:.2f} {info['loadavg'][1]:.2f} "
                         f"{info['loadavg'][2]:.2f} at the start; cores used by other processes during each run "
                         "in the table")]
    del probe
    print(sysinfo.format_header(info, extra=extra) + "\n", flush=True)

    argv = _child_argv(args, args.data, spec.io)
    warnings: List[str] = []
    results: Dict[str, Any] = {}
    for tier in tiers:
        methods = set()

        def measure(n: int, tier: str = tier, methods: set = methods) -> Dict[str, Any]:
            repeats = []
            for i in range(args.repeat):
                log(f"{tier}: {n} accelerator{'s' if n > 1 else ''}, run {i + 1} of {args.repeat}")
                in_process = launch == "threads" or n == 1  # one rank: this process is it
                got = measure_threads(spec, n, tier) if in_process else measure_mpirun(spec, n, tier, argv)
                methods.add(got["cache_method"])
                figures = aggregate(got["ranks"], wl.au_threshold_pct)
                figures["others_cores"] = _others_cores(got["ranks"], in_process)
                figures["engine"] = got["ranks"][0][0]["engine"]
                figures["cache_method"] = got["cache_method"]
                figures["resident_at_start"] = got["resident"]
                if tier == "warm" and got["resident"] is not None and got["resident"] < 0.95:
                    why = ("the data outgrows the page cache" if nbytes > cache
                           else "evicted by other processes")
                    if spec.io == "direct":
                        why += "; io engine direct reads around it anyway"
                    warnings.append(f"warm at {n} (run {i + 1}): only {100 * got['resident']:.0f}% of the data was "
                                    f"in the page cache at the start ({why}): partly cold")
                figures["ranks"] = got["ranks"]
                first = figures["first_step_read_pct"]
                if first is not None and 10.0 <= first < FIRST_STEP_READ_LIMIT_PCT:
                    warnings.append(f"{tier} at {n} (run {i + 1}): step 1, which MLPerf's AU leaves out, read "
                                    f"{first:.0f}% of a rank's epoch (its shuffle buffer fills first): the AU leaves "
                                    "that reading out; AU % (whole epoch) counts it (more data per rank, or "
                                    "--shuffle none, makes step 1 smaller)")
                warnings.extend(sysinfo.trust_warnings(f"{tier} at {n} (run {i + 1})",
                                                       figures["epochs"][0]["seconds"], figures["others_cores"]))
                repeats.append(figures)
            out = _median_run(repeats, wl.au_threshold_pct)
            log(f"  AU {out['au_pct']:.1f}% (whole epoch {out['au_whole_pct']:.1f}%), "
                f"{out['samples_per_s']:,.0f} samples/s")
            return out

        if args.accelerators is not None:
            runs = {args.accelerators: measure(args.accelerators)}
            found = {"best": args.accelerators if runs[args.accelerators]["passed"] else None,
                     "tried": [args.accelerators], "runs": runs, "capped": False, "fixed": True}
        else:
            found = search_accelerators(measure, args.max_accelerators)
        found["cache_method"] = "; ".join(sorted(m for m in methods if m))
        results[tier] = found

    doc = {"scenario": "mlperf", "command": ["python", "-m", "dlstore.bench", "mlperf"] + sys.argv[2:],
           "sysinfo": info, "header": extra, "workload": asdict(wl), "record_bytes_on_disk": nbytes / records,
           "config": {"data": args.data, "files": len(files), "records": records, "bytes": nbytes,
                      "launch": launch, "io": args.io, "engine": spec.io, "shuffle": args.shuffle, "seed": args.seed,
                      "prefetch": args.prefetch, "threads": args.threads, "epochs": args.epochs,
                      "repeat": args.repeat, "verify": args.verify, "page_cache_bytes": cache},
           "tiers": results, "warnings": warnings}
    print(format_report(doc), flush=True)
    report.write_outputs(doc, args.json, args.markdown, lambda: markdown_report(doc))
    return 0


# ---- report --------------------------------------------------------------------------------------

_COLUMNS = [
    report.Column("accelerators", "accelerators", "{}"),
    report.Column("au_pct", "AU % (MLPerf)", "{:.1f}"),
    report.Column("au_whole_pct", "AU % (whole epoch)", "{:.1f}"),
    report.Column("first_step_read_pct", "step 1 reads", "{:.0f}%"),
    report.Column("samples_per_s", "samples/s", "{:,.0f}"),
    report.Column("mib_per_s", "MiB/s", "{:,.0f}"),
    report.Column("samples_per_s_per_accelerator", "samples/s per acc.", "{:,.0f}"),
    report.Column("mib_per_s_per_accelerator", "MiB/s per acc.", "{:,.0f}"),
    report.Column("au_ranks", "AU per accelerator", "{}", "<"),
    report.Column("au_range", "AU over runs", "{}", "<"),
    report.Column("cached", "cached at start", "{}"),
    report.Column("others_cores", "other cores", "{:.2f}"),
    report.Column("verdict", "verdict", "{}", "<"),
]


def _rows(found: Dict[str, Any]) -> List[Dict[str, Any]]:
    rows = []
    for n in sorted(int(k) for k in found["runs"]):
        run_ = found["runs"].get(n, found["runs"].get(str(n)))
        spread = run_["au_pct_spread"]
        per_rank = [a for r in run_["repeats"] for a in r["au_per_rank_pct"] if a is not None]
        cached = [r["resident_at_start"] for r in run_["repeats"] if r.get("resident_at_start") is not None]
        rows.append(dict(run_, au_ranks=f"{min(per_rank):.1f}-{max(per_rank):.1f}" if per_rank else None,
                         au_range=(f"{spread['min']:.1f}-{spread['max']:.1f} ({spread['n']} runs)"
                                   if spread["n"] > 1 else "1 run"),
                         cached=(f"{100 * min(cached):.0f}%" + (f"-{100 * max(cached):.0f}%" if len(cached) > 1 else "")
                                 if cached else None),
                         verdict=("pass" if run_["passed"] else "fail")
                         + (" (whole epoch)" if run_.get("decided_on") == "au_whole_pct" else "")))
    return rows


def _decided_by(run_: Dict[str, Any]) -> str:
    """The verdict's words on which AU decided a run, when it was not MLPerf's rule."""
    if run_.get("decided_on") != "au_whole_pct":
        return ""
    return (f" (decided on the whole-epoch AU: step 1, which MLPerf's rule leaves out, read "
            f"{run_['first_step_read_pct']:.0f}% of a rank's epoch; MLPerf's AU {run_['au_pct']:.1f}%)")


def _verdict(tier: str, found: Dict[str, Any], wl: Dict[str, Any]) -> str:
    acc = wl["accelerator"].upper()
    best = found["best"]
    runs = found["runs"]
    if not best:
        first = found["tried"][0]
        run_ = runs.get(first, runs.get(str(first)))
        return (f"{tier}: no count passed (AU below {wl['au_threshold_pct']:g}% at {first})"
                + (_decided_by(run_) if run_ else ""))
    run_ = runs.get(best, runs.get(str(best)))
    more = " (the search's cap: more may pass)" if found.get("capped") else ""
    au = run_[run_.get("decided_on") or "au_pct"]
    return (f"{tier}: this storage feeds {best} emulated {acc}{'s' if best > 1 else ''} of {wl['workload']} at AU >= "
            f"{wl['au_threshold_pct']:g}%{more}: {run_['samples_per_s']:,.0f} samples/s, "
            f"{run_['mib_per_s']:,.0f} MiB/s, AU {au:.1f}%" + _decided_by(run_))


def format_report(doc: Dict[str, Any]) -> str:
    """The terminal report: a table per tier (counts tried), then the verdicts."""
    out = []
    for tier, found in doc["tiers"].items():
        out.append(report.text_table(_rows(found), _COLUMNS,
                                     title=f"{tier} ({found['cache_method']}), {doc['workload']['workload']} on "
                                           f"emulated {doc['workload']['accelerator'].upper()}s, "
                                           f"{doc['config']['launch']}"))
        out.append("")
    out += [_verdict(t, f, doc["workload"]) for t, f in doc["tiers"].items()]
    if doc["warnings"]:
        out += ["", "warnings:"] + [f"  {w}" for w in doc["warnings"]]
    return "\n".join(out)


def markdown_report(doc: Dict[str, Any]) -> str:
    """The report as markdown: the header, a table per tier, the verdicts."""
    out = ["| | |", "|:---|:---|"] + [f"| {k} | {str(v).replace('|', '/')} |" for k, v in doc["header"]]
    for tier, found in doc["tiers"].items():
        out += ["", f"**{tier}** ({found['cache_method']})", "", report.markdown_table(_rows(found), _COLUMNS)]
    out += [f"- {_verdict(t, f, doc['workload'])}" for t, f in doc["tiers"].items()]
    return "\n".join(out) + "\n"
