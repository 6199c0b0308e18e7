"""Stand-ins for a GPU machine, shared by the tests of pinned memory, the loader's copies to a GPU, the
bench's ``--device`` and the adapters over a GPU loader: no CUDA needed.

- :class:`Registry`: ``cudaHostRegister``/``cudaHostUnregister`` that remember what is registered.
- :class:`StandInCudaArray` and :class:`DlpackHostDevice`: the device arrays of a
  :class:`dlstore.io.memory.DeviceCopier` as objects that are *not* numpy arrays and are read through
  DLPack only, as CuPy arrays are (they report the CPU, since the torch here cannot hold CUDA memory).
- :func:`use_gpu_stand_in`: the machine seen by :func:`dlstore.io.memory.check_device` has CUDA device
  0 and CuPy, and ``Loader(device="cuda:0")`` copies through the given stand-in device; everything
  between (the check, ``device_copier``, the pinned ring, the copier's ordering) is dlstore's own.
"""
from __future__ import annotations

from typing import Any, List

import numpy as np

from dlstore.errors import DlstoreError
from dlstore.io import cuda, memory

STAND_IN_FACTS = cuda.CudaFacts(driver="13.0", devices=["stand-in GPU"], cupy="stand-in")


class Registry:
    """A stand-in for cudaHostRegister/cudaHostUnregister that remembers what is registered."""

    def __init__(self, fail_above=None):
        self.live, self.calls, self.fail_above = {}, [], fail_above

    def register(self, address, nbytes):
        if self.fail_above is not None and nbytes > self.fail_above:
            raise DlstoreError(f"cudaHostRegister of {nbytes} bytes at 0x{address:x} failed: out of memory")
        assert address not in self.live
        self.live[address] = nbytes
        self.calls.append(("register", nbytes))

    def unregister(self, address, nbytes):
        assert self.live.pop(address) == nbytes
        self.calls.append(("unregister", nbytes))


class StandInCudaArray:
    """A device array that numpy code cannot mistake for its own: shape, slicing, assignment, ``copy``
    and DLPack (every ``__dlpack__`` call is logged with its keyword arguments, e.g. torch's stream)."""

    def __init__(self, array: np.ndarray, log: List[Any]):
        self._array, self._log = array, log

    shape = property(lambda self: self._array.shape)
    dtype = property(lambda self: self._array.dtype)
    data_ptr = property(lambda self: self._array.ctypes.data)

    def __len__(self) -> int:
        return len(self._array)

    def __getitem__(self, key) -> "StandInCudaArray":
        return StandInCudaArray(self._array[key], self._log)

    def __setitem__(self, key, value) -> None:
        self._array[key] = value

    def copy(self) -> "StandInCudaArray":
        return StandInCudaArray(self._array.copy(), self._log)

    def get(self) -> np.ndarray:
        """Back to the host, as ``cupy.ndarray.get``."""
        return self._array.copy()

    def __dlpack__(self, **kwargs):
        self._log.append(("dlpack", kwargs))
        return self._array.__dlpack__()

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class DlpackHostDevice(memory.HostDevice):
    """:class:`dlstore.io.memory.HostDevice` whose arrays are :class:`StandInCudaArray`."""

    def empty(self, shape, dtype) -> StandInCudaArray:
        return StandInCudaArray(np.empty(shape, dtype=dtype), self.log)


def use_gpu_stand_in(monkeypatch, device: Any = None) -> Registry:
    """Makes this process see CUDA device 0 with CuPy, pinned memory registered with a :class:`Registry`
    (returned), and ``CupyDevice(0)`` be ``device`` (a new :class:`DlpackHostDevice` by default)."""
    reg = Registry()
    device = DlpackHostDevice() if device is None else device
    monkeypatch.setattr(cuda, "cuda_facts", lambda: STAND_IN_FACTS)
    monkeypatch.setattr(memory, "cuda_host_register", reg.register)
    monkeypatch.setattr(memory, "cuda_host_unregister", reg.unregister)
    monkeypatch.setattr(memory, "CupyDevice", lambda index: device)
    reg.device = device
    return reg
