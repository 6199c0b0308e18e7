"""Reading record ranges of shards from mount points, failing over to a replica mount on an I/O error.

A :class:`ReadPiece` is a run of records of one shard (``start`` .. ``stop``, from the shard's
index) with the places it can be read from, best first. :class:`PieceReader` streams the pieces
through one C++ reader; when a read fails (EIO, ESTALE, a vanished file, a read past the timeout),
it restarts at the first record not yet handed out, on the piece's next replica, so no record is
lost or repeated. Without a replica it retries the same place a bounded number of times, then
raises an error naming the mount, the file and the offset.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from dlstore.errors import DlstoreIOError

__all__ = ["Place", "ReadPiece", "PieceReader", "FailoverStats"]


@dataclass(frozen=True)
class Place:
    """Where a shard can be read: the mount point and the file's full path under it."""

    mount: str
    path: str


@dataclass(frozen=True)
class ReadPiece:
    """Records ``start`` .. ``stop`` (exclusive) of a shard, and where to read them.

    Attributes
    ----------
    shard : int
        The shard's number in the dataset (for reports).
    start, stop : int
        Record numbers within the shard.
    frame_offsets : numpy.ndarray
        Byte offset of each record's frame from ``start`` to ``stop`` inclusive: the last entry is
        where the piece ends (the next frame, or the file's size).
    places : tuple of Place
        The primary place first, then replicas in the order to fail over to.
    """

    shard: int
    start: int
    stop: int
    frame_offsets: np.ndarray = field(repr=False, compare=False)
    places: Tuple[Place, ...]

    @property
    def num_records(self) -> int:
        return self.stop - self.start

    def byte_range(self, first: int = 0) -> Tuple[int, int]:
        """The bytes of the piece's records from its ``first``-th record to its end."""
        return int(self.frame_offsets[first]), int(self.frame_offsets[self.num_records])


@dataclass
class FailoverStats:
    """Counts a pass keeps: reads restarted on a replica, retries in place, and why."""

    failovers: int = 0
    retries: int = 0
    events: List[str] = field(default_factory=list)
    failed_mounts: List[str] = field(default_factory=list)

    def as_dict(self) -> Dict[str, object]:
        return {"failovers": self.failovers, "retries": self.retries, "failover_events": list(self.events),
                "failed_mounts": list(self.failed_mounts)}


class PieceReader:
    """Streams the records of ``pieces`` in order, through one C++ reader at a time.

    Parameters
    ----------
    pieces : sequence of ReadPiece
    make_core : callable
        ``make_core(paths, ranges)`` returns a started ``_C.Reader`` over those (path, byte range)
        entries; the caller fixes the format, engine and its options.
    max_retries : int
        Attempts at one place, after the first, before giving up on it when no replica is left.
    retry_delay : float
        Seconds before the first retry; doubled for each further one.
    """

    def __init__(self, pieces: Sequence[ReadPiece], make_core, *, max_retries: int = 2, retry_delay: float = 0.2):
        self.pieces = list(pieces)
        self._make_core = make_core
        self.max_retries = max_retries
        self.retry_delay = retry_delay
        self.stats = FailoverStats()
        self.core_stats: Dict[str, int] = {}

    def _place_for(self, piece: ReadPiece, tried: Dict[int, int]) -> Optional[Place]:
        # The first place not yet failed in this pass; a place that failed may be retried up to
        # max_retries times, but only when every replica has failed too.
        for place in piece.places:
            if place.mount not in self.stats.failed_mounts:  # later pieces avoid a mount that failed
                return place
        for i, place in enumerate(piece.places):
            if tried.get(i, 0) <= self.max_retries:
                return place
        return None

    def batches(self, first_piece: int = 0, first_record: int = 0) -> Iterator:
        """Yields RecordBatches of the pieces from record ``first_record`` of piece ``first_piece`` on."""
        pos_piece, pos_record = first_piece, first_record
        tries: Dict[int, Dict[int, int]] = {}  # piece -> place index -> failed attempts
        while True:
            while pos_piece < len(self.pieces) and pos_record >= self.pieces[pos_piece].num_records:
                pos_piece, pos_record = pos_piece + 1, 0
            if pos_piece >= len(self.pieces):
                return
            chosen: List[Place] = []
            for k in range(pos_piece, len(self.pieces)):
                place = self._place_for(self.pieces[k], tries.get(k, {}))
                if place is None:
                    raise self._gave_up(k, pos_record if k == pos_piece else 0)
                chosen.append(place)
            ranges = [self.pieces[pos_piece].byte_range(pos_record)]
            ranges += [p.byte_range() for p in self.pieces[pos_piece + 1:]]
            base = pos_piece
            core = None
            try:
                core = self._make_core([p.path for p in chosen], ranges)
                while True:
                    batch = core.next_batch()
                    if batch is None:
                        break
                    k = base + batch.file_index
                    if k != pos_piece:  # the reader moved on to a later piece
                        pos_piece, pos_record = k, 0
                    pos_record += batch.num_records
                    yield batch
                self._add_core_stats(core)
                return
            except DlstoreIOError as e:
                if core is not None:
                    self._add_core_stats(core)
                core = None  # its files and buffers go before the next attempt
                while pos_piece < len(self.pieces) and pos_record >= self.pieces[pos_piece].num_records:
                    pos_piece, pos_record = pos_piece + 1, 0
                k = self._piece_of(e, base, chosen, pos_piece)
                place = chosen[k - base]
                piece = self.pieces[k]
                index = piece.places.index(place)
                attempts = tries.setdefault(k, {})
                attempts[index] = attempts.get(index, 0) + 1
                if place.mount not in self.stats.failed_mounts:
                    self.stats.failed_mounts.append(place.mount)
                nxt = self._place_for(piece, attempts)
                at = f"record {pos_record + piece.start if k == pos_piece else piece.start} of shard {piece.shard}"
                if nxt is None:
                    raise self._gave_up(k, pos_record if k == pos_piece else 0, e) from e
                if nxt.mount != place.mount:
                    self.stats.failovers += 1
                    self.stats.events.append(f"{place.mount} -> {nxt.mount} at {at}: {e}")
                else:
                    self.stats.retries += 1
                    self.stats.events.append(f"retry {attempts[index]} on {place.mount} at {at}: {e}")
                    time.sleep(self.retry_delay * (2 ** (attempts[index] - 1)))

    def _piece_of(self, err: DlstoreIOError, base: int, chosen: List[Place], pos_piece: int) -> int:
        # Errors arrive in file order after every record before them, so the failing read belongs
        # to the first piece not fully delivered; the error's path confirms it when it names one.
        if err.path:
            for k in range(pos_piece, base + len(chosen)):
                if os.path.abspath(chosen[k - base].path) == os.path.abspath(err.path):
                    return k
        return min(pos_piece, base + len(chosen) - 1)

    def _gave_up(self, k: int, record: int, cause: Optional[BaseException] = None) -> DlstoreIOError:
        piece = self.pieces[k]
        offset = int(piece.frame_offsets[min(record, piece.num_records)])
        last = piece.places[-1]
        places = ", ".join(f"{p.mount} ({p.path})" for p in piece.places)
        why = f": {cause}" if cause is not None else ""
        return DlstoreIOError(
            f"{last.path}: at byte {offset}: cannot read record {piece.start + record} of shard {piece.shard} "
            f"from any of its {len(piece.places)} mount(s) [{places}] after {self.max_retries} retries "
            f"each{why}", path=last.path, offset=offset)

    def _add_core_stats(self, core) -> None:
        for key, value in core.stats().items():
            self.core_stats[key] = self.core_stats.get(key, 0) + int(value)
