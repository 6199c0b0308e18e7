"""Pinned host memory, and batches copied from it to a GPU.

:class:`PinnedPool` hands out page-aligned host buffers (anonymous ``mmap``: O_DIRECT reads into them),
page-locked in the primary context of the GPU they feed (the CUDA driver through :mod:`ctypes`, so no
build-time CUDA and no context on another GPU), and reused. :class:`DeviceCopier` copies a loader's
batches from them to CuPy arrays on a stream of its own. Tests run both over the stand-ins of
tests/stand_ins; on an H200 (docs/gpu.md) they fed a training step the host's batches.
"""
from __future__ import annotations

import ctypes
import functools
import mmap
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from dlstore.errors import DlstoreError
from dlstore.io import cuda  # looked up at each call: tests stand in for the machine

__all__ = ["PAGE", "PinnedBuffer", "PinnedPool", "cuda_host_register", "cuda_host_unregister", "DeviceCopier",
           "check_device", "device_path", "device_copier"]

PAGE = mmap.PAGESIZE
Register = Callable[[int, int], None]  # (address, bytes); raises DlstoreError when it fails
_contexts: Dict[int, ctypes.c_void_p] = {}  # device -> its primary context, retained for the process
_lock = threading.Lock()


def _in_primary_context(device: int, what: str, call: Callable[[Any], int]) -> None:
    """``call(libcuda)`` with GPU ``device``'s primary context (CuPy's) current on this thread, then the
    thread's own again."""
    lib = cuda.load_driver()
    if lib is None:
        raise DlstoreError(f"{what} needs the CUDA driver (libcuda.so.1 cannot be loaded)")
    with _lock:
        if device not in _contexts:
            dev, ctx = ctypes.c_int(0), ctypes.c_void_p()
            for rc in (lib.cuInit(0), lib.cuDeviceGet(ctypes.byref(dev), device),
                       lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)):
                if rc != 0:
                    raise DlstoreError(f"{what}: the primary context of cuda:{device} failed: {_error(lib, rc)}")
            _contexts[device] = ctx  # kept: releasing the last reference would destroy it and its registrations
    if lib.cuCtxPushCurrent_v2(_contexts[device]) != 0:
        raise DlstoreError(f"{what}: cannot make cuda:{device}'s context current")
    try:
        rc = call(lib)
    finally:
        lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    if rc != 0:
        raise DlstoreError(f"{what} failed: {_error(lib, rc)}")


def _error(lib: Any, rc: int) -> str:
    text = ctypes.c_char_p()
    ok = lib.cuGetErrorString(rc, ctypes.byref(text)) == 0 and text.value
    return text.value.decode() if ok else f"CUDA error {rc}"


def cuda_host_register(address: int, nbytes: int, device: int = 0) -> None:
    """Page-locks ``nbytes`` at ``address`` for GPU ``device``; DlstoreError naming why when it cannot."""
    _in_primary_context(device, f"cuMemHostRegister of {nbytes} bytes at 0x{address:x} on cuda:{device}",
                        lambda lib: lib.cuMemHostRegister_v2(ctypes.c_void_p(address), ctypes.c_size_t(nbytes), 0))


def cuda_host_unregister(address: int, nbytes: int, device: int = 0) -> None:
    _in_primary_context(device, f"cuMemHostUnregister at 0x{address:x} on cuda:{device}",
                        lambda lib: lib.cuMemHostUnregister(ctypes.c_void_p(address)))


class PinnedBuffer:
    """One page-aligned region: ``array`` (uint8) over ``capacity`` bytes; ``pinned`` unless refused."""

    __slots__ = ("region", "array", "address", "capacity", "pinned")

    def __init__(self, region: mmap.mmap, capacity: int, pinned: bool = True):
        self.region, self.capacity, self.pinned = region, capacity, pinned
        self.array = np.frombuffer(region, dtype=np.uint8)
        self.address = self.array.ctypes.data


