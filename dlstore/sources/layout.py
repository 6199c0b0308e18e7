"""Finding which mount points hold which shards, and how many records each shard has.

The one part of placement that touches the file system: it builds the
:class:`~dlstore.placement.mounts.Layout` that the pure planning functions take.
"""
from __future__ import annotations

import glob
import os
import stat
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

import numpy as np

from dlstore.errors import DlstoreIOError, PlacementError
from dlstore.io import deadline
from dlstore.placement.mounts import Layout
from dlstore.sources.indexing import read_manifest
from dlstore.sources.reader import (_glob_record_files, list_record_files, record_file_names, refuse_unreadable,
                                    split_glob)

__all__ = ["scan_layout", "check_mounts"]

_GLOB_CHARS = "*?["


def _record_files_under(mount: str, refuse: bool = True) -> Iterator[str]:
    """Relative paths of the record files under ``mount``, recursively (indexes, metadata, hidden
    and temporary files left out, as when a directory is read; links to directories not followed, as
    ``os.walk`` does), as the walk finds them. Each directory's entries say which are files: no ``stat``
    per file. A name that is no file (a dangling link) raises (:func:`refuse_unreadable`) with
    ``refuse``, else is passed over."""

    stack = [""]
    while stack:
        rel = stack.pop()
        odd: List[str] = []
        here = os.path.join(mount, rel) if rel else mount
        names = list_record_files(here, None, odd)
        if refuse:
            refuse_unreadable([os.path.join(here, n) for n in odd])  # as for a glob: not left out in silence
        yield from (os.path.join(rel, n) if rel else n for n in names)
        try:
            with deadline.waiting_on(here, "a listing"), os.scandir(here) as entries:
                subdirs = sorted(e.name for e in entries
                                 if e.is_dir(follow_symlinks=False) and not e.name.startswith("."))
        except OSError:
            subdirs = []
        stack.extend(os.path.join(rel, d) if rel else d for d in reversed(subdirs))


def _matches(mount: str, pattern: str) -> List[str]:
    """Record files matching ``pattern`` under ``mount``, relative to it (a glob such as ``train-*``
    also matches the shards' ``.idx`` files, which are left out as everywhere paths are expanded). A
    glob whose wildcards are in its last part is one listing of one directory, no ``stat`` per file."""

    one = split_glob(os.path.join(mount, pattern))
    if one is not None and one[1] is not None:
        head = os.path.dirname(pattern)  # normalised by scan_layout: "" or "sub/dir"
        odd: List[str] = []
        names = list_record_files(one[0], one[1], odd)
        refuse_unreadable([os.path.join(one[0], n) for n in odd])
        return [os.path.join(head, n) for n in names] if head else names
    found, _ = _glob_record_files(os.path.join(glob.escape(mount), pattern))
    return [os.path.relpath(f, mount) for f in found]


def _listing(mount: str, patterns: Optional[Sequence[str]]) -> List[List[str]]:
    """The shards (relative paths) ``mount`` holds, per pattern: every record file under it (one list),
    or per one of ``patterns`` (paths relative to the mounts, or globs) the files it names there."""
    if patterns is None:
        return [list(_record_files_under(mount))]
    out: List[List[str]] = []
    for pattern in patterns:
        if any(ch in pattern for ch in _GLOB_CHARS):
            out.append(_matches(mount, pattern))
            continue
        full = os.path.join(mount, pattern)
        try:
            out.append([pattern] if stat.S_ISREG(deadline.stat(full).st_mode) else [])
        except FileNotFoundError:
            out.append([])
        except OSError as e:
            raise DlstoreIOError(f"{full}: cannot stat: {e.strerror} (errno {e.errno})", path=full) from e
    return out


def _manifest_listing(directory: str) -> Optional[bytes]:
    """The record files of ``directory`` as its manifest lists them, while the directory is unchanged
    since (the manifest's stamp is its mtime); None without such a manifest."""
    try:
        _, manifest, _ = read_manifest(directory)
        if manifest is None or manifest.stamp == 0 or deadline.stat(directory).st_mtime_ns != manifest.stamp:
            return None
    except OSError:
        return None
    return bytes(manifest.listing_blob if manifest.listing_blob is not None else manifest.names_blob)


