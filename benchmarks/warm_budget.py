"""Where warm-cache time goes: the mmap engine with and without CRC checks, with one or two CRC
threads, beside the raw CRC-32C rate of this machine over memory, in one run.

    python benchmarks/warm_budget.py [--data GLOB] [--repeat 3] [--save]

The JSON goes to benchmarks/results/warm_budget-latest.json (git ignores it); --save writes the
committed benchmarks/results/warm_budget.json.

It explains the warm ceiling: with CRCs on, every byte is read once by the CRC (memory-bound, about
one core's memory bandwidth), and the two cores also run the read-ahead; the sum of the CPU seconds
per GB of those parts bounds what two cores can deliver.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import dlstore  # noqa: E402
from benchmarks import _harness  # noqa: E402
from dlstore.bench import sysinfo  # noqa: E402
from dlstore.bench.storage import dataset_paths  # noqa: E402
from dlstore import _C  # noqa: E402


def read_pass(paths, total, **kw):
    reader = dlstore.open_records(paths, io="mmap", **kw)
    c0, t0 = sysinfo.process_cpu_seconds(), time.perf_counter()
    for _ in reader.batches():
        pass
    seconds, cpu = time.perf_counter() - t0, sysinfo.process_cpu_seconds() - c0
    return total / seconds / 1e9, cpu / (total / 1e9)


def crc_rate(threads: int, size: int = 512 << 20) -> float:
    data = memoryview(np.random.default_rng(0).bytes(size))
    _C.crc32c(data)  # touch once: the pages exist before timing
    parts = [data[i * size // threads:(i + 1) * size // threads] for i in range(threads)]
    workers = [threading.Thread(target=lambda p=p: [_C.crc32c(p) for _ in range(4)]) for p in parts]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return 4 * size / (time.perf_counter() - t0) / 1e9


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="files to read (default: the cached 'default' synthetic ImageNet-like set)")
    p.add_argument("--repeat", type=int, default=3)
    _harness.add_output_arguments(p, "warm_budget")
    args, json_path = _harness.parse(p, "warm_budget")
    paths = dataset_paths(args.data, "default")  # --data (glob, dir, file) or the cached set
    total = sum(os.path.getsize(x) for x in paths)
    read_pass(paths, total)  # warm the page cache
    rows = {
        "mmap, CRC off (read-ahead and framing only)": dict(verify=False),
        "mmap, CRC on, consumer thread only": dict(verify_threads=0),
        "mmap, CRC on, consumer + 1 CRC thread (default)": dict(verify_threads=1),
    }
    results = {}
    for _ in range(args.repeat):  # interleaved rounds: drift hits every row alike
        for name, kw in rows.items():
            results.setdefault(name, []).append(read_pass(paths, total, **kw))
        for t in (1, 2):
            results.setdefault(f"raw CRC-32C over memory, {t} thread(s)", []).append((crc_rate(t), None))
    print(f"{total / 1e9:.2f} GB in {len(paths)} files, warm page cache, median of {args.repeat}")
    print(f"{'what':52s} {'GB/s':>6s} {'CPU s/GB':>9s}")
    out = {}
    for name, v in results.items():
        gbs = statistics.median(x[0] for x in v)
        cpus = [x[1] for x in v if x[1] is not None]
        cpu = statistics.median(cpus) if cpus else None
        out[name] = {"gb_per_s": gbs, "cpu_seconds_per_gb": cpu}
        print(f"{name:52s} {gbs:6.2f} {'' if cpu is None else f'{cpu:9.3f}'}")
    base = out["mmap, CRC off (read-ahead and framing only)"]["cpu_seconds_per_gb"]
    crc2 = out["raw CRC-32C over memory, 2 thread(s)"]["gb_per_s"]
    bound = 2 / (base + 2 / crc2)  # two cores' seconds over (pipeline + CRC) CPU seconds per GB
    print(f"two-core bound with CRC on: 2 / ({base:.3f} + 2/{crc2:.1f}) = {bound:.1f} GB/s")
    out["two_core_bound_gb_per_s"] = bound
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
