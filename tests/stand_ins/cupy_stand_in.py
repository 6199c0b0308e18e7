"""CuPy 14, as dlstore calls it, on the host: the ``gpu_libraries`` fixture installs this module as ``cupy``.

Device memory is numpy memory (each array's ``_host``), and work on a stream runs at once; what is
modelled is what dlstore's correctness depends on. From CuPy v14.2.0's sources (cupy/cupy, tag v14.2.0):

- ``ndarray`` (cupy/_core/core.pyx): shape, dtype, size, nbytes, strides; basic slicing gives views of
  the same memory, ``data.ptr`` is the view's address; ``set(host, stream=)`` takes only a numpy array
  of the same dtype and shape (TypeError / ValueError as ``set`` raises them); ``get()`` copies back;
  ``__array__`` raises TypeError (no implicit conversion to numpy).
- ``__cuda_array_interface__`` (v3): the current stream's pointer, the legacy default stream (1) for 0.
- ``__dlpack_device__()``: ``(2, device id)`` (kDLCUDA). ``__dlpack__(stream=)``: a consumer's stream
  other than CuPy's current one is made to wait for an event recorded on the current stream (``None``
  means the legacy default stream 1; -1 no ordering), as core.pyx does; every call is logged with its
  stream. The capsule returned is the host memory's (a CPU torch cannot import a CUDA one).
- ``cuda.Device(i)`` (a context manager: the current device; an index past ``DEVICES`` fails on entry,
  as cudaSetDevice does), ``cuda.Stream(non_blocking=)`` (``with stream``: the current stream of the
  device), ``get_current_stream()`` (the null stream, ptr 0, unless one is entered), ``Stream.record()``
  -> ``Event``, ``wait_event``, ``synchronize``, ``Event.synchronize`` (cupy/cuda/stream.pyx).
- The memory pool (cupy/cuda/memory.pyx, ``SingleDeviceMemoryPool``): one per device; sizes rounded up
  to 512 bytes; a block is taken from the free list of the stream current when it is allocated, and
  goes back there when its last array or view is dropped; the next allocation on that stream with a
  fitting size gets it back (best fit; blocks are not split). ``used_bytes``/``free_bytes``/``total_bytes``.
- ``RawModule(code=).get_function(name)``: the host version of the kernel
  (:func:`tests.stand_ins.host_kernels.host_kernel`), called as ``kernel(grid, block, args, shared_mem=0)``.

``log`` records the stream-ordering calls (record, wait_event, synchronize, set, dlpack) in order.
"""
from __future__ import annotations

import ctypes
import itertools
import threading
import weakref
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

__version__ = "14.2.0"
DEVICES = 2  # devices the stand-in machine has
log: List[Tuple[Any, ...]] = []
_ids = itertools.count(1)
_local = threading.local()

uint8, int8, int16, int32, int64 = np.uint8, np.int8, np.int16, np.int32, np.int64
uint16, uint32, uint64, float16, float32, float64, bool_ = (np.uint16, np.uint32, np.uint64, np.float16, np.float32,
                                                           np.float64, np.bool_)


def _device_id() -> int:
    return getattr(_local, "device", 0)


# ---- streams and events ------------------------------------------------------------------------------

class Event:
    def __init__(self):
        self.id = next(_ids)

    done = property(lambda self: True)  # work on a stand-in stream runs at once

    def record(self, stream: Optional["Stream"] = None) -> None:
        stream = stream or get_current_stream()
        log.append(("record", stream.ptr, self.id))

    def synchronize(self) -> None:
        log.append(("event synchronize", self.id))


