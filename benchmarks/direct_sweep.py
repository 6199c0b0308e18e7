"""Why the direct engine uses a thread pool: its cold-cache throughput beside fio's psync, libaio and
io_uring engines at several queue depths, on the same files, in one run.

    python benchmarks/direct_sweep.py [--data GLOB] [--rounds 2] [--save]

The JSON goes to benchmarks/results/direct_sweep-latest.json (git ignores it); --save writes the
committed benchmarks/results/direct_sweep.json.

Needs root (drops the page cache) and fio.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dlstore  # noqa: E402
from benchmarks import _harness  # noqa: E402
from dlstore.io.pagecache import drop_page_cache  # noqa: E402

CONFIGS = [dict(depth=4, io_threads=2, chunk_size=8 << 20), dict(depth=8, io_threads=4, chunk_size=8 << 20),
           dict(depth=4, io_threads=4, chunk_size=4 << 20), dict(depth=2, io_threads=2, chunk_size=16 << 20)]
FIO = [("psync", 1, "1M"), ("libaio", 16, "1M"), ("io_uring", 4, "8M"), ("io_uring", 16, "1M")]


def run_dlstore(paths, total, cfg) -> float:
    drop_page_cache()
    reader = dlstore.open_records(paths, io="direct", **cfg)
    t = time.perf_counter()
    reader.count()
    return total / (time.perf_counter() - t) / 1e9


def fio_rate(paths, engine, depth, bs) -> float:
    """One fio job reading the files in turn (dlstore.bench.fio: huge-page buffers, as dlstore's)."""
    return _harness.cold_fio_rate(paths, jobs=1, bs=bs, ioengine=engine, iodepth=depth)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="files to read (default: the cached 'small' synthetic ImageNet-like set)")
    p.add_argument("--rounds", type=int, default=2)
    _harness.add_output_arguments(p, "direct_sweep")
    args, json_path = _harness.parse(p, "direct_sweep")
    found = _harness.cold_set_or_refusal("direct_sweep", args.data, "small")  # --data or the cached set
    if found is None:
        return 2
    paths = found[0]
    total = sum(os.path.getsize(x) for x in paths)
    results = {}
    for _ in range(args.rounds):  # interleaved, so drift on a shared disk hits every row alike
        for engine, depth, bs in FIO:
            results.setdefault(f"fio {engine} qd{depth} bs{bs}", []).append(fio_rate(paths, engine, depth, bs))
        for cfg in CONFIGS:
            name = f"dlstore direct depth{cfg['depth']} threads{cfg['io_threads']} chunk{cfg['chunk_size'] >> 20}M"
            results.setdefault(name, []).append(run_dlstore(paths, total, cfg))
    ceiling = max(statistics.median(v) for k, v in results.items() if k.startswith("fio"))
    print(f"{total / 1e9:.2f} GB in {len(paths)} files, cold cache, median of {args.rounds}")
    print(f"{'reader':52s} {'GB/s':>6s} {'vs best fio':>11s}")
    for name, v in results.items():
        print(f"{name:52s} {statistics.median(v):6.2f} {statistics.median(v) / ceiling:11.2f}")
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as f:
        json.dump({"bytes": total, "files": len(paths), "gb_per_s": results}, f, indent=1)
    print(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
