"""``dlstore plan --simulate``: plans one rank of a dataset that exists only as counts (no files), and
says what it costs, so that a job at any scale can be sized before its data exists.

The rank is planned as :class:`dlstore.Dataset` plans it (:func:`dlstore.placement.rank.plan_rank`),
with blocks and the shuffle buffer sized from ``--record-bytes`` as a dataset of that mean record
size would have them.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from typing import Any, Dict, Tuple

from dlstore import settings
from dlstore.placement.rank import plan_rank
from dlstore.placement.sharding import shuffle_sizes

__all__ = ["parse_simulate", "simulate", "run_simulate"]


def parse_simulate(text: str) -> Tuple[int, int]:
    """``"SHARDS:RECORDS_PER_SHARD"`` -> ``(shards, records per shard)``, both at least 1."""
    try:
        shards, records = (int(x.replace(",", "").replace("_", "")) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--simulate takes SHARDS:RECORDS_PER_SHARD, e.g. 153600:1250, "
                                         f"not {text!r}") from None
    if shards < 1 or records < 1:
        raise argparse.ArgumentTypeError(f"--simulate needs at least 1 shard and 1 record per shard, not {text!r}")
    return shards, records


def simulate(shards: int, records_per_shard: int, world_size: int, rank: int, *, mounts: int = 1,
             record_bytes: int = 110_000, **options: Any) -> Dict[str, Any]:
    """Plans rank ``rank`` and returns what it reads and what planning cost (``records``, ``pieces``,
    ``mounts``, ``records_per_mount``, ``seconds``, ``max_rss_mb``)."""
    import numpy as np


    start = time.perf_counter()
    block_records, block_window, buffer_size = shuffle_sizes(
        record_bytes, settings.get("block_size"), settings.get("shuffle_window"), settings.get("shuffle_buffer"))
    options.setdefault("buffer_size", buffer_size)
    counts = np.full(shards, records_per_shard, dtype=np.int64)
    plan = plan_rank(counts, world_size, rank, num_mounts=mounts, block_records=block_records,
                     block_window=block_window, **options)
    records, pieces, per_mount = plan.records, plan.pieces, plan.records_per_mount()
    seconds = time.perf_counter() - start
    return {"shards": shards, "records_per_shard": records_per_shard, "total_records": shards * records_per_shard,
            "world_size": world_size, "rank": rank, "mounts_count": mounts, "mounts": plan.mounts,
            "records": records, "pieces": pieces, "records_per_mount": {str(k): v for k, v in per_mount.items()},
            "block_records": block_records, "buffer_size": options["buffer_size"],
            "options": {k: v for k, v in options.items() if k != "buffer_size"},
            "seconds": seconds, "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_simulate(args: argparse.Namespace) -> int:
    """What ``dlstore plan --simulate`` prints (and writes with ``--json F``)."""
    shards, per_shard = args.simulate
    if not 0 <= args.rank < args.world_size:
        print(f"dlstore plan: --rank {args.rank} is outside 0..{args.world_size - 1}", file=sys.stderr)
        return 2
    throughput = [float(x) for x in args.throughput.split(",")] if args.throughput else None
    out = simulate(shards, per_shard, args.world_size, args.rank, mounts=args.mounts_count,
                   record_bytes=args.record_bytes, mounts_per_rank=args.mounts_per_rank, policy=args.policy,
                   throughput=throughput, num_workers=args.workers, seed=args.seed, epoch=args.epoch,
                   shuffle_shards=not args.no_shard_shuffle, shuffle=args.shuffle,
                   remainder=args.remainder or "pad", batch_size=args.batch_size)
    if args.json == "-":
        print(json.dumps(out, indent=1))
        return 0
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    per_mount = ", ".join(f"mount {m}: {n:,}" for m, n in out["records_per_mount"].items())
    print(f"simulated: {shards:,} shards x {per_shard:,} records ({out['total_records']:,}) on "
          f"{args.mounts_count} replicated mount(s), {args.world_size:,} ranks x {args.workers} worker(s)")
    print(f"rank {args.rank}: mounts {out['mounts']}; {out['records']:,} records in {out['pieces']:,} pieces "
          f"({per_mount}); shuffle {args.shuffle}, blocks of {out['block_records']:,} records, buffer "
          f"{out['buffer_size']:,} records (at {args.record_bytes:,} B per record)")
    print(f"planned in {out['seconds']:.3f} s, max RSS {out['max_rss_mb']:.0f} MB"
          + (f"; written to {args.json}" if args.json else ""))
    return 0
