"""Finding which mount points hold which shards, and how many records each shard has.

The one part of placement that touches the file system: it builds the
:class:`~dlstore.placement.mounts.Layout` that the pure planning functions take.
"""
from __future__ import annotations

import glob
import os
import warnings
from typing import Dict, Iterator, List, Optional, Sequence, Tuple


from dlstore.errors import DlstoreIOError, PlacementError
from dlstore.placement.mounts import Layout
from dlstore.sources.reader import _glob_record_files, _is_record_file_name

__all__ = ["scan_layout", "check_mounts"]

_GLOB_CHARS = "*?["


def _record_files_under(mount: str) -> Iterator[str]:
    """Relative paths of the record files under ``mount``, recursively (indexes, metadata, hidden
    and temporary files left out, as when a directory is read), as the walk finds them."""

    for root, dirs, names in os.walk(mount):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            full = os.path.join(root, name)
            if _is_record_file_name(name) and os.path.isfile(full):
                yield os.path.relpath(full, mount)


def _files_under(mount: str) -> List[str]:
    return list(_record_files_under(mount))


def _matches(mount: str, pattern: str) -> List[str]:
    """Record files matching ``pattern`` under ``mount`` (a glob such as ``train-*`` also matches the
    shards' ``.idx`` files, which are left out as everywhere paths are expanded)."""

    found, _ = _glob_record_files(os.path.join(glob.escape(mount), pattern))
    return [os.path.relpath(f, mount) for f in found]


def check_mounts(mounts: Sequence[str]) -> None:
    """Raises a PlacementError when a mount point is not a directory, or two name the same directory
    (``m0`` and ``m0/``, or a bind mount): read as two replicas, one would fail over to the storage that
    failed, and a scrub would count every copy twice."""
    seen: Dict[Tuple[int, int], str] = {}
    for m in mounts:
        if not os.path.isdir(m):
            raise PlacementError(f"mount point {m} is not a directory", path=m)
        st = os.stat(m)
        if (st.st_dev, st.st_ino) in seen:
            raise PlacementError(f"mount points {seen[st.st_dev, st.st_ino]} and {m} are the same directory: give "
                                 f"each mount once", path=m)
        seen[st.st_dev, st.st_ino] = m


def scan_layout(mounts: Sequence[str], shards: Optional[Sequence[str]] = None) -> Layout:
    """Which of ``mounts`` hold which shards.

    Parameters
    ----------
    mounts : sequence of str
        Mount point directories (the dataset's root on each).
    shards : sequence of str, optional
        Shard paths relative to a mount, or globs (``train/*.tfrecord``, ``**/*.rec``). By default,
        every record file found under any mount. Globs and directory walks leave out what is not
        a record file (indexes, metadata, hidden and temporary files); a path named exactly is kept.

    Returns
    -------
    Layout
        Shards sorted by relative path, with their sizes; a shard is held by a mount that has a
        file at the same relative path.

    Raises
    ------
    PlacementError
        When a mount is not a directory, a named shard is on no mount, a glob matches nothing on
        any mount, there are no shards at all, or the same shard has different sizes on two mounts
        (both files and sizes named).
    """
    mounts = [os.fspath(m) for m in mounts]
    if not mounts:
        raise PlacementError("no mount points given")
    check_mounts(mounts)
    names: List[str] = []
    if shards is None:
        for m in mounts:
            names.extend(_files_under(m))
    else:
        for pattern in shards:
            pattern = os.fspath(pattern)
            if os.path.isabs(pattern):
                raise PlacementError(f"shard {pattern} must be relative to the mount points", path=pattern)
            if any(ch in pattern for ch in _GLOB_CHARS):
                hits = [rel for m in mounts for rel in _matches(m, pattern)]
                if not hits:
                    raise PlacementError(f"no record file matches {pattern!r} on any mount ({', '.join(mounts)})",
                                         path=pattern)
                names.extend(hits)
            else:
                names.append(os.path.normpath(pattern))
    names = sorted(set(names))
    if not names:
        raise PlacementError(f"no record files under {', '.join(mounts)}")
    holders: List[Tuple[int, ...]] = []
    sizes: List[int] = []
    for rel in names:
        held: List[int] = []
        seen: Dict[int, str] = {}
        for i, m in enumerate(mounts):
            full = os.path.join(m, rel)
            try:
                size = os.stat(full).st_size
            except FileNotFoundError:
                continue
            except OSError as e:
                raise DlstoreIOError(f"{full}: cannot stat: {e.strerror} (errno {e.errno})", path=full) from e
            if not os.path.isfile(full):
                continue
            if seen and size not in seen:
                other_size, other = next(iter(seen.items()))
                raise PlacementError(f"shard {rel} differs between mounts: {other} has {other_size} bytes, "
                                     f"{full} has {size}", path=full)
            seen.setdefault(size, full)
            held.append(i)
        if not held:
            raise PlacementError(f"shard {rel} is on no mount (looked in {', '.join(mounts)})", path=rel)
        holders.append(tuple(held))
        sizes.append(next(iter(seen)))
    # A mount with no record file at all is most likely a mount point with nothing mounted on it: its ranks
    # read from the others, but say so. (One without the shards asked for, but with others, is a choice.)
    empty = [m for i, m in enumerate(mounts)
             if not any(i in held for held in holders) and next(_record_files_under(m), None) is None]
    if empty:
        warnings.warn(f"{'mounts' if len(empty) > 1 else 'mount'} {', '.join(empty)} "
                      f"{'hold' if len(empty) > 1 else 'holds'} no record files (nothing mounted there?): the ranks "
                      f"given {'them' if len(empty) > 1 else 'it'} read the {len(names)} shards from the other "
                      f"mounts", RuntimeWarning, stacklevel=2)
    return Layout(tuple(mounts), tuple(names), tuple(holders), tuple(sizes))
