"""How long a rank of a large job takes to start, through ``Dataset``: the seeds' scale by default.

153,600 TFRecord shards of 1,250 records in one directory (192 M records): 1,024 small shards written
once, then ``dlstore expand --mode hardlink`` to 150 copies each, with their ``.idx`` files (307,200
names in the directory, as the Dell EMC Isilon study's ImageNet x150). Records are small (``--record-bytes``)
to save disk; the manifest has its full size (one offset per record).

Each start is a fresh process running ``dlstore.Dataset(DIR/train-*, world=World(rank=7, size=4096),
shuffle=S, batch_size=64)`` and its first batch (imports not counted), for ``block`` and ``global``:

- cold (page cache, dentries and inodes dropped as root; else the files evicted, and the page says
  so) and warm: time to the first batch (constructor + first batch), max RSS;
- the manifest's bytes read: its pages in the page cache after a cold start (``fincore``'s mincore);
- ``stat`` calls (``stat``, ``lstat``, ``fstat``, ``newfstatat``, ``statx``): in a separate cold run under
  ``strace -f``, those between the Dataset's construction and its first batch, and the process's total
  (imports included).

    python benchmarks/dataset_start.py --save --markdown docs/dataset_start.md

``--mounts N`` reads through ``Dataset("train-*", mounts=[...])`` over N directories holding the same
shards (``big`` and N - 1 hardlinked replicas beside it); ``--one-export`` gives the replicas' directories
``big``'s mtime, as N mounts of one export see one directory.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import _harness  # noqa: E402

RESULT = "START "
MARK = "/.dlstore-start-mark/"  # stat-ed (ENOENT) around the measured part, to find it in strace's log
CHILD = r"""
import json, os, resource, sys, time
import dlstore
from dlstore.placement.world import World
pattern, rank, size, shuffle, batch, mark, mounts = sys.argv[1:8]
mounts = json.loads(mounts) or None
try: os.stat(mark + "start")
except OSError: pass
t0 = time.perf_counter()
ds = dlstore.Dataset(pattern, mounts=mounts, world=World(rank=int(rank), size=int(size)), shuffle=shuffle,
                     batch_size=int(batch))
t1 = time.perf_counter()
first = next(iter(ds.batches()))
t2 = time.perf_counter()
try: os.stat(mark + "first-batch")
except OSError: pass
print("START " + json.dumps({"constructor_s": t1 - t0, "first_batch_s": t2 - t1, "start_s": t2 - t0,
      "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "notes": ds.index.notes,
      "engine": ds.engine, "records": len(ds), "batch": first.num_records, "shards": len(ds.shards)}))
