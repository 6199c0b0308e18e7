#!/usr/bin/env python
"""An epoch read through ``dlstore.Dataset`` under each shuffle, cold from the device and warm from the page
cache, records only (no decoding): what a shuffle costs the read path, beside the unshuffled read.

    python benchmarks/shuffles.py                          # the cached 1 GB ImageNet-like set
    python benchmarks/shuffles.py --quick                  # a tiny set: a smoke test
    python benchmarks/shuffles.py --data '/data/train-*' --cache cold --engines direct
    python benchmarks/shuffles.py --save --markdown docs/shuffles.md  # the committed results and page
    python benchmarks/shuffles.py --cache cold --engines direct,io_uring --shuffles none,block,global \
        --data '~/.cache/dlstore/synthetic/imagenet-default-*/train-*' --json benchmarks/results/engines_cold.json

Every measurement runs in a fresh interpreter (its own memory and threads): it builds the Dataset
(one rank, batch ``--batch-size``) and reads one epoch untimed, as a training job has by its second
epoch (its buffers allocated and touched once: on a VM, fresh memory can cost a host fault per page
the first time; that first epoch's rate is kept as ``first_epoch_gb_per_s``, the last column).
Then it prepares the cache (cold: the page cache dropped as root, else the files evicted; warm:
every file read once, so it sits in the page cache), reads ``--epochs`` epochs and reports for the
first of them:

- **GB/s** of record payload and records/s over the epoch's wall time, and the process's CPU seconds
  per GB; **vs none**: the rate over the unshuffled read of the same engine and cache state.
- **neighbours**: the share of consecutive records that are neighbours in one file (record ``r`` then
  ``r + 1`` or ``r - 1`` of the same shard): 1.0 unshuffled; what a shuffle should make rare.
- **memory**: the most chunk bytes the reader held at once (for ``block`` and ``buffer``, the shuffle
  buffer's), the records it copied out of chunks it let go, the batches gathered by copy; and the
  process's resident memory after each epoch (warm runs), which stays flat unless something leaks.

Cold runs are set beside fio on the same files (``--fio``, on by default where fio is installed),
each fio job cold too, in every round: fio ``io_uring`` ``randread`` at the mean record size (rounded
up to 4 KiB) with as many jobs as dlstore has I/O threads and the queue depth each thread of each
engine keeps (``direct``: 1; ``io_uring``: its ``queue_depth``), which a ``global`` epoch is held
to; and the grid of sequential 1 MiB and random record-sized reads at depths 1 to 64, whose best is
what the device gives these files, which ``block`` and ``none`` are held to. fio's buffers are huge
pages where the process may allow them, as dlstore's are (see :mod:`dlstore.bench.fio`).

Measurements run in rounds, every configuration once per round in a rotating order, so drift on a
shared machine spreads over all of them; figures are medians over rounds.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:  # run from a checkout: measure this tree's dlstore
    sys.path.insert(0, ROOT)

from benchmarks import _harness  # noqa: E402

RESULT_PREFIX = "SHUFFLES_RESULT "
SHUFFLES = ("none", "block", "buffer", "global")
# Issue 8's targets for the read path: a cold shuffled epoch streams as the unshuffled one does.
COLD_BLOCK_VS_NONE = 0.9
# Issue 19's: a cold global epoch against fio randread at the same depth, block and none against fio's best.
GLOBAL_VS_FIO_SAME_DEPTH = 0.85
STREAM_VS_BEST_FIO = 0.9
FIO_DEPTHS = (1, 2, 4, 8, 16, 32, 64)
O_DIRECT_ENGINES = ("direct", "io_uring")  # the engines fio's direct=1 jobs compare with
NEIGHBOURS_MAX = 0.05  # block: consecutive records rarely neighbours in a file


# ---- one measurement (in a worker process) --------------------------------------------------------

def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(plan: Dict) -> Dict:
    """Reads ``plan["epochs"]`` epochs of one configuration; figures of the first, RSS after each."""
    import numpy as np

    from dlstore.io import pagecache as cache
    from dlstore.sources.dataset import Dataset
    from dlstore.placement import expand_runs

    ds = Dataset(plan["files"], io=plan["engine"], shuffle=plan["shuffle"], batch_size=plan["batch_size"],
                 remainder="uneven", seed=plan["seed"], verify=plan.get("verify", True))
    # Every frame of the dataset as one sorted key (shard, offset), to tell which record a batch holds.
    shard_of = np.repeat(np.arange(len(ds.shards)), ds.counts)
    offsets, _ = ds.index.frames(shard_of, expand_runs(np.zeros(len(ds.counts), np.int64), ds.counts))
    keys = (shard_of << 40) | offsets
    if plan["cache"] == "cold":  # the untimed epoch is cold too, for its rate
        cache.make_cold(plan["files"])
    t0 = time.perf_counter()
    warm_up = sum(b.nbytes for b in ds.batches())
    first_epoch = warm_up / (time.perf_counter() - t0) / 1e9
    method = cache.make_cold(plan["files"]) if plan["cache"] == "cold" else cache.make_warm(plan["files"])
    resident = cache.resident_fraction(plan["files"])
    rss, first = [], None
    for epoch in range(1, plan["epochs"] + 1):
        ds.set_epoch(epoch)
        t0, c0 = time.perf_counter(), time.process_time()
        nbytes = records = neighbours = 0
        last = None
        for batch in ds.batches():
            nbytes += batch.nbytes
            records += batch.num_records
            if epoch == 1:
                ids = np.searchsorted(keys, (batch.file_indices.astype(np.int64) << 40) |
                                      batch.file_offsets.astype(np.int64))
                if last is not None:
                    ids = np.concatenate([[last], ids])
                near = np.abs(np.diff(ids)) == 1
                neighbours += int(np.sum(near & (shard_of[ids[1:]] == shard_of[ids[:-1]])))
                last = int(ids[-1])
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        if epoch == 1:
            stats = ds.stats()
            first = {"seconds": seconds, "bytes": nbytes, "records": records, "gb_per_s": nbytes / seconds / 1e9,
                     "records_per_s": records / seconds, "cpu_s_per_gb": cpu / (nbytes / 1e9) if nbytes else None,
                     "neighbours": neighbours / max(1, records - 1),
                     "peak_held_bytes": stats.get("peak_held_bytes"), "spilled_records": stats.get("spilled_records"),
                     "gathered_batches": stats.get("gathered_batches"), "chunks": stats.get("chunks"),
                     "file_bytes_read": stats.get("file_bytes_read"), "first_epoch_gb_per_s": first_epoch}
        rss.append(_rss_bytes())
    return dict(first, engine=ds.engine, engine_reason=ds.engine_reason, shuffle_text=ds.describe_shuffle(),
                cache_method=method, cached_before=resident, rss_bytes=rss,
                buffer_records=ds.buffer_size, block_records=ds.block_records)


def worker(plan_path: str) -> int:
    with open(plan_path) as f:
        plan = json.load(f)
    try:
        out = measure(plan)
    except Exception as e:  # noqa: BLE001 - reported in the row
        import traceback

        traceback.print_exc()
        out = {"error": f"{type(e).__name__}: {e}"[:400]}
    print(RESULT_PREFIX + json.dumps(out), flush=True)
    return 0


# ---- fio beside the cold rows ------------------------------------------------------------------------

def engine_depth(engine: str, files: List[str]) -> int:
    """Reads each I/O thread of ``engine`` keeps in flight: what fio's same-depth job uses."""
    from dlstore.io.select import io_uring_depth

    return io_uring_depth(files[0])[0] if engine == "io_uring" else 1


