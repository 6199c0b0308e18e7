"""An epoch's read plan through the gds engine: :class:`GdsPlanReader`, with the C++ plan reader's interface."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from dlstore.errors import CorruptRecordError, DlstoreError
from dlstore.io.gds.batch import DeviceBatch
from dlstore.io.gds.core import GdsCore
from dlstore.io.gds.kernels import FRAME_FOOTER, FRAME_HEADER, FRAME_OK
from dlstore.io.gds.plan import frame_problem, packed_offsets

__all__ = ["GdsPlanReader"]


class GdsPlanReader:
    """An epoch's read plan through :class:`GdsCore`, handed out in batches of exactly ``batch_size``
    records in emission order: ``_C.PlanReader``'s interface and shape, for :class:`dlstore.Dataset`
    with ``io="gds"``.

    The plan comes in *read* order and is read in that order, in reads of about ``chunk_size``
    (:func:`plan_reads`, ``depth`` in flight), each read's frames checked on the device. Records are
    handed out in ``emit`` order, gathered from the reads held in device memory: a batch whose
    records all lie in one buffer is a view of it, any other is gathered by one launch of
    :data:`GATHER_KERNEL` (``backend.gather``). A read is let go once its records are handed out; while
    the reads held exceed ``hold_bytes`` (a shuffle buffer holds records back), the oldest one's
    remaining records are gathered into a straggler buffer and the read let go.

    Parameters
    ----------
    paths : list of str
    file, offset, size : numpy.ndarray
        Per read position: file index, frame offset and frame size.
    backend : HostBackend or KvikioBackend
    emit : numpy.ndarray, optional
        Read positions in emission order, each at most once (positions left out are not read: a
        resumed plan); None: read order.
    batch_size : int
    first_batch : int
        Records of the first batch (a plan restarted mid-batch); 0: ``batch_size``.
    chunk_size, depth : int
    verify : bool
    on_error : {"raise", "skip"}
        ``raise``: the good records before a corrupt one are handed out (the batch before it may be
        short), then the next call raises :class:`~dlstore.CorruptRecordError` naming file and offset.
        ``skip``: it is left out, listed in ``corruptions()`` and counted in ``position``.
    file_sizes : sequence of int, optional
    hold_bytes : int
        The most bytes of reads held for records not yet handed out (0: no limit); reads in flight
        (``depth``) come on top.
    """

    def __init__(self, paths: Sequence[str], file: np.ndarray, offset: np.ndarray, size: np.ndarray, backend: Any,
                 *, emit: Optional[np.ndarray] = None, batch_size: int, first_batch: int = 0, chunk_size: int,
                 depth: int = 2, verify: bool = True, on_error: str = "raise",
                 file_sizes: Optional[Sequence[int]] = None, hold_bytes: int = 0):
        file, offset, size = (np.asarray(a, dtype=np.int64) for a in (file, offset, size))
        if emit is None:
            self._emit = np.arange(len(file), dtype=np.int64)
        else:  # read only the positions emitted, in read order; emission order over those
            needed = np.sort(np.asarray(emit, dtype=np.int64))
            self._emit = np.searchsorted(needed, emit).astype(np.int64)
            file, offset, size = file[needed], offset[needed], size[needed]
        # The core reports every corrupt record: this reader decides what it does, knowing its position.
        self._core = GdsCore(paths, file, offset, size, backend, chunk_size=chunk_size, depth=depth, verify=verify,
                             on_error="skip", file_sizes=file_sizes)
        plan, n = self._core.plan, len(file)
        self._raise = on_error == "raise"
        self._batch = max(1, int(batch_size))
        self._want = int(first_batch) or self._batch
        self._hold = max(0, int(hold_bytes))
        # Per position: where its payload is (source buffer ``src``: a read k, or a straggler buffer
        # numbered from len(plan) on; byte ``at`` in it) and its frame status once read.
        self._read_of = np.repeat(np.arange(len(plan), dtype=np.int64), plan.count)
        self._src = self._read_of.copy()
        self._at = offset - plan.start[self._read_of] + FRAME_HEADER
        self._length = size - FRAME_HEADER - FRAME_FOOTER
        self._status = np.zeros(n, dtype=np.uint8)
        self._done = np.zeros(n, dtype=bool)
        self._buffers: Dict[int, Any] = {}   # source -> buffer, while it holds records not handed out
        self._left: Dict[int, int] = {}      # source -> its good records not handed out
        self._held: List[int] = []           # reads held, oldest first
        self._held_bytes = 0
        self._arrived = 0                    # reads arrived (in order)
        self._next_straggler = len(plan)
        self._error: Optional[BaseException] = None  # raised once the records before it are handed out
        self._corruptions: List[Tuple[str, int, str]] = []
        self.position = 0        # emission positions consumed: records handed out plus corrupt ones skipped
        self._stats = {"records": 0, "payload_bytes": 0, "gathered_batches": 0, "gathered_bytes": 0,
                       "spilled_records": 0, "spilled_bytes": 0, "peak_held_bytes": 0, "skipped": 0}

    def __len__(self) -> int:
        return len(self._emit)

    # -- reads arriving, held, let go --------------------------------------------------------------

    def _arrive_through(self, read: int) -> None:
        """Reads on until read ``read`` has arrived, or an error stops it (kept in ``_error``)."""
        core = self._core
        while self._arrived <= read and self._error is None:
            try:
                got = core.next_read()
            except DlstoreError as e:  # an open or a short read: hand out what came before, then raise
                self._error = e
                return
            assert got is not None and got[0] == self._arrived, "reads arrive in plan order"
            k, buf, status = got
            self._arrived += 1
            a = int(core.plan.first[k])
            self._status[a:a + len(status)] = status
            good = int(np.count_nonzero(status == FRAME_OK))
            if not good:
                continue
            self._buffers[k], self._left[k] = buf, good
            self._held.append(k)
            self._held_bytes += int(core.plan.stop[k] - core.plan.start[k])
            self._stats["peak_held_bytes"] = max(self._stats["peak_held_bytes"], self._held_bytes)
            # Reads arrive faster than a shuffle buffer's stragglers leave them: past the budget the
            # oldest are let go, their remaining records copied out first.
            while self._hold and self._held_bytes > self._hold and len(self._held) > 1:
                self._spill(self._held[0])

    def _let_go(self, source: int) -> None:
        self._buffers.pop(source, None)
        self._left.pop(source, None)
        if source in self._held:
            self._held.remove(source)
            self._held_bytes -= int(self._core.plan.stop[source] - self._core.plan.start[source])

    def _spill(self, read: int) -> None:
        """Copies the good records of ``read`` not handed out yet into a buffer of their own, and lets
        the read go."""
        a = int(self._core.plan.first[read])
        pos = a + np.flatnonzero(~self._done[a:a + int(self._core.plan.count[read])]
                                 & (self._status[a:a + int(self._core.plan.count[read])] == FRAME_OK))
        if len(pos):
            buf, at = self._gather_into(pos)
            s = self._next_straggler
            self._next_straggler += 1
            self._buffers[s], self._left[s] = buf, len(pos)
            self._src[pos], self._at[pos] = s, at
            self._stats["spilled_records"] += len(pos)
            self._stats["spilled_bytes"] += int(self._length[pos].sum())
        self._let_go(read)

    def _gather_into(self, pos: np.ndarray) -> Tuple[Any, np.ndarray]:
        """One new buffer holding the payloads of positions ``pos`` one after the other (one gather)."""
        sources, src_buf = np.unique(self._src[pos], return_inverse=True)
        length = self._length[pos]
        dst_at = packed_offsets(length)
        backend = self._core.backend
        out = backend.alloc(max(1, int(length.sum())))
        backend.gather(out, [self._buffers[int(b)] for b in sources.tolist()], src_buf.reshape(-1).astype(np.int64),
                       self._at[pos], length, dst_at)
        return out, dst_at

    # -- batches -----------------------------------------------------------------------------------

    def _pick(self) -> np.ndarray:
        """The positions of the next batch, in emission order; corrupt ones skipped or the error kept."""
        picked: List[np.ndarray] = []
        count, n = 0, len(self._emit)
        while count < self._want and self.position < n and self._error is None:
            cand = self._emit[self.position:self.position + self._want - count]
            self._arrive_through(int(self._read_of[cand].max()))
            if self._error is not None:  # the records whose reads arrived before it go out first
                cand = cand[:int(np.argmax(self._read_of[cand] >= self._arrived))]
            bad = self._status[cand] != FRAME_OK
            if bad.any() and self._raise:
                i = int(np.argmax(bad))
                path, offset, what = self._corrupt(int(cand[i]))
                self._error = CorruptRecordError(f"{path}: at byte {offset}: {what}", path=path, offset=offset)
                cand, bad = cand[:i], bad[:i]
            if bad.any():
                self._corruptions += [self._corrupt(p) for p in cand[bad].tolist()]
                self._stats["skipped"] += int(bad.sum())
                self._done[cand[bad]] = True
            picked.append(cand[~bad])
            count += int((~bad).sum())
            self.position += len(cand)
        return np.concatenate(picked) if picked else np.zeros(0, dtype=np.int64)

    def _corrupt(self, p: int) -> Tuple[str, int, str]:
        core = self._core
        path = core.paths[int(core.plan.file[self._read_of[p]])]
        return path, int(core.offset[p]), frame_problem(int(self._status[p]), int(self._length[p]))

    def next_batch(self) -> Optional[DeviceBatch]:
        """The next batch: ``batch_size`` records (``first_batch`` for the first); fewer only at the
        end of the plan or before an error, which the next call raises; None at the end."""
        pos = self._pick()
        if not len(pos):
            if self._error is not None:
                raise self._error
            self.close()
            return None
        self._want = self._batch
        sources, counts = np.unique(self._src[pos], return_counts=True)
        if len(sources) == 1:  # a view of the one buffer holding them
            buf, at = self._buffers[int(sources[0])], self._at[pos]
        else:
            buf, at = self._gather_into(pos)
            self._stats["gathered_batches"] += 1
            self._stats["gathered_bytes"] += int(self._length[pos].sum())
        core = self._core
        file = core.plan.file[self._read_of[pos]]
        batch = DeviceBatch(buf, at, self._length[pos], core.offset[pos], int(file[0]), core.paths, file)
        self._done[pos] = True
        for source, k in zip(sources.tolist(), counts.tolist()):
            self._left[source] -= k
            if not self._left[source]:
                self._let_go(source)
        self._stats["records"] += batch.num_records
        self._stats["payload_bytes"] += batch.nbytes
        return batch

    def stats(self) -> Dict[str, Any]:
        """The C++ plan reader's counters (``records`` handed out, ``file_bytes_read``, ``chunks``:
        reads, ``peak_held_bytes``: the most bytes of reads held at once, ``spilled_records``/``_bytes``:
        copied out of reads let go early, ``gathered_batches``: batches gathered by a kernel ...), with
        ``gds_mode``, ``gds_backend`` and ``crc`` (where the CRC ran)."""
        core = self._core.stats()
        return dict(self._stats, skipped=0 if self._raise else self._stats["skipped"],
                    file_bytes_read=core["bytes_read"], chunks=core["reads"],
                    buffers_allocated=(core["buffers_allocated"] + self._stats["gathered_batches"]
                                       + self._next_straggler - len(self._core.plan)),
                    gds_mode=core["gds_mode"], gds_backend=core["gds_backend"], crc=core["crc"])

    def notes(self) -> List[str]:
        return []

    def corruptions(self) -> List[Tuple[str, int, str]]:
        """``(path, offset, what)`` of each corrupt record skipped (none under ``on_error="raise"``)."""
        return [] if self._raise else list(self._corruptions)

    def close(self) -> None:
        self._buffers, self._left, self._held, self._held_bytes = {}, {}, [], 0
        self._core.close()
