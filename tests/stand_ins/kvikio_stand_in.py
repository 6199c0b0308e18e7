"""kvikio 26.10, as dlstore calls it, on the host: the ``gpu_libraries`` fixture installs this module as
``kvikio`` (and its ``defaults`` as ``kvikio.defaults``).

Modelled from kvikio 26.10.0 (the kvikio-cu13 and libkvikio-cu13 wheels: kvikio/cufile.py, defaults.py,
statistics.py and the C++ headers; rapidsai/kvikio's cpp/src at 26.10.00 for file_handle.cpp,
posix_io.cpp, compat_mode_manager.cpp, file_utils.cpp, defaults.cpp), and checked against the real wheel
run on a host without a GPU (a CPU buffer, and a stub libcuda.so.1 that calls host memory device memory):

- ``CuFile(path, flags)``: a missing file raises ``RuntimeError("Unable to open file. Linux system/library
  function call error at: .../file_utils.cpp:160: No such file or directory")``, a flag other than
  r, r+, w, w+ a ``ValueError`` (file_utils.cpp). Opening a file makes kvikio's defaults, so its thread
  pool starts (defaults.hpp: the pool is a member of the defaults singleton).
- Compat mode is decided per file (compat_mode_manager.cpp): ``KVIKIO_COMPAT_MODE=on``, or ``auto``
  without a usable libcufile (:data:`CUFILE_AVAILABLE` False, the fixture's machine), or ``auto`` where the
  file cannot be opened with O_DIRECT or cuFile refuses its handle (:data:`REFUSED_FILES`).
- ``pread(buf, size, file_offset, task_size)`` into a device buffer (an array with ``_host``, as the CuPy
  stand-in's): under ``gds_threshold`` (16 KiB: defaults.cpp sets 16384 since kvikio 25.06; the header's
  "1 MiB" is stale) the read runs at once through POSIX, even for a GDS file, and an error is raised by
  ``pread`` itself; larger reads run on the thread pool (as one task: the split into ``task_size`` tasks
  is not modelled) and errors come from ``IOFuture.get()``. The POSIX (compat) path copies what it
  read and raises ``RuntimeError("KvikIO failure at: .../posix_io.hpp:173: POSIX error on pread: EOF")``
  when the file ends first; cuFile (a GDS file, reads at or over the threshold) returns the short count
  instead. A numpy buffer is host memory: always the pool, POSIX.
- ``IOFuture``: ``get()`` a second time raises ``RuntimeError("std::future_error: No associated state")``;
  ``done()`` after ``get()`` a ``ValueError`` (an invalid std::future, utils.hpp).
- ``defaults``: ``get``/``set`` (``set`` also a context manager restoring the old values) of compat_mode,
  num_threads (1, or ``KVIKIO_NTHREADS``), task_size (4 MiB), gds_threshold (16 KiB), bounce_buffer_size
  (16 MiB); ``is_compat_mode_preferred()``.
- ``SummaryMonitor`` (statistics.py, new in 26.10): counting only while a monitor exists; ``get()`` gives
  totals and ``by_backend`` keyed ``POSIX``, ``GDS``, ``MMAP``, ``REMOTE_HTTP``, ``REMOTE_HDFS`` (each
  ``num_ops``, ``bytes_transferred``, ``total_duration_ns``, ``num_errors``); a failed read counts as an
  operation with an error and no bytes transferred.
"""
from __future__ import annotations

import concurrent.futures
import enum
import os
import threading
import time
import types
from typing import Any, Dict, List, Optional

import numpy as np

__version__ = "26.10.00"
_AT = "KvikIO failure at: /__w/kvikio/kvikio/cpp/"
EOF_MESSAGE = _AT + "include/kvikio/detail/posix_io.hpp:173: POSIX error on pread: EOF"
BACKENDS = ("POSIX", "GDS", "MMAP", "REMOTE_HTTP", "REMOTE_HDFS")
CUFILE_AVAILABLE = False  # libcufile loads and /run/udev is readable (kvikio's is_cufile_available)
REFUSED_FILES: set = set()  # paths whose cuFile handle registration fails


class CompatMode(enum.IntEnum):
    OFF = 0
    ON = 1
    AUTO = 2


def _env_compat() -> CompatMode:
    raw = os.environ.get("KVIKIO_COMPAT_MODE", "auto").strip().lower()
    return {"on": CompatMode.ON, "true": CompatMode.ON, "yes": CompatMode.ON, "1": CompatMode.ON,
            "off": CompatMode.OFF, "false": CompatMode.OFF, "no": CompatMode.OFF, "0": CompatMode.OFF
            }.get(raw, CompatMode.AUTO)


