"""Pinned host memory, and batches copied from it to a GPU.

:class:`PinnedPool` hands out page-aligned host buffers (anonymous ``mmap`` regions, so O_DIRECT can
read into them) that are page-locked with ``cudaHostRegister``, the CUDA runtime opened at run time
with :mod:`ctypes` (no build-time CUDA). A released buffer is kept and handed out again, so a loader
registers its buffers once. The register function is a parameter: tests pass a stand-in and check
the bookkeeping (sizes, alignment, reuse) without CUDA.

:class:`DeviceCopier` copies a loader's batches from pinned slots to GPU arrays asynchronously, on a
stream of its own, while the loader's thread reads and prepares the next batches. Its device is a
small interface (:class:`CupyDevice`; :class:`HostDevice` is the stand-in tests run). NOT YET RUN ON A
GPU: see docs/gpu.md.
"""
from __future__ import annotations

import ctypes
import mmap
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from dlstore.errors import DlstoreError
from dlstore.io import cuda  # cuda.cuda_facts looked up at each call: tests stand in for the machine
from dlstore.io.cuda import device_missing, parse_device

__all__ = ["PAGE", "PinnedBuffer", "PinnedPool", "cuda_host_register", "DeviceCopier", "CupyDevice", "HostDevice",
           "check_device", "device_path", "device_copier"]

PAGE = mmap.PAGESIZE
Register = Callable[[int, int], None]  # (address, bytes); raises DlstoreError when it fails


class _CudaRuntime:
    """``cudaHostRegister`` / ``cudaHostUnregister`` from libcudart, opened on first use."""

    _lib: Optional[ctypes.CDLL] = None
    _lock = threading.Lock()

    @classmethod
    def lib(cls) -> ctypes.CDLL:
        with cls._lock:
            if cls._lib is None:
                from dlstore.io.cuda import _CUDART_NAMES, load_cuda_library

                lib, where = load_cuda_library(_CUDART_NAMES, "cudart")
                if lib is None:
                    raise DlstoreError(f"pinned memory needs the CUDA runtime: {where}")
                lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
                lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
                lib.cudaGetErrorString.restype = ctypes.c_char_p
                cls._lib = lib
            return cls._lib


def _cuda_error(lib: ctypes.CDLL, rc: int) -> str:
    try:
        return lib.cudaGetErrorString(rc).decode()
    except Exception:  # noqa: BLE001 - the message is a courtesy
        return f"error {rc}"


def cuda_host_register(address: int, nbytes: int) -> None:
    """Page-locks ``nbytes`` at ``address`` (``cudaHostRegister``, default flags: portable to the
    current context, mapped for copies).

    Raises
    ------
    DlstoreError
        Without a CUDA runtime, or when the call fails (the CUDA error named).
    """
    lib = _CudaRuntime.lib()
    rc = lib.cudaHostRegister(address, nbytes, 0)
    if rc != 0:
        raise DlstoreError(f"cudaHostRegister of {nbytes} bytes at 0x{address:x} failed: {_cuda_error(lib, rc)}")


def cuda_host_unregister(address: int, nbytes: int) -> None:
    lib = _CudaRuntime.lib()
    rc = lib.cudaHostUnregister(address)
    if rc != 0:
        raise DlstoreError(f"cudaHostUnregister at 0x{address:x} failed: {_cuda_error(lib, rc)}")


class PinnedBuffer:
    """One page-aligned, page-locked region: ``array`` (uint8, the bytes asked for) over ``capacity``."""

    __slots__ = ("region", "array", "address", "capacity")

    def __init__(self, region: mmap.mmap, capacity: int):
        self.region = region
        self.capacity = capacity
        whole = np.frombuffer(region, dtype=np.uint8)
        self.address = whole.ctypes.data
        self.array = whole

    def view(self, shape: Tuple[int, ...], dtype: Any) -> np.ndarray:
        """The start of the region as a C-contiguous array of ``shape`` and ``dtype``."""
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if n > self.capacity:
            raise ValueError(f"{n} bytes asked of a {self.capacity}-byte pinned buffer")
        return self.array[:n].view(dtype).reshape(shape)


