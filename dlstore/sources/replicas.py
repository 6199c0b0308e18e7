"""Reading around a corrupt copy: which record of a read plan a frame or CRC error names, and what
becomes of it when other mounts hold the same shard.

A :class:`~dlstore.Dataset` over replica mounts runs its reader with ``on_error="raise"``. When a
record fails its check, :func:`locate` finds it in the plan from the error's file and offset; the copy
is marked bad in the pass's :class:`~dlstore.io.failover.MountHealth`, reported once
(:class:`CopyReports`), and the plan restarts at the batch under way with the shard read from another
holder (so the batches are those of a clean read). Only when no holder has the record good does the
dataset's own ``on_error`` apply: ``raise`` raises naming every copy, ``skip`` and ``warn`` leave the
record out (the plan restarts just after it, so it is neither read again nor lost).
"""
from __future__ import annotations

import warnings
from typing import Optional, Sequence, Set, Tuple

import numpy as np

__all__ = ["locate", "emission_index", "CopyReports", "bad_copy_line", "no_good_copy_message"]


def locate(paths: Sequence[str], file: np.ndarray, offset: np.ndarray, size: np.ndarray, path: Optional[str],
           at: Optional[int]) -> Optional[int]:
    """The read position of the plan's record of ``path`` whose frame holds byte ``at``, or None.

    ``paths``, ``file``, ``offset`` and ``size`` are a read plan's (per read position: its file, frame
    offset and frame size).
    """
    if path is None or at is None or path not in paths:
        return None
    index = list(paths).index(path)
    hit = np.flatnonzero((file == index) & (offset <= at) & (offset + size > at))
    return int(hit[0]) if len(hit) else None


def emission_index(emit: Optional[np.ndarray], read_position: int) -> int:
    """Where read position ``read_position`` is handed out in the plan (its emission index)."""
    if emit is None:
        return read_position
    return int(np.flatnonzero(emit == read_position)[0])


class CopyReports:
    """Warns of each bad copy once over a dataset's life (a copy found bad again in a later epoch, or by
    another pass, is counted in that pass's stats but not warned of again)."""

    def __init__(self) -> None:
        self._seen: Set[Tuple[str, int]] = set()

    def report(self, line: str, path: str, offset: int, instead: Optional[str], stacklevel: int) -> None:
        """Warns (``RuntimeWarning``) of the bad copy ``line`` (:func:`bad_copy_line`) the first time
        ``path`` is found bad at ``offset``; ``instead``: the mount the record is read from now."""
        if (path, offset) not in self._seen:
            self._seen.add((path, offset))
            then = f"; read from {instead} instead" if instead else "; no other mount holds it good"
            warnings.warn(f"bad copy on mount {line}{then}", RuntimeWarning, stacklevel=stacklevel)


def bad_copy_line(mount: str, path: str, offset: int, what: str) -> str:
    """One bad copy in a line, as the stats and the warning give it: ``<mount>: <file>: at byte N: what``."""
    return f"{mount}: {path}: at byte {offset}: {what}"


def no_good_copy_message(path: str, offset: int, what: str, record: int, shard: int,
                         bad: Sequence[Tuple[str, str]], unreadable: Sequence[str]) -> str:
    """The message of a record no copy can be read good from: the last copy read, the copies found bad
    (mount, file), and the mounts whose copy could not be read."""
    where = ", ".join(f"{m} ({p})" for m, p in bad)
    if not unreadable:
        return (f"{path}: at byte {offset}: {what}; record {record} of shard {shard} is bad on every mount "
                f"holding it [{where}]")
    return (f"{path}: at byte {offset}: {what}; record {record} of shard {shard} has no good copy that can "
            f"be read: bad on [{where}]; the copies on {', '.join(unreadable)} could not be read")
