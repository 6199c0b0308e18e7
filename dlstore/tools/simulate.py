"""``dlstore plan --simulate``: plans one rank of a dataset that exists only as counts (no files), and
says what it costs, so that a job at any scale can be sized before its data exists.

The rank is planned by the planner :class:`dlstore.Dataset` reads (:func:`dlstore.placement.rank.plan_rank`
and :func:`dlstore.sources.reads.reader_plan`), over a simulated manifest: every record ``--record-bytes``
long, blocks and the shuffle buffer sized from that as a dataset of that mean record size would have
them, on mounts that each hold every shard.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from dlstore import settings
from dlstore.placement.mounts import assign_rank_mounts
from dlstore.placement.rank import plan_rank
from dlstore.placement.sharding import EpochPlan, shuffle_sizes
from dlstore.sources.reads import merged_reads, read_runs, reader_plan

__all__ = ["parse_simulate", "parse_throughput", "SimulatedManifest", "simulate", "run_simulate"]


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


def parse_throughput(text: str) -> List[float]:
    """``"1.5,2,0"`` -> one throughput figure per mount (the weighted policy checks their count and range)."""
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas (one per mount), "
                                         f"not {text!r}") from None


class SimulatedManifest:
    """A manifest of ``shards`` shards of ``records_per_shard`` records of ``record_bytes`` each, as numbers."""

    def __init__(self, shards: int, records_per_shard: int, record_bytes: int):
        self.counts = np.full(shards, records_per_shard, dtype=np.int64)
        self.record_bytes = int(record_bytes)

    def frames(self, shards: np.ndarray, records: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """``(offset, size)`` of each record's frame."""
        records = np.asarray(records, dtype=np.int64)
        return records * self.record_bytes, np.full(len(records), self.record_bytes, dtype=np.int64)

    @staticmethod
    def paths(shards: np.ndarray, mounts: np.ndarray) -> List[str]:
        return [f"mount{m}/shard-{s:06d}" for s, m in zip(shards.tolist(), mounts.tolist())]


def simulate(shards: int, records_per_shard: int, world_size: int, rank: int, *, mounts: int = 1,
             record_bytes: int = 110_000, mounts_per_rank: int = 1, policy: str = "rank",
             throughput: Optional[Sequence[float]] = None, local_rank: Optional[int] = None, num_workers: int = 1,
             list_reads: bool = False, **order: Any) -> Dict[str, Any]:
    """Plans rank ``rank`` (each of its workers) and returns what it reads and what planning cost
    (``records``, ``pieces`` (reads), ``mounts``, ``records_per_mount``, ``seconds``, ``max_rss_mb``; with
    ``list_reads``, ``reads``: per worker every read's path, byte range, records and mount)."""
    start = time.perf_counter()
    block_records, block_window, buffer_size = shuffle_sizes(
        record_bytes, settings.get("block_size"), settings.get("shuffle_window"), settings.get("shuffle_buffer"))
    order.setdefault("buffer_size", buffer_size)
    manifest = SimulatedManifest(shards, records_per_shard, record_bytes)
    rank_mounts = assign_rank_mounts(mounts, rank, rank if local_rank is None else local_rank, policy,
                                     mounts_per_rank, throughput)
    epoch = EpochPlan(manifest.counts, world_size * num_workers, block_records=block_records,
                      block_window=block_window, **order)
    reads, pieces, per_mount = [], 0, np.zeros(mounts, dtype=np.int64)
    for worker in range(num_workers):
        planned = plan_rank(epoch, rank * num_workers + worker, rank_mounts)
        per_mount += np.bincount(planned.mounts, minlength=mounts)
        plan = reader_plan(planned, manifest.frames, manifest.paths, mounts=True)
        pieces += len(read_runs(plan)[0])
        if list_reads:
            reads.append(merged_reads(plan, [f"mount{m}" for m in range(mounts)]))
    seconds = time.perf_counter() - start
    return {"shards": shards, "records_per_shard": records_per_shard, "total_records": shards * records_per_shard,
            "world_size": world_size, "rank": rank, "mounts_count": mounts, "mounts": rank_mounts,
            "records": int(per_mount.sum()), "pieces": pieces,
            "records_per_mount": {str(m): int(n) for m, n in enumerate(per_mount.tolist()) if n},
            "block_records": block_records, "buffer_size": order["buffer_size"],
            "options": {k: v for k, v in order.items() if k != "buffer_size"},
            "seconds": seconds, "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            **({"reads": reads} if list_reads else {})}


def run_simulate(args: argparse.Namespace) -> int:
    """What ``dlstore plan --simulate`` prints (and writes with ``--json F``)."""
    shards, per_shard = args.simulate
    rank = args.rank or 0
    if not 0 <= rank < args.world_size:
        print(f"dlstore plan: --rank {rank} is outside 0..{args.world_size - 1}", file=sys.stderr)
        return 2
    out = simulate(shards, per_shard, args.world_size, rank, mounts=args.mounts_count,
                   record_bytes=args.record_bytes, mounts_per_rank=args.mounts_per_rank, policy=args.policy,
                   throughput=args.throughput, num_workers=args.workers, seed=args.seed, epoch=args.epoch,
                   shuffle_shards=not args.no_shard_shuffle, shuffle=args.shuffle,
                   remainder=args.remainder or "pad", batch_size=args.batch_size, list_reads=args.list_reads)
    if args.json == "-":
        print(json.dumps(out, indent=1))
        return 0
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    per_mount = ", ".join(f"mount {m}: {n:,}" for m, n in out["records_per_mount"].items())
    print(f"simulated: {shards:,} shards x {per_shard:,} records ({out['total_records']:,}) on "
          f"{args.mounts_count} replicated mount(s), {args.world_size:,} ranks x {args.workers} worker(s)")
    print(f"rank {rank}: mounts {out['mounts']}; {out['records']:,} records in {out['pieces']:,} reads "
          f"({per_mount}); shuffle {args.shuffle}, blocks of {out['block_records']:,} records, buffer "
          f"{out['buffer_size']:,} records (at {args.record_bytes:,} B per record)")
    print(f"planned in {out['seconds']:.3f} s, max RSS {out['max_rss_mb']:.0f} MB"
          + (f"; written to {args.json}" if args.json else ""))
    return 0