class _Defaults:
    """kvikio's defaults singleton: made on first use, with its thread pool."""

    def __init__(self):
        self.settings: Dict[str, Any] = {
            "compat_mode": _env_compat(), "num_threads": int(os.environ.get("KVIKIO_NTHREADS", 1)),
            "task_size": int(os.environ.get("KVIKIO_TASK_SIZE", 4 << 20)),
            "gds_threshold": int(os.environ.get("KVIKIO_GDS_THRESHOLD", 16 << 10)),
            "bounce_buffer_size": int(os.environ.get("KVIKIO_BOUNCE_BUFFER_SIZE", 16 << 20)),
            "auto_direct_io_read": False, "auto_direct_io_write": True}
        self.pool = concurrent.futures.ThreadPoolExecutor(self.settings["num_threads"], "kvikio")


_instance: Optional[_Defaults] = None
_lock = threading.Lock()


def _defaults() -> _Defaults:
    global _instance
    with _lock:
        if _instance is None:
            _instance = _Defaults()
        return _instance


def thread_pool_started() -> bool:
    """Whether this process has made kvikio's defaults, and so started its thread pool."""
    return _instance is not None


def reset() -> None:
    """Back to a fresh process: no defaults (no pool), libcufile absent, no monitors."""
    global _instance, CUFILE_AVAILABLE
    if _instance is not None:
        _instance.pool.shutdown(wait=True)
    _instance, CUFILE_AVAILABLE = None, False
    REFUSED_FILES.clear()
    _monitors.clear()


class _Set:
    def __init__(self, values: Dict[str, Any]):
        settings = _defaults().settings
        self._old = {k: settings[k] for k in values}
        for k, v in values.items():
            settings[k] = v
            if k == "num_threads":
                _defaults().pool = concurrent.futures.ThreadPoolExecutor(int(v), "kvikio")

    def __enter__(self) -> "_Set":
        return self

    def __exit__(self, *exc) -> None:
        _Set(self._old)


def _is_compat_mode_preferred(mode: Optional[CompatMode] = None) -> bool:
    mode = _defaults().settings["compat_mode"] if mode is None else mode
    return mode == CompatMode.ON or (mode == CompatMode.AUTO and not CUFILE_AVAILABLE)


defaults = types.ModuleType("kvikio.defaults", "kvikio.defaults (stand-in)")
defaults.get = lambda name: _defaults().settings[name]
defaults.set = lambda *config: _Set(config[0] if len(config) == 1 else {config[0]: config[1]})
defaults.is_compat_mode_preferred = _is_compat_mode_preferred


# ---- statistics ---------------------------------------------------------------------------------------

_monitors: List["SummaryMonitor"] = []


class Summary(types.SimpleNamespace):
    """What :meth:`SummaryMonitor.get` returns: num_ops, num_reads, bytes_requested, bytes_transferred,
    bytes_read, num_errors, by_backend."""


class SummaryMonitor:
    def __init__(self):
        self._totals = {k: 0 for k in ("num_ops", "num_reads", "bytes_requested", "bytes_transferred",
                                       "bytes_read", "num_errors")}
        self._by_backend = {b: {"num_ops": 0, "bytes_transferred": 0, "total_duration_ns": 0, "num_errors": 0}
                            for b in BACKENDS}
        self._lock = threading.Lock()
        _monitors.append(self)

    def _record(self, backend: str, requested: int, transferred: int, failed: bool, ns: int) -> None:
        with self._lock:
            for key, n in (("num_ops", 1), ("num_reads", 1), ("bytes_requested", requested),
                           ("bytes_transferred", transferred), ("bytes_read", transferred),
                           ("num_errors", int(failed))):
                self._totals[key] += n
            for key, n in (("num_ops", 1), ("bytes_transferred", transferred), ("total_duration_ns", ns),
                           ("num_errors", int(failed))):
                self._by_backend[backend][key] += n

    def get(self) -> Summary:
        with self._lock:
            return Summary(**self._totals, by_backend={b: dict(v) for b, v in self._by_backend.items()})

    def stop(self) -> None:
        if self in _monitors:
            _monitors.remove(self)

    def __enter__(self) -> "SummaryMonitor":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _observed(backend: str, requested: int, read) -> int:
    """Runs ``read()`` as one logical operation the live monitors count."""
    t0 = time.perf_counter_ns()
    try:
        n = read()
    except BaseException:
        for m in list(_monitors):
            m._record(backend, requested, 0, True, time.perf_counter_ns() - t0)
        raise
    for m in list(_monitors):
        m._record(backend, requested, n, False, time.perf_counter_ns() - t0)
    return n