class PinnedPool:
    """Reusable page-aligned, page-locked host buffers.

    Parameters
    ----------
    register, unregister : callable, optional
        ``(address, nbytes)``; default :func:`cuda_host_register` and its inverse. Tests pass stand-ins.
    page : int
        Alignment and rounding of every buffer (the system page: O_DIRECT and cuFile need 4096).

    Notes
    -----
    A buffer is registered once, when first made, and unregistered by :meth:`close`. :meth:`acquire`
    reuses the smallest free buffer that holds the bytes asked for and is at most twice as large
    (a larger one would pin memory to no use), else makes a new one.
    """

    def __init__(self, register: Optional[Register] = None, unregister: Optional[Register] = None,
                 page: int = PAGE):
        self._register = register or cuda_host_register
        self._unregister = unregister or (cuda_host_unregister if register is None else (lambda a, n: None))
        self.page = int(page)
        self._free: List[PinnedBuffer] = []
        self._used: Dict[int, PinnedBuffer] = {}  # address -> buffer
        self._lock = threading.Lock()
        self._stats = {"made": 0, "reused": 0, "registered_bytes": 0}

    def acquire(self, nbytes: int) -> PinnedBuffer:
        """A buffer of at least ``nbytes`` (rounded up to whole pages), page-aligned and page-locked."""
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
        region = mmap.mmap(-1, capacity)  # anonymous: page-aligned, zero-filled, touched on registration
        buf = PinnedBuffer(region, capacity)
        assert buf.address % self.page == 0, "anonymous mappings start on a page"
        self._register(buf.address, capacity)
        with self._lock:
            self._stats["made"] += 1
            self._stats["registered_bytes"] += capacity
            self._used[buf.address] = buf
        return buf

    def release(self, buf: PinnedBuffer) -> None:
        """Gives ``buf`` back for reuse."""
        with self._lock:
            if self._used.pop(buf.address, None) is None:
                raise ValueError(f"the pinned buffer at 0x{buf.address:x} is not in use from this pool")
            self._free.append(buf)

    def allocator(self, shape: Tuple[int, ...], dtype: Any) -> np.ndarray:
        """``allocator(shape, dtype)`` for :class:`~dlstore.pipeline.Loader`: an array in a pinned
        buffer held until :meth:`close`."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return self.acquire(nbytes).view(tuple(shape), dtype)

    def stats(self) -> Dict[str, int]:
        """``buffers`` made, ``reused`` acquisitions, ``in_use``, ``free``, ``registered_bytes``."""
        with self._lock:
            return dict(self._stats, buffers=self._stats["made"], in_use=len(self._used), free=len(self._free))

    def close(self) -> None:
        """Unregisters every buffer; arrays still referenced stay valid host memory, no longer pinned."""
        with self._lock:
            every = list(self._free) + list(self._used.values())
            self._free, self._used = [], {}
            self._stats["registered_bytes"] = 0
        for buf in every:
            self._unregister(buf.address, buf.capacity)

    def __del__(self):
        # Unregister before the regions are unmapped: the driver must not keep pages of freed memory.
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the runtime may be gone
            pass


# ---- batches to the GPU -------------------------------------------------------------------------

class HostDevice:
    """The stand-in for a GPU: "device" arrays are numpy arrays, copies are immediate, events are
    counters. It runs :class:`DeviceCopier`'s sequencing in tests."""

    name = "host stand-in"

    def __init__(self):
        self.log: List[Tuple[str, Any]] = []

    def empty(self, shape: Tuple[int, ...], dtype: Any) -> np.ndarray:
        return np.empty(shape, dtype=dtype)

    def copy_async(self, dst: np.ndarray, src: np.ndarray) -> None:
        self.log.append(("copy", src.ctypes.data))
        dst[...] = src

    def after_consumer(self) -> None:
        self.log.append(("wait consumer", None))

    def record(self) -> int:
        self.log.append(("record", None))
        return len(self.log)

    def consumer_waits(self, event: Any) -> None:
        self.log.append(("consumer waits", event))

    def synchronize(self, event: Any) -> None:
        self.log.append(("synchronize", event))