class Stream:
    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False):
        self.ptr = 0 if null else next(_ids) * 0x100
        self.non_blocking, self.device_id = non_blocking, _device_id()

    def record(self, event: Optional[Event] = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        log.append(("wait_event", self.ptr, event.id))

    def synchronize(self) -> None:
        log.append(("synchronize", self.ptr))

    def __enter__(self) -> "Stream":
        _streams().setdefault(self.device_id, []).append(self)
        return self

    def __exit__(self, *exc) -> None:
        _streams()[self.device_id].pop()


class ExternalStream(Stream):
    """``cupy.cuda.ExternalStream(ptr)``: a stream made elsewhere (a consumer's), named by its pointer."""

    def __init__(self, ptr: int, device_id: int = -1):
        self.ptr, self.non_blocking, self.device_id = int(ptr), False, _device_id() if device_id < 0 else device_id


def get_elapsed_time(start: Event, end: Event) -> float:
    """Milliseconds between two events: the stand-in's streams take no time."""
    return 0.0


def _streams() -> Dict[int, List[Stream]]:
    if not hasattr(_local, "streams"):
        _local.streams = {}
    return _local.streams


_null_streams: Dict[int, Stream] = {}


def get_current_stream(device_id: Optional[int] = None) -> Stream:
    device = _device_id() if device_id is None else device_id
    entered = _streams().get(device)
    if entered:
        return entered[-1]
    return _null_streams.setdefault(device, Stream(null=True))


class Device:
    def __init__(self, device: Optional[int] = None):
        self.id = _device_id() if device is None else int(device)

    def __enter__(self) -> "Device":
        if not 0 <= self.id < DEVICES:
            raise RuntimeError("cudaErrorInvalidDevice: invalid device ordinal")
        self._previous = _device_id()
        _local.device = self.id
        return self

    def __exit__(self, *exc) -> None:
        _local.device = self._previous

    def synchronize(self) -> None:
        log.append(("device synchronize", self.id))


# ---- the memory pool ----------------------------------------------------------------------------------

class _Memory:
    """One pooled block: host bytes standing in for device memory, returned to its stream's free list when
    the last array over it goes."""

    def __init__(self, pool: "MemoryPool", raw: np.ndarray, stream_ptr: int):
        self.raw, self.ptr, self.device_id = raw, raw.ctypes.data, pool.device_id
        weakref.finalize(self, pool._free, raw, stream_ptr)


class MemoryPool:
    def __init__(self, device_id: int):
        self.device_id = device_id
        self._arenas: Dict[int, List[np.ndarray]] = {}  # stream ptr -> free blocks
        self._used = 0
        self._lock = threading.Lock()

    def malloc(self, nbytes: int) -> _Memory:
        size = max(512, -(-int(nbytes) // 512) * 512)
        stream_ptr = get_current_stream(self.device_id).ptr
        with self._lock:
            arena = self._arenas.setdefault(stream_ptr, [])
            fits = [i for i, b in enumerate(arena) if b.nbytes >= size]
            raw = arena.pop(min(fits, key=lambda i: arena[i].nbytes)) if fits else np.zeros(size, dtype=np.uint8)
            self._used += raw.nbytes
        return _Memory(self, raw, stream_ptr)

    def _free(self, raw: np.ndarray, stream_ptr: int) -> None:
        with self._lock:
            self._used -= raw.nbytes
            self._arenas.setdefault(stream_ptr, []).append(raw)

    def used_bytes(self) -> int:
        return self._used

    def free_bytes(self) -> int:
        return sum(b.nbytes for arena in self._arenas.values() for b in arena)

    def total_bytes(self) -> int:
        return self.used_bytes() + self.free_bytes()

    def free_all_blocks(self, stream: Optional[Stream] = None) -> None:
        with self._lock:
            if stream is None:
                self._arenas.clear()
            else:
                self._arenas.pop(stream.ptr, None)


_pools: Dict[int, MemoryPool] = {}


def get_default_memory_pool() -> MemoryPool:
    return _pools.setdefault(_device_id(), MemoryPool(_device_id()))


# ---- arrays -------------------------------------------------------------------------------------------

class UnownedMemory:
    """``cupy.cuda.UnownedMemory(ptr, size, owner)``: memory allocated elsewhere, ``owner`` kept alive with it."""

    def __init__(self, ptr: int, size: int, owner: Any, device_id: Optional[int] = None):
        self.ptr, self.size, self.owner = int(ptr), int(size), owner
        self.device_id = _device_id() if device_id is None else device_id
        self.raw = np.ctypeslib.as_array((ctypes.c_uint8 * self.size).from_address(self.ptr)) if self.size else \
            np.zeros(0, dtype=np.uint8)


class MemoryPointer:
    """``cupy.cuda.MemoryPointer(mem, offset)``."""

    def __init__(self, mem: Any, offset: int):
        self.mem, self.ptr, self.device_id = mem, mem.ptr + int(offset), mem.device_id


class _Pointer:
    def __init__(self, array: "ndarray"):
        self.ptr, self.device_id, self.mem = array._host.ctypes.data, array._mem.device_id, array._mem


class ndarray:  # noqa: N801 - CuPy's name
    """A device array: ``_host`` is its memory as numpy sees it, ``_mem`` the pooled block it lives in."""

    def __init__(self, shape: Any, dtype: Any = float, memptr: Any = None, _view: Any = None):
        if _view is not None:
            self._host, self._mem = _view
            return
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        if memptr is not None:  # over memory given (an UnownedMemory keeps its owner alive)
            self._mem, start = memptr.mem, memptr.ptr - memptr.mem.ptr
            self._host = memptr.mem.raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)
            return
        self._mem = get_default_memory_pool().malloc(count * dtype.itemsize)
        self._host = self._mem.raw[:count * dtype.itemsize].view(dtype).reshape(shape)

    shape = property(lambda self: self._host.shape)
    dtype = property(lambda self: self._host.dtype)
    size = property(lambda self: self._host.size)
    nbytes = property(lambda self: self._host.nbytes)
    ndim = property(lambda self: self._host.ndim)
    strides = property(lambda self: self._host.strides)
    itemsize = property(lambda self: self._host.itemsize)
    data = property(lambda self: _Pointer(self))
    device = property(lambda self: Device(self._mem.device_id))

    def __len__(self) -> int:
        return len(self._host)

    def __repr__(self) -> str:
        return f"stand-in cupy array({self._host!r}, device={self._mem.device_id})"

    def __array__(self, dtype=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    def __getitem__(self, key) -> "ndarray":
        key = _host_key(key)
        view = self._host[key]
        if not isinstance(view, np.ndarray):  # a scalar: CuPy gives a 0-d array
            return asarray(np.asarray(view))
        if np.shares_memory(view, self._host):
            return ndarray(None, _view=(view, self._mem))
        return asarray(view)  # advanced indexing: a new array, as in CuPy

    def __setitem__(self, key, value) -> None:
        if isinstance(value, np.ndarray):
            raise TypeError("stand-in: CuPy takes host arrays through .set() or cupy.asarray()")
        self._host[_host_key(key)] = value._host if isinstance(value, ndarray) else value

    def reshape(self, *shape) -> "ndarray":
        return ndarray(None, _view=(self._host.reshape(*shape), self._mem))

    def view(self, dtype) -> "ndarray":
        return ndarray(None, _view=(self._host.view(dtype), self._mem))

    def copy(self) -> "ndarray":
        return asarray(self._host)

    def astype(self, dtype) -> "ndarray":
        return asarray(self._host.astype(dtype))

    def fill(self, value) -> None:
        self._host.fill(value)

    def get(self, stream: Optional[Stream] = None) -> np.ndarray:
        return self._host.copy()

    def set(self, arr: np.ndarray, stream: Optional[Stream] = None) -> None:
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        stream = stream or get_current_stream()
        log.append(("set", stream.ptr, self.data.ptr, arr.nbytes))
        self._host[...] = arr

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        contiguous = self._host.flags.c_contiguous
        return {"shape": self.shape, "typestr": self.dtype.str, "descr": self.dtype.descr, "version": 3,
                "data": (self.data.ptr, False), "strides": None if contiguous else self.strides,
                "stream": get_current_stream(self._mem.device_id).ptr or 1}

    def __dlpack_device__(self) -> Tuple[int, int]:
        return 2, self._mem.device_id  # kDLCUDA

    def __dlpack__(self, *, stream: Optional[int] = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None):
        log.append(("dlpack", stream))
        consumer = 1 if stream is None else int(stream)
        current = get_current_stream(self._mem.device_id)
        if consumer >= 0 and consumer != (current.ptr or 1):
            log.append(("wait_event", consumer, current.record().id))
        # The capsule keeps the block alive, as CuPy's keeps the array: only then may the pool take it back.
        return np.asarray(_Export(self._host, self._mem)).__dlpack__()


class _Export:
    """The exported memory, owning a reference to its block."""

    def __init__(self, host: np.ndarray, mem: _Memory):
        self.__array_interface__, self.mem = host.__array_interface__, mem


def _host_key(key):
    if isinstance(key, tuple):
        return tuple(k._host if isinstance(k, ndarray) else k for k in key)
    return key._host if isinstance(key, ndarray) else key


def empty(shape: Any, dtype: Any = float) -> ndarray:
    return ndarray(shape, dtype)


def zeros(shape: Any, dtype: Any = float) -> ndarray:
    out = ndarray(shape, dtype)
    out._host[...] = 0
    return out


def asarray(a: Any, dtype: Any = None) -> ndarray:
    if isinstance(a, ndarray) and (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    host = np.asarray(a._host if isinstance(a, ndarray) else a, dtype=dtype)
    out = ndarray(host.shape, host.dtype)
    out._host[...] = host
    return out


array = asarray


def asnumpy(a: Any, stream: Optional[Stream] = None) -> np.ndarray:
    return a.get() if isinstance(a, ndarray) else np.asarray(a)


class RawModule:
    """``RawModule(code=...)``: the source is not compiled here; each function is its host version."""

    def __init__(self, code: str = "", options: Tuple[str, ...] = (), **kwargs: Any):
        self.code, self.options = code, options

    def get_function(self, name: str):
        from tests.stand_ins.host_kernels import host_kernel

        return host_kernel(name)


class _Runtime:
    @staticmethod
    def getDeviceCount() -> int:  # noqa: N802 - CUDA's name
        return DEVICES


class _CudaModule:
    """``cupy.cuda``."""

    Device, Stream, Event, MemoryPool = Device, Stream, Event, MemoryPool
    ExternalStream, UnownedMemory, MemoryPointer = ExternalStream, UnownedMemory, MemoryPointer
    get_elapsed_time = staticmethod(get_elapsed_time)
    runtime = _Runtime()
    get_current_stream = staticmethod(get_current_stream)


cuda = _CudaModule()
Stream.null = get_current_stream(0)


def reset() -> None:
    """Back to a fresh process: no log, empty pools, device 0, no stream entered."""
    log.clear()
    _pools.clear()
    _local.__dict__.clear()