def fio_jobs(files: List[str], mean_record: float, engines: List[str], depths=FIO_DEPTHS) -> List[Dict]:
    """The fio jobs of a round: randread at each cold engine's depth, then the grid."""
    from dlstore import settings
    from dlstore.bench.fio import block_size_for

    bs, threads = block_size_for(mean_record), settings.get("io_threads")
    jobs = {}
    for engine in engines:
        depth = engine_depth(engine, files)
        jobs[("randread", bs, depth)] = {"rw": "randread", "bs": bs, "depth": depth, "jobs": threads}
    for rw, size in (("read", "1M"), ("randread", bs)):
        for depth in depths:
            jobs.setdefault((rw, size, depth), {"rw": rw, "bs": size, "depth": depth, "jobs": threads})
    return list(jobs.values())


def fio_key(job: Dict) -> str:
    return f"fio/{job['rw']}/{job['bs']}/qd{job['depth']}x{job['jobs']}"


def run_fio_job(files: List[str], job: Dict) -> Dict:
    from dlstore.bench.fio import FioError, run_fio
    from dlstore.io import pagecache as cache

    cache.make_cold(files)
    try:
        r = run_fio(files, job["jobs"], bs=job["bs"], ioengine="io_uring", iodepth=job["depth"], rw=job["rw"])
    except FioError as e:
        return {"error": str(e)[:400]}
    return {"gb_per_s": r.gb_per_s, "description": r.describe(), "cpu_s_per_gb": r.cpu_seconds_per_gb,
            "version": r.version, "buffers": r.config.get("mem"), "buffers_note": r.buffers_note or None,
            "seconds": r.seconds}