class CupyDevice:
    """Copies on a CuPy stream of their own into CuPy arrays on device ``index``."""

    name = "CuPy"

    def __init__(self, index: int):
        import cupy

        self._cp = cupy
        self._device = cupy.cuda.Device(index)
        with self._device:
            self._stream = cupy.cuda.Stream(non_blocking=True)

    def empty(self, shape: Tuple[int, ...], dtype: Any) -> Any:
        with self._device:
            return self._cp.empty(shape, dtype=dtype)

    def copy_async(self, dst: Any, src: np.ndarray) -> None:
        # src is in registered (pinned) memory, so the copy is a real asynchronous DMA on the stream.
        dst.set(src, stream=self._stream)

    def after_consumer(self) -> None:
        # A buffer about to be overwritten may still be read by kernels the consumer queued.
        self._stream.wait_event(self._cp.cuda.get_current_stream().record())

    def record(self) -> Any:
        return self._stream.record()

    def consumer_waits(self, event: Any) -> None:
        self._cp.cuda.get_current_stream().wait_event(event)

    def synchronize(self, event: Any) -> None:
        event.synchronize()


class DeviceCopier:
    """A loader's batches from pinned host slots to device arrays, asynchronously.

    :meth:`send` queues the copies of one batch on the copier's stream into the next of ``sets``
    sets of device arrays, and makes the consumer's stream wait for them (no host wait). The host
    slot is given back only after :meth:`done_with_host` has waited for those copies.
    """

    def __init__(self, device: Any, sets: int = 2):
        self.device = device
        self.sets = int(sets)
        self._arrays: List[Dict[str, Any]] = []
        self._next = 0
        self._pending: Any = None
        self.copies = 0

    def send(self, arrays: Dict[str, np.ndarray]) -> Dict[str, Any]:
        if not self._arrays:
            self._arrays = [{k: self.device.empty(a.shape, a.dtype) for k, a in arrays.items()}
                            for _ in range(self.sets)]
        out = self._arrays[self._next]
        self._next = (self._next + 1) % self.sets
        self.device.after_consumer()
        for name, a in arrays.items():
            dst = out[name] if out[name].shape == a.shape else out[name][:len(a)]
            self.device.copy_async(dst, a)
        event = self.device.record()
        self.device.consumer_waits(event)
        self._pending = event
        self.copies += 1
        return {name: (out[name] if out[name].shape == a.shape else out[name][:len(a)]) for name, a in arrays.items()}

    def done_with_host(self) -> None:
        """Waits until the last batch's copies have finished: they have read its host slot (call before
        reusing the slot) and the device arrays hold the batch. At most one batch's copies are outstanding."""
        if self._pending is not None:
            self.device.synchronize(self._pending)
            self._pending = None


def check_device(device: Any, local_rank: int = 0) -> Optional[int]:
    """The CUDA device index ``device`` names, after checking that a GPU batch can reach it; None for the CPU.

    The one device check of dlstore: ``Loader(device=...)``, ``python -m dlstore.bench ... --device``
    and the adapters call it.

    Parameters
    ----------
    device : str, torch.device-like or None
        ``None`` or ``"cpu"``; ``"cuda"`` (device 0), ``"cuda:N"`` or ``"cuda:local"`` (device
        ``local_rank``: a GPU per rank on the host); or anything whose ``str`` is one of them
        (``torch.device("cuda", 1)``).
    local_rank : int
        This process's rank among those of its host (:attr:`dlstore.World.local_rank`).

    Raises
    ------
    ValueError
        When ``device`` is none of those.
    DlstoreError
        For a GPU, one line naming what is missing: no CUDA driver, no GPU, no CUDA device N, CuPy not
        installed (the facts of :func:`dlstore.io.cuda.cuda_facts`).
    """
    index = parse_device(device, local_rank)
    if index is None:
        return None
    facts = cuda.cuda_facts()
    missing = device_missing(facts, index)
    if not missing and facts.cupy is None:
        missing = facts.cupy_error or "CuPy is not installed"
    if missing:
        raise DlstoreError(f"device={str(device)!r} needs a CUDA GPU and CuPy: {missing}")
    return index


def device_path(index: int) -> str:
    """How batches reach CUDA device ``index`` (the loader's ``stats()["device_path"]`` and bench headers)."""
    return f"batches in pinned memory, copied to cuda:{index} on a stream"


def device_copier(device: Any, local_rank: int = 0) -> Tuple[Optional[int], Optional[DeviceCopier], str]:
    """``(CUDA index, copier, why)`` for ``Loader(device=...)``: ``(None, None, "")`` for the CPU.

    Raises
    ------
    ValueError, DlstoreError
        As :func:`check_device`.
    """
    index = check_device(device, local_rank)
    if index is None:
        return None, None, ""
    return index, DeviceCopier(CupyDevice(index)), device_path(index)
