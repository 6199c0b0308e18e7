#!/usr/bin/env python
"""A cold epoch through ``dlstore.Dataset`` under each of several engine settings, beside fio's sequential
1 MiB reads at several depths and job counts, in rotating rounds: which settings bring an engine nearer the
disk.

    python benchmarks/engine_settings.py                      # io_uring, shuffle none, the cached ~1 GB default set
    python benchmarks/engine_settings.py --engine direct --shuffle block --rounds 3
    python benchmarks/engine_settings.py --save               # benchmarks/results/engine_settings.json
    python benchmarks/engine_settings.py --quick              # the tiny set, 2 settings, 2 fio jobs, 1 round

Each dlstore measurement is one ``benchmarks/shuffles.py`` run (a fresh interpreter: an untimed epoch,
the page cache dropped, one timed epoch, CRCs checked unless ``--no-verify``) with the settings given as
their environment variables (``DLSTORE_QUEUE_DEPTH`` has no keyword), so it reads exactly as a user's
``Dataset`` with those settings would. fio reads the same files cold with huge-page buffers
(:func:`dlstore.bench.fio.run_fio`). Every configuration runs once per round; figures are medians over
rounds, ratios against the best fio median. Needs root (drops the page cache) and fio.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _harness  # noqa: E402
from dlstore.bench import report  # noqa: E402

# Settings (environment variables) tried per engine; {} is the defaults.
CONFIGS: Dict[str, List[Dict[str, str]]] = {
    "io_uring": [{}, {"DLSTORE_QUEUE_DEPTH": "2"}, {"DLSTORE_QUEUE_DEPTH": "4"},
                 {"DLSTORE_IO_THREADS": "1", "DLSTORE_QUEUE_DEPTH": "4"}, {"DLSTORE_IO_THREADS": "1"},
                 {"DLSTORE_IO_THREADS": "4", "DLSTORE_DEPTH": "8"},
                 {"DLSTORE_IO_THREADS": "4", "DLSTORE_QUEUE_DEPTH": "1"},
                 {"DLSTORE_IO_THREADS": "1", "DLSTORE_QUEUE_DEPTH": "4", "DLSTORE_CHUNK_SIZE": "64M"},
                 {"DLSTORE_IO_THREADS": "1", "DLSTORE_QUEUE_DEPTH": "2", "DLSTORE_CHUNK_SIZE": "2M",
                  "DLSTORE_DEPTH": "2"}],
    "direct": [{}, {"DLSTORE_IO_THREADS": "4", "DLSTORE_DEPTH": "8"}, {"DLSTORE_IO_THREADS": "1"},
               {"DLSTORE_CHUNK_SIZE": "4M"}],
}
# fio io_uring sequential reads: (block size, depth, jobs). One job reads the files in turn; two jobs
# read every other file each, two streams at once.
FIO: List[Tuple[str, int, int]] = [("1M", 2, 2), ("1M", 4, 1), ("1M", 8, 1), ("1M", 16, 2), ("8M", 2, 1)]


def config_name(cfg: Dict[str, str]) -> str:
    return " ".join(f"{k[len('DLSTORE_'):].lower()}={v}" for k, v in cfg.items()) or "defaults"


def run_dlstore(data: str, engine: str, shuffle: str, verify: bool, cfg: Dict[str, str]) -> Dict:
    """One shuffles.py run with ``cfg`` in its environment: its row (GB/s, CPU s/GB, the engine's reason)."""
    row = _harness.cold_dataset_row(data, engine, shuffle, verify=verify, settings=cfg)
    if "error" in row:
        return row
    return {k: row.get(k) for k in ("gb_per_s", "cpu_s_per_gb", "engine_reason", "status")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="TFRecord files (default: the cached generated ~1 GB ImageNet-like set)")
    p.add_argument("--engine", choices=sorted(CONFIGS), default="io_uring")
    p.add_argument("--shuffle", default="none", help="the Dataset's shuffle (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="the tiny set, 2 settings, 2 fio jobs, 1 round: a smoke test")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                   help="check each record's CRCs, as a Dataset does by default (--no-verify: what they cost)")
    _harness.add_output_arguments(p, "engine_settings")
    args, json_path = _harness.parse(p, "engine_settings")
    found = _harness.cold_set_or_refusal("engine_settings", args.data, "tiny" if args.quick else "default")
    if found is None:
        return 2
    paths, data = found
    configs, fio_jobs = CONFIGS[args.engine], FIO
    if args.quick:
        configs, fio_jobs, args.rounds = configs[:2], FIO[:2], 1
    load_before = os.getloadavg()[0]
    rows: Dict[str, Dict] = {}
    for r in range(args.rounds):  # every configuration once a round, starting one further each round
        jobs = [("fio", f) for f in fio_jobs] + [("dlstore", c) for c in configs]
        jobs = jobs[r % len(jobs):] + jobs[:r % len(jobs)]
        for kind, what in jobs:
            if kind == "fio":
                bs, depth, n = what
                name = f"fio io_uring read bs={bs} qd{depth} x {n} job{'s' if n > 1 else ''}"
                rate = _harness.cold_fio_rate(paths, jobs=n, bs=bs, ioengine="io_uring", iodepth=depth)
                rows.setdefault(name, {"kind": "fio", "runs": []})["runs"].append(rate)
            else:
                name = f"dlstore {args.engine} {args.shuffle}: {config_name(what)}"
                got = run_dlstore(data, args.engine, args.shuffle, args.verify, what)
                row = rows.setdefault(name, {"kind": "dlstore", "settings": what, "runs": [], "cpu_s_per_gb": []})
                row["runs"].append(got.get("gb_per_s"))
                row["cpu_s_per_gb"].append(got.get("cpu_s_per_gb"))
                row["engine_reason"] = got.get("engine_reason") or got.get("error")
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    for row in rows.values():
        row["gb_per_s"] = _harness.median(row["runs"])
    best = max(v["gb_per_s"] or 0 for v in rows.values() if v["kind"] == "fio")
    total = sum(os.path.getsize(x) for x in paths)
    print(f"{total / 1e9:.2f} GB in {len(paths)} files, cold, CRC {'on' if args.verify else 'off'}, "
          f"medians of {args.rounds} rounds; load before {load_before:.1f}, after {os.getloadavg()[0]:.1f}")
    print(f"{'reader':64s} {'GB/s':>6s} {'vs best fio':>11s}  runs")
    for name, row in rows.items():
        rate = row["gb_per_s"] or 0
        runs = " ".join(f"{x:.2f}" for x in row["runs"] if x is not None)
        print(f"{name:64s} {rate:6.2f} {rate / best:11.2f}  {runs}")
    doc = {"benchmark": "engine_settings", "when": time.strftime("%Y-%m-%d %H:%M:%S"), "command": sys.argv,
           "engine": args.engine, "shuffle": args.shuffle, "verify": args.verify, "rounds": args.rounds,
           "bytes": total, "files": len(paths), "load_before": load_before, "load_after": os.getloadavg()[0],
           "best_fio_gb_per_s": best, "rows": rows}
    print(f"wrote {report.write_json(json_path, doc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