# ---- the run ----------------------------------------------------------------------------------------

def configurations(args) -> List[Dict]:
    out = []
    for state in args.cache.split(","):
        engines = args.engines.split(",") if args.engines else (["direct", "io_uring", "buffered"] if state == "cold"
                                                                else ["buffered", "mmap"])
        for engine in engines:
            for shuffle in args.shuffles.split(","):
                out.append({"cache": state, "engine": engine, "shuffle": shuffle})
    return out


def run(args) -> Dict:
    from dlstore import settings
    from dlstore.bench import sysinfo
    from dlstore.bench.storage import dataset_paths

    files = dataset_paths(args.data, args.size, "imagenet", progress=not args.quiet)
    from dlstore.sources.dataset import Dataset

    probe = Dataset(files, batch_size=args.batch_size)  # builds the indexes before any cache is prepared
    configs = configurations(args)
    results: Dict[str, List[Dict]] = {}
    import tempfile

    from dlstore.bench.fio import fio_missing_reason

    cold_engines = sorted({c["engine"] for c in configs if c["cache"] == "cold" and c["engine"] in O_DIRECT_ENGINES})
    fio_why = None if cold_engines else "no cold configuration"
    fio_why = fio_why or (None if args.fio else "--no-fio") or fio_missing_reason()
    depths = [int(d) for d in args.fio_depths.split(",")]
    jobs = fio_jobs(files, probe.mean_record_bytes, cold_engines, depths) if fio_why is None else []
    fio_results: Dict[str, List[Dict]] = {}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="dlstore-shuffles-") as tmp:
        for r in range(args.repeat):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            print(f"round {r + 1} of {args.repeat}", flush=True)
            for cfg in order:
                key = f"{cfg['cache']}/{cfg['engine']}/{cfg['shuffle']}"
                plan = dict(cfg, files=files, batch_size=args.batch_size, seed=args.seed, verify=args.verify,
                            epochs=args.epochs if cfg["cache"] == "warm" else 1)
                path = os.path.join(tmp, "plan.json")
                with open(path, "w") as f:
                    json.dump(plan, f)
                got = _harness.run_worker(__file__, ["--worker", path], RESULT_PREFIX, args.timeout)
                results.setdefault(key, []).append(got)
                if "error" in got:
                    print(f"{key:<24} failed: {got['error']}", flush=True)
                else:
                    print(f"{key:<24} {got['gb_per_s']:6.2f} GB/s {got['records_per_s']:10,.0f} records/s  "
                          f"neighbours {got['neighbours']:.3f}", flush=True)
            for job in jobs:
                got = run_fio_job(files, job)
                fio_results.setdefault(fio_key(job), []).append(got)
                print(f"{fio_key(job):<24} " + (f"failed: {got['error']}" if "error" in got
                                                 else f"{got['gb_per_s']:6.2f} GB/s"), flush=True)
            loads.append(os.getloadavg()[0])
    rows = []
    for cfg in configs:
        key = f"{cfg['cache']}/{cfg['engine']}/{cfg['shuffle']}"
        runs = [g for g in results[key] if "error" not in g]
        row = dict(cfg, key=key)
        if not runs:
            row["status"] = f"failed: {results[key][0].get('error')}"
            rows.append(row)
            continue
        for k in ("gb_per_s", "records_per_s", "cpu_s_per_gb", "neighbours", "peak_held_bytes",
                  "spilled_records", "gathered_batches", "cached_before", "first_epoch_gb_per_s"):
            row[k] = _harness.median([g.get(k) for g in runs])
        from dlstore.bench import report

        row["spread_pct"] = report.summarize([g["gb_per_s"] for g in runs])["spread_pct"] if len(runs) > 1 else None
        last = runs[-1]
        for k in ("engine", "engine_reason", "shuffle_text", "cache_method", "rss_bytes", "buffer_records",
                  "block_records"):
            row[k] = last.get(k)
        rss = last.get("rss_bytes") or []
        row["rss_growth_bytes"] = (rss[-1] - rss[0]) if len(rss) > 1 else None  # after the untimed epoch
        row["status"] = "ok"
        row["runs"] = runs
        if cfg["cache"] == "cold" and cfg["engine"] in O_DIRECT_ENGINES and not fio_why:
            row["fio_depth"] = engine_depth(cfg["engine"], files)
        rows.append(row)
    base = {(r["cache"], r["engine"]): r.get("gb_per_s") for r in rows if r["shuffle"] == "none"}
    for r in rows:
        b = base.get((r["cache"], r["engine"]))
        if r.get("gb_per_s") and b:
            r["vs_none"] = r["gb_per_s"] / b
    fio_rows = []
    for job in jobs:
        runs = fio_results.get(fio_key(job), [])
        ok = [g["gb_per_s"] for g in runs if "error" not in g]
        fio_rows.append(dict(job, key=fio_key(job), gb_per_s=_harness.median(ok) if ok else None,
                             runs=ok, description=next((g["description"] for g in runs if "description" in g), None),
                             buffers_notes=sorted({g["buffers_note"] for g in runs if g.get("buffers_note")}),
                             status="ok" if ok else f"failed: {runs[0].get('error') if runs else 'not run'}"))
    info = sysinfo.collect(files, probe.engine, probe.engine_reason)
    doc = {"benchmark": "shuffles", "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": ["python", "benchmarks/shuffles.py"] + sys.argv[1:], "system": info,
           "data": {"files": len(files), "bytes": sum(os.path.getsize(p) for p in files),
                    "records": int(probe.counts.sum()), "mean_record_bytes": probe.mean_record_bytes,
                    "size": None if args.data else args.size},
           "config": {"batch_size": args.batch_size, "repeat": args.repeat, "epochs": args.epochs, "seed": args.seed,
                      "verify": args.verify,
                      # Settings given as environment variables (DLSTORE_CHUNK_SIZE=2M ...): the workers inherit them.
                      "environment": {k: v for k, v in sorted(os.environ.items())
                                      if k.startswith("DLSTORE_") and k != "DLSTORE_NO_PROGRESS"}},
           "load_before": loads[0], "load_after_rounds": loads[1:], "rows": rows,
           "fio": {"skipped": fio_why, "rows": fio_rows,
                   "depths": {e: engine_depth(e, files) for e in cold_engines},
                   "io_threads": settings.get("io_threads")}}
    doc["targets"] = targets(rows, fio_rows)
    return doc


