"""Device backends: :class:`KvikioBackend` (``CuFile.pread`` into CuPy buffers, the CUDA kernels) and its
host stand-in :class:`HostBackend` (numpy buffers, ``os.preadv``, the C++ core's CRC-32C), with the same methods."""
from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from dlstore.errors import GdsUnavailableError
from dlstore.io.gds.kernels import (CUDA_SOURCE, FRAME_DATA_CRC, FRAME_FOOTER, FRAME_HEADER, FRAME_LENGTH,
                                    FRAME_LENGTH_CRC)
from dlstore.io.gds.plan import byte_indices

__all__ = ["DoneRead", "FailedRead", "HostBackend", "KvikioBackend", "default_backend"]


class DoneRead:
    """A finished read, as the host stand-in returns it (kvikio returns an IOFuture)."""

    def __init__(self, n: int):
        self.n = n

    def get(self) -> int:
        return self.n


class FailedRead:
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

    def read(self, handle: int, buf: np.ndarray, size: int, file_offset: int) -> DoneRead:
        done = 0
        while done < size:  # a short read is retried until EOF
            n = os.preadv(handle, [memoryview(buf[done:size])], file_offset + done)
            if n == 0:
                break
            done += n
        return DoneRead(done)

    def frame_status(self, buf: np.ndarray, rel: np.ndarray, size: np.ndarray, verify: bool) -> np.ndarray:
        from dlstore import _C

        status = np.zeros(len(rel), dtype=np.uint8)
        view = memoryview(buf)
        for i, (r, s) in enumerate(zip(rel.tolist(), size.tolist())):
            length = int.from_bytes(view[r:r + 8], "little")
            if s < FRAME_HEADER + FRAME_FOOTER or length != s - FRAME_HEADER - FRAME_FOOTER:
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
            module = cupy.RawModule(code=CUDA_SOURCE)
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
        # Non-blocking: kvikio splits the read into tasks on its thread pool; .get() waits. `buf` may be
        # memory CuPy's pool took back from buffers a queued gather or frame kernel still reads, and
        # cuFile's DMA (or kvikio's compat copies) does not wait for that stream: wait for it first.
        with self._device:
            self._cupy.cuda.get_current_stream().synchronize()
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
