# Over 500 lines: the gds engine, the CUDA kernel it compiles and the host stand-in that runs the same code.
"""``io="gds"``: TFRecord records read straight into GPU memory through kvikio's ``CuFile``.

The engine is written so that everything but the CUDA calls runs anywhere:

- :func:`plan_reads` (pure numpy) groups a read plan (per record: file, frame offset, frame size,
  as the index gives them) into large reads, each starting on a 4096-byte boundary, as cuFile needs
  for true GDS; :func:`frame_positions` says where each record lies in its read's buffer.
- A *device backend* does the rest: opens files, allocates buffers, reads ranges into them, and
  checks each record's frame, returning one status byte per record (:data:`FRAME_OK` ...).
  :class:`KvikioBackend` reads with ``CuFile.pread`` into CuPy buffers and checks frames with a
  small CUDA kernel (:data:`FRAME_KERNEL`: length against the index, then the length and data
  CRC-32C, one thread per record), so only the status bytes come back to the host.
  :class:`HostBackend` is its stand-in: numpy buffers, ``os.preadv``, and the C++ core's CRC-32C.
  Tests run the same :class:`GdsCore` over it.
- :class:`GdsCore` has the C++ reader's interface (``next_batch``, ``count_all``, ``stats``,
  ``notes``, ``corruptions``), so :class:`dlstore.RecordReader` runs it as it runs the C++ core.
- :class:`GdsPlanReader` has the C++ plan reader's (``next_batch``, ``position``, ``stats``,
  ``notes``, ``corruptions``), so :class:`dlstore.Dataset` runs it as it runs ``_C.PlanReader``:
  an epoch's read plan, read in read order in large reads, handed out in emission order in batches
  of exactly ``batch_size``, gathered on the device (:data:`GATHER_KERNEL`, one launch per batch).
  Its batches (:class:`DeviceBatch`) hold the buffer (``buffer``: a CuPy array, which frameworks
  take without a copy through ``__cuda_array_interface__`` or DLPack), and the record ``offsets``
  and ``lengths`` into it as host numpy arrays.

Whether cuFile ran true GDS or a compat mode is :func:`dlstore.io.cuda.gds_verdict`'s, and goes into
``engine_reason`` and ``stats()["gds_mode"]``. NOT YET RUN ON A GPU: see docs/gpu.md.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from dlstore.errors import CorruptRecordError, DlstoreError, DlstoreIOError, GdsUnavailableError
from dlstore.sources.indexing import find_index

__all__ = ["ALIGN", "FRAME_OK", "FRAME_LENGTH", "FRAME_LENGTH_CRC", "FRAME_DATA_CRC", "FRAME_KERNEL", "GATHER_KERNEL",
           "ReadPlan", "plan_reads", "frame_positions", "packed_offsets", "byte_indices", "frame_problem",
           "DeviceBatch", "HostBackend", "KvikioBackend", "GdsCore", "GdsPlanReader", "file_plan", "default_backend"]

#: Reads start on this boundary: cuFile reads GPU pages of 4 KiB, and O_DIRECT needs the block size.
ALIGN = 4096
#: Frame status codes, the same from the CUDA kernel and the host stand-in.
FRAME_OK, FRAME_LENGTH, FRAME_LENGTH_CRC, FRAME_DATA_CRC = 0, 1, 2, 3
_HEADER, _FOOTER = 12, 4  # TFRecord: u64 length + u32 masked CRC of it; u32 masked CRC of the data

# One thread per record; the CRC-32C table is built in shared memory by each block. The device
# functions are plain C so that tests compile the same text for the host (tests/unit/test_gds.py).
FRAME_KERNEL = r"""
DLSTORE_DEVICE void dlstore_crc_table(unsigned int* table, int first, int step) {
  for (int i = first; i < 256; i += step) {
    unsigned int c = (unsigned int)i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    table[i] = c;
  }
}

