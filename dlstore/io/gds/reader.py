"""The GPU executor of a read plan: :class:`GdsPlanReader`.

What is read together, what each batch takes, when memory is let go or records are spilled, and what
an error does, is decided by the one C++ schedule (``dlstore._C.ReadSchedule``) that the host engines
run too. This module only carries out its steps on the GPU: a chunk's pieces are read with kvikio's
``CuFile.pread`` into one CuPy buffer (each piece in a 4 KiB-aligned slot, from a 4 KiB-aligned file
offset, as cuFile needs for true GDS), its frames are checked by the frame kernel, and batches not
lying in one buffer are gathered by the gather kernel. Only status bytes come back to the host; the
rare flagged frame is copied back and named by the C++ frame check, in the host engines' words.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from dlstore import _C
from dlstore.errors import GdsUnavailableError
from dlstore.formats.tfrecord import FOOTER_BYTES, HEADER_BYTES
from dlstore.io.cuda import kvikio_backends, kvikio_monitor
from dlstore.io.gds import kernels
from dlstore.io.gds.batch import DeviceBatch, Quarantine
from dlstore.io.system import open_files_budget

__all__ = ["ALIGN", "GdsPlanReader"]

#: cuFile reads whole GPU pages: reads start, and but at a file's end stop, on this boundary.
ALIGN = 4096


def _packed(lengths: np.ndarray) -> np.ndarray:
    """Where each record starts when they are packed one after the other."""
    out = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=out[1:])
    return out


def _wait_rest(issued: List[Tuple[Any, int, str, int]]) -> None:
    """Waits once for each piece in flight: the device must not write into memory let go, nor a file close
    under a read. Their errors are not the one raised."""
    for future, *_ in issued:
        try:
            None if isinstance(future, Exception) else future.get()
        except Exception:  # noqa: BLE001 - the first error was raised
            pass


class GdsPlanReader:
    """An epoch's read plan (per read position: file, frame offset, frame size; and an emission order)
    read into GPU memory, handed out as :class:`DeviceBatch` objects: ``_C.PlanReader``'s interface
    (``next_batch``, ``position``, ``stats``, ``notes``, ``corruptions``), so :class:`dlstore.Dataset` and
    :func:`dlstore.open_records` run it as they run the host reader.

    Parameters
    ----------
    paths : list of str
    file, offset, size, emit : numpy.ndarray
        The plan, as ``_C.PlanReader`` takes it (``emit`` None: read order).
    device : int
        The CUDA device read into.
    mounts : numpy.ndarray, optional
        Per file, its mount among the plan's (chunks do not straddle mounts).
    batch_size, first_batch, chunk_size, depth, hold_bytes, on_error
        As the host reader's (:class:`dlstore.ReadOptions`).
    verify : bool
        Check the length and data CRCs (the length against the index always).
    mode : str
        What :func:`dlstore.io.cuda.gds_verdict` said (``gds`` or ``compat``), until kvikio says per file.
    max_open_files : int, optional
        As the host reader's (so is the cap per chunk); in gds mode half, as kvikio opens each file twice.
    """

    def __init__(self, paths: Sequence[str], file: np.ndarray, offset: np.ndarray, size: np.ndarray,
                 emit: Optional[np.ndarray] = None, *, device: int = 0, mounts: Optional[np.ndarray] = None,
                 batch_size: int, first_batch: int = 0, chunk_size: int, depth: int = 2, hold_bytes: int = 0,
                 verify: bool = True, on_error: str = "raise", mode: str = "gds",
                 max_open_files: Optional[int] = None):
        try:
            import cupy
            import kvikio
        except ImportError as e:
            raise GdsUnavailableError(f"io='gds' needs kvikio and CuPy: {e} (pip install 'dlstore[gpu]')") from e
        self._cp, self._kvikio, self._mode, self._verify = cupy, kvikio, mode, bool(verify)
        self.paths = list(paths)
        self._offset = np.asarray(offset, dtype=np.int64)
        self._size = np.asarray(size, dtype=np.int64)
        self._file = np.asarray(file, dtype=np.int64)
        self._max_open = max(1, int(max_open_files or open_files_budget() // (2 if mode == "gds" else 1)))
        self._sched = _C.ReadSchedule(self.paths, self._file, self._offset, self._size, emit, mounts,
                                      chunk_size=chunk_size, depth=max(1, int(depth)),
                                      batch_size=max(1, int(batch_size)), first_batch=int(first_batch),
                                      hold_bytes=int(hold_bytes), on_error=on_error,
                                      max_chunk_files=max(16, self._max_open // (2 * max(1, int(depth)))))
        self._device = cupy.cuda.Device(int(device))
        with self._device:
            module = cupy.RawModule(code=kernels.CUDA_SOURCE)
            self._frames = module.get_function(kernels.FRAMES_KERNEL_NAME)
            self._gather = module.get_function(kernels.GATHER_KERNEL_NAME)
        self._quarantine = Quarantine(cupy)
        self._monitor = kvikio_monitor()  # kvikio counts by backend what it moves while this lives
        self._handles: "OrderedDict[int, Any]" = OrderedDict()  # least recently used first
        self._file_sizes: Dict[int, int] = {}
        # chunk -> (buffer, per piece (future or its error, bytes, path, offset), positions, frame starts in the
        # buffer, piece of each position, first position of each piece, files held open), from read to arrival
        self._reads: Dict[int, tuple] = {}
        n = len(self._file)
        self._src = np.zeros(n, dtype=np.int64)  # per read position: the buffer its payload is in ...
        self._at = np.zeros(n, dtype=np.int64)   # ... and where in it
        self._buffers: Dict[int, Any] = {}       # chunk number, or a spill's number from num_chunks on
        self._left: Dict[int, int] = {}          # spills: records not handed out yet
        self._next_spill = self._sched.num_chunks
        self._moved = {"payload_bytes": 0, "gathered_batches": 0, "gathered_bytes": 0, "spilled_bytes": 0,
                       "buffers_allocated": 0}

    @property
    def position(self) -> int:
        return self._sched.position

    def __len__(self) -> int:
        return len(self._sched)

    # ---- the schedule's steps ---------------------------------------------------------------------

    def next_batch(self) -> Optional[DeviceBatch]:
        """The next batch (``first_batch``, then ``batch_size`` records; fewer only at the end or before
        an error, which the next call raises); None at the end."""
        while True:
            step = self._sched.next()
            if step is None:
                self.close()
                return None
            kind = step[0]
            if kind == "read":
                self._read(*step[1:])
            elif kind == "wait":
                self._arrive(step[1])
            elif kind == "spill":
                self._spill(step[2])
            elif kind == "release":
                self._buffers.pop(step[1], None)
            else:
                return self._batch(step[1])

    def _alloc(self, nbytes: int) -> Any:
        self._quarantine.purge()
        self._moved["buffers_allocated"] += 1
        with self._device:
            return self._cp.empty(max(1, int(nbytes)), dtype=self._cp.uint8)

    def _handle(self, f: int) -> Any:
        if f not in self._handles:
            self._handles[f] = self._kvikio.CuFile(self.paths[f], "r")
            self._file_sizes[f] = os.fstat(self._handles[f].fileno()).st_size
        self._handles.move_to_end(f)
        return self._handles[f]

    def _trim(self) -> None:
        """Closes the least recently used files no read in flight holds, down to ``max_open_files``."""
        busy = {f for read in self._reads.values() for f in read[-1]}
        for f in [f for f in self._handles if f not in busy][:max(0, len(self._handles) - self._max_open)]:
            self._handles.pop(f).close()

    def _read(self, chunk: int, file: np.ndarray, start: np.ndarray, end: np.ndarray, first: np.ndarray,
              last: np.ndarray) -> None:
        # Per read position of the chunk: its piece, and (below) where its frame lands in the buffer.
        count = last - first
        piece = np.repeat(np.arange(len(first)), count)
        pos = np.repeat(first - _packed(count), count) + np.arange(int(count.sum()))
        issued: List[Tuple[Any, int, str, int]] = []  # per piece: (future, or the error, bytes asked, path, at)
        opened, failure = len(file), None
        for i, f in enumerate(file.tolist()):  # a file that does not open fails its first piece and those after
            try:
                self._handle(f)
            except Exception as e:  # noqa: BLE001 - kvikio raises RuntimeError, OSError, ValueError...
                opened, failure = i, (e, 0, self.paths[f], -1)
                break
        lo = start[:opened] & ~(ALIGN - 1)
        sizes = np.array([self._file_sizes[f] for f in file[:opened].tolist()], dtype=np.int64)
        # Whole pages, but not past the file's end; never short of a frame's end (a file cut after it was
        # indexed then fails at kvikio's EOF, naming file and offset, rather than reading a short frame).
        hi = np.maximum(end[:opened], np.minimum((end[:opened] + ALIGN - 1) & ~(ALIGN - 1), sizes))
        slot = _packed((hi - lo + ALIGN - 1) & ~(ALIGN - 1))
        buf = self._alloc(int(slot[-1] + hi[-1] - lo[-1])) if opened else None
        with self._device:
            # The buffer may be memory CuPy took back from one a queued kernel still reads, and a pread
            # is not ordered on CuPy's stream: wait for the stream first.
            self._cp.cuda.get_current_stream().synchronize()
            for i in range(opened):
                path, n, at = self.paths[int(file[i])], int(hi[i] - lo[i]), int(lo[i])
                try:
                    issued.append((self._handles[int(file[i])].pread(buf[int(slot[i]):int(slot[i]) + n], n, at),
                                   n, path, at))
                except Exception as e:  # noqa: BLE001 - refused at once: fails when waited on
                    issued.append((e, n, path, at))
                    break
        if failure is not None and len(issued) == opened:
            issued.append(failure)
        shift = np.zeros(len(first), dtype=np.int64)
        shift[:opened] = slot - lo
        self._reads[chunk] = (buf, issued, pos, self._offset[pos] + shift[piece], piece, first, file[:opened].tolist())

    def _arrive(self, chunk: int) -> None:
        buf, issued, pos, rel, piece, first, _ = self._reads.pop(chunk)
        got_bytes, failed, why, path, at = 0, -1, "", "", -1
        for i, (future, n, p, a) in enumerate(issued):
            try:
                if isinstance(future, Exception):
                    raise future
                got = int(future.get())  # each future waited once, as kvikio allows
            except Exception as e:  # noqa: BLE001 - every kvikio error fails over, not only OSError
                doing = f"read failed at byte {a}" if a >= 0 else "cannot open"
                failed, why, path, at = int(first[i]), f"{p}: {doing}: {e}", p, a
                break
            if got < n:
                failed, why, path, at = int(first[i]), (f"{p}: short read at byte {a}: {got} of {n} bytes (the file "
                                                        f"shrank, or the index is stale)"), p, a
                break
            got_bytes += got
        _wait_rest(issued[i + 1:] if failed >= 0 else [])  # pieces after a failed one still write into buf
        self._trim()
        if failed >= 0:  # the pieces read before the failure still count
            keep = piece < i
            pos, rel = pos[keep], rel[keep]
        bad, bad_at, bad_what = self._check(buf, pos, rel)
        self._src[pos], self._at[pos] = chunk, rel + HEADER_BYTES
        if buf is not None:
            self._buffers[chunk] = buf
        self._sched.arrived(chunk, got_bytes, 0 if buf is None else int(buf.nbytes), bad, bad_at, bad_what,
                            failed, why, path, at)

    def _check(self, buf: Any, pos: np.ndarray, rel: np.ndarray) -> Tuple[np.ndarray, np.ndarray, List[str]]:
        """The frames at ``rel`` checked on the device; for each flagged one, its read position, where in
        its file the problem is and what it is (the frame copied back and named by the C++ check)."""
        if not len(pos):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64), []
        cp = self._cp
        with self._device:
            status = cp.empty(len(pos), dtype=cp.uint8)
            grid, block, shared = kernels.frames_launch(len(pos))
            self._frames(grid, block, (buf, cp.asarray(rel), cp.asarray(self._size[pos]), np.int32(len(pos)),
                                       np.int32(self._verify), status), shared_mem=shared)
            flagged = np.flatnonzero(cp.asnumpy(status))
        bad_at, bad_what = [], []
        for i in flagged.tolist():
            frame = cp.asnumpy(buf[int(rel[i]):int(rel[i] + self._size[pos[i]])])
            tail = int(self._offset[pos[i]] + self._size[pos[i]]) == self._file_sizes[int(self._file[pos[i]])]
            found = _C.frame_problem(frame, "tfrecord", self._verify, tail)
            what, at = found if found is not None else ("the device's frame check failed", 0)
            bad_at.append(int(self._offset[pos[i]]) + int(at))
            bad_what.append(what)
        return pos[flagged], np.array(bad_at, dtype=np.uint64), bad_what

    def _gather_into(self, pos: np.ndarray) -> Tuple[Any, np.ndarray]:
        """One new buffer holding the payloads of read positions ``pos`` one after the other (one launch)."""
        cp = self._cp
        sources, which = np.unique(self._src[pos], return_inverse=True)
        length = self._size[pos] - HEADER_BYTES - FOOTER_BYTES
        dst_at = _packed(length)
        out = self._alloc(int(length.sum()))
        with self._device:
            pointers = np.array([self._buffers[int(b)].data.ptr for b in sources.tolist()], dtype=np.uint64)
            grid, block, shared = kernels.gather_launch(len(pos))
            self._gather(grid, block, (cp.asarray(pointers), cp.asarray(which.reshape(-1).astype(np.int64)),
                                       cp.asarray(self._at[pos]), cp.asarray(length), cp.asarray(dst_at),
                                       np.int64(len(pos)), out), shared_mem=shared)
        return out, dst_at

    def _spill(self, pos: np.ndarray) -> None:
        out, dst_at = self._gather_into(pos)
        s = self._next_spill
        self._next_spill += 1
        self._buffers[s], self._left[s] = out, len(pos)
        self._src[pos], self._at[pos] = s, dst_at
        self._moved["spilled_bytes"] += int(out.nbytes)

    def _batch(self, pos: np.ndarray) -> DeviceBatch:
        src = self._src[pos]
        length = self._size[pos] - HEADER_BYTES - FOOTER_BYTES
        if (src == src[0]).all():  # a view of the one buffer holding them
            buf, at = self._buffers[int(src[0])], self._at[pos]
        else:
            buf, at = self._gather_into(pos)
            self._moved["gathered_batches"] += 1
            self._moved["gathered_bytes"] += int(length.sum())
        spills, counts = np.unique(src[src >= self._sched.num_chunks], return_counts=True)
        for s, k in zip(spills.tolist(), counts.tolist()):
            self._left[s] -= k
            if not self._left[s]:
                del self._left[s], self._buffers[s]
        self._moved["payload_bytes"] += int(length.sum())
        return DeviceBatch(buf, at, length, self._offset[pos], self._file[pos], self.paths, self._quarantine)

    # ---- what the pass did ------------------------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        """The host reader's counters, with ``gds_mode`` (what kvikio says moved the bytes, where it says),
        ``gds_backend`` and ``crc`` (where the CRC ran)."""
        out = dict(self._sched.stats())
        out.update(self._moved)
        moved = kvikio_backends(self._monitor)
        out.update(gds_mode=moved["gds_mode"] if moved["gds_mode"] not in ("unknown", "none") else self._mode,
                   gds_moved=moved["reason"], gds_backend="kvikio CuFile",
                   crc="GPU (frame kernel)" if self._verify else "off (verify=False; lengths still checked)")
        return out

    def notes(self) -> List[str]:
        return []

    def corruptions(self) -> List[Tuple[str, int, str]]:
        return list(self._sched.corruptions())

    def count_all(self) -> None:
        while self.next_batch() is not None:
            pass

    def close(self) -> None:
        """Waits for reads in flight and closes the files."""
        for _, issued, *_ in self._reads.values():
            _wait_rest(issued)
        self._reads = {}
        for h in self._handles.values():
            h.close()
        self._handles, self._buffers = OrderedDict(), {}

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit
            pass