def fio_targets(rows: List[Dict], fio_rows: List[Dict]) -> List[Dict]:
    """Issue 19's: each cold engine's global epoch against fio randread at its depth, block and none
    against the best fio figure over the same files."""
    out = []
    fio_ok = [f for f in fio_rows if f.get("gb_per_s")]
    if not fio_ok:
        return out
    best = max(fio_ok, key=lambda f: f["gb_per_s"])
    randread = [f for f in fio_ok if f["rw"] == "randread"]
    for r in rows:
        if (r["cache"] != "cold" or r["engine"] not in O_DIRECT_ENGINES or not r.get("gb_per_s")
                or r["shuffle"] not in ("global", "block", "none")):
            continue
        if r["shuffle"] == "global":
            same = [f for f in randread if f["depth"] == r.get("fio_depth")]
            if not same:
                continue
            ref, goal = same[0], GLOBAL_VS_FIO_SAME_DEPTH
            what = f"fio randread bs={ref['bs']} at the same depth (qd{ref['depth']} x {ref['jobs']} jobs)"
        else:
            ref, goal = best, STREAM_VS_BEST_FIO
            what = f"the best fio ({ref['rw']} bs={ref['bs']} qd{ref['depth']} x {ref['jobs']} jobs)"
        ratio = r["gb_per_s"] / ref["gb_per_s"]
        out.append({"target": f"cold, io={r['engine']}: {r['shuffle']} >= {goal} x {what}",
                    "measured": f"{ratio:.2f}x ({r['gb_per_s']:.2f} vs {ref['gb_per_s']:.2f} GB/s)",
                    "ratio": ratio, "verdict": "PASS" if ratio >= goal else "FAIL"})
    return out


