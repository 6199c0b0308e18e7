"""The read plan: records grouped into large reads that start on 4096-byte boundaries, where each record lies
in its read's buffer, and the index arithmetic of a gather (pure numpy); :func:`file_plan`, the plan of whole
files from their indexes; :func:`frame_problem`, what a frame status means."""
from __future__ import annotations

import os
from typing import Sequence, Tuple

import numpy as np

from dlstore.errors import DlstoreError
from dlstore.io.gds.kernels import FRAME_DATA_CRC, FRAME_LENGTH, FRAME_LENGTH_CRC
from dlstore.sources.indexing import find_index

__all__ = ["ALIGN", "ReadPlan", "plan_reads", "frame_positions", "packed_offsets", "byte_indices", "frame_problem",
           "file_plan"]


#: Reads start on this boundary: cuFile reads GPU pages of 4 KiB, and O_DIRECT needs the block size.
ALIGN = 4096


class ReadPlan:
    """Reads of a plan: read ``k`` takes ``[start[k], stop[k])`` of file ``file[k]``, and holds the
    plan's records ``first[k] .. first[k] + count[k] - 1``."""

    __slots__ = ("file", "start", "stop", "first", "count")

    def __init__(self, file: np.ndarray, start: np.ndarray, stop: np.ndarray, first: np.ndarray, count: np.ndarray):
        self.file, self.start, self.stop, self.first, self.count = file, start, stop, first, count

    def __len__(self) -> int:
        return len(self.file)

    @property
    def max_bytes(self) -> int:
        """The largest read: the buffer size a read needs."""
        return int((self.stop - self.start).max()) if len(self) else 0


def plan_reads(file: np.ndarray, offset: np.ndarray, size: np.ndarray, file_sizes: Sequence[int],
               chunk_size: int, align: int = ALIGN) -> ReadPlan:
    """Groups records into reads of about ``chunk_size`` bytes, each starting on an ``align`` boundary.

    Records join a read while they follow each other in the same file; a read takes the records
    starting within ``chunk_size`` bytes of its first one's aligned start, so it covers at most
    ``chunk_size`` plus one record. Its end is rounded up to ``align`` but not past the file's end.

    Parameters
    ----------
    file, offset, size : numpy.ndarray
        Per record, in read order: file index, frame offset and frame size (header and footer included).
    file_sizes : sequence of int
        Bytes per file.
    chunk_size : int
    align : int
        A power of two.
    """
    file = np.asarray(file, dtype=np.int64)
    offset = np.asarray(offset, dtype=np.int64)
    size = np.asarray(size, dtype=np.int64)
    n = len(file)
    if n == 0:
        e = np.zeros(0, dtype=np.int64)
        return ReadPlan(e, e, e, e, e)
    if chunk_size < align:
        raise ValueError(f"chunk_size {chunk_size} is below the {align}-byte alignment of gds reads")
    mask = ~np.int64(align - 1)
    # Runs: records that follow each other in one file.
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = (file[1:] != file[:-1]) | (offset[1:] != offset[:-1] + size[:-1])
    run_id = np.cumsum(new_run) - 1
    run_start = (offset[new_run] & mask)[run_id]
    # Within a run, the chunk_size window a record starts in.
    window = (offset - run_start) // chunk_size
    new_read = new_run.copy()
    new_read[1:] |= window[1:] != window[:-1]
    first = np.flatnonzero(new_read).astype(np.int64)
    last = np.append(first[1:], n) - 1
    sizes = np.asarray(file_sizes, dtype=np.int64)
    rfile = file[first]
    start = offset[first] & mask
    stop = np.minimum((offset[last] + size[last] + align - 1) & mask, sizes[rfile])
    return ReadPlan(rfile, start, stop, first, last - first + 1)


def frame_positions(plan: ReadPlan, k: int, offset: np.ndarray) -> np.ndarray:
    """Where each frame of read ``k`` starts in its buffer (int64)."""
    a, b = int(plan.first[k]), int(plan.first[k] + plan.count[k])
    return np.asarray(offset[a:b], dtype=np.int64) - int(plan.start[k])


def packed_offsets(lengths: np.ndarray) -> np.ndarray:
    """Where each record starts when the records are packed one after the other (int64)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=out[1:])
    return out


def byte_indices(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The byte indices of ranges ``[starts[r], starts[r] + lengths[r])``, one range after the other:
    the bytes :data:`GATHER_KERNEL` copies for those records, as one numpy index."""
    starts, lengths = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    return np.repeat(starts - packed_offsets(lengths), lengths) + np.arange(int(lengths.sum()), dtype=np.int64)


def frame_problem(status: int, length_in_index: int) -> str:
    """What a frame status code means, for the error message: the host engines' words (the device brings back
    a status byte, not the stored and computed CRCs they also print)."""
    if status == FRAME_LENGTH:
        return f"record length differs from the index's frame size ({length_in_index} bytes of payload expected)"
    if status == FRAME_LENGTH_CRC:
        return "bad length CRC"
    if status == FRAME_DATA_CRC:
        return f"bad data CRC in a record of {length_in_index} bytes"
    return f"unknown frame status {status}"


def file_plan(paths: Sequence[str]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The read plan of whole files in order, from their indexes: ``(file, offset, size)``.

    Raises
    ------
    DlstoreError
        When a file has no valid index (gds locates records from the index rather than by reading
        the file on the host first): the message says to build one.
    """

    files, offsets, sizes = [], [], []
    for i, path in enumerate(paths):
        found, offs, why = find_index(path, "tfrecord")
        if offs is None:
            raise DlstoreError(f"{path}: io='gds' locates records from the index, and "
                               f"{'its index ' + found + ' is refused: ' + why if found else 'it has none'}; "
                               f"build one with `dlstore index {path}`", path=path)
        offs = np.asarray(offs, dtype=np.int64)
        size = np.diff(np.append(offs, os.path.getsize(path)))
        files.append(np.full(len(offs), i, dtype=np.int64))
        offsets.append(offs)
        sizes.append(size)
    if not files:
        return (np.zeros(0, dtype=np.int64),) * 3
    return np.concatenate(files), np.concatenate(offsets), np.concatenate(sizes)
