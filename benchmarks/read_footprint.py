#!/usr/bin/env python
"""Does a cold read's rate depend on how much memory the reads land in? The same O_DIRECT reads (each
thread its share of the files front to back, 1 MiB at a time) into one ring of buffers, of several
sizes, beside fio's best sequential job and cold ``dlstore.Dataset`` epochs at several batch sizes (a
batch is one buffer, so the batch size sets how much memory a Dataset's reads land in), in rotating
rounds.

    python benchmarks/read_footprint.py                 # the cached ~1 GB default set, 3 rounds
    python benchmarks/read_footprint.py --save          # benchmarks/results/read_footprint.json
    python benchmarks/read_footprint.py --quick         # the tiny set, 2 sizes, 1 round: a smoke test

Why: on a VM whose disk is a file of the host, each read is the host copying bytes into guest memory,
and a copy into memory the CPU caches still hold is faster than one into memory it does not. fio's
fastest jobs reuse a few MiB of buffers; a reader that hands out batches cannot. This script measures
that effect with nothing of dlstore's in the way (plain ``os.preadv`` into ``mmap`` memory with
transparent huge pages, as dlstore's and fio's buffers are), so the gap between a Dataset and fio can
be split into what the memory costs and what the reader does. Needs root (drops the page cache) and fio.
"""
from __future__ import annotations

import argparse
import itertools
import mmap
import os
import sys
import threading
import time
from typing import Dict, List, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _harness  # noqa: E402
from dlstore.bench import report  # noqa: E402

MiB = 1 << 20
HUGE = 2 * MiB
READ = 1 * MiB  # bytes per read, as fio's sequential jobs and dlstore's io_uring pieces
FOOTPRINTS_MIB = (4, 8, 16, 32, 64, 128, 256)  # total ring bytes over all threads
# (batch size, chunk size setting or None): a batch is one buffer, so the batch size sets how much memory
# a Dataset's reads land in; 2 MiB chunks keep a batch-16 epoch's reads in ~8 MiB, as fio's best job's.
DATASETS = ((16, "2M"), (16, None), (64, None), (256, None))
STAGED = (8, 128)  # MiB: reads land in the first, then are copied into the second
FIO_JOB = {"jobs": 1, "bs": "1M", "ioengine": "io_uring", "iodepth": 4}  # fio's best here (docs/engines.md)
FIO_BUFFERS = FIO_JOB["jobs"] * FIO_JOB["iodepth"] * READ  # fio's buffers: a block per read in flight