def targets(rows: List[Dict], fio_rows: Sequence[Dict] = ()) -> List[Dict]:
    """Issue 8's read-path targets and issue 19's against fio, each with what was measured and PASS/FAIL
    (or n/a when not run)."""
    by = {r["key"]: r for r in rows}
    out = fio_targets(rows, list(fio_rows))
    block, none = by.get("cold/direct/block"), by.get("cold/direct/none")
    ratio = block.get("vs_none") if block else None
    measured = None if ratio is None else f"{ratio:.2f}x ({block['gb_per_s']:.2f} vs {none['gb_per_s']:.2f} GB/s)"
    out.append({"target": f"cold, io=direct: block >= {COLD_BLOCK_VS_NONE} x none (GB/s)", "measured": measured,
                "verdict": None if ratio is None else ("PASS" if ratio >= COLD_BLOCK_VS_NONE else "FAIL")})
    near = [r["neighbours"] for r in rows if r["shuffle"] == "block" and r.get("neighbours") is not None]
    out.append({"target": f"block: consecutive records neighbours in a file < {NEIGHBOURS_MAX:.0%} of the time",
                "measured": None if not near else f"{max(near):.2%} at most",
                "verdict": None if not near else ("PASS" if max(near) < NEIGHBOURS_MAX else "FAIL")})
    growth = [r["rss_growth_bytes"] for r in rows if r.get("rss_growth_bytes") is not None]
    out.append({"target": "resident memory flat over the warm epochs (growth < 16 MB after the first)",
                "measured": None if not growth else f"{max(growth) / 1e6:+.1f} MB at most",
                "verdict": None if not growth else ("PASS" if max(growth) < 16e6 else "FAIL")})
    return out


