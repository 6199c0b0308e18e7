"""What the machine says about where bytes come from: the mount holding a path, and the memory the
page cache can use. The engine choice (:mod:`dlstore.io.select`) and the benchmark header
(:mod:`dlstore.bench.sysinfo`) both read these, so they always quote the same facts.
"""
from __future__ import annotations

import os
import re
from typing import Dict, Optional, TypedDict

__all__ = [
    "available_cores", "cpuinfo_field", "Mount", "filesystem_of", "unescape_mount_field", "meminfo",
    "available_page_cache_bytes", "format_bytes", "open_files_budget",
]

_PROC_MOUNTS = "/proc/mounts"
_PROC_MEMINFO = "/proc/meminfo"
# The kernel writes space, tab, newline and backslash in /proc/mounts fields as \040 \011 \012 \134.
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def cpuinfo_field(name: str, path: str = "/proc/cpuinfo") -> Optional[str]:
    """The value of the first ``name`` line of /proc/cpuinfo (``model name``, ``flags``...), or None
    where there is no such file or line."""
    try:
        with open(path) as f:
            for line in f:
                if line.split(":", 1)[0].strip() == name:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Mount(TypedDict):
    """The mount holding a path: ``mount`` point, filesystem type (``fstype``) and ``device``."""

    mount: str
    fstype: str
    device: str


def unescape_mount_field(field: str) -> str:
    """A field of /proc/mounts or /proc/self/mountinfo, with its octal escapes (space, tab, newline,
    backslash) decoded."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def filesystem_of(path: str, mounts_file: str = _PROC_MOUNTS) -> Mount:
    """The mount holding ``path``, from /proc/mounts.

    The longest mount point containing the (symlink-resolved) path wins; among mounts stacked on
    the same point, the one listed last, since a later mount shadows the earlier ones.

    Parameters
    ----------
    path : str
        Any path; it need not exist.
    mounts_file : str, optional
        The mount table to read (a test can pass its own).

    Returns
    -------
    Mount
        ``{"mount": "", "fstype": "unknown", "device": "unknown"}`` when the table is unreadable.
    """
    real = os.path.realpath(path)
    best: Mount = {"mount": "", "fstype": "unknown", "device": "unknown"}
    try:
        with open(mounts_file) as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                point = unescape_mount_field(parts[1])
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                # >= so that the last of several mounts on one point wins.
                if inside and len(point) >= len(best["mount"]):
                    best = {"mount": point, "fstype": parts[2], "device": unescape_mount_field(parts[0])}
    except OSError:
        pass
    return best


def meminfo(meminfo_file: str = _PROC_MEMINFO) -> Dict[str, int]:
    """``/proc/meminfo`` in bytes (``{"MemTotal": ..., "MemAvailable": ..., "Cached": ...}``).

    Empty when the file cannot be read (not Linux).
    """
    out: Dict[str, int] = {}
    try:
        with open(meminfo_file) as f:
            for line in f:
                name, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    scale = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
                    out[name.strip()] = int(parts[0]) * scale
    except OSError:
        pass
    return out


def available_page_cache_bytes() -> int:
    """Memory the page cache can grow into: ``MemAvailable`` from /proc/meminfo (0 when unknown).

    ``io="auto"`` compares the dataset size with this figure, and benchmark reports quote it.
    """
    return meminfo().get("MemAvailable", 0)


def cgroup_memory_room(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> Optional[int]:
    """Bytes this process's memory cgroup may still charge (its limit less its usage: cgroup v2's
    ``memory.max`` and ``memory.current``, or v1's ``memory.limit_in_bytes`` and ``memory.usage_in_bytes``);
    None without a limit, or where it cannot be read. A container's MemAvailable is the host's."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            where = os.path.join(root, path.lstrip("/"))
            files, cache = ("memory.max", "memory.current"), "inactive_file"
        elif "memory" in controllers.split(","):
            where = os.path.join(root, "memory", path.lstrip("/"))
            files, cache = ("memory.limit_in_bytes", "memory.usage_in_bytes"), "total_inactive_file"
        else:
            continue
        try:
            with open(os.path.join(where, files[0])) as f:
                limit = f.read().strip()
            with open(os.path.join(where, files[1])) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:  # v1 writes ~2**63 for no limit
            continue
        # The usage counts the page cache the group's reads filled; its inactive part is reclaimed on demand.
        reclaimable = 0
        try:
            with open(os.path.join(where, "memory.stat")) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == cache:
                        reclaimable = int(value)
        except (OSError, ValueError):
            pass
        return max(0, int(limit) - usage + reclaimable)
    return None


def existing_parent(path: str) -> str:
    """``path`` if it is a directory, else its nearest ancestor that is: where a file or directory about to be
    made at ``path`` would go (for its free space, or whether it can be written)."""
    where = os.path.abspath(path)
    while not os.path.isdir(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    return where


def format_bytes(n: float) -> str:
    """Bytes in the decimal unit that fits, as storage, memory and datasets are quoted, with three
    significant digits: ``3.14 GB``, ``24.9 GB``, ``46.1 MB``, ``512 B`` (never a 46 MB set as
    ``0.0 GB``)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale * 0.9995:  # 999.6 MB reads better as 1.00 GB than as 1000 MB
            value = n / scale
            return f"{value:.{2 if abs(value) < 10 else 1 if abs(value) < 100 else 0}f} {unit}"
    return f"{n:.0f} B"


def open_files_budget() -> int:
    """Files one read plan may keep open at once besides those its reads in flight hold (its C++
    ``max_open_files``, least recently used closed first), within this process's soft ``RLIMIT_NOFILE``:
    ``(soft - 128) // 2``, at least 16 and at most 1024.

    Two plan readers can be alive at once (a window's and the next one's, read ahead), and 128
    descriptors are left to the rest of the process and to the reads in flight. At the common soft
    limit of 1024 a plan keeps 448 files open, where 1024 ran out of descriptors ("Too many open
    files") before the plan's own limit was reached.
    """
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(16, min(1024, (int(soft) - 128) // 2))