class PinnedPool:
    """Reusable page-aligned host buffers, page-locked for GPU ``device``.

    ``register``/``unregister`` (``(address, nbytes)``) default to :func:`cuda_host_register` and its
    inverse; ``page`` is the alignment and rounding (O_DIRECT and cuFile need 4096). A buffer is
    registered once, when made, and unregistered by :meth:`close`; where registration is refused (a
    locked-memory limit) it stays pageable, slower, not wrong, and ``stats()["note"]`` says why.
    :meth:`acquire` reuses the smallest free buffer that holds the bytes and is at most twice as large.
    """

    def __init__(self, register: Optional[Register] = None, unregister: Optional[Register] = None, page: int = PAGE,
                 device: int = 0):
        self.device = int(device)  # partial, not a lambda over self: no cycle delays __del__'s unregistering
        self._register = register or functools.partial(cuda_host_register, device=self.device)
        self._unregister = unregister or (functools.partial(cuda_host_unregister, device=self.device)
                                          if register is None else (lambda a, n: None))
        self.page = int(page)
        self._free: List[PinnedBuffer] = []
        self._used: Dict[int, PinnedBuffer] = {}  # address -> buffer
        self._lock = threading.Lock()
        self._stats: Dict[str, Any] = {"made": 0, "reused": 0, "registered_bytes": 0, "pageable": 0, "note": ""}

    def acquire(self, nbytes: int) -> PinnedBuffer:
        """A buffer of at least ``nbytes`` (rounded up to whole pages), page-aligned, page-locked unless refused."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be non-negative, not {nbytes}")
        capacity = max(self.page, -(-int(nbytes) // self.page) * self.page)
        with self._lock:
            fits = [b for b in self._free if capacity <= b.capacity <= 2 * capacity]
            if fits:
                buf = min(fits, key=lambda b: b.capacity)
                self._free.remove(buf)
                self._stats["reused"] += 1
                self._used[buf.address] = buf
                return buf
        buf = PinnedBuffer(mmap.mmap(-1, capacity), capacity)  # anonymous: page-aligned, zero-filled
        assert buf.address % self.page == 0, "anonymous mappings start on a page"
        try:
            self._register(buf.address, capacity)
        except DlstoreError as e:
            buf.pinned = False
            note = f"{e}: buffers left pageable (copies to the GPU are synchronous)"
        with self._lock:
            self._stats["made"] += 1
            if buf.pinned:
                self._stats["registered_bytes"] += capacity
            else:
                self._stats["pageable"] += 1
                self._stats["note"] = note
            self._used[buf.address] = buf
        return buf

    def release(self, buf: PinnedBuffer) -> None:
        """Gives ``buf`` back for reuse."""
        with self._lock:
            if self._used.pop(buf.address, None) is None:
                raise ValueError(f"the pinned buffer at 0x{buf.address:x} is not in use from this pool")
            self._free.append(buf)

    def allocator(self, shape: Tuple[int, ...], dtype: Any) -> np.ndarray:
        """``allocator(shape, dtype)`` for :class:`~dlstore.pipeline.Loader`: an array in a pinned buffer
        held until :meth:`close`."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return self.acquire(nbytes).array[:nbytes].view(dtype).reshape(shape)

    def stats(self) -> Dict[str, Any]:
        """``buffers``, ``reused``, ``in_use``, ``free``, ``registered_bytes``, ``pageable`` (not pinned), ``note``."""
        with self._lock:
            return dict(self._stats, buffers=self._stats["made"], in_use=len(self._used), free=len(self._free))

    def close(self) -> None:
        """Unregisters every buffer; arrays still referenced stay valid host memory, no longer pinned."""
        with self._lock:
            every = list(self._free) + list(self._used.values())
            self._free, self._used = [], {}
            self._stats["registered_bytes"] = 0
        for buf in every:
            if buf.pinned:
                self._unregister(buf.address, buf.capacity)

    def __del__(self):
        # Unregister before the regions are unmapped: the driver must not keep pages of freed memory.
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the driver may be gone
            pass


