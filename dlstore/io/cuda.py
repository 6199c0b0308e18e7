"""What CUDA and GPUDirect Storage this machine offers, found at run time, and what that allows.

Nothing here needs CUDA to import or to build: the driver (``libcuda.so.1``), the runtime
(``libcudart.so*``) and ``libcufile`` are opened with :mod:`ctypes`, kvikio is imported lazily, and
the kernel module nvidia-fs is looked up in ``/proc``. :func:`probe_cuda` gathers the facts once
(:class:`CudaFacts`); :func:`gds_verdict` and :func:`device_missing` are pure functions of them, so
``dlstore info``, ``io="gds"``, ``io="auto"`` with a GPU target, ``Loader(device="cuda:0")`` and the
benchmark header all quote the same reasons, and tests can feed them facts of machines they are not.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Tuple

__all__ = ["CudaFacts", "GdsVerdict", "probe_cuda", "cuda_facts", "gds_verdict", "device_missing", "parse_device",
           "load_cuda_library", "kvikio_compat_env", "cufile_allows_compat", "find_library_file"]

_NVFS_PROC = "/proc/driver/nvidia-fs"
_PROC_MODULES = "/proc/modules"
_CUFILE_JSON = "/etc/cufile.json"
# The CUDA 13 runtime first; the pip wheels (nvidia-cuda-runtime) put it under site-packages/nvidia.
_CUDART_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")
_CUFILE_NAMES = ("libcufile.so.0", "libcufile.so")

Loader = Callable[[str], ctypes.CDLL]


@dataclass
class CudaFacts:
    """What was found, each with the reason when it was not.

    Attributes
    ----------
    driver : str or None
        The CUDA driver's version (``"13.0"``), None when ``libcuda.so.1`` could not be used.
    driver_error : str
        Why not (empty when found).
    devices : list of str
        Device names, index order (``cuInit`` and ``cuDeviceGetCount``).
    runtime : str or None
        The CUDA runtime library found (path and version), None when none.
    runtime_error : str
    kvikio : str or None
        kvikio's version, None when it cannot be imported.
    kvikio_error : str
    cupy : str or None
        CuPy's version (the gds engine's buffers and CRC kernel), None when it cannot be imported.
    cupy_error : str
    libcufile : str or None
        Where libcufile was found.
    nvidia_fs : bool
        The nvidia-fs kernel module is loaded (``/proc/driver/nvidia-fs`` or ``/proc/modules``).
    nvidia_fs_how : str
        How that was told.
    kvikio_compat : str
        ``KVIKIO_COMPAT_MODE`` as kvikio reads it: ``on``, ``off`` or ``auto`` (its default).
    kvikio_compat_preferred : bool or None
        What kvikio itself says (``kvikio.defaults.is_compat_mode_preferred()``), when it is importable.
    cufile_json : str
        The cuFile configuration file read (``CUFILE_ENV_PATH_JSON`` or /etc/cufile.json), empty if none.
    cufile_allow_compat : bool or None
        Its ``properties.allow_compat_mode`` (cuFile's default: true), None without a file.
    """

    driver: Optional[str] = None
    driver_error: str = ""
    devices: List[str] = field(default_factory=list)
    runtime: Optional[str] = None
    runtime_error: str = ""
    kvikio: Optional[str] = None
    kvikio_error: str = ""
    cupy: Optional[str] = None
    cupy_error: str = ""
    libcufile: Optional[str] = None
    nvidia_fs: bool = False
    nvidia_fs_how: str = ""
    kvikio_compat: str = "auto"
    kvikio_compat_preferred: Optional[bool] = None
    cufile_json: str = ""
    cufile_allow_compat: Optional[bool] = None

    def as_dict(self) -> Dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class GdsVerdict:
    """Whether ``io="gds"`` can run, and how.

    Attributes
    ----------
    missing : str
        Empty when the gds engine can run; else one line naming what is missing.
    mode : str
        ``gds`` (cuFile reads straight into GPU memory through nvidia-fs), ``compat`` (kvikio or
        cuFile reads through host memory with POSIX calls, then copies), or ``none``.
    reason : str
        Why that mode, in the words every report uses.
    """

    missing: str
    mode: str
    reason: str

    @property
    def runs(self) -> bool:
        return not self.missing


# ---- finding libraries ------------------------------------------------------------------------------

def find_library_file(stem: str) -> Optional[str]:
    """A loadable file for a library: a soname the dynamic loader resolves, else one in the NVIDIA pip
    wheels' ``site-packages/nvidia/*/lib`` folders, else ``ctypes.util.find_library(stem)``."""
    for base in sys.path:
        for pattern in (os.path.join(base, "nvidia", "*", "lib", f"lib{stem}.so*"),
                        os.path.join(base, "nvidia", "*", "lib64", f"lib{stem}.so*")):
            hits = sorted(glob.glob(pattern))
            if hits:
                return hits[-1]
    return ctypes.util.find_library(stem)


def load_cuda_library(names: Tuple[str, ...], stem: str,
                      load: Loader = ctypes.CDLL) -> Tuple[Optional[ctypes.CDLL], str]:
    """Opens the first of ``names`` the dynamic loader finds (then the pip wheels' copy): ``(library, where)``,
    or ``(None, why)``."""
    errors = []
    candidates = list(names)
    wheel = find_library_file(stem)
    if wheel and wheel not in candidates:
        candidates.append(wheel)
    for name in candidates:
        try:
            return load(name), name
        except OSError as e:
            errors.append(str(e).split(":")[-1].strip() or name)
    return None, f"{names[0]} not found ({errors[0] if errors else 'no candidates'})"


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def _probe_driver(facts: CudaFacts, load: Loader, init: bool) -> None:
    try:
        lib = load("libcuda.so.1")
    except OSError:
        facts.driver_error = "no CUDA driver (libcuda.so.1 cannot be loaded)"
        return
    version = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
        facts.driver_error = "the CUDA driver does not report its version"
        return
    facts.driver = _cuda_version(version.value)
    if not init:
        return
    rc = lib.cuInit(0)
    if rc != 0:
        # 100: CUDA_ERROR_NO_DEVICE; 999 and others: a broken driver or a container without /dev/nvidia*.
        facts.driver_error = ("no GPU (cuInit: no CUDA-capable device)" if rc == 100
                              else f"the CUDA driver failed to initialise (cuInit returned {rc})")
        return
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        facts.driver_error = "cuDeviceGetCount failed"
        return
    for i in range(count.value):
        dev = ctypes.c_int(0)
        name = ctypes.create_string_buffer(256)
        if lib.cuDeviceGet(ctypes.byref(dev), i) == 0 and lib.cuDeviceGetName(name, 256, dev) == 0:
            facts.devices.append(name.value.decode(errors="replace"))
        else:
            facts.devices.append(f"device {i} (name unavailable)")
    if not facts.devices:
        facts.driver_error = "no GPU (the CUDA driver sees 0 devices)"


def _probe_runtime(facts: CudaFacts, load: Loader) -> None:
    lib, where = load_cuda_library(_CUDART_NAMES, "cudart", load)
    if lib is None:
        facts.runtime_error = f"no CUDA runtime: {where}"
        return
    version = ctypes.c_int(0)
    try:
        ok = lib.cudaRuntimeGetVersion(ctypes.byref(version)) == 0
    except AttributeError:
        ok = False
    facts.runtime = f"{where} ({_cuda_version(version.value)})" if ok else where


def _probe_module(name: str) -> Tuple[Optional[str], str]:
    try:
        module = __import__(name)
    except Exception as e:  # noqa: BLE001 - an import that fails for any reason means "not usable"
        if isinstance(e, ImportError) and getattr(e, "name", None) == name:
            return None, f"{name} is not installed (pip install 'dlstore[gpu]')"
        return None, f"{name} cannot be imported: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return str(getattr(module, "__version__", "unknown version")), ""


def kvikio_compat_env(environ: Mapping[str, str]) -> str:
    """``KVIKIO_COMPAT_MODE`` as kvikio reads it: ``on``, ``off`` or ``auto`` (unset: ``auto``)."""
    raw = environ.get("KVIKIO_COMPAT_MODE", "").strip().lower()
    if raw in ("on", "true", "yes", "1"):
        return "on"
    if raw in ("off", "false", "no", "0"):
        return "off"
    return "auto"


def cufile_allows_compat(text: str) -> Optional[bool]:
    """``properties.allow_compat_mode`` of a cufile.json text (which may hold ``//`` comments), or
    None when the text does not say."""
    stripped = "\n".join(re.sub(r"(^|\s)//.*$", "", line) for line in text.splitlines())
    try:
        doc = json.loads(stripped)
    except ValueError:
        return None
    value = doc.get("properties", {}).get("allow_compat_mode") if isinstance(doc, dict) else None
    return value if isinstance(value, bool) else None


def _nvidia_fs_loaded(proc_nvfs: str, proc_modules: str) -> Tuple[bool, str]:
    if os.path.exists(proc_nvfs):
        return True, f"{proc_nvfs} exists"
    try:
        with open(proc_modules) as f:
            if any(line.split(" ", 1)[0] == "nvidia_fs" for line in f):
                return True, f"nvidia_fs in {proc_modules}"
    except OSError:
        return False, f"neither {proc_nvfs} nor {proc_modules} can be read"
    return False, f"no {proc_nvfs}, no nvidia_fs in {proc_modules}"


def probe_cuda(*, init: bool = True, load: Loader = ctypes.CDLL, environ: Optional[Mapping[str, str]] = None,
               proc_nvfs: str = _NVFS_PROC, proc_modules: str = _PROC_MODULES,
               import_modules: bool = True) -> CudaFacts:
    """Looks for the CUDA driver and devices, the runtime, kvikio, CuPy, libcufile, nvidia-fs and the
    compat-mode settings.

    Parameters
    ----------
    init : bool
        Call ``cuInit`` to count and name the devices. A process that forks workers which use CUDA
        should not initialise it first; without ``init`` only the driver's version is read.
    load : callable
        Opens a shared library (``ctypes.CDLL``; tests pass a stand-in).
    environ : mapping, optional
        The environment (``os.environ``).
    proc_nvfs, proc_modules : str
        Where nvidia-fs shows itself.
    import_modules : bool
        Import kvikio and CuPy to read their versions (importing CuPy does not initialise CUDA).
    """
    environ = os.environ if environ is None else environ
    facts = CudaFacts()
    _probe_driver(facts, load, init)
    _probe_runtime(facts, load)
    if import_modules:
        facts.kvikio, facts.kvikio_error = _probe_module("kvikio")
        facts.cupy, facts.cupy_error = _probe_module("cupy")
        if facts.kvikio is not None and facts.driver is not None and not facts.driver_error:
            try:
                import kvikio.defaults

                facts.kvikio_compat_preferred = bool(kvikio.defaults.is_compat_mode_preferred())
            except Exception:  # noqa: BLE001 - an old kvikio without it: the environment says
                facts.kvikio_compat_preferred = None
    else:
        facts.kvikio_error = facts.cupy_error = "not looked up"
    lib, where = load_cuda_library(_CUFILE_NAMES, "cufile", load)
    facts.libcufile = where if lib is not None else None
    facts.nvidia_fs, facts.nvidia_fs_how = _nvidia_fs_loaded(proc_nvfs, proc_modules)
    facts.kvikio_compat = kvikio_compat_env(environ)
    json_path = environ.get("CUFILE_ENV_PATH_JSON") or _CUFILE_JSON
    try:
        with open(json_path) as f:
            facts.cufile_json = json_path
            facts.cufile_allow_compat = cufile_allows_compat(f.read())
    except OSError:
        facts.cufile_json = ""
    return facts


@functools.lru_cache(maxsize=1)
def cuda_facts() -> CudaFacts:
    """:func:`probe_cuda` once per process (``io="gds"``, ``io="auto"`` with a GPU target, the loader)."""
    return probe_cuda()


# ---- what the facts allow -----------------------------------------------------------------------

def device_missing(facts: CudaFacts, index: int = 0) -> str:
    """Empty when CUDA device ``index`` can be used; else one line naming what is missing."""
    if facts.driver is None or facts.driver_error:
        return facts.driver_error or "no CUDA driver"
    if index >= len(facts.devices):
        return f"no CUDA device {index} (the driver sees {len(facts.devices)})"
    return ""


def gds_verdict(facts: CudaFacts, index: int = 0) -> GdsVerdict:
    """Whether the gds engine can run on device ``index``, and whether cuFile would read true GDS or
    in a compat mode (through host memory), with the reason.

    True GDS needs the driver and a device, kvikio and CuPy, libcufile and the nvidia-fs kernel
    module, with kvikio's compat mode not forced on. Without libcufile or nvidia-fs kvikio falls
    back to its own POSIX compat mode (unless ``KVIKIO_COMPAT_MODE=off``, when it fails instead).
    """
    missing = [m for m in (device_missing(facts, index),) if m]
    if facts.kvikio is None:
        missing.append(facts.kvikio_error or "kvikio is not installed")
    if facts.cupy is None:
        missing.append(facts.cupy_error or "cupy is not installed")
    if missing and facts.libcufile is None:
        missing.append("libcufile not found")
    if missing:
        return GdsVerdict("io='gds' cannot run: " + "; ".join(missing), "none", "; ".join(missing))
    if facts.kvikio_compat == "on":
        return GdsVerdict("", "compat", "compat mode: KVIKIO_COMPAT_MODE=on makes kvikio read with POSIX calls "
                                        "into host memory and copy")
    lacks = []
    if facts.libcufile is None:
        lacks.append("libcufile not found")
    if not facts.nvidia_fs:
        lacks.append("nvidia-fs not loaded")
    if facts.kvikio_compat_preferred and not lacks:
        lacks.append("kvikio prefers its compat mode here")
    if lacks:
        why = ", ".join(lacks)
        if facts.kvikio_compat == "off":
            return GdsVerdict(f"io='gds' cannot run: {why}, and KVIKIO_COMPAT_MODE=off forbids kvikio's compat "
                              f"mode", "none", why)
        return GdsVerdict("", "compat", f"compat mode: {why}: kvikio reads with POSIX calls into host memory "
                                        f"and copies")
    if facts.cufile_allow_compat is not False:
        allow = "cuFile may still fall back per file (allow_compat_mode"
        allow += f" in {facts.cufile_json})" if facts.cufile_json else " defaults to true)"
    else:
        allow = f"cuFile's compat mode off in {facts.cufile_json}"
    return GdsVerdict("", "gds", f"GPUDirect Storage: libcufile at {facts.libcufile}, nvidia-fs loaded; {allow}")


def parse_device(device: object, local_rank: int = 0) -> Optional[int]:
    """The CUDA device index of ``"cuda"``, ``"cuda:1"``, ``"cuda:local"`` or a torch-like device; None
    for the CPU.

    ``"cuda:local"`` is the GPU numbered as the process's ``local_rank`` (its rank among the processes of
    its host, as a launcher gives it): one GPU per rank on a host with as many GPUs as ranks.

    Raises
    ------
    ValueError
        For anything else.
    """
    if device is None:
        return None
    text = str(device).strip().lower()
    if text == "cpu":
        return None
    m = re.fullmatch(r"cuda(?::(\d+|local))?", text)
    if not m:
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'cuda:local', not {device!r}")
    return int(local_rank) if m.group(1) == "local" else int(m.group(1) or 0)
