"""dlstore's CUDA kernels run on the host: the same text (dlstore/io/gds/kernels.cu) compiled by g++.

kernels.cu compiles for the host with ``-DDLSTORE_HOST``: its device functions are plain C++, and each
``__global__`` kernel ``NAME`` has a host twin ``NAME_host(grid, block, <the kernel's parameters>)`` that
runs the same device functions for every block and thread in turn, a barrier being the end of a step
all threads finish before any starts the next. So a host kernel computes what the GPU computes for the
same launch (grid and block sizes included: they decide how records are sliced and combined).

:func:`host_kernel` gives the callable a CuPy ``RawModule.get_function(name)`` would, for the GPU
stand-ins (a fake CuPy) and for tests. The library is built once per source text and cached under the
temp dir, so pytest sessions and workers share it.

Arguments, as CuPy takes them, with the same checks the GPU would make implicitly:

- a pointer parameter takes a "device array": an object with a ``_host`` attribute holding a numpy
  array (the agreement with the fake CuPy's arrays: that array *is* the device memory), else a numpy
  array, else an object with a ``host`` numpy array, else one with ``__array_interface__``. It must be
  C-contiguous (the kernel sees only its first address). Addresses *inside* arrays (the gather's
  ``sources``) are dereferenced as host addresses, so a fake device array's ``data.ptr`` must be its
  numpy array's ``ctypes.data``.
- a scalar parameter takes a Python int (CuPy passes it as a 64-bit integer) or a numpy integer no
  narrower than the parameter: the GPU reads the parameter's size from the value's first bytes, so a
  narrower value would be read with garbage above it, and a wider one must fit.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from dlstore.io.gds.kernels import CUDA_SOURCE_PATH, FRAME_THREADS, cuda_source

__all__ = ["host_kernel", "host_library", "build_host_library", "asan_runtime", "kernel_parameters",
           "HostCompilerMissing"]


class HostCompilerMissing(RuntimeError):
    """No C++ compiler to build kernels.cu for the host (tests skip on it)."""


# C parameter type -> (ctypes type, bytes; 0 for a pointer).
_C_TYPES = {"int": (ctypes.c_int, 4), "long long": (ctypes.c_longlong, 8), "dlstore_i64": (ctypes.c_longlong, 8),
            "unsigned long long": (ctypes.c_ulonglong, 8), "dlstore_u64": (ctypes.c_ulonglong, 8),
            "unsigned int": (ctypes.c_uint, 4), "dlstore_u32": (ctypes.c_uint, 4)}


def kernel_parameters(source: str) -> Dict[str, List[Tuple[str, str]]]:
    """Each ``extern "C" __global__`` kernel of ``source``: its parameters as ``(C type, name)``, in order."""
    kernels = {}
    pattern = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(([^)]*)\)')
    for name, params in pattern.findall(source):
        kernels[name] = []
        for param in params.split(","):
            words = " ".join(param.split())
            m = re.fullmatch(r"(?:const\s+)?([\w ]*?\w)\s*(\*?)\s*(?:const\s+)?\*?\s*(\w+)", words)
            if m is None:
                raise ValueError(f"{CUDA_SOURCE_PATH}: kernel {name}: cannot read parameter {words!r}")
            ctype = m.group(1) + ("*" if "*" in words else "")
            kernels[name].append((ctype, m.group(3)))
    return kernels


@functools.lru_cache(maxsize=None)
def build_host_library(source: str, sanitize: bool = False) -> ctypes.CDLL:
    """``source`` (kernels.cu's text, or a variant a test made of it) built for the host with
    ``-DDLSTORE_HOST``, once per process, and cached under the temp dir by the text's hash.

    ``sanitize``: with AddressSanitizer, which checks every read and write to the byte, as
    compute-sanitizer's memcheck does on a GPU (the process must have libasan preloaded:
    :func:`asan_runtime`).
    """
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise HostCompilerMissing("no C++ compiler (g++) to build dlstore/io/gds/kernels.cu for the host")
    flags = ["-fsanitize=address", "-fno-omit-frame-pointer", "-g", "-O1"] if sanitize else ["-O2"]
    digest = hashlib.sha256((source + " ".join(flags)).encode()).hexdigest()[:16]
    folder = os.path.join(tempfile.gettempdir(), f"dlstore-host-kernels-{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    lib_path = os.path.join(folder, f"kernels-{digest}.so")
    if not os.path.exists(lib_path):
        # Built under a private name, then renamed: concurrent sessions never load a half-written file.
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".so", delete=False) as f:
            partial = f.name
        command = [cxx, "-x", "c++", "-std=c++17", *flags, "-fno-strict-aliasing", "-Wall", "-Wextra", "-shared",
                   "-fPIC", "-DDLSTORE_HOST", "-o", partial, "-"]
        built = subprocess.run(command, input=source.encode(), capture_output=True)
        if built.returncode != 0:
            os.unlink(partial)
            raise RuntimeError(f"{CUDA_SOURCE_PATH}: the host build failed:\n{built.stderr.decode()}")
        os.replace(partial, lib_path)
    return ctypes.CDLL(lib_path)


def asan_runtime() -> Optional[str]:
    """The AddressSanitizer runtime g++ links against (to preload into a Python process), or None."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return None
    path = subprocess.run([cxx, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


def host_library() -> ctypes.CDLL:
    """kernels.cu built for the host, once per session (and per source text across sessions)."""
    return build_host_library(cuda_source())


def _host_array(arg: Any) -> np.ndarray:
    host = getattr(arg, "_host", None)
    if isinstance(host, np.ndarray):
        return host
    if isinstance(arg, np.ndarray):
        return arg
    host = getattr(arg, "host", None)
    if isinstance(host, np.ndarray):
        return host
    if hasattr(arg, "__array_interface__"):
        return np.asarray(arg)
    raise TypeError(f"not a device array: {type(arg).__name__}")


def _dims(dims: Any, what: str) -> int:
    dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    if not dims or any(int(d) < 1 for d in dims) or any(int(d) != 1 for d in dims[1:]):
        raise ValueError(f"{what} {dims}: the kernels use x only, at least 1")
    return int(dims[0])


def host_kernel(name: str, source: Optional[str] = None, sanitize: bool = False) -> Callable[..., None]:
    """The host twin of CUDA kernel ``name`` (e.g. ``"dlstore_tfrecord_frames"``) as
    ``fn(grid, block, args, shared_mem=0)``, CuPy's launch signature; see the module's docstring for
    what ``args`` may hold.

    ``source``: the CUDA text to build (a fake ``RawModule(code=...)`` passes its ``code``); kernels.cu's
    by default. ``sanitize``: a build with AddressSanitizer (:func:`build_host_library`). Raises
    :class:`HostCompilerMissing` without g++.
    """
    source = cuda_source() if source is None else source
    params = kernel_parameters(source)
    if name not in params:
        raise AttributeError(f"{CUDA_SOURCE_PATH} has no kernel {name!r} (it has {sorted(params)})")
    signature = params[name]
    twin = getattr(build_host_library(source, sanitize), f"{name}_host")
    twin.restype = None
    twin.argtypes = [ctypes.c_int, ctypes.c_int] + [
        ctypes.c_void_p if ctype.endswith("*") else _C_TYPES[ctype][0] for ctype, _ in signature]

    def launch(grid: Any, block: Any, args: Any, shared_mem: int = 0) -> None:
        if len(args) != len(signature):
            raise TypeError(f"{name} takes {len(signature)} arguments ({', '.join(p for _, p in signature)}), "
                            f"got {len(args)}")
        grid_x, block_x = _dims(grid, "grid"), _dims(block, "block")
        if name == "dlstore_tfrecord_frames" and block_x > FRAME_THREADS:
            raise ValueError(f"{name}: block {block_x} over its __launch_bounds__ of {FRAME_THREADS}: "
                             "the launch fails on a GPU")
        values, keep = [], []
        for (ctype, pname), arg in zip(signature, args):
            if ctype.endswith("*"):
                try:
                    array = _host_array(arg)
                except TypeError as e:
                    raise TypeError(f"{name}: {pname}: {e}") from None
                if not array.flags.c_contiguous:
                    raise ValueError(f"{name}: {pname} is not contiguous")
                keep.append(array)
                values.append(array.ctypes.data)
            else:
                values.append(_scalar(name, pname, ctype, arg))
        twin(grid_x, block_x, *values)

    launch.__name__ = name
    return launch


def _scalar(kernel: str, pname: str, ctype: str, arg: Any) -> int:
    size = _C_TYPES[ctype][1]
    if isinstance(arg, (bool, np.bool_)) or not isinstance(arg, (int, np.integer)):
        raise TypeError(f"{kernel}: {pname} ({ctype}) takes an integer, got {type(arg).__name__}")
    if isinstance(arg, np.integer) and arg.dtype.itemsize < size:
        raise TypeError(f"{kernel}: {pname} is {ctype} ({size} bytes); a {arg.dtype} would be read with "
                        f"garbage above it on the GPU: pass np.{'int32' if size == 4 else 'int64'}")
    value = int(arg)
    signed = not ctype.startswith("unsigned") and ctype not in ("dlstore_u64", "dlstore_u32")
    low, high = (-(1 << (8 * size - 1)), (1 << (8 * size - 1)) - 1) if signed else (0, (1 << (8 * size)) - 1)
    if not low <= value <= high:
        raise OverflowError(f"{kernel}: {pname} ({ctype}) cannot hold {value}")
    return value
