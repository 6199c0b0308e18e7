"""``dlstore <command>``: gen, index, verify.

Each command is a function registered in :data:`COMMANDS`; ``main`` parses arguments and dispatches.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Dict, List, Optional

__all__ = ["main", "COMMANDS"]


def _progress(total: int, label: str, unit: str = "B"):
    try:
        from dlstore._progress import Progress
    except ImportError:  # the bar is a nicety; the work does not depend on it
        return None
    return Progress(total=total, desc=label, unit=unit)


def cmd_gen(args: argparse.Namespace) -> int:
    """Writes a synthetic ImageNet-like or BERT dataset."""
    from dlstore import synthetic

    if args.kind == "imagenet":
        paths = synthetic.generate_imagenet(args.out, shards=args.shards, records_per_shard=args.records_per_shard,
                                            seed=args.seed, progress=not args.quiet)
    else:
        paths = synthetic.generate_bert(args.out, shards=args.shards, records_per_shard=args.records_per_shard,
                                        seed=args.seed, seq_len=args.seq_len, progress=not args.quiet)
    size = sum(os.path.getsize(p) for p in paths)
    records = args.shards * args.records_per_shard
    print(f"wrote {len(paths)} shards, {records} records, {size / 1e6:.1f} MB "
          f"(mean record {size / max(records, 1) / 1e3:.1f} KB) to {args.out}")
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    """Builds index files (``offset size`` for TFRecord, ``key<TAB>offset`` for RecordIO)."""
    from dlstore.indexing import build_index
    from dlstore.reader import expand_paths

    files = expand_paths(args.paths)
    for f in files:
        out = os.path.join(args.out_dir, os.path.basename(f) + ".idx") if args.out_dir else None
        dest, n = build_index(f, args.format, out=out)
        print(f"{f}: {n} records -> {dest}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Reads every record, checks framing and CRCs, and lists each corrupt offset. Exit 1 if any."""
    from dlstore.errors import DlstoreError
    from dlstore.reader import expand_paths, open_records

    files = expand_paths(args.paths)
    total = sum(os.path.getsize(f) for f in files)
    bar = None if args.quiet else _progress(total, "verify")
    bad_files, records, problems = 0, 0, 0
    for f in files:
        try:
            reader = open_records(f, format=args.format, io=args.io, on_error="skip")
            stats = reader.count()
            found = reader.corruptions()
            records += stats["records"]
        except (DlstoreError, ValueError) as e:  # unreadable file or unknown format
            found = [(f, getattr(e, "offset", None), str(e))]
        if bar is not None:
            bar.update(os.path.getsize(f))
        if found:
            bad_files += 1
            problems += len(found)
            for path, offset, what in found:
                where = f"at byte {offset}: " if offset is not None and str(offset) not in what[:40] else ""
                msg = what if what.startswith(path) else f"{path}: {where}{what}"
                print(msg, file=sys.stdout, flush=True)
    if bar is not None:
        bar.close()
    verdict = "OK" if not problems else "CORRUPT"
    print(f"{verdict}: {len(files)} files, {records} good records, {problems} corrupt "
          f"{'record' if problems == 1 else 'records'} in {bad_files} {'file' if bad_files == 1 else 'files'}")
    return 1 if problems else 0


COMMANDS: Dict[str, Callable[[argparse.Namespace], int]] = {
    "gen": cmd_gen,
    "index": cmd_index,
    "verify": cmd_verify,
}


def build_parser() -> argparse.ArgumentParser:
    from dlstore import settings

    p = argparse.ArgumentParser(prog="dlstore", description="Storage-aware data loading tools.")
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("gen", help=cmd_gen.__doc__, description=cmd_gen.__doc__)
    g.add_argument("kind", choices=["imagenet", "bert"])
    g.add_argument("--out", required=True, help="output directory")
    g.add_argument("--shards", type=int, default=8)
    g.add_argument("--records-per-shard", type=int, default=128)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--seq-len", type=int, default=128, choices=[128, 384], help="BERT sequence length")
    g.add_argument("--quiet", action="store_true", help="no progress bar")

    i = sub.add_parser("index", help=cmd_index.__doc__, description=cmd_index.__doc__)
    i.add_argument("paths", nargs="+", help="files, globs or directories")
    i.add_argument("--format", default="auto", choices=["auto", "tfrecord", "recordio"])
    i.add_argument("--out-dir", help="write indexes here instead of beside the data")

    v = sub.add_parser("verify", help=cmd_verify.__doc__, description=cmd_verify.__doc__)
    v.add_argument("paths", nargs="+", help="files, globs or directories")
    v.add_argument("--format", default="auto", choices=["auto", "tfrecord", "recordio"])
    v.add_argument("--io", default="auto", help=settings.SETTINGS["io"].help)
    v.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    from dlstore.errors import DlstoreError

    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except DlstoreError as e:
        print(f"dlstore {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
