#!/usr/bin/env python
"""Aggregate read bandwidth over several throttled mounts: 1, 2, 4 mounts x 1, 2, 4 ranks, in one run.

    python benchmarks/mounts.py                         # 4 mounts at 100 MiB/s each, 1 GiB replicated
    python benchmarks/mounts.py --quick                 # 2 mounts, small data: a smoke run
    python benchmarks/mounts.py --save --markdown docs/mounts.md

Root only: it builds a ``dlstore testbed`` (loop-mounted ext4 images, each throttled with cgroup v1
``blkio.throttle.read_bps_device`` to the same bandwidth B), copies a dataset onto every mount
(replicated layout, as the Dell EMC Isilon reference architecture's 16 NFS mounts of one export),
and for each (mounts M, ranks R) starts R processes that each read their share of one epoch through
``dlstore.Dataset`` with that architecture's rank -> mount round robin; when R < M each rank reads
M / R mounts at once. The page cache is evicted before each run and reads are O_DIRECT, so every
byte comes through a throttled device.

Aggregate bandwidth is the payload bytes of all ranks over the time from the common start (a
barrier) to the last rank's end. The ideal is ``min(M, R x mounts per rank) x B``: one mount reads
at most B however many ranks share it.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
from benchmarks import _harness  # noqa: E402

import dlstore  # noqa: E402
from dlstore.bench import report, sysinfo  # noqa: E402
from dlstore.sources.indexing import ensure_index  # noqa: E402

MiB = 1 << 20
COLUMNS = [report.Column("mounts", "mounts"), report.Column("ranks", "ranks"),
           report.Column("per_rank", "mounts/rank"), report.Column("mb_per_s", "MB/s", "{:.1f}"),
           report.Column("ideal_mb_per_s", "ideal MB/s", "{:.1f}"), report.Column("ratio", "of ideal", "{:.2f}"),
           report.Column("seconds", "s", "{:.2f}"), report.Column("failovers", "failovers")]


HOW_TO_READ = """
## How to read it

- **One mount reads about B however many ranks share it.** The blkio rule is per device and every
  process sits in the root blkio cgroup (docs/testbed.md), so the ranks share the mount's bandwidth.
- **Ranks on their own mounts add up**: the `round_robin_mpi.py` assignment of the Dell EMC Isilon F800
  reference architecture, rank r on mount r % M.
- **A rank can read several mounts at once** (`mounts_per_rank`). `dlstore.Dataset` cuts each shard into
  blocks (`block_size`, 8 MiB) and reads block *j* of shard *s* through one of the rank's mounts chosen
  by (*s* + *j*): the same mount every epoch, so its page cache stays useful. Under the block shuffle
  the blocks come in a seeded order, which mixes the mounts; unshuffled, consecutive blocks take the
  mounts in turns. With k mounts the reader keeps 2k threads and 4k chunks in flight: chunks are
  consumed in order, so a mount running late would otherwise leave the others idle.
- **What is left of the ideal is start-up**: after the common barrier each rank opens its files and
  fills its first reads.
