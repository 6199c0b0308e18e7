"""What the ``direct_cache`` setting costs and gives: ``Dataset`` epochs with ``io="direct"`` and
``io="io_uring"``, the setting on and off, from a dropped page cache (cold: every read asks the kernel
first, and the answer is no) and from a warm one (on: the reads come from the cache), side by side in
one run, rounds interleaved.

    python benchmarks/direct_cache.py [--data GLOB] [--rounds 3] [--shuffles none,global] [--save]
    python benchmarks/direct_cache.py --quick     # the tiny set, 1 round: a smoke test

The JSON goes to benchmarks/results/direct_cache-latest.json (git ignores it); --save writes the
committed benchmarks/results/direct_cache.json. Needs root (drops the page cache).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dlstore  # noqa: E402
from benchmarks import _harness  # noqa: E402
from dlstore.bench import report  # noqa: E402
from dlstore.bench.storage import dataset_paths  # noqa: E402
from dlstore.io import pagecache  # noqa: E402


def one_epoch(paths, engine: str, shuffle: str, cache: str, direct_cache: bool) -> dict:
    os.environ["DLSTORE_DIRECT_CACHE"] = "1" if direct_cache else "0"
    ds = dlstore.Dataset(paths, io=engine, shuffle=shuffle, batch_size=256, seed=1)
    if cache == "cold":
        pagecache.drop_page_cache()
    else:
        pagecache.make_warm(paths)
    t = time.perf_counter()
    for _ in ds.batches():
        pass
    seconds = time.perf_counter() - t
    stats = ds.stats()
    if stats["engine"] != engine:
        raise SystemExit(f"asked for {engine}, {stats['engine']} ran: {stats['engine_reason']}")
    return {"gb_per_s": stats["payload_bytes"] / seconds / 1e9,
            "from_cache": stats["cache_bytes_read"] / max(stats["file_bytes_read"], 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="files to read (default: the cached 'small' synthetic ImageNet-like set)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shuffles", default="none,global")
    p.add_argument("--quick", action="store_true", help="the tiny set, 1 round: a smoke test")
    _harness.add_output_arguments(p, "direct_cache")
    args, json_path = _harness.parse(p, "direct_cache")
    why = pagecache.drop_page_cache_refusal()
    if why:
        print(f"direct_cache needs root to drop the page cache: {why}", file=sys.stderr)
        return 2
    paths = dataset_paths(args.data, "tiny" if args.quick else "small")
    if args.quick:
        args.rounds = 1
    shuffles = args.shuffles.split(",")
    rows: dict = {}
    loads = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for cache in ("cold", "warm"):
            for shuffle in shuffles:
                for engine in ("direct", "io_uring"):
                    for on in (True, False):
                        r = one_epoch(paths, engine, shuffle, cache, on)
                        key = f"{cache} {shuffle} {engine} direct_cache={'on' if on else 'off'}"
                        rows.setdefault(key, []).append(r)
        loads.append(os.getloadavg()[0])
    total = sum(os.path.getsize(x) for x in paths)
    print(f"{total / 1e9:.2f} GB in {len(paths)} files; median of {args.rounds} rounds; "
          f"1-minute load {min(loads):.2f}-{max(loads):.2f}")
    print(f"{'epoch':48s} {'GB/s':>6s} {'on/off':>7s} {'from cache':>10s}")
    out = {}
    for key, runs in rows.items():
        rate = statistics.median(r["gb_per_s"] for r in runs)
        off = key.replace("=on", "=off")
        ratio = rate / statistics.median(r["gb_per_s"] for r in rows[off]) if key.endswith("on") else None
        share = statistics.median(r["from_cache"] for r in runs)
        out[key] = {"gb_per_s": [r["gb_per_s"] for r in runs], "median": rate, "on_vs_off": ratio,
                    "from_cache": share}
        print(f"{key:48s} {rate:6.2f} {'' if ratio is None else f'{ratio:.2f}x':>7s} {100 * share:9.0f}%")
    report.write_json(json_path, {"bytes": total, "files": len(paths), "rounds": args.rounds, "load": loads,
                                  "cores": os.cpu_count(), "rows": out})
    print(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
