"""The system-information header every benchmark prints first: what ran, where, on what.

CPU model and cores, kernel, the filesystem holding the data (from /proc/mounts), the memory the
page cache can use, the I/O engine that resolved and why, whether the CRC is in hardware, and
the GPU/GDS status. Plus per-core CPU counters, for the busiest-core figure that the Dell EMC Isilon
reference architecture uses as the bottleneck signal, and for telling when other processes took CPU
time during a measurement (:func:`trust_warnings`).
"""
from __future__ import annotations

import os
import platform
import resource
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from dlstore import __version__
from dlstore.io import cuda  # cuda.cuda_facts looked up at each call: tests stand in for the machine
from dlstore.io.cuda import gds_verdict
from dlstore.io.memory import device_path
from dlstore.io.pagecache import cached_bytes
from dlstore.io.system import (
    available_cores,
    available_page_cache_bytes,
    cpuinfo_field,
    filesystem_of,
    format_bytes,
    meminfo,
)

# filesystem_of is dlstore.io.system's, the one the engine choice reads too.
__all__ = ["cpu_model", "filesystem_of", "gpu_status", "device_fields", "device_row", "collect", "format_header",
           "per_core_cpu_ticks", "busiest_core_percent", "other_processes_cores", "outside_the_run", "trust_warnings",
           "MIN_STABLE_SECONDS", "OTHERS_TOLERATED_CORES"]

#: A measurement shorter than this is dominated by start-up and timer noise: its figure is flagged.
MIN_STABLE_SECONDS = 2.0
#: Cores that other processes may keep busy, on average, during a measurement before it is flagged:
#: a quarter of a core is what a shell, a logger and the kernel's own threads stay below.
OTHERS_TOLERATED_CORES = 0.25


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    return cpuinfo_field("model name") or platform.processor() or "unknown"


def gpu_status() -> str:
    """A line on the GPU and GPUDirect Storage: the devices, and what ``io="gds"`` would do here or
    what it lacks (:func:`dlstore.io.cuda.gds_verdict`, as ``dlstore info`` says it)."""

    facts = cuda.cuda_facts()
    verdict = gds_verdict(facts)
    gpus = ", ".join(facts.devices) if facts.devices else "no GPU"
    gds = (f"gds cannot run ({verdict.reason})" if verdict.missing
           else f"gds runs in {verdict.mode} mode ({verdict.reason})")
    return f"{gpus}; {gds}"


def device_fields(index: Optional[int], path: Optional[str] = None, pinned: bool = True) -> Dict[str, Any]:
    """Where a benchmark delivers its data, as its header and JSON carry it.

    Returns
    -------
    dict
        ``device`` (``cpu`` or ``cuda:N``), ``device_name`` (the driver's, for a GPU), ``device_path``
        (how the data reaches it: ``path``, by default the loader's pinned-memory copy) and ``pinned``
        (host buffers page-locked).
    """
    if index is None:
        return {"device": "cpu", "device_name": None, "device_path": "batches in host memory", "pinned": False}
    devices = cuda.cuda_facts().devices
    return {"device": f"cuda:{index}", "device_name": devices[index] if index < len(devices) else None,
            "device_path": path or device_path(index), "pinned": bool(pinned)}


def device_row(fields: Dict[str, Any]) -> Tuple[str, str]:
    """The header's ``device`` row of :func:`device_fields`."""
    name = f" ({fields['device_name']})" if fields.get("device_name") else ""
    pinned = "; host buffers pinned (cuMemHostRegister)" if fields["pinned"] else ""
    return "device", f"{fields['device']}{name}: {fields['device_path']}{pinned}"


def _crc_status() -> str:
    try:
        from dlstore import _C
    except ImportError as e:
        return f"unknown (the C++ core is not built: {e})"
    return "hardware CRC-32C (SSE4.2)" if _C.crc32c_is_hardware() else "software CRC-32C (table)"


def collect(paths: Sequence[str] = (), engine: Optional[str] = None,
            engine_reason: Optional[str] = None) -> dict:
    """The header's facts as a dict (it goes into the JSON as ``sysinfo``)."""

    info: dict = {
        "cpu": cpu_model(),
        "cores": available_cores(),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "dlstore": __version__,
        "memory_bytes": meminfo().get("MemTotal", 0),
        "page_cache_available_bytes": available_page_cache_bytes(),
        "page_cache_used_bytes": cached_bytes(),
        "crc": _crc_status(),
        "gpu": gpu_status(),
    }
    if paths:
        fs = filesystem_of(paths[0])
        info["data_dir"] = os.path.dirname(os.path.abspath(paths[0]))
        info["filesystem"] = fs["fstype"]
        info["mount"] = fs["mount"]
        info["device"] = fs["device"]
        other = {filesystem_of(p)["mount"] for p in paths[1:]} - {fs["mount"]}
        if other:
            info["other_mounts"] = sorted(other)
    if engine is not None:
        info["engine"] = engine
        info["engine_reason"] = engine_reason or ""
    return info


