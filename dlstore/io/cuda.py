"""What CUDA and GPUDirect Storage this machine offers, found at run time, and what that allows.

Nothing here needs CUDA to import or build (the driver through :mod:`ctypes`, kvikio and CuPy imported
lazily). :func:`cuda_facts` gathers the facts once per process without initialising CUDA or starting
kvikio's thread pool, so a process may then fork DataLoader workers; ``cuda_facts(init=True)`` asks
the driver and kvikio themselves, in the process that reads. :func:`gds_verdict` and
:func:`device_missing` are pure functions of the facts: every report quotes the same reasons, and tests
feed them machines they are not. :func:`kvikio_backends` says which backend moved the bytes.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

__all__ = ["CudaFacts", "GdsVerdict", "probe_cuda", "cuda_facts", "gds_verdict", "device_missing", "parse_device",
           "load_driver", "find_library_file", "kvikio_compat_env", "cufile_property", "kvikio_monitor",
           "kvikio_backends"]

Loader = Callable[[str], Any]


@dataclass
class CudaFacts:
    """What was found; each ``*_error``/``*_how`` says why or how.

    ``driver``: the CUDA driver's version, None without ``libcuda.so.1``. ``devices``: GPU names in index
    order (after ``cuInit`` with ``init``; else ``/proc/driver/nvidia/gpus`` narrowed by
    ``CUDA_VISIBLE_DEVICES``). ``kvikio``, ``cupy``: versions, None when not installed. ``libcufile``:
    where it is. ``kvikio_compat``: ``KVIKIO_COMPAT_MODE`` (``on``, ``off``, ``auto``);
    ``kvikio_compat_preferred``: kvikio's own answer, asked with ``init`` only. ``cufile_json``: the
    cuFile configuration read; ``cufile_allow_compat``, ``cufile_p2pdma``: its ``allow_compat_mode``
    and ``use_pci_p2pdma`` (None: not set).
    """

    driver: Optional[str] = None
    driver_error: str = ""
    devices: List[str] = field(default_factory=list)
    devices_how: str = ""
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
    cufile_p2pdma: Optional[bool] = None

    def as_dict(self) -> Dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class GdsVerdict:
    """Whether ``io="gds"`` can run: ``missing`` (empty, or one line naming what is missing), ``mode``
    (``gds``: cuFile reads straight into GPU memory; ``compat``: kvikio reads through host memory with
    POSIX calls and copies; ``none``) and ``reason``, in the words every report uses."""

    missing: str
    mode: str
    reason: str

    @property
    def runs(self) -> bool:
        return not self.missing


def find_library_file(stem: str) -> Optional[str]:
    """A file for ``lib<stem>``, not loaded: in the NVIDIA pip wheels (``site-packages/nvidia/*/lib``),
    else as ``ctypes.util.find_library`` finds it."""
    for base in sys.path:
        hits = sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib*", f"lib{stem}.so*")))
        if hits:
            return hits[-1]
    return ctypes.util.find_library(stem)


def load_driver(load: Loader = ctypes.CDLL) -> Optional[Any]:
    """``libcuda.so.1`` (tests stand in for it), or None when it cannot be loaded."""
    try:
        return load("libcuda.so.1")
    except OSError:
        return None


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def _count_devices(facts: CudaFacts, lib: Any) -> None:
    """``cuInit`` and the driver's count and names: initialises CUDA in this process."""
    rc = lib.cuInit(0)
    if rc != 0:  # 100: CUDA_ERROR_NO_DEVICE; others: a broken driver, a container without /dev/nvidia*
        facts.driver_error = ("no GPU (cuInit: no CUDA-capable device)" if rc == 100
                              else f"the CUDA driver failed to initialise (cuInit returned {rc})")
        return
    count, dev, name = ctypes.c_int(0), ctypes.c_int(0), ctypes.create_string_buffer(256)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        facts.driver_error = "cuDeviceGetCount failed"
        return
    for i in range(count.value):
        ok = lib.cuDeviceGet(ctypes.byref(dev), i) == 0 and lib.cuDeviceGetName(name, 256, dev) == 0
        facts.devices.append(name.value.decode(errors="replace") if ok else f"device {i} (name unavailable)")
    facts.devices_how = "cuInit"


def _listed_devices(proc_gpus: str, environ: Mapping[str, str]) -> Tuple[List[str], str]:
    """The GPUs the kernel driver lists (no CUDA call: fork-safe), narrowed by ``CUDA_VISIBLE_DEVICES``."""
    names, uuids = [], []
    for info in sorted(glob.glob(os.path.join(proc_gpus, "*", "information"))):
        with open(info) as f:
            text = f.read()
        model, uuid = (re.search(rf"^{key}:\s*(.+)$", text, re.M) for key in ("Model", "GPU UUID"))
        names.append(model.group(1).strip() if model else os.path.basename(os.path.dirname(info)))
        uuids.append(uuid.group(1).strip() if uuid else "")
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return names, proc_gpus
    picked = []
    for entry in (e.strip() for e in visible.split(",")):  # CUDA stops at the first entry it cannot use
        match = [i for i, u in enumerate(uuids) if entry.startswith("GPU-") and u.startswith(entry)]
        if entry.isdigit() and int(entry) < len(names):
            picked.append(names[int(entry)])
        elif len(match) == 1 or entry.startswith("MIG-"):
            picked.append(names[match[0]] if match else f"MIG instance {entry}")
        else:
            break
    return picked, f"{proc_gpus}, CUDA_VISIBLE_DEVICES={visible}"


def _module_version(name: str, import_it: bool) -> Tuple[Optional[str], str]:
    """``(version, why not)`` of a module; without ``import_it`` it is only looked up (importing kvikio
    loads libcufile)."""
    module = sys.modules.get(name)
    try:
        if module is None and not import_it:
            if importlib.util.find_spec(name) is None:
                return None, f"{name} is not installed (pip install 'dlstore[gpu]')"
            dists = importlib.metadata.packages_distributions().get(name) or [name]
            return importlib.metadata.version(dists[0]), ""
        module = module or importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - a module that fails to import for any reason is not usable
        if isinstance(e, ImportError) and e.name == name:
            return None, f"{name} is not installed (pip install 'dlstore[gpu]')"
        return None, f"{name} cannot be imported: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
    return str(getattr(module, "__version__", "unknown version")), ""


def kvikio_compat_env(environ: Mapping[str, str]) -> str:
    """``KVIKIO_COMPAT_MODE`` as kvikio reads it: ``on``, ``off`` or ``auto`` (unset: ``auto``)."""
    raw = environ.get("KVIKIO_COMPAT_MODE", "").strip().lower()
    return "on" if raw in ("on", "true", "yes", "1") else "off" if raw in ("off", "false", "no", "0") else "auto"


def cufile_property(text: str, name: str) -> Optional[bool]:
    """A boolean ``properties.<name>`` of a cufile.json text (which may hold ``//`` comments), or None."""
    try:
        doc = json.loads("\n".join(re.sub(r"(^|\s)//.*$", "", line) for line in text.splitlines()))
    except ValueError:
        return None
    value = doc.get("properties", {}).get(name) if isinstance(doc, dict) else None
    return value if isinstance(value, bool) else None


def _nvidia_fs_loaded(proc_nvfs: str, proc_modules: str) -> Tuple[bool, str]:
    if os.path.exists(proc_nvfs):
        return True, f"{proc_nvfs} exists"
    try:
        with open(proc_modules) as f:
            listed = any(line.split(" ", 1)[0] == "nvidia_fs" for line in f)
    except OSError:
        return False, f"neither {proc_nvfs} nor {proc_modules} can be read"
    return listed, f"nvidia_fs in {proc_modules}" if listed else f"no {proc_nvfs}, no nvidia_fs in {proc_modules}"


def probe_cuda(*, init: bool = False, load: Loader = ctypes.CDLL, environ: Optional[Mapping[str, str]] = None,
               proc_nvfs: str = "/proc/driver/nvidia-fs", proc_modules: str = "/proc/modules",
               proc_gpus: str = "/proc/driver/nvidia/gpus") -> CudaFacts:
    """Looks for the CUDA driver and GPUs, kvikio, CuPy, libcufile, nvidia-fs and the compat-mode settings.

    With ``init`` it asks CUDA and kvikio themselves (``cuInit`` counts the GPUs; kvikio, imported, says
    whether it prefers its compat mode, which starts its thread pool); without (the default) nothing is
    initialised, imported or started. ``load`` opens a library (tests pass a stand-in); ``environ``
    defaults to ``os.environ``; ``proc_*`` are where nvidia-fs and the GPUs show themselves.
    """
    environ = os.environ if environ is None else environ
    facts = CudaFacts()
    lib, version = load_driver(load), ctypes.c_int(0)
    if lib is None:
        facts.driver_error = "no CUDA driver (libcuda.so.1 cannot be loaded)"
    elif lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
        facts.driver_error = "the CUDA driver does not report its version"
    else:
        facts.driver = _cuda_version(version.value)
        if init:
            _count_devices(facts, lib)
        else:
            facts.devices, facts.devices_how = _listed_devices(proc_gpus, environ)
        if not facts.devices and not facts.driver_error:
            facts.driver_error = f"no GPU (none in {facts.devices_how})"
    facts.kvikio, facts.kvikio_error = _module_version("kvikio", init)
    facts.cupy, facts.cupy_error = _module_version("cupy", init)
    if init and facts.kvikio is not None and not facts.driver_error:
        try:
            facts.kvikio_compat_preferred = bool(importlib.import_module("kvikio.defaults").is_compat_mode_preferred())
        except Exception:  # noqa: BLE001 - a kvikio without it: the environment says
            pass
    facts.libcufile = find_library_file("cufile")
    facts.nvidia_fs, facts.nvidia_fs_how = _nvidia_fs_loaded(proc_nvfs, proc_modules)
    facts.kvikio_compat = kvikio_compat_env(environ)
    json_path = environ.get("CUFILE_ENV_PATH_JSON") or "/etc/cufile.json"
    try:
        with open(json_path) as f:
            text = f.read()
        facts.cufile_json = json_path
        facts.cufile_allow_compat = cufile_property(text, "allow_compat_mode")
        facts.cufile_p2pdma = cufile_property(text, "use_pci_p2pdma")
    except OSError:
        pass
    return facts


@functools.lru_cache(maxsize=2)
def cuda_facts(init: bool = False) -> CudaFacts:
    """:func:`probe_cuda` once per process: without ``init`` wherever only a verdict is needed
    (``io="gds"``, ``io="auto"``, ``device=`` checks, which may run before workers fork); with it in the
    process that reads into a GPU."""
    return probe_cuda(init=init)


def device_missing(facts: CudaFacts, index: int = 0) -> str:
    """Empty when CUDA device ``index`` can be used; else one line naming what is missing."""
    if facts.driver is None or facts.driver_error:
        return facts.driver_error or "no CUDA driver"
    if index >= len(facts.devices):
        return f"no CUDA device {index} (the driver sees {len(facts.devices)})"
    return ""


def gds_verdict(facts: CudaFacts, index: int = 0) -> GdsVerdict:
    """Whether the gds engine can run on device ``index``, and whether cuFile would read true GDS or kvikio
    its compat mode (POSIX reads through host memory), with the reason. True GDS needs libcufile and
    nvidia-fs or PCI P2PDMA (``use_pci_p2pdma`` in cufile.json); kvikio still decides per file, and
    :func:`kvikio_backends` says after a pass what ran."""
    missing = [m for m in (device_missing(facts, index),
                           facts.kvikio is None and (facts.kvikio_error or "kvikio is not installed"),
                           facts.cupy is None and (facts.cupy_error or "cupy is not installed")) if m]
    if missing:
        missing += [] if facts.libcufile else ["libcufile not found"]
        return GdsVerdict("io='gds' cannot run: " + "; ".join(missing), "none", "; ".join(missing))
    if facts.kvikio_compat == "on":
        return GdsVerdict("", "compat", "compat mode: KVIKIO_COMPAT_MODE=on makes kvikio read with POSIX calls "
                                        "into host memory and copy")
    if facts.libcufile is None:
        why = "libcufile not found"
    elif facts.kvikio_compat_preferred:
        why = "kvikio prefers its compat mode here (libcufile unusable)"
    elif not (facts.nvidia_fs or facts.cufile_p2pdma):
        why = f"nvidia-fs not loaded, and {facts.cufile_json or 'no cufile.json'} does not set use_pci_p2pdma"
    else:
        how = "nvidia-fs loaded" if facts.nvidia_fs else f"PCI P2PDMA ({facts.cufile_json}: use_pci_p2pdma)"
        fallback = "off" if facts.cufile_allow_compat is False else "on"
        return GdsVerdict("", "gds", f"GPUDirect Storage: libcufile at {facts.libcufile}, {how}; kvikio decides "
                                     f"per file (cuFile's compat fallback {fallback})")
    if facts.kvikio_compat == "off":
        return GdsVerdict(f"io='gds' cannot run: {why}, and KVIKIO_COMPAT_MODE=off forbids kvikio's compat mode",
                          "none", why)
    return GdsVerdict("", "compat", f"compat mode: {why}: kvikio reads with POSIX calls into host memory and copies")


def parse_device(device: object, local_rank: int = 0) -> Optional[int]:
    """The CUDA device index of ``"cuda"``, ``"cuda:1"``, ``"cuda:local"`` (the GPU numbered as the
    process's ``local_rank``) or a torch-like device; None for ``None`` and ``"cpu"``; else ValueError."""
    text = "cpu" if device is None else str(device).strip().lower()
    if text == "cpu":
        return None
    m = re.fullmatch(r"cuda(?::(\d+|local))?", text)
    if not m:
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'cuda:local', not {device!r}")
    return int(local_rank) if m.group(1) == "local" else int(m.group(1) or 0)


# ---- what kvikio did -------------------------------------------------------------------------------

def kvikio_monitor() -> Optional[Any]:
    """A ``kvikio.SummaryMonitor`` (kvikio counts its I/O by backend while one exists; new in kvikio 26.10),
    or None for an older kvikio. Make it in the process that reads, before the reads."""
    import kvikio

    monitor = getattr(kvikio, "SummaryMonitor", None)
    return monitor() if monitor is not None else None


def kvikio_backends(monitor: Optional[Any]) -> Dict[str, Any]:
    """Which of kvikio's backends moved the bytes counted by ``monitor`` (:func:`kvikio_monitor`).

    Returns
    -------
    dict
        ``gds_mode``: ``gds`` (all through cuFile), ``compat`` (all through POSIX: kvikio's compat
        mode, or reads under its ``gds_threshold``), ``gds+compat``, ``none`` (nothing read) or
        ``unknown`` (no monitor); ``bytes`` and ``reads`` per backend (``GDS``, ``POSIX``), ``errors``
        and ``reason``, one line. The monitor counts every thread of the process.
    """
    if monitor is None:
        return {"gds_mode": "unknown", "bytes": {}, "reads": {}, "errors": 0,
                "reason": "this kvikio has no statistics (kvikio.SummaryMonitor, 26.10 and later)"}
    by = monitor.get().by_backend
    moved = {b: by.get(b, {}).get("bytes_transferred", 0) for b in ("GDS", "POSIX")}
    reads = {b: by.get(b, {}).get("num_ops", 0) for b in ("GDS", "POSIX")}
    errors = sum(v.get("num_errors", 0) for v in by.values())
    mode = {(True, True): "gds+compat", (True, False): "gds", (False, True): "compat"}.get(
        (reads["GDS"] > 0, reads["POSIX"] > 0), "none")
    reason = (f"kvikio's statistics: {moved['GDS']} bytes in {reads['GDS']} reads through cuFile (GDS), "
              f"{moved['POSIX']} bytes in {reads['POSIX']} reads through POSIX (compat mode, or under "
              f"gds_threshold); {errors} failed")
    return {"gds_mode": mode, "bytes": moved, "reads": reads, "errors": errors, "reason": reason}
