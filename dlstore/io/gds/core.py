"""The gds engine over files in order: :class:`GdsCore`, with the C++ reader's interface."""
from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from dlstore.errors import CorruptRecordError, DlstoreIOError
from dlstore.io.gds.backends import FailedRead
from dlstore.io.gds.batch import DeviceBatch
from dlstore.io.gds.kernels import FRAME_FOOTER, FRAME_HEADER, FRAME_OK
from dlstore.io.gds.plan import frame_positions, frame_problem, plan_reads

__all__ = ["GdsCore"]


class GdsCore:
    """Reads a plan of TFRecord frames into device buffers, ``depth`` reads in flight; the C++
    reader's interface.

    Parameters
    ----------
    paths : list of str
    file, offset, size : numpy.ndarray
        The plan: per record, in read order (:func:`file_plan` for whole files).
    backend : HostBackend or KvikioBackend
    chunk_size, depth : int
    verify : bool
        Check the length and data CRCs (the length against the index always).
    on_error : {"raise", "skip"}
    file_sizes : sequence of int, optional
        Bytes per file, where the caller knows them (a dataset's index); else each file is stat'ed.
    """

    def __init__(self, paths: Sequence[str], file: np.ndarray, offset: np.ndarray, size: np.ndarray, backend: Any,
                 *, chunk_size: int, depth: int = 2, verify: bool = True, on_error: str = "raise",
                 file_sizes: Optional[Sequence[int]] = None):
        self.paths = list(paths)
        self.offset = np.asarray(offset, dtype=np.int64)
        self.size = np.asarray(size, dtype=np.int64)
        self.backend = backend
        self.verify = bool(verify)
        self.on_error = on_error
        self.depth = max(1, int(depth))
        if file_sizes is None:
            file_sizes = [os.path.getsize(p) for p in self.paths]
        self.plan = plan_reads(file, self.offset, self.size, file_sizes, chunk_size)
        self._next = 0  # the next read to issue
        self._inflight: List[Tuple[int, Any, Any]] = []  # (read, buffer, future)
        self._handles: Dict[int, Any] = {}
        self._corruptions: List[Tuple[str, int, str]] = []
        self._stats = {"records": 0, "bytes": 0, "bytes_read": 0, "skipped": 0, "reads": 0, "buffers_allocated": 0}

    def _handle(self, f: int) -> Any:
        h = self._handles.get(f)
        if h is None:
            try:
                h = self._handles[f] = self.backend.open(self.paths[f])
            except OSError as e:
                raise DlstoreIOError(f"{self.paths[f]}: cannot open: {e.strerror} (errno {e.errno})",
                                     path=self.paths[f]) from e
            except RuntimeError as e:  # kvikio's C++ errors (cuFile, its compat mode) reach Python as these
                raise DlstoreIOError(f"{self.paths[f]}: cannot open: {e}", path=self.paths[f]) from e
        return h

    def _issue(self) -> None:
        while self._next < len(self.plan) and len(self._inflight) < self.depth:
            k = self._next
            self._next += 1
            f, start, stop = int(self.plan.file[k]), int(self.plan.start[k]), int(self.plan.stop[k])
            try:  # a file that does not open fails its read, when that read is waited on
                handle = self._handle(f)
            except DlstoreIOError as e:
                self._inflight.append((k, None, FailedRead(e)))
                continue
            buf = self.backend.alloc(stop - start)
            self._stats["buffers_allocated"] += 1
            try:
                future = self.backend.read(handle, buf, stop - start, start)
            except (OSError, RuntimeError) as e:  # refused at once (kvikio): fails when waited on, as above
                future = FailedRead(DlstoreIOError(f"{self.paths[f]}: read failed at byte {start}: {e}",
                                                   path=self.paths[f], offset=start))
            self._inflight.append((k, buf, future))

    def close(self) -> None:
        """Waits for reads in flight (their buffers must not go while the device writes them) and
        closes the files."""
        for _, _, future in self._inflight:
            try:
                future.get()
            except Exception:  # noqa: BLE001 - closing after an error: the first one was raised
                pass
        self._inflight = []
        for h in self._handles.values():
            self.backend.close(h)
        self._handles = {}

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit
            pass

    def next_read(self) -> Optional[Tuple[int, Any, np.ndarray]]:
        """The next read of the plan, in order, once it has arrived and its frames are checked:
        ``(read, buffer, status)`` with a status byte per record of the read; None after the last.

        Raises
        ------
        DlstoreIOError
            The read's file did not open, or it came back short: the message names file and offset.
        """
        self._issue()
        if not self._inflight:
            self.close()
            return None
        k, buf, future = self._inflight.pop(0)
        self._issue()  # the next read is under way while this one is checked
        f, start, stop = int(self.plan.file[k]), int(self.plan.start[k]), int(self.plan.stop[k])
        path = self.paths[f]
        try:
            got = int(future.get())
        except DlstoreIOError:  # a file that did not open (FailedRead): already named
            raise
        except (OSError, RuntimeError) as e:  # kvikio's read errors: failover reads the file elsewhere
            raise DlstoreIOError(f"{path}: read failed at byte {start}: {e}", path=path, offset=start) from e
        if got != stop - start:
            raise DlstoreIOError(f"{path}: short read at byte {start}: {got} of {stop - start} bytes (the file "
                                 f"shrank, or the index is stale)", path=path, offset=start)
        self._stats["reads"] += 1
        self._stats["bytes_read"] += got
        a, b = int(self.plan.first[k]), int(self.plan.first[k] + self.plan.count[k])
        return k, buf, self.backend.frame_status(buf, frame_positions(self.plan, k, self.offset), self.size[a:b],
                                                 self.verify)

    def next_batch(self) -> Optional[DeviceBatch]:
        while True:
            read = self.next_read()
            if read is None:
                return None
            batch = self._batch_of(*read)
            if batch.num_records:
                return batch

    def _batch_of(self, k: int, buf: Any, status: np.ndarray) -> DeviceBatch:
        f = int(self.plan.file[k])
        path = self.paths[f]
        a, b = int(self.plan.first[k]), int(self.plan.first[k] + self.plan.count[k])
        rel = frame_positions(self.plan, k, self.offset)
        size = self.size[a:b]
        payload = size - FRAME_HEADER - FRAME_FOOTER
        batch = DeviceBatch(buf, rel + FRAME_HEADER, payload, self.offset[a:b], f, self.paths)
        bad = np.flatnonzero(status != FRAME_OK)
        if len(bad):
            if self.on_error == "raise":
                i = int(bad[0])
                raise CorruptRecordError(f"{path}: at byte {int(self.offset[a + i])}: "
                                         f"{frame_problem(int(status[i]), int(payload[i]))}",
                                         path=path, offset=int(self.offset[a + i]))
            for i in bad.tolist():
                self._corruptions.append((path, int(self.offset[a + i]),
                                          frame_problem(int(status[i]), int(payload[i]))))
            self._stats["skipped"] += len(bad)
            batch = batch.take(status == FRAME_OK)
        self._stats["records"] += batch.num_records
        self._stats["bytes"] += batch.nbytes
        return batch

    def count_all(self) -> None:
        while self.next_batch() is not None:
            pass

    def stats(self) -> Dict[str, Any]:
        return dict(self._stats, gds_mode=self.backend.mode, gds_backend=self.backend.name,
                    crc=self.backend.crc_where if self.verify else "off (verify=False; lengths still checked)")

    def notes(self) -> List[str]:
        return []

    def corruptions(self) -> List[Tuple[str, int, str]]:
        return list(self._corruptions)

    def __iter__(self) -> Iterator[DeviceBatch]:
        while True:
            batch = self.next_batch()
            if batch is None:
                return
            yield batch