class Ring:
    """``nbytes`` of anonymous memory on a 2 MiB boundary, asking for transparent huge pages (as dlstore's
    buffers do), written once so that no first-touch fault lands inside a timed read."""

    def __init__(self, nbytes: int):
        self.nbytes = max(READ, nbytes // READ * READ)
        # Private: anonymous shared memory is shmem, which gets no transparent huge pages by default.
        self.map = mmap.mmap(-1, self.nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        import ctypes

        self.start = -ctypes.addressof(ctypes.c_char.from_buffer(self.map)) % HUGE  # a page multiple
        if hasattr(mmap, "MADV_HUGEPAGE"):
            self.map.madvise(mmap.MADV_HUGEPAGE, self.start, self.nbytes)
        self.view = memoryview(self.map)[self.start:self.start + self.nbytes]
        one = b"\1" * READ
        for at in range(0, self.nbytes, READ):
            self.view[at:at + READ] = one

    def close(self) -> None:
        self.view.release()
        self.map.close()


def read_into_ring(paths: Sequence[str], threads: int, footprint: int, copy_into: int = 0) -> float:
    """GB/s of ``threads`` threads reading ``paths`` (file i by thread i % threads) front to back with
    O_DIRECT, ``READ`` bytes a call, into the slots of one ring of ``footprint`` bytes taken in turn;
    with ``copy_into``, each read is then copied into the next slot of a second ring of that many bytes
    (a reader that stages its reads in a small ring and hands out copies)."""
    import numpy as np

    ring = Ring(footprint)
    slots = ring.nbytes // READ
    turn = itertools.count()  # next(itertools.count()) is atomic under the GIL
    dst = Ring(copy_into) if copy_into else None
    dst_turn = itertools.count()
    src_array = np.frombuffer(ring.view, np.uint8)
    dst_array = np.frombuffer(dst.view, np.uint8) if dst else None
    errors: List[BaseException] = []

    def work(t: int) -> None:
        try:
            for path in paths[t::threads]:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
                try:
                    offset = 0
                    while True:
                        at = next(turn) % slots * READ
                        n = os.preadv(fd, [ring.view[at:at + READ]], offset)
                        if dst_array is not None:  # numpy copies without the GIL
                            to = next(dst_turn) % (dst.nbytes // READ) * READ
                            np.copyto(dst_array[to:to + n], src_array[at:at + n])
                        offset += n
                        if n < READ:
                            break
                finally:
                    os.close(fd)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            errors.append(e)

    from dlstore.io.pagecache import drop_page_cache

    drop_page_cache()
    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - t0
    src_array = dst_array = None  # the views go before the maps close
    ring.close()
    if dst:
        dst.close()
    if errors:
        raise errors[0]
    return sum(os.path.getsize(p) for p in paths) / seconds / 1e9


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="TFRecord files (default: the cached generated ~1 GB ImageNet-like set)")
    p.add_argument("--threads", type=int, default=4,
                   help="threads of the plain rows, each with one read at a time (default: %(default)s, fio's depth)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="the tiny set, 2 sizes, 1 round: a smoke test")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=False,
                   help="the Dataset rows check CRCs (default off: the plain reads check nothing either)")
    _harness.add_output_arguments(p, "read_footprint")
    args, json_path = _harness.parse(p, "read_footprint")
    found = _harness.cold_set_or_refusal("read_footprint", args.data, "tiny" if args.quick else "default")
    if found is None:
        return 2
    paths, data = found
    footprints, datasets = FOOTPRINTS_MIB, DATASETS
    if args.quick:
        footprints, datasets, args.rounds = (8, 64), DATASETS[:1], 1
    load_before = os.getloadavg()[0]
    rows: Dict[str, Dict] = {}
    jobs = ([("fio", None)] + [("plain", f) for f in footprints] + [("staged", STAGED)] +
            [("dataset", d) for d in datasets])
    for r in range(args.rounds):  # every configuration once a round, starting one further each round
        for kind, what in jobs[r % len(jobs):] + jobs[:r % len(jobs)]:
            if kind == "fio":
                name = (f"fio {FIO_JOB['ioengine']} read bs={FIO_JOB['bs']} qd{FIO_JOB['iodepth']} x {FIO_JOB['jobs']} "
                        f"job (huge-page buffers, {FIO_BUFFERS // MiB} MiB)")
                row = rows.setdefault(name, {"kind": kind, "footprint_bytes": FIO_BUFFERS, "runs": []})
                row["runs"].append(_harness.cold_fio_rate(paths, **FIO_JOB))
            elif kind == "plain":
                name = f"plain O_DIRECT 1 MiB reads, {args.threads} threads, into {what} MiB"
                row = rows.setdefault(name, {"kind": kind, "footprint_bytes": what * MiB, "runs": []})
                row["runs"].append(read_into_ring(paths, args.threads, what * MiB))
            elif kind == "staged":
                name = f"plain reads into {what[0]} MiB, each copied into {what[1]} MiB"
                row = rows.setdefault(name, {"kind": kind, "footprint_bytes": what[0] * MiB,
                                             "copied_into_bytes": what[1] * MiB, "runs": []})
                row["runs"].append(read_into_ring(paths, args.threads, what[0] * MiB, what[1] * MiB))
            else:
                batch, chunk = what
                name = f"Dataset io_uring none, batch {batch}" + (f", chunk_size {chunk}" if chunk else "")
                row = rows.setdefault(name, {"kind": kind, "batch_size": batch, "chunk_size": chunk, "runs": [],
                                             "peak_held_bytes": []})
                got = _harness.cold_dataset_row(data, "io_uring", "none", verify=args.verify, batch_size=batch,
                                                settings={"DLSTORE_CHUNK_SIZE": chunk} if chunk else None)
                row["runs"].append(got.get("gb_per_s"))
                row["peak_held_bytes"].append(got.get("peak_held_bytes"))
                if "error" in got:
                    row["error"] = got["error"]
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    for row in rows.values():
        row["gb_per_s"] = _harness.median(row["runs"])
    fio = next(v["gb_per_s"] for v in rows.values() if v["kind"] == "fio") or 0.0
    total = sum(os.path.getsize(x) for x in paths)
    print(f"{total / 1e6:,.0f} MB in {len(paths)} files, cold; medians of {args.rounds} rounds; "
          f"load before {load_before:.1f}, after {os.getloadavg()[0]:.1f}")
    print(f"{'reader':66s} {'GB/s':>6s} {'vs fio':>7s}  runs")
    for name, row in rows.items():
        rate = row["gb_per_s"] or 0.0
        runs = " ".join(f"{x:.2f}" for x in row["runs"] if x is not None)
        print(f"{name:66s} {rate:6.2f} {rate / fio if fio else 0:7.2f}  {runs}")
    doc = {"benchmark": "read_footprint", "when": time.strftime("%Y-%m-%d %H:%M:%S"), "command": sys.argv,
           "threads": args.threads, "read_bytes": READ, "verify": args.verify, "rounds": args.rounds,
           "bytes": total, "files": len(paths), "load_before": load_before, "load_after": os.getloadavg()[0],
           "fio_gb_per_s": fio, "fio_job": FIO_JOB, "rows": rows}
    print(f"wrote {report.write_json(json_path, doc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