class _Reference:
    """The first mount's listing, per pattern, and what each pattern's directory held by name: what
    another mount's names are held against (:func:`_lists_alike`)."""

    def __init__(self, mount: str, patterns: Optional[Sequence[str]], found: List[List[str]]):
        # Per pattern: the pattern, the shard names, every name of its directory (listed when first needed),
        # and the directory's listing as a current manifest holds it (None without one).
        self.parts: Optional[List[Tuple[str, Set[str], Optional[Set[str]], Optional[bytes]]]] = []
        for pattern, rels in zip(patterns or (), found):
            one = split_glob(os.path.join(mount, pattern))
            head = os.path.dirname(pattern)
            if one is None or one[1] is None:
                self.parts = None
                break
            self.parts.append((pattern, {rel[len(head) + 1:] if head else rel for rel in rels}, None,
                               _manifest_listing(one[0])))
        self.mount = mount
        if patterns is None:
            self.parts = None


def _lists_alike(mount: str, reference: _Reference) -> bool:
    """Whether ``mount`` holds the shards the first mount's listing names and no other record file those
    globs match: from a current manifest listing the first mount's files, else from its directories'
    names (one ``listdir``, no ``stat`` or entry type per file: a name there that is no file, a dangling
    link or a directory, is found by the rank that reads the copy, :meth:`Dataset._check_copies`, or
    fails its read over to another copy). Only for globs in one directory; else False."""
    if reference.parts is None:
        return False
    for k, (pattern, want, every, listed) in enumerate(reference.parts):
        directory = os.path.dirname(os.path.join(mount, pattern))
        # Both directories unchanged since manifests that list the same files (mounts of one export, or
        # replicas whose manifests were copied with them): no listing at all. (A manifest is not stamped
        # while its directory holds a name that is no file.)
        if listed is not None and _manifest_listing(directory or ".") == listed:
            continue
        try:
            with deadline.waiting_on(directory or ".", "a listing"):
                names = set(os.listdir(directory or "."))
            if every is None:  # the first mount's directory by name, once
                first = os.path.dirname(os.path.join(reference.mount, pattern)) or "."
                with deadline.waiting_on(first, "a listing"):
                    every = set(os.listdir(first))
                reference.parts[k] = (pattern, want, every, listed)
        except OSError:
            return False
        if names == every:  # the same names as the first mount's directory: a replica
            continue
        if not want <= names or record_file_names(list(names - want), os.path.basename(pattern)):
            return False
    return True


def check_mounts(mounts: Sequence[str]) -> None:
    """Raises a PlacementError when a mount point is not a directory, or two name the same directory
    (``m0`` and ``m0/``, or a bind mount): read as two replicas, one would fail over to the storage that
    failed, and a scrub would count every copy twice."""
    seen: Dict[Tuple[int, int], str] = {}
    for m in mounts:
        with deadline.waiting_on(m, "a stat of the mount point"):
            try:
                st = os.stat(m)
            except (OSError, ValueError):
                st = None
        if st is None or not stat.S_ISDIR(st.st_mode):
            raise PlacementError(f"mount point {m} is not a directory", path=m)
        if (st.st_dev, st.st_ino) in seen:
            raise PlacementError(f"mount points {seen[st.st_dev, st.st_ino]} and {m} are the same directory: give "
                                 f"each mount once", path=m)
        seen[st.st_dev, st.st_ino] = m