HOW_TO_READ = """
## How to read it

- **Cold, direct** is what a data set larger than the page cache meets every epoch. `block` streams
  about as fast as the unshuffled read: its reads are whole 8 MiB blocks, in a seeded order within
  128 MiB windows of the shard-shuffled sequence (`shuffle_window`); `buffer` reads in order. `global`
  reads every record where it lies: as fast as the device serves random ~115 kB reads, about half the
  sequential rate here. The device is a shared VM's disk: identical runs vary by a third (`spread`),
  so compare medians over many rounds, and fio on the same files (`docs/read_throughput.md`).
- **Cold, io_uring** reads what `direct` reads, with many reads in flight: a `global` epoch's records up
  to `queue_depth` at a time per I/O thread (64 here: the device's nr_requests, capped), where `direct`
  reads one per thread; `none` and `block` chunks as 1 MiB pieces all in flight. The fio rows are the
  same files read by fio's io_uring engine, each job cold: `randread` at the mean record size and the
  depth each engine keeps per thread is what `global` is held to, the best of the grid (sequential 1 MiB
  and random record-sized reads, depths 1 to 64) what `none` and `block` are held to. fio suffers from a
  loaded machine as dlstore does, so both are measured in every round and compared as medians.
- **fio's buffers are huge pages** (`mem=mmaphuge`; as root the huge-page overcommit is raised for the
  job and put back), as dlstore's are (its buffers ask for transparent huge pages). On this VM's disk
  the layout reaches the device: a request into 4 KiB pages carries a segment per page, into huge
  pages one, and the disk is about twice as fast with the latter (fio's sequential 1 MiB reads at
  depth 1: 1.2-1.7 GB/s into malloc's pages, 2.7-2.8 into huge pages; dlstore's `none` falls from 2.2
  to 1.2 GB/s with transparent huge pages disabled). Runs before that change held dlstore to the
  malloc figures (docs/engines.md).
- **What fio does not do.** fio checks no CRC, and guest CPU and memory work slows this disk (fio's
  sequential reads lose 3-23% while one core runs CRC-32C); fio also rereads its own few buffers, and
  reads fastest with little memory in flight (1 MiB x depth 2 x 2 jobs), where a reader that hands
  out batches writes each record into memory not written just before.
- **First epoch.** A fresh process pays once for memory it touches the first time (on a VM, a host
  fault per page): the last column is each process's first epoch, read before the measured one. Cold,
  the block shuffle's first epoch is slower than its later ones by about the time its ~130 MB of held
  chunks take to touch once; a training job pays that once, not every epoch.
- **Warm** figures are the read path alone, no decoding: `block` and `buffer` gather each batch by copy
  (a view is impossible once records are reordered), so they top out at the copy rate, ~3.5 GB/s on one
  core; a ResNet-50 pipeline needs ~0.23 GB/s on two cores and BERT ~0.4 GB/s, so in a pipeline the
  shuffle costs 0-10% (docs/pipelines.md). `global` from the page cache hands out views (its batches
  are read, not reordered, so `buffered` preads straight into the batch's chunk).
- **Memory**: `peak held` is the most chunk bytes the reader held (a shuffle buffer's blocks and the
  reads in flight), `copied out` the records still waiting in a chunk when it was let go, copied out
  first. Resident memory stays flat over epochs.
"""


