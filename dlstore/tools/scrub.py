"""Scrubbing replica mounts: every copy of every shard read with its frames and CRCs checked, the mounts
read at once, each bad copy named with the mounts that hold that record good (``dlstore verify --mounts``).

Each mount is read by one thread, copy after copy, through the C++ reader's counting pass
(:meth:`~dlstore.sources.reader.RecordReader.count`: large reads, CRCs checked on its own threads, no
record handed to Python), so that every mount streams at its disk's speed and no mount's reads crowd
another's.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from dlstore._progress import Progress
from dlstore.errors import DlstoreError, PlacementError
from dlstore.sources.layout import check_mounts, scan_layout
from dlstore.sources.reader import open_records

__all__ = ["BadCopy", "ScrubReport", "scrub_mounts"]


@dataclass
class BadCopy:
    """One bad copy: a corrupt record (``offset`` >= 0) or a copy that cannot be read at all."""

    mount: str
    path: str
    shard: str
    offset: Optional[int]  # the byte the check failed at; None: the copy could not be read
    what: str
    good_on: List[str] = field(default_factory=list)  # mounts whose copy holds that record good

    def line(self) -> str:
        at = f"at byte {self.offset}: " if self.offset is not None else ""
        good = (f"good copy on {', '.join(self.good_on)}" if self.good_on
                else "NO good copy on any mount")
        return f"{self.mount}: {self.path}: {at}{self.what}; {good}"


@dataclass
class ScrubReport:
    """What a scrub found: copies read, records and bytes checked, and each bad copy."""

    mounts: List[str]
    shards: int = 0
    copies: int = 0
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0
    bad: List[BadCopy] = field(default_factory=list)
    unreported: int = 0  # corrupt records counted beyond the reader's detailed reports
    # Shards some mounts hold no copy of, with those mounts: a mixed layout, which a Dataset reads as it is
    # (each such shard from the mounts holding it), so not a bad copy; said, in case a copy went missing.
    missing: List[Tuple[str, List[str]]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.bad and not self.unreported


class _CopyCheck:
    """One copy's result: its corrupt records ``(offset, what)``, how many went unreported, or why
    it could not be read."""

    def __init__(self) -> None:
        self.corrupt: List[Tuple[int, str]] = []
        self.unreported = 0
        self.records = 0
        self.unreadable: Optional[str] = None


def _check_copy(path: str, fmt: str, io: Optional[str]) -> _CopyCheck:
    out = _CopyCheck()
    reader = None
    try:
        reader = open_records(path, format=fmt, io=io, on_error="skip")
        stats = reader.count()
    except (DlstoreError, OSError) as e:
        text = str(e)
        out.unreadable = text[len(path) + 2:] if text.startswith(path + ": ") else text
        if reader is not None:  # the read stopped partway (a broken compressed stream): what it read counts
            out.records = int(reader.stats()["records"])
        return out
    out.records = int(stats["records"])
    out.corrupt = [(int(offset), what) for _, offset, what in reader.corruptions()]
    out.unreported = max(0, int(stats["skipped"]) - len(out.corrupt))
    return out


def _copies(mounts: List[str], shards: Optional[Sequence[str]]) -> Tuple[List[str], List[List[int]]]:
    """The shards (relative paths) and the mounts holding a copy of each. Unlike a dataset's layout,
    copies of different sizes are accepted: a torn copy is one of the bad copies to find. The mounts are
    checked already (check_mounts)."""
    patterns: List[Optional[str]] = list(shards) if shards else [None]
    names = set()
    for pattern in patterns:
        found = False
        for m in mounts:
            try:
                names.update(scan_layout([m], None if pattern is None else [pattern]).shards)
                found = True
            except PlacementError:
                continue  # nothing of it on this mount
        if not found:
            what = f"{pattern!r}" if pattern is not None else "record files"
            raise PlacementError(f"no {what} on any mount ({', '.join(mounts)})", path=pattern)
    ordered = sorted(names)
    return ordered, [[i for i, m in enumerate(mounts) if os.path.isfile(os.path.join(m, rel))] for rel in ordered]


def scrub_mounts(mounts: Sequence[str], shards: Optional[Sequence[str]] = None, *, fmt: str = "auto",
                 io: Optional[str] = None, progress: Optional[bool] = None) -> ScrubReport:
    """Reads every copy of every shard on ``mounts`` and reports each bad one.

    Parameters
    ----------
    mounts : sequence of str
        Mount point directories (the dataset's root on each).
    shards : sequence of str, optional
        Shard paths or globs relative to the mounts; every record file by default.
    fmt : {"auto", "tfrecord", "recordio"}
    io : str, optional
        The engine (``direct`` reads past the page cache); the ``io`` setting by default.
    progress : bool, optional
        A progress bar over the bytes of all copies (by default on a terminal).

    Raises
    ------
    PlacementError
        When a mount is not a directory, two mounts are one directory, or a shard path or glob matches nothing
        on any mount.
    """
    import time

    names = [os.fspath(m) for m in mounts]
    check_mounts(names)
    shard_names, holders_of = _copies(names, shards)
    per_mount: Dict[int, List[int]] = {m: [] for m in range(len(names))}
    for s, holders in enumerate(holders_of):
        for m in holders:
            per_mount[m].append(s)
    sizes = {(s, m): os.path.getsize(os.path.join(names[m], shard_names[s]))
             for s, holders in enumerate(holders_of) for m in holders}
    total = sum(sizes.values())
    results: Dict[Tuple[int, int], _CopyCheck] = {}
    lock = threading.Lock()
    report = ScrubReport(mounts=names)
    start = time.monotonic()
    with Progress(total, "scrub", unit="B", enabled=progress) as bar:
        def read_mount(m: int) -> None:
            for s in per_mount[m]:
                check = _check_copy(os.path.join(names[m], shard_names[s]), fmt, io)
                with lock:
                    results[(s, m)] = check
                    bar.update(sizes[(s, m)])

        with ThreadPoolExecutor(max_workers=max(1, len(names)), thread_name_prefix="dlstore-scrub") as pool:
            for done in [pool.submit(read_mount, m) for m in per_mount if per_mount[m]]:
                done.result()
    report.seconds = time.monotonic() - start
    report.shards = len(shard_names)
    for s, holders in enumerate(holders_of):
        if len(holders) < len(names):
            report.missing.append((shard_names[s], [names[m] for m in range(len(names)) if m not in holders]))
        # A copy whose own check failed is listed by that below; one that reads clean yet differs from the
        # others (cut on a record boundary, another file of the same name) only by this.
        report.bad += [b for b in _disagreeing_copies(names, shard_names[s], holders, sizes, s)
                       if not _failed(results[(s, names.index(b.mount))])]
        for m in holders:
            check = results[(s, m)]
            report.copies += 1
            report.records += check.records
            report.unreported += check.unreported
            report.bytes += sizes[(s, m)]
            path = os.path.join(names[m], shard_names[s])
            if check.unreadable is not None:
                good = [names[o] for o in holders if o != m and results[(s, o)].unreadable is None]
                report.bad.append(BadCopy(names[m], path, shard_names[s], None, check.unreadable, good))
            for offset, what in check.corrupt:
                # Replicas are the same bytes: a record is good on another copy that reads and has no
                # corruption at that offset.
                good = [names[o] for o in holders if o != m and results[(s, o)].unreadable is None
                        and all(at != offset for at, _ in results[(s, o)].corrupt)]
                report.bad.append(BadCopy(names[m], path, shard_names[s], offset, what, good))
    return report


def _failed(check: _CopyCheck) -> bool:
    return check.unreadable is not None or bool(check.corrupt) or check.unreported > 0


def _disagreeing_copies(names: List[str], shard: str, holders: List[int], sizes: Dict[Tuple[int, int], int],
                        s: int) -> List[BadCopy]:
    """The copies of one shard whose size is not the one most of its copies have (the larger of a tie: a torn
    copy is the shorter one). A Dataset refuses mounts whose copies of a shard differ, so each is a bad copy,
    named where it stops agreeing: where a short copy ends, or where a long one runs on."""
    by_size: Dict[int, List[int]] = {}
    for m in holders:
        by_size.setdefault(sizes[(s, m)], []).append(m)
    if len(by_size) < 2:
        return []
    agreed = max(by_size, key=lambda n: (len(by_size[n]), n))
    good = [names[m] for m in by_size[agreed]]
    out = []
    for size, mounts in sorted(by_size.items()):
        if size == agreed:
            continue
        what = (f"the copy holds {size} bytes where {', '.join(good)} "
                f"{'holds' if len(good) == 1 else 'hold'} {agreed}: "
                + ("cut short (torn), or another file" if size < agreed else "longer, or another file"))
        out += [BadCopy(names[m], os.path.join(names[m], shard), shard, min(size, agreed), what, good)
                for m in mounts]
    return out