"""


def write_dataset(directory: str, total_bytes: int, shards: int, record_bytes: int = 115_000) -> int:
    """Shards of random records (their content does not matter here), with their indexes."""
    rng = np.random.default_rng(0)
    per_shard = max(1, total_bytes // shards // record_bytes)
    blob = rng.bytes(record_bytes * 2)
    for s in range(shards):
        path = os.path.join(directory, f"train-{s:04d}.tfrecord")
        with dlstore.TFRecordWriter(path) as w:
            for i in range(per_shard):
                start = (i * 7919) % record_bytes
                w.write(blob[start:start + record_bytes])
        ensure_index(path)
    return per_shard * shards * record_bytes


def _rank_main(args):
    mounts, rank, size, per_rank, shuffle, barrier, queue = args
    from dlstore.sources.dataset import Dataset
    from dlstore.placement.world import World

    ds = Dataset("*.tfrecord", mounts=mounts, world=World(rank=rank, size=size), mounts_per_rank=per_rank,
                 io="direct", remainder="uneven", shuffle=shuffle, seed=0)
    barrier.wait()
    start = time.time()
    nbytes = 0
    for batch in ds.batches():
        nbytes += batch.nbytes
    end = time.time()
    stats = ds.stats()
    queue.put({"rank": rank, "bytes": nbytes, "start": start, "end": end, "engine": stats["engine"],
               "mounts": stats["mounts"], "failovers": stats.get("failovers", 0)})


def run_config(tb, m: int, r: int, bps: int, shuffle: str) -> Dict:
    mounts = tb.mountpoints[:m]
    per_rank = max(1, m // r)
    tb.evict()
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(r), ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=((mounts, k, r, per_rank, shuffle, barrier, queue),))
             for k in range(r)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=900) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode:
            raise RuntimeError(f"a rank exited with {p.exitcode}")
    total = sum(x["bytes"] for x in results)
    seconds = max(x["end"] for x in results) - min(x["start"] for x in results)
    busy = len({mt for x in results for mt in x["mounts"]})
    ideal = min(m, busy) * bps / 1e6
    mb = total / seconds / 1e6
    return {"mounts": m, "ranks": r, "per_rank": per_rank, "mb_per_s": mb, "ideal_mb_per_s": ideal,
            "ratio": mb / ideal, "seconds": seconds, "bytes": total, "failovers": sum(x["failovers"] for x in results),
            "engine": results[0]["engine"], "rank_mounts": {x["rank"]: x["mounts"] for x in results}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mounts", type=int, default=4, help="mounts in the testbed (default 4)")
    p.add_argument("--mbps", type=float, default=100, help="read limit of each mount, MiB/s (default 100)")
    p.add_argument("--data-mb", type=int, default=1024, help="dataset size in MiB, copied to every mount")
    p.add_argument("--ranks", default="1,2,4", help="rank counts to run (default 1,2,4)")
    p.add_argument("--mount-counts", default=None, help="mount counts to run (default 1,2,4 up to --mounts)")
    p.add_argument("--dir", default=None, help="where to build the testbed (default: a temp dir in /var/tmp)")
    p.add_argument("--shuffle", default="block", choices=("none", "block", "buffer", "global"),
                   help="the Dataset's record shuffle (default: %(default)s, what training reads with)")
    p.add_argument("--quick", action="store_true", help="2 mounts, 64 MiB, ranks 1,2: a smoke run")
    _harness.add_output_arguments(p, "mounts")
    p.add_argument("--markdown", default=None, help="write the table to this markdown file")
    args = p.parse_args(argv)
    json_path = _harness.output_path(p, args, "mounts")
    from dlstore.tools.testbed import create_testbed, destroy_testbed, root_refusal

    why = root_refusal()
    if why:
        print(f"benchmarks/mounts.py needs the testbed: {why}", file=sys.stderr)
        return 2
    if args.quick:
        args.mounts, args.data_mb, args.ranks = 2, 64, "1,2"
    ranks = [int(x) for x in args.ranks.split(",")]
    counts = sorted({c for c in (1, 2, 4, args.mounts) if c <= args.mounts})
    if args.mount_counts:
        counts = [int(x) for x in args.mount_counts.split(",")]
    bps = int(args.mbps * MiB)
    base = args.dir or tempfile.mkdtemp(prefix="dlstore-mounts-", dir="/var/tmp")
    src = os.path.join(base, "src")
    os.makedirs(src, exist_ok=True)
    total = write_dataset(src, args.data_mb * MiB, shards=16)
    info = sysinfo.collect([os.path.join(src, n) for n in sorted(os.listdir(src))], "direct",
                           "O_DIRECT: every byte through a throttled device")
    print(sysinfo.format_header(info), flush=True)
    print(f"dataset: {total / 1e6:.0f} MB in 16 shards, replicated on {args.mounts} mounts at "
          f"{args.mbps:g} MiB/s each", flush=True)
    rows: List[Dict] = []
    try:
        tb = create_testbed(os.path.join(base, "tb"), args.mounts, data=src, layout="replicated", throttle_bps=bps,
                            progress=sys.stderr.isatty())
        measured = tb.measure_read_bps(seconds=1.0)
        print("per-mount direct read with dd-like probe: " + ", ".join(f"{x / 1e6:.0f}" for x in measured) + " MB/s")
        for m in counts:
            for r in ranks:
                row = run_config(tb, m, r, bps, args.shuffle)
                rows.append(row)
                print(f"  {m} mounts x {r} ranks ({row['per_rank']} per rank): {row['mb_per_s']:.1f} MB/s, "
                      f"{row['ratio']:.2f} of ideal {row['ideal_mb_per_s']:.1f}", flush=True)
    finally:
        destroy_testbed(os.path.join(base, "tb"))
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    print()
    print(report.text_table(rows, COLUMNS, title=f"aggregate read bandwidth, mounts throttled to B = "
                                                   f"{bps / 1e6:.1f} MB/s each (O_DIRECT, cold)"))
    checks = []
    for row in rows:
        if row["mounts"] == args.mounts and row["ranks"] in (args.mounts, args.mounts // 2):
            checks.append((f"{row['mounts']} mounts x {row['ranks']} ranks >= 0.95 x {row['mounts']}B",
                           row["ratio"] >= 0.95, row["ratio"]))
        if row["mounts"] == 1:
            checks.append((f"1 mount x {row['ranks']} ranks about B (0.8..1.1)", 0.8 <= row["ratio"] <= 1.1,
                           row["ratio"]))
    for text, ok, value in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {text}: {value:.2f}")
    out = {"sysinfo": info, "bandwidth_per_mount_bytes": bps, "data_bytes": total, "shuffle": args.shuffle,
           "rows": rows, "probe_bps": measured,
           "checks": [{"check": t, "pass": ok, "value": v} for t, ok, v in checks]}
    report.write_json(json_path, out)
    print(f"wrote {json_path}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            command = " ".join(["python", "benchmarks/mounts.py"] + list(sys.argv[1:] if argv is None else argv))
            f.write("# Aggregate bandwidth over throttled mounts\n\n")
            f.write(f"Written by `{command}` (root; the JSON is in `{os.path.relpath(json_path, ROOT)}`): "
                    f"{args.mounts} loop-mounted ext4 mounts, each throttled to B = {bps / 1e6:.1f} MB/s with "
                    f"cgroup v1 blkio, a {total / 1e6:.0f} MB dataset replicated on each, O_DIRECT reads, page "
                    f"cache evicted before each run, every rank reading a `dlstore.Dataset` with shuffle "
                    f"`{args.shuffle}`.\n\n")
            f.write(report.markdown_table(rows, COLUMNS))
            f.write("\n\n" + "\n".join(f"- {'PASS' if ok else 'FAIL'} {t}: {v:.2f}" for t, ok, v in checks) + "\n")
            f.write(HOW_TO_READ)
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