def _fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def markdown(doc: Dict) -> str:
    d, sysi = doc["data"], doc["system"]
    env = doc["config"].get("environment") or {}
    lines = ["# Shuffles on the read path: cold and warm epochs through `dlstore.Dataset`", "",
             f"Written by `{' '.join(doc['command'])}` on {doc['when']}.", "",
             f"- **Machine**: {sysi.get('cpu', '?')}, {sysi.get('cores', '?')} cores; 1-minute load "
             f"{doc['load_before']:.2f} before the run"
             + (", after each round " + ", ".join(f"{x:.2f}" for x in doc["load_after_rounds"])
                if doc.get("load_after_rounds") else ""),
             f"- **Data**: {d['files']} TFRecord files, {d['bytes'] / 1e9:.2f} GB, {d['records']:,} records "
             f"(mean {d['mean_record_bytes'] / 1e3:.1f} kB); one rank reads all of them; batch "
             f"{doc['config']['batch_size']}; records only, no decoding; "
             + ("TFRecord CRCs checked" if doc["config"].get("verify", True) else "CRCs NOT checked (--no-verify)")
             + ("; settings from the environment: " + ", ".join(f"`{k}={v}`" for k, v in env.items()) if env else ""),
             f"- **Method**: {doc['config']['repeat']} rounds, every configuration once per round in its own "
             "process, the order rotating; medians over rounds; each process reads one epoch untimed first (its "
             "rate in the last column: a fresh process's first touch of its buffers included), then the "
             "measured one; cold = the page cache dropped (root) or the files evicted before the epoch; warm = "
             "every file read once before it", ""]
    lines += ["| cache | engine | shuffle | GB/s | records/s | vs none | CPU s/GB | neighbours | peak held | "
              "copied out | gathered batches | spread | first epoch GB/s |",
              "|:---|:---|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        if r["status"] != "ok":
            lines.append(f"| {r['cache']} | {r['engine']} | {r['shuffle']} | {r['status']} ||||||||||")
            continue
        lines.append(f"| {r['cache']} | {r['engine']} | {r['shuffle']} | {r['gb_per_s']:.2f} | "
                     f"{r['records_per_s']:,.0f} | {_fmt(r.get('vs_none'), '.2f')}x | "
                     f"{_fmt(r['cpu_s_per_gb'], '.2f')} | "
                     f"{r['neighbours']:.3f} | {(r['peak_held_bytes'] or 0) / 1e6:.0f} MB | "
                     f"{_fmt(r['spilled_records'], ',.0f')} | {_fmt(r['gathered_batches'], ',.0f')} | "
                     f"{_fmt(r.get('spread_pct'), '.0f')}% | {_fmt(r.get('first_epoch_gb_per_s'), '.2f')} |")
    shuffles = {r["shuffle"]: r.get("shuffle_text") for r in doc["rows"] if r.get("shuffle_text")}
    lines += ["", "Shuffles as this dataset ran them:", ""]
    lines += [f"- **{k}**: {v}" for k, v in shuffles.items()]
    fio = doc.get("fio") or {}
    if fio.get("rows"):
        lines += ["", f"fio on the same files, each job cold, in every round (io_uring, O_DIRECT; "
                      f"dlstore's depth per I/O thread: {fio.get('depths')}):", "",
                  "| fio job | GB/s | runs |", "|:---|---:|:---|"]
        for f in fio["rows"]:
            lines.append(f"| {f.get('description') or f['key']} | {_fmt(f.get('gb_per_s'), '.2f')} | "
                         + ", ".join(f"{g:.2f}" for g in f.get("runs", [])) + " |")
        notes = sorted({n for f in fio["rows"] for n in f.get("buffers_notes") or ()})
        lines += [""] + [f"fio's buffers: {n}" for n in notes] if notes else []
    elif fio.get("skipped"):
        lines += ["", f"No fio beside the cold rows: {fio['skipped']}."]
    lines += ["", "## Targets", "", "| target | measured | verdict |", "|:---|:---|:---|"]
    for t in doc["targets"]:
        lines.append(f"| {t['target']} | {t['measured'] or 'not run'} | {t['verdict'] or 'n/a'} |")
    lines += ["", "Resident memory after each warm epoch (MB):", ""]
    for r in doc["rows"]:
        if r.get("rss_bytes") and len(r["rss_bytes"]) > 1:
            lines.append(f"- {r['key']}: " + ", ".join(f"{b / 1e6:.0f}" for b in r["rss_bytes"]))
    return "\n".join(lines) + "\n" + HOW_TO_READ


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", metavar="PLAN", help=argparse.SUPPRESS)
    p.add_argument("--data", metavar="GLOB", help="TFRecord files to read (default: a generated ImageNet-like set)")
    p.add_argument("--size", default="default", help="generated set's preset (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="the tiny set, one round, two epochs: a smoke test")
    p.add_argument("--cache", default="cold,warm", help="cache states to run (default: %(default)s)")
    p.add_argument("--engines", default=None,
                   help="engines, comma-separated (default: direct,io_uring,buffered cold; buffered,mmap warm)")
    p.add_argument("--shuffles", default=",".join(SHUFFLES), help="shuffles (default: %(default)s)")
    p.add_argument("--fio", action=argparse.BooleanOptionalAction, default=True,
                   help="cold runs: fio on the same files beside them (default: on where fio is installed)")
    p.add_argument("--fio-depths", default=",".join(map(str, FIO_DEPTHS)),
                   help="queue depths of fio's grid (default: %(default)s; --quick: 1,4)")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                   help="check each record's CRCs, as a Dataset does by default (--no-verify: what they cost)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=3,
                   help="warm epochs measured after the untimed one, for RSS (default: 3)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900.0)
    _harness.add_output_arguments(p, "shuffles")
    p.add_argument("--markdown", metavar="FILE")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--render", metavar="JSON", help="measure nothing: write --markdown from an earlier run's JSON")
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    if args.render:
        return _harness.render(args.render, args.markdown, markdown)
    json_path = _harness.output_path(p, args, "shuffles")
    if args.quick:
        args.size, args.repeat, args.epochs, args.batch_size = "tiny", 1, 2, 8
        args.fio_depths = "1,4"
    doc = run(args)
    print()
    print(markdown(doc))
    _harness.write_outputs(doc, json_path, args.markdown, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