DLSTORE_DEVICE unsigned int dlstore_masked_crc(const unsigned int* table, const unsigned char* p,
                                               unsigned long long n) {
  unsigned int c = 0xFFFFFFFFu;
  for (unsigned long long i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
  c ^= 0xFFFFFFFFu;
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

DLSTORE_DEVICE unsigned int dlstore_load_u32(const unsigned char* p) {
  return (unsigned int)p[0] | ((unsigned int)p[1] << 8) | ((unsigned int)p[2] << 16) | ((unsigned int)p[3] << 24);
}

/* rel: where each frame starts in buf; size: its frame size from the index. */
DLSTORE_DEVICE unsigned char dlstore_frame_status(const unsigned int* table, const unsigned char* buf,
                                                  long long rel, long long size, int verify) {
  const unsigned char* p = buf + rel;
  unsigned long long len = 0;
  for (int k = 0; k < 8; ++k) len |= (unsigned long long)p[k] << (8 * k);
  if (size < 16 || len != (unsigned long long)(size - 16)) return 1;
  if (!verify) return 0;
  if (dlstore_masked_crc(table, p, 8) != dlstore_load_u32(p + 8)) return 2;
  if (dlstore_masked_crc(table, p + 12, len) != dlstore_load_u32(p + 12 + len)) return 3;
  return 0;
}
"""

# Gathers records from several device buffers into one (a batch in emission order, or a chunk's
# stragglers): record r's bytes [src_at[r], src_at[r] + len[r]) of buffer sources[src_buf[r]] go to
# dst + dst_at[r]. On the GPU a block per record, its threads copying every blockDim.x-th byte; plain C
# too, so that tests compile it for the host (tests/unit/test_gds.py).
GATHER_KERNEL = r"""
DLSTORE_DEVICE void dlstore_copy_record(const unsigned char* const* sources, const long long* src_buf,
                                        const long long* src_at, const long long* len, const long long* dst_at,
                                        unsigned char* dst, long long r, long long first, long long step) {
  const unsigned char* s = sources[src_buf[r]] + src_at[r];
  unsigned char* d = dst + dst_at[r];
  for (long long i = first; i < len[r]; i += step) d[i] = s[i];
}
"""

_CUDA_WRAPPER = r"""
#define DLSTORE_DEVICE __device__
""" + FRAME_KERNEL + GATHER_KERNEL + r"""
extern "C" __global__ void dlstore_tfrecord_frames(const unsigned char* buf, const long long* rel,
                                                   const long long* size, int n, int verify,
                                                   unsigned char* status) {
  __shared__ unsigned int table[256];
  dlstore_crc_table(table, threadIdx.x, blockDim.x);
  __syncthreads();
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < n) status[r] = dlstore_frame_status(table, buf, rel[r], size[r], verify);
}

extern "C" __global__ void dlstore_gather(const unsigned long long* sources, const long long* src_buf,
                                          const long long* src_at, const long long* len, const long long* dst_at,
                                          long long n, unsigned char* dst) {
  for (long long r = blockIdx.x; r < n; r += gridDim.x)
    dlstore_copy_record((const unsigned char* const*)sources, src_buf, src_at, len, dst_at, dst, r,
                        threadIdx.x, blockDim.x);
}
"""


# ---- the plan: pure functions ------------------------------------------------------------------------

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
    """What a frame status code means, for the error message."""
    if status == FRAME_LENGTH:
        return f"record length differs from the index's frame size ({length_in_index} bytes of payload expected)"
    if status == FRAME_LENGTH_CRC:
        return "corrupt record: the length CRC does not match"
    if status == FRAME_DATA_CRC:
        return "corrupt record: the data CRC does not match"
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


# ---- batches ---------------------------------------------------------------------------------------

class DeviceBatch:
    """Records of one read, in one buffer: on the GPU (a CuPy array) or, with the host stand-in, numpy.

    Record ``i`` is ``buffer[offsets[i]:offsets[i] + lengths[i]]``. The buffer goes to any framework
    without a copy: ``torch.from_dlpack(batch)`` or ``cupy.asarray(batch)``.
    """

    def __init__(self, buffer: Any, offsets: np.ndarray, lengths: np.ndarray, file_offsets: np.ndarray,
                 file_index: int, paths: Sequence[str], file_indices: Optional[np.ndarray] = None):
        self.buffer = buffer
        self.offsets, self.lengths, self.file_offsets = offsets, lengths, file_offsets
        # A batch of one read has one file; one gathered from several reads has a file per record.
        self.file_indices = (np.full(len(offsets), int(file_index), dtype=np.int64) if file_indices is None
                             else np.asarray(file_indices, dtype=np.int64))
        self.file_index = int(self.file_indices[0]) if len(self.file_indices) else int(file_index)
        self._paths = paths

    @property
    def num_records(self) -> int:
        return len(self.offsets)

    def __len__(self) -> int:
        return self.num_records

    @property
    def nbytes(self) -> int:
        return int(self.lengths.sum())

    @property
    def on_gpu(self) -> bool:
        return hasattr(self.buffer, "__cuda_array_interface__")

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        if not self.on_gpu:
            raise AttributeError("__cuda_array_interface__: this batch's buffer is in host memory")
        return self.buffer.__cuda_array_interface__

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self.buffer.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self.buffer.__dlpack_device__()

    def path(self, i: int) -> Optional[str]:
        return self._paths[int(self.file_indices[i])] if 0 <= i < self.num_records else None

    def slice(self, start: int, stop: int) -> "DeviceBatch":
        return DeviceBatch(self.buffer, self.offsets[start:stop], self.lengths[start:stop],
                           self.file_offsets[start:stop], self.file_index, self._paths, self.file_indices[start:stop])

    def take(self, keep: np.ndarray) -> "DeviceBatch":
        return DeviceBatch(self.buffer, self.offsets[keep], self.lengths[keep], self.file_offsets[keep],
                           self.file_index, self._paths, self.file_indices[keep])


# ---- device backends --------------------------------------------------------------------------------

class _Done:
    """A finished read, as the host stand-in returns it (kvikio returns an IOFuture)."""

    def __init__(self, n: int):
        self.n = n

    def get(self) -> int:
        return self.n


class _Failed:
    """A read that could not start (its file did not open): waiting on it raises why."""

    def __init__(self, error: BaseException):
        self.error = error

    def get(self) -> int:
        raise self.error


class HostBackend:
    """The stand-in for the GPU: numpy buffers, ``os.preadv``, and the C++ core's CRC-32C.

    It runs :class:`GdsCore`'s code path where there is no GPU (CI). Its frame checks loop over
    records in Python, calling the C++ CRC per record: it is a test stand-in, not a fast path.
    """

    name = "host stand-in"
    crc_where = "host (stand-in: C++ CRC-32C per record)"

    def __init__(self, mode: str = "host", reason: str = "host stand-in: numpy buffers and os.preadv, no GPU"):
        self.mode, self.reason = mode, reason

    def open(self, path: str) -> int:
        return os.open(path, os.O_RDONLY)

    def close(self, handle: int) -> None:
        os.close(handle)

    def alloc(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, dtype=np.uint8)

    def gather(self, dst: np.ndarray, sources: Sequence[np.ndarray], src_buf: np.ndarray, src_at: np.ndarray,
               length: np.ndarray, dst_at: np.ndarray) -> None:
        """What :data:`GATHER_KERNEL` does: record ``r``'s ``length[r]`` bytes at ``src_at[r]`` of
        ``sources[src_buf[r]]`` go to ``dst`` at ``dst_at[r]``; one indexed copy per source buffer."""
        for b in np.unique(src_buf).tolist():
            mine = src_buf == b
            dst[byte_indices(dst_at[mine], length[mine])] = sources[b][byte_indices(src_at[mine], length[mine])]

    def read(self, handle: int, buf: np.ndarray, size: int, file_offset: int) -> _Done:
        done = 0
        while done < size:  # a short read is retried until EOF
            n = os.preadv(handle, [memoryview(buf[done:size])], file_offset + done)
            if n == 0:
                break
            done += n
        return _Done(done)

    def frame_status(self, buf: np.ndarray, rel: np.ndarray, size: np.ndarray, verify: bool) -> np.ndarray:
        from dlstore import _C

        status = np.zeros(len(rel), dtype=np.uint8)
        view = memoryview(buf)
        for i, (r, s) in enumerate(zip(rel.tolist(), size.tolist())):
            length = int.from_bytes(view[r:r + 8], "little")
            if s < 16 or length != s - 16:
                status[i] = FRAME_LENGTH
            elif verify and _C.masked_crc32c(view[r:r + 8]) != int.from_bytes(view[r + 8:r + 12], "little"):
                status[i] = FRAME_LENGTH_CRC
            elif verify and (_C.masked_crc32c(view[r + 12:r + 12 + length])
                             != int.from_bytes(view[r + 12 + length:r + 16 + length], "little")):
                status[i] = FRAME_DATA_CRC
        return status


class KvikioBackend:
    """Reads with kvikio's ``CuFile.pread`` into CuPy buffers on device ``device``, and checks frames
    with :data:`FRAME_KERNEL` on the GPU. NOT YET RUN ON A GPU (docs/gpu.md).

    Parameters
    ----------
    mode, reason : str
        What :func:`dlstore.io.cuda.gds_verdict` said: ``gds`` or ``compat``, and why.
    """

    name = "kvikio CuFile"
    crc_where = "GPU (CuPy kernel, one thread per record)"

    def __init__(self, mode: str, reason: str, device: int = 0):
        try:
            import cupy
            import kvikio
        except ImportError as e:
            raise GdsUnavailableError(f"io='gds' needs kvikio and CuPy: {e} (pip install 'dlstore[gpu]')") from e
        self.mode, self.reason = mode, reason
        self._cupy, self._kvikio = cupy, kvikio
        self._device = cupy.cuda.Device(device)
        with self._device:
            module = cupy.RawModule(code=_CUDA_WRAPPER)
            self._kernel = module.get_function("dlstore_tfrecord_frames")
            self._gather = module.get_function("dlstore_gather")

    def open(self, path: str) -> Any:
        return self._kvikio.CuFile(path, "r")

    def close(self, handle: Any) -> None:
        handle.close()

    def alloc(self, nbytes: int) -> Any:
        with self._device:
            return self._cupy.empty(nbytes, dtype=self._cupy.uint8)

    def gather(self, dst: Any, sources: Sequence[Any], src_buf: np.ndarray, src_at: np.ndarray,
               length: np.ndarray, dst_at: np.ndarray) -> None:
        # One launch of GATHER_KERNEL on the current stream: a block per record (at most 65535 blocks,
        # each then taking every gridDim-th record). The index arrays are freed to CuPy's pool, which
        # hands them out again only in this stream's order, after the launch.
        cp = self._cupy
        n = len(length)
        if n == 0:
            return
        with self._device:
            pointers = cp.asarray(np.array([int(b.data.ptr) for b in sources], dtype=np.uint64))
            self._gather((min(n, 65535),), (256,),
                         (pointers, cp.asarray(src_buf, dtype=cp.int64), cp.asarray(src_at, dtype=cp.int64),
                          cp.asarray(length, dtype=cp.int64), cp.asarray(dst_at, dtype=cp.int64), np.int64(n), dst))

    def read(self, handle: Any, buf: Any, size: int, file_offset: int) -> Any:
        # Non-blocking: kvikio splits the read into tasks on its thread pool; .get() waits.
        return handle.pread(buf[:size], size, file_offset)

    def frame_status(self, buf: Any, rel: np.ndarray, size: np.ndarray, verify: bool) -> np.ndarray:
        cp = self._cupy
        n = len(rel)
        if n == 0:
            return np.zeros(0, dtype=np.uint8)
        with self._device:
            status = cp.empty(n, dtype=cp.uint8)
            threads = 128
            self._kernel(((n + threads - 1) // threads,), (threads,),
                         (buf, cp.asarray(rel, dtype=cp.int64), cp.asarray(size, dtype=cp.int64), np.int32(n),
                          np.int32(1 if verify else 0), status))
            return cp.asnumpy(status)


def default_backend(mode: str, reason: str, device: int = 0) -> Any:
    """The backend ``io="gds"`` runs: kvikio on the GPU (tests replace this function)."""
    return KvikioBackend(mode, reason, device)


# ---- the engine -------------------------------------------------------------------------------------

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
        return h

    def _issue(self) -> None:
        while self._next < len(self.plan) and len(self._inflight) < self.depth:
            k = self._next
            self._next += 1
            f, start, stop = int(self.plan.file[k]), int(self.plan.start[k]), int(self.plan.stop[k])
            try:  # a file that does not open fails its read, when that read is waited on
                handle = self._handle(f)
            except DlstoreIOError as e:
                self._inflight.append((k, None, _Failed(e)))
                continue
            buf = self.backend.alloc(stop - start)
            self._stats["buffers_allocated"] += 1
            self._inflight.append((k, buf, self.backend.read(handle, buf, stop - start, start)))

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
        got = int(future.get())
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
        batch = DeviceBatch(buf, rel + _HEADER, size - _HEADER - _FOOTER, self.offset[a:b], f, self.paths)
        bad = np.flatnonzero(status != FRAME_OK)
        if len(bad):
            if self.on_error == "raise":
                i = int(bad[0])
                raise CorruptRecordError(f"{path}: at byte {int(self.offset[a + i])}: "
                                         f"{frame_problem(int(status[i]), int(size[i]) - 16)}",
                                         path=path, offset=int(self.offset[a + i]))
            for i in bad.tolist():
                self._corruptions.append((path, int(self.offset[a + i]), frame_problem(int(status[i]),
                                                                                         int(size[i]) - 16)))
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
        self._at = offset - plan.start[self._read_of] + _HEADER
        self._length = size - _HEADER - _FOOTER
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
        sources = np.unique(self._src[pos])
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
        used, counts = np.unique(self._src[pos], return_counts=True)
        for source, k in zip(used.tolist(), counts.tolist()):
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
