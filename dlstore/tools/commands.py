"""The ``dlstore testbed``, ``dlstore expand``, ``dlstore plan`` and ``dlstore verify --mounts`` commands:
their arguments, and what they print.

:mod:`dlstore.cli` registers them; the work is done by :mod:`dlstore.tools.testbed`,
:mod:`dlstore.tools.expand`, :mod:`dlstore.tools.scrub`, and for ``plan`` by the planner
:class:`dlstore.Dataset` reads (:meth:`dlstore.Dataset.read_plan`; :mod:`dlstore.tools.simulate` for
``--simulate``).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any, Dict, List, Optional

from dlstore.tools import testbed as tbm
from dlstore.tools.expand import EXPAND_MODES, expand_shards
from dlstore.tools.testbed import BREAK_MODES, FILESYSTEMS, LAYOUTS, MAX_MOUNTS

__all__ = ["add_testbed_arguments", "run_testbed", "add_expand_arguments", "run_expand", "format_status",
           "plan_document", "run_plan", "run_scrub"]

_MB = 1e6  # --throttle-mbps counts decimal megabytes, as storage figures do


def add_testbed_arguments(p: argparse.ArgumentParser) -> None:

    p.add_argument("--dir", required=True, help="directory of the testbed: images/, mnt0.., testbed.json")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--down", action="store_true", help="tear the testbed down (safe after a partial setup, "
                                                          "and when already torn down)")
    what.add_argument("--status", action="store_true", help="show the testbed as recorded and as the system sees it")
    what.add_argument("--set-throttle", type=float, metavar="MBPS",
                      help="change the read limit of every mount, in MB/s (0: none)")
    what.add_argument("--break", dest="break_mount", type=int, metavar="I",
                      help="make mount I fail for readers (see --how) until --restore")
    what.add_argument("--restore", nargs="?", type=int, const=-1, metavar="I",
                      help="undo --break on mount I (every broken mount without I)")
    what.add_argument("--exec", dest="exec_command", action="store_true",
                      help="run the command after -- in the cgroup whose throttle rules apply: "
                           "--exec -- CMD ARGS (last on the line)")
    p.add_argument("--mounts", type=int, help=f"create this many mounts (1..{MAX_MOUNTS})")
    p.add_argument("--size-gb", type=float, help="size of each sparse image in GiB (default: fits --data, else 1)")
    p.add_argument("--fs", default="ext4", choices=FILESYSTEMS, help="filesystem of each mount (xfs: 0.3 GiB at least)")
    p.add_argument("--throttle-mbps", type=float, help="read limit of each mount in MB/s (cgroup v1 blkio)")
    p.add_argument("--data", nargs="+", metavar="SRC", help="shards to copy onto the mounts: files, globs, a directory")
    p.add_argument("--layout", default="replicated", choices=LAYOUTS,
                   help="replicated: every shard on every mount; striped: shard i on mount i %% N")
    p.add_argument("--no-direct-io", action="store_true",
                   help="attach loop devices without direct I/O (blocks are then cached twice)")
    p.add_argument("--cgroup", help="keep the rules in this child blkio cgroup (created) instead of the root")
    p.add_argument("--how", default="umount", choices=BREAK_MODES, help="how --break breaks a mount")
    p.add_argument("--measure", action="store_true",
                   help="also read each loop device with O_DIRECT for 1 s and show the rate it allows")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the state (create) or status as JSON")
    p.add_argument("exec_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def run_testbed(args: argparse.Namespace) -> int:

    if not args.status:
        refusal = tbm.root_refusal()
        if refusal:
            print(f"dlstore testbed: {refusal}", file=sys.stderr)
            return 2
    if args.down:
        done = tbm.destroy_testbed(args.dir)
        if args.json:
            print(json.dumps({"done": done}, indent=1))
        else:
            print("\n".join(done) if done else f"{os.path.abspath(args.dir)}: no testbed, nothing to do")
        return 0
    command = args.exec_args[1:] if args.exec_args[:1] == ["--"] else args.exec_args
    if command and not args.exec_command:
        print(f"dlstore testbed: unexpected arguments {' '.join(command)!r} (a command to run goes after --exec --)",
              file=sys.stderr)
        return 2
    if args.exec_command:
        if not command:
            print("dlstore testbed: --exec needs a command: --exec -- CMD ARGS...", file=sys.stderr)
            return 2
        tbm.load_testbed(args.dir).enter_cgroup()
        try:
            os.execvp(command[0], command)
        except OSError as e:
            print(f"dlstore testbed: cannot run {command[0]}: {e.strerror}", file=sys.stderr)
            return 127
    if args.mounts is None and not args.status and args.set_throttle is None and args.break_mount is None \
            and args.restore is None:
        print("dlstore testbed: say what to do: --mounts N (create), --status, --down, --set-throttle, --break, "
              "--restore or --exec", file=sys.stderr)
        return 2
    if args.mounts is not None:
        try:
            tb = tbm.create_testbed(
                args.dir, args.mounts, size_bytes=int(args.size_gb * (1 << 30)) if args.size_gb else None,
                fs=args.fs, throttle_bps=int(args.throttle_mbps * _MB) if args.throttle_mbps else None,
                data=args.data, layout=args.layout, direct_io=not args.no_direct_io, cgroup=args.cgroup,
                progress=False if args.quiet else None)
        except ValueError as e:
            print(f"dlstore testbed: {e}", file=sys.stderr)
            return 2
    else:
        tb = tbm.load_testbed(args.dir)
        if args.set_throttle is not None:
            tb.set_throttle(int(args.set_throttle * _MB) or None)
        elif args.break_mount is not None:
            tb.break_mount(args.break_mount, args.how)
        elif args.restore is not None:
            tb.restore(None if args.restore < 0 else args.restore)
    status = tb.status()
    measured = tb.measure_read_bps() if args.measure else None
    if args.json:
        out: Dict[str, Any] = dict(status)
        if measured is not None:
            out["measured_read_bps"] = measured
        if args.mounts is not None:
            out["state"] = tb.to_dict()
        print(json.dumps(out, indent=1))
    else:
        print(format_status(status, measured))
    return 0


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def format_status(status: Dict[str, Any], measured: Optional[List[float]] = None) -> str:
    """The text ``dlstore testbed`` prints for a :meth:`Testbed.status` (and measured read rates)."""
    lines = [f"testbed {status['dir']}: {len(status['mounts'])} x {status['fs']}, "
             f"sparse images of {_size(status['image_bytes'])}"]
    rows = [["mount", "device", "direct I/O", "mounted", "read limit", "used", "files", "state"]]
    if measured is not None:
        rows[0].insert(5, "measured")
    for k, m in enumerate(status["mounts"]):
        state = f"broken ({m['broken']})" if m["broken"] else ("ok" if m["attached"] and m["mounted"] else "partial")
        row = [m["mountpoint"], f"{m['device']} ({m['devno']})" if m["device"] else "-",
               {True: "on", False: "off", None: "-"}[m["direct_io"]], "yes" if m["mounted"] else "no",
               f"{m['throttle_bps'] / _MB:.1f} MB/s" if m["throttle_bps"] else "none",
               _size(m["used_bytes"]) if "used_bytes" in m else "-", str(m["files"]), state]
        if measured is not None:
            row.insert(5, f"{measured[k] / _MB:.1f} MB/s")
        rows.append(row)
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    if status["layout"]:
        lines.append(f"data: {status['files']} files, {status['layout']}")
    me, where = status["this_process_cgroup"], status["cgroup"]
    if any(m["throttle_bps"] for m in status["mounts"]) and me is not None:
        outside = status["processes_outside_cgroup"]
        lines.append(f"throttle rules in blkio cgroup {where}; this process is in {me} "
                     f"({'throttled' if status['this_process_throttled'] else 'NOT throttled'}); "
                     f"{outside} processes are in other blkio cgroups and are not throttled")
        if not status["this_process_throttled"] or where != "/":
            lines.append(f"run readers with: dlstore testbed --dir {shlex.quote(status['dir'])} --exec -- CMD")
    for note in status["notes"]:
        lines.append(f"note: {note}")
    lines.append("mounts: " + " ".join(m["mountpoint"] for m in status["mounts"]))
    lines.append(f"tear down: dlstore testbed --dir {shlex.quote(status['dir'])} --down")
    return "\n".join(lines)


def add_expand_arguments(p: argparse.ArgumentParser) -> None:

    p.add_argument("paths", nargs="+", help="shards: files, globs or a directory")
    p.add_argument("--copies", type=int, required=True,
                   help="copies of each shard (the Dell EMC Isilon F800 reference architecture used 150)")
    p.add_argument("--out", required=True, help="directory for the copies (not one holding the sources)")
    p.add_argument("--mode", default="copy", choices=EXPAND_MODES,
                   help="copy (default: defeats every cache), reflink (own page cache, shared blocks), hardlink "
                        "(shares the page cache: does NOT defeat caches)")
    p.add_argument("--index", action="store_true", help="build missing or stale source indexes so every copy gets one")
    p.add_argument("--overwrite", action="store_true", help="rewrite copies that already exist")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run_expand(args: argparse.Namespace) -> int:
    from dataclasses import asdict


    try:
        r = expand_shards(args.paths, args.out, args.copies, mode=args.mode, index=args.index,
                          overwrite=args.overwrite, progress=False if args.quiet else None)
    except ValueError as e:
        print(f"dlstore expand: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(asdict(r), indent=1))
        return 0
    sources = len(r.outputs) // args.copies
    rate = r.written_bytes / r.seconds / _MB if r.seconds > 0 else 0.0
    made = len(r.outputs) - r.skipped
    print(f"{args.mode}: {made} of {len(r.outputs)} copies made ({sources} shards x {args.copies}) in "
          f"{os.path.abspath(args.out)}, {r.written_bytes / _MB:.1f} MB in {r.seconds:.1f} s ({rate:.0f} MB/s); "
          f"{r.skipped} already there; {r.indexes} indexes placed")
    if r.manifest:
        print(f"manifest: {r.manifest} (the copies' record offsets, taken from the sources)")
    for note in r.notes:
        print(f"note: {note}")
    if args.mode == "hardlink":
        print("note: hardlinks share one inode and so one set of page-cache pages: they do NOT defeat caches")
    return 0


def plan_document(args: argparse.Namespace) -> Dict[str, Any]:
    """What ``dlstore plan --mounts`` shows, planned by a :class:`~dlstore.Dataset` over the mounts: per
    consumer (``--rank``'s, else every rank's) its mounts and every read it performs (file, byte range,
    mount), in reading order."""
    from dlstore.placement.world import World
    from dlstore.sources.dataset import Dataset
    from dlstore.sources.reads import merged_reads

    local_size = args.local_size or args.world_size

    def world(rank: int, worker: int) -> World:
        return World(rank=rank, size=args.world_size, local_rank=rank % local_size,
                     local_size=local_size).with_worker(worker, args.workers)

    ds = Dataset(args.shards, mounts=args.mounts, world=world(0, 0), seed=args.seed,
                 shuffle_shards=not args.no_shard_shuffle, shuffle=args.shuffle, remainder=args.remainder or "pad",
                 batch_size=args.batch_size, mount_policy=args.policy, mounts_per_rank=args.mounts_per_rank,
                 throughput=args.throughput)
    plan = ds.plan(args.epoch)
    ranks = [args.rank] if args.rank is not None else range(args.world_size)
    consumers = []
    for rank in ranks:
        for worker in range(args.workers):
            w = world(rank, worker)
            whole = ds.read_plan(args.epoch, world=w)
            # As that rank's own Dataset would: a shard rewritten since the manifest is refused, not shown
            # with the manifest's byte ranges (the Dataset above, rank 0's, checked only its own shards).
            mounts = ds._assign(w)
            ds.index.check(whole.shards)
            ds._check_copies(whole.shards, mounts)
            reads = merged_reads(whole, ds.mounts, cuts=ds.window_starts(len(whole.file)))
            consumers.append({"rank": rank, "worker": worker, "consumer": w.consumer,
                              "mounts": [ds.mounts[m] for m in mounts],
                              "records": sum(r["records"] for r in reads), "reads": reads})
    layout = ds.layout
    return {"layout": {"kind": layout.kind, "mounts": list(layout.mounts), "shards": list(layout.shards),
                       "holders": [list(h) for h in layout.holders]},
            "world_size": args.world_size, "num_workers": args.workers, "policy": args.policy,
            "mounts_per_rank": args.mounts_per_rank, "options": plan.options(), "total_records": plan.total,
            "num_batches": plan.num_batches, "shuffle": ds.describe_shuffle(), "manifests": list(ds.index.manifests),
            "index_notes": list(ds.index.notes), "consumers": consumers}


def run_plan(args: argparse.Namespace, max_reads: int = 6, max_consumers: int = 64) -> int:
    """What ``dlstore plan --mounts`` prints (the JSON of :func:`plan_document` with ``--json``)."""
    doc = plan_document(args)
    if args.json:
        text = json.dumps(doc, indent=1)
        if args.json == "-":
            print(text)
            return 0
        with open(args.json, "w") as f:
            f.write(text)
    options = doc["options"]
    workers = f" x {args.workers} workers" if args.workers > 1 else ""
    print(f"layout: {doc['layout']['kind']}: {len(doc['layout']['shards'])} shards on {len(args.mounts)} mounts, "
          f"{doc['total_records']:,} records")
    print(f"record counts from {', '.join(doc['manifests'])}: {doc['total_records']:,} records"
          + "".join(f"; {note}" for note in doc["index_notes"]))
    print(f"world: {args.world_size} ranks{workers}; policy {args.policy}, {args.mounts_per_rank} mount(s) per rank; "
          f"seed {options['seed']}, epoch {options['epoch']}, shard shuffle "
          f"{'on' if options['shuffle_shards'] else 'off'}, remainder {options['remainder']}, batch "
          f"{options['batch_size']} -> {doc['num_batches']} batches per consumer")
    print(f"shuffle {doc['shuffle']}")
    print("mounts: " + "  ".join(f"[{i}] {m}" for i, m in enumerate(doc["layout"]["mounts"])))
    rows = [("rank", "worker", "mounts", "records", "reads", "first reads (shard[bytes]@mount)")]
    index = {m: i for i, m in enumerate(doc["layout"]["mounts"])}
    for c in doc["consumers"][:max_consumers]:
        shown = [f"{os.path.basename(r['path'])}[{r['start']}:{r['stop']}]@{index[r['mount']]}"
                 for r in c["reads"][:max_reads]]
        if len(c["reads"]) > max_reads:
            shown.append(f"... +{len(c['reads']) - max_reads} more")
        rows.append((str(c["rank"]), str(c["worker"]), ",".join(str(index[m]) for m in c["mounts"]),
                     f"{c['records']:,}", f"{len(c['reads']):,}", " ".join(shown) or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(row[i].ljust(widths[i]) for i in range(5)) + "  " + row[5])
    if len(doc["consumers"]) > max_consumers:
        print(f"... {len(doc['consumers']) - max_consumers} more consumers (--json lists all)")
    return 0


def run_scrub(args: argparse.Namespace) -> int:
    """``dlstore verify [SHARDS] --mounts M1 M2 ...``: exit 1 if any copy is bad, 0 if all are clean,
    2 when the mounts or shards cannot be found."""
    from dataclasses import asdict

    from dlstore.errors import PlacementError
    from dlstore.tools.scrub import scrub_mounts

    try:
        r = scrub_mounts(args.mounts, args.paths or None, fmt=args.format, io=args.io,
                         progress=False if args.quiet or args.json else None)
    except PlacementError as e:
        print(f"dlstore verify: {e}", file=sys.stderr)
        return 2
    rate = r.bytes / r.seconds / _MB if r.seconds > 0 else 0.0
    if args.json:
        print(json.dumps({"clean": r.clean, "mounts": r.mounts, "copies": r.copies, "records": r.records,
                          "bytes": r.bytes, "seconds": r.seconds, "unreported": r.unreported,
                          "bad": [asdict(b) for b in r.bad],
                          "missing": [{"shard": shard, "not_on": lacking} for shard, lacking in r.missing]}, indent=1))
    else:
        for bad in r.bad:
            print(bad.line(), flush=True)
        if r.missing:
            first = "; ".join(f"{shard} not on {', '.join(lacking)}" for shard, lacking in r.missing[:3])
            more = f"; and {len(r.missing) - 3} more" if len(r.missing) > 3 else ""
            print(f"note: {len(r.missing)} of {r.shards} shards have no copy on some mounts (a Dataset reads "
                  f"them from the mounts holding them): {first}{more}")
        if r.unreported:
            print(f"{r.unreported} more corrupt records were found than reported one by one")
        verdict = "OK" if r.clean else "CORRUPT"
        print(f"{verdict}: {r.copies} copies on {len(r.mounts)} mounts, {r.records} good records, "
              f"{len(r.bad)} bad {'copy' if len(r.bad) == 1 else 'copies'}; {r.bytes / _MB:.1f} MB in "
              f"{r.seconds:.1f} s ({rate:.0f} MB/s)")
    return 0 if r.clean else 1