"""
STATS = ("stat(", "lstat(", "fstat(", "newfstatat(", "statx(", "fstatat64(", "stat64(", "lstat64(", "fstat64(")


def make_data(directory: str, sources: int, copies: int, records: int, record_bytes: int) -> str:
    """``directory/big``: ``sources`` shards x ``copies`` hardlinked copies with their indexes (made once)."""
    import dlstore

    big = os.path.join(directory, "big")
    if os.path.isdir(big) and len(os.listdir(big)) >= sources * copies:
        return big
    src = os.path.join(directory, "src")
    os.makedirs(src, exist_ok=True)
    payload = b"r" * record_bytes
    for s in range(sources):
        with dlstore.TFRecordWriter(os.path.join(src, f"train-{s:05d}-of-{sources:05d}")) as w:
            for _ in range(records):
                w.write(payload)
    subprocess.run([sys.executable, "-m", "dlstore", "expand", src, "--copies", str(copies), "--out", big,
                    "--mode", "hardlink", "--index", "--quiet"], check=True, env=_env())
    return big


def make_mounts(big: str, count: int, one_export: bool = False) -> List[str]:
    """``count`` mount directories holding the same shards: ``big`` and ``count - 1`` hardlinked replicas of
    it beside it (``mnt1``...; every name, the manifest and indexes too). ``one_export``: each replica's
    directory gets ``big``'s mtime, as N mounts of one export see one directory (its manifest, stamped with
    that mtime, then current on every mount); else each keeps its own, as replicas on separate storage."""
    mounts = [big]
    names = [n for n in os.listdir(big) if not n.endswith(".lock")]
    for i in range(1, count):
        mnt = os.path.join(os.path.dirname(big), f"mnt{i}")
        os.makedirs(mnt, exist_ok=True)
        have = set(os.listdir(mnt))
        for n in names:
            if n not in have:
                os.link(os.path.join(big, n), os.path.join(mnt, n))
        if one_export:
            st = os.stat(big)
            os.utime(mnt, ns=(st.st_atime_ns, st.st_mtime_ns))
        mounts.append(mnt)
    return mounts


def _env() -> Dict[str, str]:
    return dict(os.environ, DLSTORE_NO_PROGRESS="1",
                PYTHONPATH=os.pathsep.join([_harness.ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


def start(args, pattern: str, shuffle: str, strace: Optional[str] = None) -> Dict:
    """One start in a fresh process (under ``strace`` when ``strace`` names a log file)."""
    cmd = [sys.executable, "-c", CHILD, pattern, str(args.rank), str(args.world_size), shuffle, str(args.batch_size),
           MARK, json.dumps(getattr(args, "mount_dirs", []))]
    if strace:
        cmd = ["strace", "-f", "-qq", "-e", "trace=%stat,%lstat,%fstat", "-o", strace] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    return {"error": f"exit {proc.returncode}: {proc.stderr[-400:]}"}


def count_stats(log: str) -> Dict[str, int]:
    """``stat`` calls in an ``strace -e trace=%stat,%lstat,%fstat`` log: in all, and between the two marks."""
    total = measured = 0
    inside = False
    with open(log) as f:
        for line in f:
            if MARK in line:
                inside = "start" in line.split(MARK, 1)[1][:5]
                continue
            if any(call in line for call in STATS):
                total += 1
                measured += inside
    return {"stat_calls": total, "stat_calls_before_first_batch": measured}


def manifest_bytes_read(manifest: str) -> Optional[int]:
    """Bytes of ``manifest`` in the page cache (after a cold start: what the start read of it)."""
    from dlstore.io import pagecache

    fraction = pagecache.resident_fraction([manifest])
    return None if fraction is None else int(round(fraction * os.path.getsize(manifest)))


def _count(n: Optional[int]) -> str:
    return "-" if n is None else f"{n:,}"


def markdown(doc: Dict) -> str:
    med = _harness.median
    lines = [
        "# Starting a rank of a large job, through Dataset",
        "",
        f"Generated by `{doc['command']}` on {doc['date']} (1-minute load {doc['load_before']:.2f} before the run; "
        f"{doc['cores']} cores). `dlstore.Dataset(\"{doc['pattern']}\", "
        + (f"mounts=[{len(doc['mounts'])} mounts: {doc['mounts'][0]} and hardlinked replicas of it"
           + (", their directories with its mtime, as mounts of one export" if doc.get("one_export") else
              ", each directory with its own mtime, as replicas on separate storage") + "], "
           if doc.get("mounts") else "")
        + f"world=World(rank={doc['rank']}, "
        f"size={doc['world_size']}), shuffle=S, batch_size={doc['batch_size']})` and its first batch, each start in "
        f"a fresh process (imports not counted): {doc['shards']:,} TFRecord shards x {doc['records_per_shard']:,} "
        f"records ({doc['record_bytes']} B each) in one directory of {doc['names']:,} names, made by "
        f"`dlstore expand --mode hardlink` from {doc['sources']:,} shards; "
        f"manifest {doc['manifest_bytes'] / 1e6:,.0f} MB. "
        f"Cold: {doc['cold_method']}.",
        "",
        "| shuffle | engine (io=auto) | first batch, cold (median) | warm (median) | max RSS, cold | "
        "manifest read, cold | stat calls before the first batch | stat calls in all | runs |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in doc["shuffles"]:
        r = doc["results"][s]
        cold, warm = r["cold"], r["warm"]
        read = [c.get("manifest_read_bytes") for c in cold if c.get("manifest_read_bytes") is not None]
        engines = sorted({c.get("engine") for c in cold + warm if c.get("engine")})
        lines.append(
            f"| {s} | {', '.join(engines) or '?'} | {med([c.get('start_s') for c in cold]):.3f} s | "
            f"{med([c.get('start_s') for c in warm]):.3f} s | "
            f"{max(c.get('max_rss_mb', 0) for c in cold):.0f} MB | "
            f"{(max(read) / 1e6 if read else float('nan')):,.1f} MB | "
            f"{_count(r['strace'].get('stat_calls_before_first_batch'))} | {_count(r['strace'].get('stat_calls'))} | "
            f"{len(cold)} cold, {len(warm)} warm |")
    lines += ["", "Acceptance (issue 20): first batch <= 0.5 s cold, max RSS <= 300 MB, <= 2,000 stat calls before "
              "the first batch:", ""]
    for s in doc["shuffles"]:
        verdict = doc["results"][s]["pass"]
        checks = ", ".join(f"{k} {'ok' if v else 'over'}" for k, v in verdict.items())
        lines.append(f"- `{s}`: **{'PASS' if all(verdict.values()) else 'FAIL'}** ({checks})")
    first = doc.get("first")
    if first:
        notes = "; ".join(first.get("notes", [])) or "no note"
        lines += ["", f"The first start of the run: {first.get('start_s', float('nan')):.1f} s ({notes})."]
    lines.append("")
    return "\n".join(lines)


def main(argv: List[str] = None) -> int:
    from dlstore.io import pagecache as cache

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default=os.path.expanduser("~/.cache/dlstore/bench/start-seeds"),
                   help="where the shards are made (kept for later runs; big/ holds the copies)")
    p.add_argument("--sources", type=int, default=1024, help="shards written before they are copied")
    p.add_argument("--copies", type=int, default=150)
    p.add_argument("--records", type=int, default=1250, help="records per shard")
    p.add_argument("--record-bytes", type=int, default=16)
    p.add_argument("--rank", type=int, default=7)
    p.add_argument("--world-size", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--shuffles", default="block,global")
    p.add_argument("--mounts", type=int, default=0,
                   help="read through this many mounts holding replicas (Dataset(..., mounts=...)); 0: the directory")
    p.add_argument("--one-export", action="store_true",
                   help="with --mounts: the replicas' directories take the first's mtime, as mounts of one export")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-strace", action="store_true", help="do not count stat calls (no strace here)")
    p.add_argument("--smoke", action="store_true", help="a tiny set in a temporary directory, deleted after")
    _harness.add_output_arguments(p, "dataset_start")
    _harness.add_page_arguments(p)
    args, json_path = _harness.parse(p, "dataset_start", argv)
    if args.render:
        return _harness.render(args.render, args.markdown, markdown)
    tmp = None
    if args.smoke:
        tmp = tempfile.mkdtemp(prefix="dlstore-start-")
        args.dir, args.sources, args.copies, args.records, args.repeat = tmp, 4, 3, 20, 1
        args.rank, args.world_size, args.batch_size = 1, 4, 4
    try:
        return _run(args, json_path, cache)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _run(args, json_path: str, cache) -> int:
    load = os.getloadavg()[0]
    big = make_data(args.dir, args.sources, args.copies, args.records, args.record_bytes)
    pattern = os.path.join(big, "train-*")
    args.mount_dirs = make_mounts(big, args.mounts, args.one_export) if args.mounts else []
    if args.mount_dirs:
        pattern = "train-*"  # relative to each mount
    manifest = os.path.join(big, ".dlstore-manifest")
    shuffles = args.shuffles.split(",")

    def make_cold() -> str:  # a smoke run evicts its own files rather than drop everybody's page cache
        if args.smoke:
            return cache.evict_files([manifest] + [os.path.join(d, n) for d in args.mount_dirs or [big]
                                                   for n in os.listdir(d)])
        return cache.make_cold([manifest])

    first = start(args, pattern, shuffles[0])  # brings the manifest up to date if it needs it
    print("first", json.dumps(first))
    strace = None if args.no_strace else shutil.which("strace")
    results, method = {}, ""
    for shuffle in shuffles:
        cold, warm, traced = [], [], {}
        for _ in range(args.repeat):
            method = make_cold()
            run = start(args, pattern, shuffle)
            run["manifest_read_bytes"] = manifest_bytes_read(manifest)
            cold.append(run)
            print(shuffle, "cold", json.dumps(run))
        for _ in range(args.repeat):
            warm.append(start(args, pattern, shuffle))
            print(shuffle, "warm", json.dumps(warm[-1]))
        if strace:
            with tempfile.TemporaryDirectory() as tmp:
                log = os.path.join(tmp, "strace.log")
                make_cold()
                start(args, pattern, shuffle, strace=log)
                traced = count_stats(log)
            print(shuffle, "strace", json.dumps(traced))
        first_s = _harness.median([c.get("start_s") for c in cold])
        verdict = {"first batch": first_s is not None and first_s <= 0.5,
                   "max RSS": all(c.get("max_rss_mb", 1e9) <= 300 for c in cold),
                   "stat calls": traced.get("stat_calls_before_first_batch", 1e9) <= 2000}
        results[shuffle] = {"cold": cold, "warm": warm, "strace": traced, "pass": verdict}
    command = "python benchmarks/dataset_start.py " + " ".join(sys.argv[1:])
    doc = {"benchmark": "dataset_start", "command": command, "date": time.strftime("%Y-%m-%d %H:%M"),
           "load_before": load, "cores": os.cpu_count(), "pattern": pattern, "mounts": args.mount_dirs,
           "one_export": bool(args.mounts and args.one_export),
           "sources": args.sources,
           "shards": args.sources * args.copies, "records_per_shard": args.records, "record_bytes": args.record_bytes,
           "names": len(os.listdir(big)), "manifest_bytes": os.path.getsize(manifest), "rank": args.rank,
           "world_size": args.world_size, "batch_size": args.batch_size, "cold_method": method,
           "shuffles": shuffles, "first": first, "results": results}
    _harness.write_outputs(doc, json_path, args.markdown, markdown)
    return 0 if all(all(r["pass"].values()) for r in results.values()) or args.smoke else 1


if __name__ == "__main__":
    sys.exit(main())
