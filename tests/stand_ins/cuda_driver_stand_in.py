"""The CUDA driver (``libcuda.so.1``) as dlstore calls it through :mod:`ctypes`, on the host.

Models the driver API calls dlstore makes (CUDA 13 ``cuda.h`` semantics): ``cuDriverGetVersion``;
``cuInit`` (every other call returns CUDA_ERROR_NOT_INITIALIZED, 3, before it; ``init_rc`` fails it, e.g.
100 CUDA_ERROR_NO_DEVICE); ``cuDeviceGetCount/Get/GetName``; ``cuDevicePrimaryCtxRetain`` (one primary
context per device, made by its first retain: :attr:`CudaDriver.contexts` shows which GPUs got one);
``cuCtxPushCurrent_v2``/``cuCtxPopCurrent_v2`` (a per-thread stack of current contexts);
``cuMemHostRegister_v2`` (in the current context: 201 CUDA_ERROR_INVALID_CONTEXT without one, 712
CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED twice, 2 CUDA_ERROR_OUT_OF_MEMORY over ``refuse_above`` bytes,
as a locked-memory limit refuses); ``cuMemHostUnregister`` (713 CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
``cuGetErrorString``. Arguments arrive as ctypes objects or ``byref`` of them, as ctypes passes them.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

ERRORS = {2: b"out of memory", 3: b"initialization error", 101: b"invalid device ordinal",
          201: b"invalid device context", 712: b"part or all of the requested memory range is already mapped",
          713: b"pointer does not correspond to a registered memory region"}


def _value(x: Any) -> Any:
    return x.value if hasattr(x, "value") else x


def _out(ref: Any, ctype: Any, value: Any) -> None:
    ctypes.cast(ref, ctypes.POINTER(ctype))[0] = value


class CudaDriver:
    """One machine's driver: ``names`` its GPUs. ``registered``: address -> (bytes, device of the context
    that registered it); ``calls``: every call's name, in order."""

    def __init__(self, names: Sequence[str] = ("stand-in GPU", "stand-in GPU"), init_rc: int = 0,
                 refuse_above: Optional[int] = None):
        self.names, self.init_rc, self.refuse_above = list(names), init_rc, refuse_above
        self.initialized = False
        self.contexts: Dict[int, int] = {}  # device -> context handle
        self.registered: Dict[int, Tuple[int, int]] = {}
        self.calls: List[str] = []
        self._local = threading.local()

    def _stack(self) -> List[int]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def _call(self, name: str) -> int:
        self.calls.append(name)
        return 0 if self.initialized or name in ("cuInit", "cuDriverGetVersion", "cuGetErrorString") else 3

    def cuDriverGetVersion(self, ref) -> int:  # noqa: N802 - the driver's names
        self._call("cuDriverGetVersion")
        _out(ref, ctypes.c_int, 13000)
        return 0

    def cuInit(self, flags) -> int:  # noqa: N802
        self._call("cuInit")
        self.initialized = self.init_rc == 0
        return self.init_rc

    def cuDeviceGetCount(self, ref) -> int:  # noqa: N802
        rc = self._call("cuDeviceGetCount")
        if rc == 0:
            _out(ref, ctypes.c_int, len(self.names))
        return rc

    def cuDeviceGet(self, ref, ordinal) -> int:  # noqa: N802
        rc = self._call("cuDeviceGet")
        if rc == 0 and not 0 <= _value(ordinal) < len(self.names):
            return 101
        if rc == 0:
            _out(ref, ctypes.c_int, _value(ordinal))
        return rc

    def cuDeviceGetName(self, buf, n, dev) -> int:  # noqa: N802
        rc = self._call("cuDeviceGetName")
        name = self.names[_value(dev)].encode() + b"\0"
        if rc == 0:
            ctypes.memmove(buf, name, min(len(name), _value(n)))
        return rc

    def cuDevicePrimaryCtxRetain(self, ref, dev) -> int:  # noqa: N802
        rc = self._call("cuDevicePrimaryCtxRetain")
        if rc == 0:
            ctx = self.contexts.setdefault(_value(dev), 0x1000 + _value(dev))
            _out(ref, ctypes.c_void_p, ctx)
        return rc

    def cuCtxPushCurrent_v2(self, ctx) -> int:  # noqa: N802
        rc = self._call("cuCtxPushCurrent_v2")
        if rc == 0:
            self._stack().append(_value(ctx))
        return rc

    def cuCtxPopCurrent_v2(self, ref) -> int:  # noqa: N802
        rc = self._call("cuCtxPopCurrent_v2")
        if rc == 0:
            _out(ref, ctypes.c_void_p, self._stack().pop() if self._stack() else None)
        return rc

    def cuMemHostRegister_v2(self, address, nbytes, flags) -> int:  # noqa: N802
        rc = self._call("cuMemHostRegister_v2")
        address, nbytes = _value(address), _value(nbytes)
        if rc != 0 or not self._stack():
            return rc or 201
        if address in self.registered:
            return 712
        if self.refuse_above is not None and nbytes > self.refuse_above:
            return 2
        device = next(d for d, c in self.contexts.items() if c == self._stack()[-1])
        self.registered[address] = (nbytes, device)
        return 0

    def cuMemHostUnregister(self, address) -> int:  # noqa: N802
        rc = self._call("cuMemHostUnregister")
        if rc != 0 or not self._stack():
            return rc or 201
        return 0 if self.registered.pop(_value(address), None) is not None else 713

    def cuGetErrorString(self, rc, ref) -> int:  # noqa: N802
        self._call("cuGetErrorString")
        text = ERRORS.get(_value(rc))
        if text is None:
            return 1  # CUDA_ERROR_INVALID_VALUE
        _out(ref, ctypes.c_char_p, text)
        return 0


def loader(driver: Optional[CudaDriver]):
    """A ``load`` for :func:`dlstore.io.cuda.probe_cuda`: ``libcuda.so.1`` is ``driver`` (absent for None),
    every other library absent."""
    def load(name: str) -> CudaDriver:
        if driver is not None and "libcuda.so" in name:
            return driver
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")
    return load