# ---- files and reads ----------------------------------------------------------------------------------

class IOFuture:
    def __init__(self, future: "concurrent.futures.Future[int]"):
        self._future: Optional[concurrent.futures.Future] = future

    def get(self) -> int:
        if self._future is None:
            raise RuntimeError("std::future_error: No associated state")
        future, self._future = self._future, None
        return future.result()

    def done(self) -> bool:
        if self._future is None:
            raise ValueError(_AT.replace("cpp/", "") + "libkvikio/include/kvikio/utils.hpp:173: The future object "
                             "does not refer to a valid shared state.")
        return self._future.done()


def _ready(read) -> IOFuture:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(read())
    return IOFuture(future)


class CuFile:
    def __init__(self, file: Any, flags: str = "r"):
        flags = str(flags)
        if not flags or flags[0] not in "rw":
            what = "141: Open flag 'a' isn't supported" if flags[:1] == "a" else "130: Unknown file open flag"
            raise ValueError(f"{_AT}src/file_utils.cpp:{what}")
        mode = os.O_RDWR if flags[1:2] == "+" else (os.O_RDONLY if flags[0] == "r" else os.O_WRONLY)
        mode |= (os.O_CREAT | os.O_TRUNC) if flags[0] == "w" else 0
        self._path = os.fspath(file)
        try:
            self._fd = os.open(self._path, mode | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise RuntimeError(f"Unable to open file. Linux system/library function call error at: "
                               f"/__w/kvikio/kvikio/cpp/src/file_utils.cpp:160: {os.strerror(e.errno)}") from None
        self._compat = _is_compat_mode_preferred() or self._path in REFUSED_FILES or not _direct_opens(self._path)

    @property
    def closed(self) -> bool:
        return self._fd is None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def fileno(self) -> int:
        return -1 if self._fd is None else self._fd

    def __enter__(self) -> "CuFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def pread(self, buf: Any, size: Optional[int] = None, file_offset: int = 0,
              task_size: Optional[int] = None) -> IOFuture:
        host = getattr(buf, "_host", None)
        device = host is not None
        array = host if device else np.asarray(buf)
        if not (array.flags.c_contiguous or array.flags.f_contiguous):
            raise ValueError("Array must be contiguous")  # kvikio/_lib/arr.pyx, parse_buffer_argument
        target = array.reshape(-1, order="A").view(np.uint8)
        size = target.nbytes if size is None else int(size)
        if size > target.nbytes:
            raise ValueError("Size is greater than the size of the buffer")
        if file_offset < 0:
            raise OverflowError("can't convert negative value to size_t")
        settings = _defaults().settings
        if device and size < settings["gds_threshold"]:  # file_handle.cpp: the shortcut, POSIX, synchronous
            return _ready(lambda: _observed("POSIX", size, lambda: self._posix(target, size, file_offset)))
        backend = "POSIX" if self._compat or not device else "GDS"
        read = self._posix if backend == "POSIX" else self._cufile
        return IOFuture(_defaults().pool.submit(_observed, backend, size, lambda: read(target, size, file_offset)))

    def read(self, buf: Any, size: Optional[int] = None, file_offset: int = 0,
             task_size: Optional[int] = None) -> int:
        return self.pread(buf, size, file_offset, task_size).get()

    def is_direct_io_supported(self) -> bool:
        return not self._compat

    def _posix(self, target: np.ndarray, size: int, offset: int) -> int:
        """posix_io.hpp: pread until ``size`` bytes are in; a pread that returns nothing is EOF."""
        done = 0
        while done < size:
            chunk = os.pread(self._fd, size - done, offset + done)
            if not chunk:
                raise RuntimeError(EOF_MESSAGE)
            target[done:done + len(chunk)] = np.frombuffer(chunk, np.uint8)
            done += len(chunk)
        return size

    def _cufile(self, target: np.ndarray, size: int, offset: int) -> int:
        """cuFileRead: the bytes up to the file's end, the count returned."""
        chunk = os.pread(self._fd, size, offset)
        target[:len(chunk)] = np.frombuffer(chunk, np.uint8)
        return len(chunk)


def _direct_opens(path: str) -> bool:
    try:
        os.close(os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0)))
        return True
    except OSError:
        return False