def format_header(info: dict, extra: Sequence[Tuple[str, str]] = ()) -> str:
    """The header as aligned ``name  value`` lines, with ``extra`` rows (a benchmark's own) last."""
    rows = [
        ("CPU", f"{info['cpu']}, {info['cores']} cores"),
        ("kernel", info["kernel"]),
        ("memory", (f"{format_bytes(info['memory_bytes'])}; page cache can use "
                    f"{format_bytes(info['page_cache_available_bytes'])}, "
                    f"holds {format_bytes(info['page_cache_used_bytes'])}")),
    ]
    if "filesystem" in info:
        where = f"{info['data_dir']} on {info['filesystem']} ({info['device']} at {info['mount']})"
        if info.get("other_mounts"):
            where += f"; also {', '.join(info['other_mounts'])}"
        rows.append(("data", where))
    if "engine" in info:
        rows.append(("io engine", f"{info['engine']}: {info['engine_reason']}"))
    rows += [("CRC", info["crc"]), ("GPU/GDS", info["gpu"]),
             ("software", f"dlstore {info['dlstore']}, Python {info['python']}")]
    rows += list(extra)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def per_core_cpu_ticks() -> List[tuple]:
    """``(busy, total)`` clock ticks per core from /proc/stat (empty where it does not exist)."""
    out = []
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("cpu") and line[3:4].isdigit():
                    v = [int(x) for x in line.split()[1:]]
                    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
                    total = sum(v[:8])  # user..steal; guest time is already inside user
                    out.append((total - idle, total))
    except OSError:
        pass
    return out


def per_core_percent(before: List[tuple], after: List[tuple]) -> List[Optional[float]]:
    """Utilisation of each core between two :func:`per_core_cpu_ticks` samples (None where no tick passed)."""
    return [100.0 * (b1 - b0) / (t1 - t0) if t1 > t0 else None for (b0, t0), (b1, t1) in zip(before, after)]


def busiest_core_percent(before: List[tuple], after: List[tuple]) -> Optional[float]:
    """Utilisation of the busiest core between two :func:`per_core_cpu_ticks` samples (system-wide)."""
    return max((p for p in per_core_percent(before, after) if p is not None), default=None)


def other_processes_cores(before: List[tuple], after: List[tuple], process_cpu_s: float,
                          seconds: float) -> Optional[float]:
    """Cores that processes other than this one kept busy, on average, between two
    :func:`per_core_cpu_ticks` samples ``seconds`` apart: the machine's busy time (/proc/stat, every
    core) less this process's CPU time, over the wall time. None where /proc/stat is missing, or over
    under 50 clock ticks (0.5 s), where the ticks' rounding on every core outweighs what is measured."""
    if not before or not after or seconds * os.sysconf("SC_CLK_TCK") < 50:
        return None
    busy_s = sum(b1 - b0 for (b0, _), (b1, _) in zip(before, after)) / os.sysconf("SC_CLK_TCK")
    return max(0.0, busy_s - process_cpu_s) / seconds


def outside_the_run(ranks: Sequence[Tuple[str, Optional[float], Optional[float]]]) -> List[Optional[float]]:
    """Each rank's :func:`other_processes_cores` less the CPU of the run's other ranks on its host.

    ``ranks``: per rank, ``(host, other_processes_cores, process_cpu_pct)`` as it measured them over
    the same span (the ranks run a tier together). A rank's "other processes" are every process but
    itself, its sibling ranks included: they are the run, not a load on it.
    """
    out: List[Optional[float]] = []
    for i, (host, others, _) in enumerate(ranks):
        if others is None:
            out.append(None)
            continue
        siblings = sum(cpu for j, (h, _, cpu) in enumerate(ranks) if j != i and h == host and cpu is not None)
        out.append(max(0.0, others - siblings / 100.0))
    return out


def trust_warnings(what: str, seconds: float, others_cores: Optional[float]) -> List[str]:
    """Why the figure of ``what`` (a tier, a pass) may not be trusted: it lasted under
    :data:`MIN_STABLE_SECONDS`, or other processes kept more than :data:`OTHERS_TOLERATED_CORES`
    cores busy meanwhile. Empty when neither."""
    out = []
    if seconds < MIN_STABLE_SECONDS:
        out.append(f"{what} lasted {seconds:.2f} s, under {MIN_STABLE_SECONDS:.0f} s: too short for a stable "
                   "figure (use more data)")
    if others_cores is not None and others_cores > OTHERS_TOLERATED_CORES:
        out.append(f"{what}: other processes kept {others_cores:.2f} cores busy on average meanwhile "
                   f"({available_cores()} available to this one): the figure may be low; rerun on a quiet machine")
    return out


def process_cpu_seconds() -> float:
    """User + system CPU time of this process: getrusage(RUSAGE_SELF) covers every thread (the C++
    readers, CRC checkers and decoders included), with microsecond resolution, unlike os.times()."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
