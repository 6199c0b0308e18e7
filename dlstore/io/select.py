"""``io="auto"``: pick an engine once, and say why.

- The dataset is larger than the memory the page cache can have: ``direct`` (O_DIRECT), so the
  read neither thrashes the cache nor pays a copy out of it.
- It fits: ``buffered``, so every epoch after the first is served from RAM.
- O_DIRECT refused by the filesystem (tmpfs, some FUSE mounts): ``buffered``, saying so.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = ["ENGINES", "EngineChoice", "resolve_engine", "probe_direct", "available_page_cache_bytes"]

ENGINES = ("buffered", "mmap", "direct")


@dataclass(frozen=True)
class EngineChoice:
    """The engine that will run, what was asked for, and why they are what they are."""

    engine: str
    requested: str
    reason: str

    def __str__(self) -> str:
        return f"{self.engine} ({self.reason})"


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def available_page_cache_bytes() -> int:
    """Memory the page cache can use: ``MemAvailable`` from /proc/meminfo (0 when unreadable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _fs_type(path: str) -> str:
    """The filesystem type of the mount holding ``path`` (longest matching mount point)."""
    path = os.path.realpath(path)
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    mnt = parts[1].replace("\\040", " ")
                    if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                        best, kind = mnt, parts[2]
    except OSError:
        pass
    return kind


def probe_direct(path: str) -> Optional[str]:
    """None when ``path`` can be opened with O_DIRECT, else the reason it cannot."""
    flag = getattr(os, "O_DIRECT", None)
    if flag is None:
        return "this platform has no O_DIRECT"
    try:
        fd = os.open(path, os.O_RDONLY | flag)
    except OSError as e:
        return f"{_fs_type(path)} at {path} refuses O_DIRECT ({e.strerror})"
    os.close(fd)
    return None


def resolve_engine(requested: str, paths: Sequence[str], total_bytes: int, compressed: bool = False,
                   available: Optional[int] = None) -> EngineChoice:
    """Resolves ``requested`` (``auto`` or an engine name) for these files, once.

    Parameters
    ----------
    requested : str
        ``auto``, ``buffered``, ``mmap`` or ``direct``.
    paths : sequence of str
        The files to be read (the first one is probed for O_DIRECT).
    total_bytes : int
        Their total size.
    compressed : bool
        Whether any of them is compressed (decompression runs on the CPU either way).
    available : int, optional
        Memory available to the page cache; read from /proc/meminfo when omitted.

    Returns
    -------
    EngineChoice
    """
    if requested == "gds":
        from dlstore.errors import GdsUnavailableError

        raise GdsUnavailableError("io='gds' reads into GPU memory through kvikio; this build reads into host "
                                  "memory only (buffered, mmap, direct). Use one of those.")
    if requested not in ENGINES + ("auto",):
        raise ValueError(f"io must be 'auto' or one of {ENGINES}, not {requested!r}")
    if requested in ("buffered", "mmap"):
        return EngineChoice(requested, requested, "requested")
    refused = probe_direct(paths[0]) if paths else None
    if requested == "direct":
        if refused:
            return EngineChoice("buffered", requested, f"direct requested, but {refused}: reading buffered")
        return EngineChoice("direct", requested, "requested")
    if available is None:
        available = available_page_cache_bytes()
    if total_bytes > available:
        if refused:
            return EngineChoice("buffered", requested,
                                f"dataset {_gb(total_bytes)} exceeds the {_gb(available)} available to the page "
                                f"cache, but {refused}")
        return EngineChoice("direct", requested,
                            f"dataset {_gb(total_bytes)} exceeds the {_gb(available)} available to the page cache: "
                            f"O_DIRECT avoids thrashing the cache and a copy out of it")
    return EngineChoice("buffered", requested,
                        f"dataset {_gb(total_bytes)} fits in the {_gb(available)} available to the page cache: "
                        f"buffered, so later epochs are served from RAM")