def scan_layout(mounts: Sequence[str], shards: Optional[Sequence[str]] = None,
                first: Optional[List[str]] = None) -> Layout:
    """Which of ``mounts`` hold which shards.

    Parameters
    ----------
    mounts : sequence of str
        Mount point directories (the dataset's root on each).
    shards : sequence of str, optional
        Shard paths relative to a mount, or globs (``train/*.tfrecord``, ``**/*.rec``). By default,
        every record file found under any mount. Globs and directory walks leave out what is not
        a record file (indexes, metadata, hidden and temporary files); a path named exactly is kept.
    first : list of str, optional
        With one glob in ``shards``: what it matches on the first mount (relative paths, sorted), known
        already (the first mount's manifest listing, :func:`~dlstore.sources.indexing.open_shards`).

    Returns
    -------
    Layout
        Shards sorted by relative path; a shard is held by a mount that has a file at the same
        relative path (as the mount's listing says: no file is stat-ed, and sizes are not compared
        here; :class:`~dlstore.Dataset` compares the copies a rank reads with the one indexed).

    Raises
    ------
    PlacementError
        When a mount is not a directory, a named shard is on no mount, a glob matches nothing on
        any mount, or there are no shards at all.
    """
    mounts = [os.fspath(m) for m in mounts]
    if not mounts:
        raise PlacementError("no mount points given")
    check_mounts(mounts)
    patterns: Optional[List[str]] = None
    if shards is not None:
        patterns = []
        for pattern in shards:
            pattern = os.fspath(pattern)
            if os.path.isabs(pattern):
                raise PlacementError(f"shard {pattern} must be relative to the mount points", path=pattern)
            # One spelling (./sub/*, sub/./* and sub//* are sub/*), so that a glob and a path named exactly
            # name one shard alike.
            patterns.append(os.path.normpath(pattern))
    # One listing per mount, the mounts listed side by side (network mounts answer slowly, each alone).
    # Which mounts hold a shard is which listings name it: no file is stat-ed here (a rank checks the
    # copies it reads: Dataset.check_copies).
    first = [list(first)] if first is not None and patterns is not None and len(patterns) == 1 \
        else _listing(mounts[0], patterns)
    reference = _Reference(mounts[0], patterns, first) if len(mounts) > 1 else None
    with ThreadPoolExecutor(max_workers=min(2, len(mounts))) as pool:  # a few listings held at a time
        rest = list(pool.map(deadline.carried(lambda m: None if _lists_alike(m, reference) else _listing(m, patterns)),
                             mounts[1:]))
    per_pattern = [first] + [first if found is None else found for found in rest]
    for p, pattern in enumerate(patterns or ()):
        if not any(found[p] for found in per_pattern):
            if any(ch in pattern for ch in _GLOB_CHARS):
                raise PlacementError(f"no record file matches {pattern!r} on any mount ({', '.join(mounts)})",
                                     path=pattern)
            raise PlacementError(f"shard {pattern} is on no mount (looked in {', '.join(mounts)})", path=pattern)
    flat = [rel for found in first for rel in found]
    listings = [flat if found is None else [rel for part in found for rel in part] for found in [None] + rest]
    del per_pattern, rest
    if not any(listings):
        raise PlacementError(f"no record files under {', '.join(mounts)}")
    if all(listing == listings[0] for listing in listings[1:]):  # every mount lists the same shards
        names = sorted(set(listings[0]))
        everywhere = tuple(range(len(mounts)))
        holders = [everywhere] * len(names)
        held = np.ones((1, len(mounts)), dtype=bool)
    else:
        names = sorted(set().union(*listings))
        row = np.arange(len(names))
        sorted_names = np.array(names)
        held = np.zeros((len(names), len(mounts)), dtype=bool)
        for m, listing in enumerate(listings):
            if listing:
                held[row[np.searchsorted(sorted_names, np.array(listing))], m] = True
        del sorted_names
        # Shards held by the same mounts share one tuple.
        patterns_held, which = np.unique(held, axis=0, return_inverse=True)
        kinds = [tuple(int(m) for m in np.flatnonzero(r)) for r in patterns_held]
        holders = [kinds[k] for k in np.asarray(which).reshape(-1).tolist()]
    del listings
    # A mount with no record file at all is most likely a mount point with nothing mounted on it: its ranks
    # read from the others, but say so. (One without the shards asked for, but with others, is a choice.)
    empty = [m for i, m in enumerate(mounts)
             if not held[:, i].any() and next(_record_files_under(m, refuse=False), None) is None]
    if empty:
        warnings.warn(f"{'mounts' if len(empty) > 1 else 'mount'} {', '.join(empty)} "
                      f"{'hold' if len(empty) > 1 else 'holds'} no record files (nothing mounted there?): the ranks "
                      f"given {'them' if len(empty) > 1 else 'it'} read the {len(names)} shards from the other "
                      f"mounts", RuntimeWarning, stacklevel=2)
    return Layout(tuple(mounts), tuple(names), tuple(holders))
