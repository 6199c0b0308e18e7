"""``dlstore <command>``: gen, convert, index, verify, plan, testbed, expand, info.

Each command is a function registered in :data:`COMMANDS`; ``main`` parses arguments and dispatches.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import numpy as np

from dlstore import __version__, _console, settings, synthetic
from dlstore._console import Parser, positive_int
from dlstore._progress import Progress
from dlstore.errors import CorruptRecordError, DlstoreError
from dlstore.formats.detect import FormatMismatchError
from dlstore.formats.registry import FORMATS
from dlstore.io import deadline
from dlstore.io.system import existing_parent, format_bytes
from dlstore.placement import ASSIGNMENTS, REMAINDERS, SHUFFLES
from dlstore.sources.indexing import (find_index, index_dataset, load_index, record_manifest, scan_offsets,
                                      write_index)
from dlstore.sources.reader import distinct_files, expand_paths, open_records, same_name, unreadable_reason
from dlstore.tools.commands import (add_expand_arguments, add_testbed_arguments, run_expand, run_plan, run_scrub,
                                     run_testbed)
from dlstore.tools.convert import convert_tree
from dlstore.tools.info import collect_info, format_info
from dlstore.tools.simulate import parse_simulate, parse_throughput, run_simulate

__all__ = ["main", "COMMANDS"]


#: About how large a record of each generated kind is (ImageNet-like at the default image size; BERT at seq 128).
_GEN_RECORD_BYTES = {"imagenet": 115_000, "bert": 850}


def _check_room(out: str, records: int, record_bytes: int) -> None:
    """Raises a ValueError (one line, exit 2) when the set would not fit on the disk that is to hold it,
    before anything is planned or written (99999999999999 records ran out of memory planning them)."""
    import shutil

    where = existing_parent(out)
    free = shutil.disk_usage(where).free
    need = records * record_bytes
    if need > free:
        raise ValueError(f"{records:,} records of about {format_bytes(record_bytes)} are about {format_bytes(need)}, "
                         f"and {where} has {format_bytes(free)} free: give fewer --shards or --records-per-shard")


def cmd_gen(args: argparse.Namespace) -> int:
    """Writes a synthetic ImageNet-like or BERT dataset."""

    _check_room(args.out, args.shards * args.records_per_shard, _GEN_RECORD_BYTES[args.kind])
    # Another set's shards in args.out are refused by the generator (refuse_other_sets): one line, exit 2.

    if args.kind == "imagenet":
        paths = synthetic.generate_imagenet(args.out, shards=args.shards, records_per_shard=args.records_per_shard,
                                            seed=args.seed, progress=not args.quiet)
    else:
        paths = synthetic.generate_bert(args.out, shards=args.shards, records_per_shard=args.records_per_shard,
                                        seed=args.seed, seq_len=args.seq_len, max_predictions=args.max_predictions,
                                        progress=not args.quiet)

    size = sum(os.path.getsize(p) for p in paths)
    records = args.shards * args.records_per_shard
    print(f"wrote {_count(len(paths), 'shard')}, {_count(records, 'record')}, {format_bytes(size)} "
          f"(mean record {format_bytes(size / max(records, 1))}) to {args.out}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """Converts a folder of class folders of images (ImageNet's train/ layout) to TFRecord shards
    with the features of TensorFlow's ImageNet converter, or to RecordIO as MXNet's im2rec writes it
    (with .idx and .lst files). Files that are not decodable images are named and left out."""

    def left_out(path: str, why: str) -> None:
        print(f"left out {path}: {why}", flush=True)

    try:
        r = convert_tree(args.src, args.out, format=args.format, shards=args.shards, seed=args.seed,
                         workers=args.workers, prefix=args.prefix, progress=False if args.quiet else None,
                         on_left_out=left_out)
    except ImportError as e:  # Pillow missing: a setup problem, said in one line
        print(f"dlstore convert: {e}", file=sys.stderr)
        return 2
    files = r.outputs + r.companions
    print(f"wrote {_count(r.records, 'image')} of {_count(r.classes, 'class folder')} in "
          f"{_count(len(r.outputs), 'shard')} ({args.format}, {format_bytes(r.bytes)} of images) to {args.out}; "
          f"{_count(len(r.left_out), 'file')} left out (not decodable images)")
    if len(r.outputs) < r.shards_asked:
        print(f"{_count(r.shards_asked - len(r.outputs), 'shard')} of the {r.shards_asked} asked for would have held "
              f"only files left out: not written")
    if args.format == "recordio":
        print(f"with an .idx and a .lst file beside each .rec ({len(files)} files in all)")
    return 0


def _listing_index(path: str, fmt: str, offsets, out: Optional[str]) -> Optional[str]:
    """A RecordIO index of ``path`` already there (``out``, else beside it or in the cache) that lists exactly
    ``offsets``, in any order: its path (rewriting it would replace its keys by record numbers), else None."""
    if fmt != "recordio":
        return None
    try:
        where, found = (out, load_index(path, out, fmt)) if out else find_index(path, fmt)[:2]
    except (OSError, ValueError):
        return None
    return where if found is not None and np.array_equal(np.sort(found), np.asarray(offsets)) else None


def cmd_index(args: argparse.Namespace) -> int:
    """Builds index files ('offset size' lines for TFRecord, 'key<TAB>offset' lines for RecordIO, which
    DALI and MXNet read) and one dataset manifest per directory (what dlstore.Dataset opens: one file
    for all its shards). A read-only directory's go to the cache directory ($DLSTORE_CACHE)."""

    named = distinct_files(expand_paths(args.paths))
    clash = same_name(named) if args.out_dir else None  # one directory of indexes named for the files
    if clash:
        raise ValueError(f"{clash[0]} and {clash[1]} would both have their index at "
                         f"{os.path.join(args.out_dir, os.path.basename(clash[1]))}.idx (--out-dir): "
                         f"index them apart, each with an --out-dir of its own")
    fresh: Dict[str, Dict[str, Any]] = {}  # per directory, per shard: the frame offsets just found
    formats: Dict[str, Dict[str, int]] = {}  # per directory, its files' formats and how many of each
    files, failed = [], 0
    for f in named:
        out = os.path.join(args.out_dir, os.path.basename(f) + ".idx") if args.out_dir else None
        try:
            fmt, offsets, lengths = scan_offsets(f, args.format)
        except FormatMismatchError:  # --format names another format than the files': a usage error
            raise
        except (DlstoreError, ValueError) as e:  # a corrupt, unreadable or compressed shard: said, the others
            print(f"dlstore index: {_console.one_line(e)}", file=sys.stderr, flush=True)  # indexed still
            failed += 1
            continue
        files.append(f)
        kept = _listing_index(f, fmt, offsets, out)
        if kept:  # an MXNet .idx's keys are the user's (image ids): one that lists every record stays
            print(f"{f}: {len(offsets)} records, {kept} kept (it lists every record, under its own keys)")
        else:
            dest = write_index(f, fmt, offsets, lengths, out)
            print(f"{f}: {len(offsets)} records -> {dest}")
        directory, name = os.path.split(os.path.abspath(f))
        fresh.setdefault(directory, {})[name] = offsets
        counts = formats.setdefault(directory, {})
        counts[fmt] = counts.get(fmt, 0) + 1
    # A manifest holds one format: a directory whose files mix them gets none (each file's index is written).
    mixed = sorted(d for d, counts in formats.items() if len(counts) > 1)
    for directory in mixed:
        kinds = ", ".join(f"{n} {fmt}" for fmt, n in sorted(formats[directory].items()))
        print(f"dlstore index: {directory}: its files mix formats ({kinds}): no manifest written there, since a "
              f"Dataset reads one format per set; put each format's files in a directory of their own",
              file=sys.stderr, flush=True)
    # The manifests take the offsets just found over what they held (a manifest damaged on disk, its
    # shards unchanged, is mended here), then cover the rest: nothing is read again.
    for directory, shards in fresh.items():
        if directory not in mixed:
            record_manifest(directory, next(iter(formats[directory])), shards)
    files = [f for f in files if os.path.dirname(os.path.abspath(f)) not in mixed]
    index = index_dataset(files, args.format) if files else None
    for manifest in index.manifests if index is not None else ():
        where = os.path.dirname(manifest)
        described = sorted({os.path.dirname(os.path.abspath(f)) for f in files})
        if where not in described:
            print(f"manifest: {manifest} (the data's directory is read-only: written to the cache directory)")
        else:
            print(f"manifest: {manifest}")
    if failed and len(named) > 1:
        print(f"dlstore index: {_count(failed, 'file')} of {len(named)} not indexed (above); "
              f"`dlstore verify` lists every problem", file=sys.stderr)
    return 2 if failed or mixed else 0


class _FileCheck(NamedTuple):
    records: int  # good records (those before an error that stopped the read included)
    corrupt: int  # corrupt records skipped (every one counted, reported or not)
    lines: List[str]  # what to print: one line per problem
    unreadable: bool  # the file could not be opened, its format told, or read
    broken: bool  # its compressed stream is damaged: nothing after the damage can be read


def _verify_file(path: str, fmt: str, io: Optional[str]) -> _FileCheck:
    """Reads one file with every check on and says what is wrong with it."""

    try:  # its opening bounded by read_timeout, as its reads are in the reader
        reader = deadline.within(settings.get("read_timeout"), "opening it for `dlstore verify`", open_records,
                                 path, format=fmt, io=io, on_error="skip")
    except FormatMismatchError:  # --format names another format than the files': a usage error
        raise
    except (DlstoreError, ValueError) as e:  # unreadable file or unknown format: say so, go on
        return _FileCheck(0, 0, [_naming(path, str(e))], True, False)
    stopped = None
    try:
        stats = reader.count()
    except FormatMismatchError:
        raise
    except DlstoreError as e:
        # The read stopped: the file cannot be read, or its compressed stream is broken (skipping
        # cannot go past that). The records read before it still count.
        stopped = e
        stats = reader.stats()
    lines = []
    found = reader.corruptions()
    for where, offset, what in found:  # the core's reports are bare: add the file and the offset
        at = f"at byte {offset}: " if offset is not None and offset >= 0 else ""
        lines.append(f"{where}: {at}{what}")
    # The core keeps the first reports only, but counts every skipped record: a file with more
    # corruptions than reports is listed too, and never called OK.
    unreported = stats["skipped"] - len(found)
    if unreported > 0:
        lines.append(f"{path}: {unreported} more corrupt {'record was' if unreported == 1 else 'records were'} "
                     f"skipped without a detailed report")
    corrupt = max(stats["skipped"], len(found))
    if stopped is not None:
        rest = "; the rest of the file cannot be read" if stats["records"] else ""
        lines.append(_naming(path, str(stopped)) + rest)
    broken = isinstance(stopped, CorruptRecordError)
    return _FileCheck(stats["records"], corrupt, lines, stopped is not None and not broken, broken)


def _naming(path: str, text: str) -> str:
    return text if text.startswith(path) else f"{path}: {text}"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def cmd_verify(args: argparse.Namespace) -> int:
    """Reads every record, checks framing and CRCs, and lists each corrupt offset and each file that
    cannot be read. With --mounts, scrubs every copy of every shard on the replica mounts at once and
    names the mounts holding each bad record good. Exit 1 if anything is bad, 2 on bad usage."""

    _check_settings(io=args.io)
    if args.mounts:
        # `--mounts` takes every argument after it: shards named after it land there (a glob, or a file here or
        # under one of the mounts); a mount that is missing (a typo) is check_mounts' to say
        real = [m for m in args.mounts if os.path.isdir(m)]
        strays = [m for m in args.mounts if not os.path.isdir(m) and (
            any(ch in m for ch in "*?[") or os.path.isfile(m) or any(os.path.isfile(os.path.join(r, m)) for r in real))]
        if strays and not args.paths:
            print(f"dlstore verify: mount point {strays[0]} is not a directory (shard paths and globs go before "
                  f"--mounts, which takes every argument after it: dlstore verify SHARDS --mounts M1 M2 ...)",
                  file=sys.stderr)
            return 2
        return run_scrub(args)
    if not args.paths:
        print("dlstore verify: name the files to check, or [SHARDS] --mounts M1 M2 ...", file=sys.stderr)
        return 2
    if args.json:
        print("dlstore verify: --json reports the scrub of replica mounts (with --mounts); a check of files "
              "prints its findings as lines", file=sys.stderr)
        return 2
    odd: List[str] = []  # named by a directory or glob but no file (a dangling link): unreadable, said
    files = distinct_files(expand_paths(args.paths, odd))
    total = sum(os.path.getsize(f) for f in files)
    records = corrupt = corrupt_files = broken = unreadable = 0
    for path in odd:
        print(f"{unreadable_reason(path)}: restore it or remove it", flush=True)
        unreadable += 1
    with Progress(total, "verify", unit="B", enabled=False if args.quiet else None) as bar:
        for f in files:
            check = _verify_file(f, args.format, args.io)  # FormatMismatchError: a usage error (_console)
            bar.update(os.path.getsize(f))
            records += check.records
            corrupt += check.corrupt
            corrupt_files += check.corrupt > 0
            broken += check.broken
            unreadable += check.unreadable
            for line in check.lines:
                print(line, file=sys.stdout, flush=True)
    bad = corrupt_files + broken + unreadable
    # CORRUPT when records are bad or a file is damaged past a point; UNREADABLE when files could not be read
    # at all (an I/O error, a dangling link) and nothing read was bad.
    verdict = "OK" if not bad else "CORRUPT" if corrupt_files or broken else "UNREADABLE"
    summary = (f"{verdict}: {_count(len(files) + len(odd), 'file')}, {records} good records, "
               f"{_count(corrupt, 'corrupt record')} in {_count(corrupt_files, 'file')}")
    if broken:
        summary += f", {_count(broken, 'file')} unreadable past damage"
    if unreadable:
        summary += f", {_count(unreadable, 'unreadable file')}"
    print(summary)
    return 1 if bad else 0


def _check_settings(**overrides) -> None:
    """Every setting as it will be read (argument, else environment variable, else default): a bad
    one is a usage error now, not an unreadable file later.

    Raises
    ------
    ValueError
        Naming the setting and where its value came from.
    """

    for name in settings.SETTINGS:
        settings.get(name, overrides.get(name))
    if settings.get("io", overrides.get("io")) == "gds":  # where it cannot run, say why now: no file is at fault
        from dlstore.io.select import resolve_engine

        resolve_engine("gds", [], 0)


def cmd_plan(args: argparse.Namespace) -> int:
    """Shows what each rank reads in one epoch, planned as dlstore.Dataset plans it: the layout the mounts
    hold (replicated, striped or mixed), each rank's mounts, and its reads (file, byte range, mount) in
    reading order. With --simulate, plans one rank of a dataset given as counts only, and what that costs."""

    if args.simulate:
        return run_simulate(args)
    if not args.mounts:
        print("dlstore plan: give --mounts (the mount points holding the dataset), or --simulate "
              "SHARDS:RECORDS_PER_SHARD", file=sys.stderr)
        return 2
    return run_plan(args)


def cmd_testbed(args: argparse.Namespace) -> int:
    """As root: N loop-mounted filesystems, each optionally throttled (cgroup v1 blkio), holding a copy
    or a stripe of a dataset, to emulate several mounts on one host; --down removes them."""

    return run_testbed(args)


def cmd_expand(args: argparse.Namespace) -> int:
    """Makes K copies of every shard (x.tfrecord -> x.copy003.tfrecord, indexes beside them) so that
    the dataset outgrows every cache, as the Dell EMC Isilon F800 reference architecture did (150 copies)."""

    return run_expand(args)


def cmd_info(args: argparse.Namespace) -> int:
    """Reports what this machine offers dlstore: CPU CRC-32C, JPEG decoding, O_DIRECT on the given
    paths, MPI, and the GPU path (CUDA driver and devices, kvikio, libcufile, nvidia-fs, compat mode)."""
    import json


    info = collect_info(args.paths)
    print(json.dumps({k: v for k, v in info.items() if k != "rows"}, indent=1) if args.json else format_info(info))
    return 0


COMMANDS: Dict[str, Callable[[argparse.Namespace], int]] = {
    "gen": cmd_gen,
    "convert": cmd_convert,
    "index": cmd_index,
    "verify": cmd_verify,
    "plan": cmd_plan,
    "testbed": cmd_testbed,
    "expand": cmd_expand,
    "info": cmd_info,
}


def build_parser() -> argparse.ArgumentParser:

    p = Parser(prog="dlstore", description="Storage-aware data loading tools.")
    p.add_argument("--version", action="version", version=f"dlstore {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("gen", help=cmd_gen.__doc__, description=cmd_gen.__doc__)
    g.add_argument("kind", choices=["imagenet", "bert"])
    g.add_argument("--out", required=True, help="output directory")
    g.add_argument("--shards", type=positive_int, default=8, help="shard files to write (default: %(default)s)")
    g.add_argument("--records-per-shard", type=positive_int, default=128,
                   help="records in each shard (default: %(default)s)")
    g.add_argument("--seed", type=int, default=0, help="seed of the generated content (default: %(default)s)")
    g.add_argument("--seq-len", type=int, default=128, choices=[128, 384], help="BERT sequence length")
    g.add_argument("--max-predictions", type=positive_int, default=None, metavar="N",
                   help="BERT masked-LM predictions per sequence (default: 20 at seq 128, 60 at 384, as the "
                        "BERT pipeline and bench expect)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")

    c = sub.add_parser("convert", help=cmd_convert.__doc__, description=cmd_convert.__doc__)
    c.add_argument("src", help="the image tree: one folder per class (sorted names give the labels)")
    c.add_argument("--out", required=True, help="output directory (created if missing; not inside SRC)")
    c.add_argument("--format", default="tfrecord", choices=["tfrecord", "recordio"],
                   help="tfrecord: labels 1..N, as TensorFlow's ImageNet converter; recordio: labels 0..N-1, as "
                        "im2rec (default: %(default)s)")
    c.add_argument("--shards", type=positive_int, default=1, help="files to write (default: %(default)s)")
    c.add_argument("--seed", type=int, default=0,
                   help="seed of the record order, a shuffle of all images (default: %(default)s)")
    c.add_argument("--workers", type=positive_int, help="threads decoding images (default: one per core)")
    c.add_argument("--prefix", default="train", help="shard names start with it (default: %(default)s)")
    c.add_argument("--quiet", action="store_true", help="no progress bar")

    i = sub.add_parser("index", help=cmd_index.__doc__, description=cmd_index.__doc__)
    i.add_argument("paths", nargs="+", help="files, globs or directories")
    i.add_argument("--format", default="auto", choices=["auto", *FORMATS])
    i.add_argument("--out-dir", help="write indexes here instead of beside the data")

    v = sub.add_parser("verify", help=cmd_verify.__doc__, description=cmd_verify.__doc__)
    v.add_argument("paths", nargs="*", help="files, globs or directories; with --mounts: shard paths or globs "
                                            "relative to the mounts (default: every record file)")
    v.add_argument("--mounts", nargs="+", metavar="M", help="replica mount points: scrub every copy, the mounts "
                                                            "read at once")
    v.add_argument("--format", default="auto", choices=["auto", *FORMATS])
    v.add_argument("--io", help=settings.SETTINGS["io"].help + f" Default: ${settings.SETTINGS['io'].env}, else auto.")
    v.add_argument("--json", action="store_true", help="with --mounts: the report as JSON")
    v.add_argument("--quiet", action="store_true", help="no progress bar")

    _add_plan_parser(sub)

    add_testbed_arguments(sub.add_parser("testbed", help=cmd_testbed.__doc__, description=cmd_testbed.__doc__))
    add_expand_arguments(sub.add_parser("expand", help=cmd_expand.__doc__, description=cmd_expand.__doc__))
    n = sub.add_parser("info", help=cmd_info.__doc__, description=cmd_info.__doc__)
    n.add_argument("paths", nargs="*", help="files or directories to check O_DIRECT on")
    n.add_argument("--json", action="store_true", help="the report as JSON")
    return p


def _add_plan_parser(sub) -> None:

    pl = sub.add_parser("plan", help=cmd_plan.__doc__, description=cmd_plan.__doc__)
    pl.add_argument("--mounts", nargs="+", help="mount point directories (the dataset root on each)")
    pl.add_argument("--world-size", type=positive_int, required=True, help="number of ranks")
    pl.add_argument("--simulate", type=parse_simulate, metavar="SHARDS:RECORDS_PER_SHARD",
                    help="plan one rank (--rank) of a dataset that exists only as counts, on --mounts-count "
                         "mounts that each hold all of it, and say what it costs")
    pl.add_argument("--mounts-count", type=positive_int, default=1, help="with --simulate: the number of mounts")
    pl.add_argument("--list-reads", action="store_true",
                    help="with --simulate --json: list every read (path, byte range, records, mount), not only counts")
    pl.add_argument("--rank", type=int, help="the one rank to plan (default: every rank; with --simulate: 0)")
    pl.add_argument("--record-bytes", type=positive_int, default=110_000,
                    help="with --simulate: the mean record size, which sizes blocks and the shuffle buffer "
                         "(default 110000, ImageNet's)")
    pl.add_argument("--shards", nargs="+", help="shard paths or globs relative to the mounts (default: all record "
                                                "files under them)")
    pl.add_argument("--policy", default="rank", choices=sorted(ASSIGNMENTS), help="how ranks get mounts")
    pl.add_argument("--mounts-per-rank", type=positive_int, default=1, help="mounts one rank reads at once")
    pl.add_argument("--throughput", type=parse_throughput, metavar="T1,T2,...",
                    help="per-mount throughput, comma-separated, for --policy weighted")
    pl.add_argument("--local-size", type=positive_int, help="ranks per host (default: all on one host)")
    pl.add_argument("--workers", type=positive_int, default=1, help="DataLoader workers per rank")
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--epoch", type=int, default=0)
    pl.add_argument("--shuffle", default="block", choices=sorted(SHUFFLES),
                    help="record shuffle (default: block, Dataset's default)")
    pl.add_argument("--no-shard-shuffle", action="store_true", help="keep shards in path order")
    pl.add_argument("--remainder", choices=sorted(REMAINDERS),
                    help="what happens to the records that do not divide evenly (default: pad)")
    pl.add_argument("--batch-size", type=positive_int, default=1)
    pl.add_argument("--json", nargs="?", const="-", metavar="FILE",
                    help="the plan as JSON, to FILE or (without one) instead of the text: every consumer's "
                         "reads (path, byte range, records, mount), as Dataset performs them")


def main(argv: Optional[List[str]] = None) -> int:
    """Runs one command. Bad input or settings: one line on stderr, exit 2 (``dlstore._console``)."""

    args = build_parser().parse_args(argv)
    return _console.run(f"dlstore {args.command}", lambda: COMMANDS[args.command](args))


if __name__ == "__main__":
    sys.exit(main())