class DeviceCopier:
    """A loader's batches from pinned host slots to CuPy arrays on GPU ``index``, asynchronously.

    :meth:`send` queues the copies of one batch on the copier's stream into the next of ``sets`` sets
    of device arrays, each of ``rows`` rows (the loader's batch size: a short batch takes the first
    rows of its set), and makes the consumer's current stream wait for them (no host wait). A host slot
    may be reused after :meth:`done_with_host` has waited for its copies. CuPy and the stream are made
    at the first batch, in the process that iterates.
    """

    def __init__(self, index: int, rows: int, sets: int = 2):
        self.index, self.rows, self.sets = int(index), int(rows), int(sets)
        self._arrays: List[Dict[str, Any]] = []
        self._next = 0
        self._pending: Any = None
        self._cp: Any = None
        self.copies = 0

    def send(self, arrays: Dict[str, np.ndarray]) -> Dict[str, Any]:
        if self._cp is None:
            import cupy

            self._cp = cupy
            with cupy.cuda.Device(self.index):
                self._stream = cupy.cuda.Stream(non_blocking=True)
        cp = self._cp
        with cp.cuda.Device(self.index):
            if not self._arrays:
                self._arrays = [{k: cp.empty((self.rows,) + a.shape[1:], dtype=a.dtype) for k, a in arrays.items()}
                                for _ in range(self.sets)]
            out = self._arrays[self._next]
            self._next = (self._next + 1) % self.sets
            # Arrays about to be overwritten may still be read by work the consumer queued on its stream.
            consumer = cp.cuda.get_current_stream()
            self._stream.wait_event(consumer.record())
            batch = {}
            for name, a in arrays.items():
                if len(a) > self.rows:
                    raise ValueError(f"a batch of {len(a)} rows for device arrays of {self.rows}")
                batch[name] = out[name][:len(a)]
                batch[name].set(a, stream=self._stream)  # from pinned memory: an asynchronous DMA
            self._pending = self._stream.record()
            consumer.wait_event(self._pending)
        self.copies += 1
        return batch

    def done_with_host(self) -> None:
        """Waits until the last batch's copies have finished (they have read its host slot); at most one
        batch's copies are outstanding."""
        if self._pending is not None:
            self._pending.synchronize()
            self._pending = None


def check_device(device: Any, local_rank: int = 0) -> Optional[int]:
    """The CUDA device index ``device`` names (see :func:`dlstore.io.cuda.parse_device`; ``cuda:local`` is
    ``local_rank``'s GPU), after checking that a GPU batch can reach it; None for the CPU.

    The one device check of dlstore (``Loader(device=)``, the bench's ``--device``, the adapters). It
    initialises nothing. Raises ValueError for what is no device, DlstoreError naming in one line what
    a GPU lacks (no CUDA driver, no GPU, no CUDA device N, no CuPy).
    """
    index = cuda.parse_device(device, local_rank)
    if index is None:
        return None
    facts = cuda.cuda_facts()
    missing = cuda.device_missing(facts, index) or ("" if facts.cupy else facts.cupy_error or "CuPy is not installed")
    if missing:
        raise DlstoreError(f"device={str(device)!r} needs a CUDA GPU and CuPy: {missing}")
    return index


def device_path(index: int) -> str:
    """How batches reach CUDA device ``index`` (the loader's ``stats()["device_path"]`` and bench headers)."""
    return f"batches in pinned memory, copied to cuda:{index} on a stream"


def device_copier(device: Any, local_rank: int = 0, rows: int = 1) -> Tuple[Optional[int], Optional[DeviceCopier], str]:
    """``(CUDA index, copier of batches of up to rows, why)`` for ``Loader(device=...)``, ``(None, None, "")``
    for the CPU; raises as :func:`check_device`."""
    index = check_device(device, local_rank)
    if index is None:
        return None, None, ""
    return index, DeviceCopier(index, rows), device_path(index)
