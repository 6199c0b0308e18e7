"""The page cache, controlled: drop it, evict files from it, warm files into it, and see what it holds.

A *cold* read must come from the device. As root the whole page cache is dropped
(``sync; echo 3 > /proc/sys/vm/drop_caches``); otherwise each file is written back and evicted
with ``posix_fadvise(POSIX_FADV_DONTNEED)``, which is enough for files nobody else holds dirty.
Either way :func:`make_cold` returns a sentence saying which method ran, for the report, and
:func:`resident_fraction` (``cachestat``, else ``mincore``) tells whether it worked.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional, Sequence

from dlstore.errors import DlstoreError
from dlstore.io.system import available_page_cache_bytes, meminfo

__all__ = [
    "drop_page_cache",
    "drop_page_cache_refusal",
    "evict_files",
    "make_cold",
    "make_warm",
    "meminfo",  # from dlstore.io.system, beside the page-cache figures built on it
    "free_page_cache_bytes",
    "cached_bytes",
    "resident_fraction",
]

_DROP_CACHES = "/proc/sys/vm/drop_caches"


def free_page_cache_bytes() -> int:
    """Memory the page cache can grow into (``MemAvailable``): the figure ``io="auto"`` compares
    the dataset size with, so a report and the engine choice quote the same number."""
    return available_page_cache_bytes()


def cached_bytes() -> int:
    """Bytes the page cache holds now (``Cached`` in /proc/meminfo)."""
    return meminfo().get("Cached", 0)


def drop_page_cache_refusal() -> Optional[str]:
    """None when :func:`drop_page_cache` can run here, else why not (not root, read-only /proc)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "not root"
    if not os.access(_DROP_CACHES, os.W_OK):
        return f"{_DROP_CACHES} is not writable (a container without the privilege?)"
    return None


def drop_page_cache() -> str:
    """Writes dirty pages back, then drops the page cache, dentries and inodes (root only).

    Returns
    -------
    str
        What ran, for the report.

    Raises
    ------
    PermissionError
        When not root or /proc/sys/vm is read-only; :func:`make_cold` falls back to eviction then.
    """
    refusal = drop_page_cache_refusal()
    if refusal:
        raise PermissionError(f"cannot drop the page cache: {refusal}")
    # Dirty pages cannot be dropped, only written back: sync first or some of the data stays cached.
    os.sync()
    with open(_DROP_CACHES, "w") as f:
        f.write("3\n")
    return "dropped the page cache (sync; echo 3 > /proc/sys/vm/drop_caches)"


def evict_files(paths: Iterable[str]) -> str:
    """Evicts each file from the page cache: ``fdatasync`` then ``posix_fadvise(0, 0, DONTNEED)``.

    Works without privileges on files the caller can open. Pages another process keeps dirty or
    locked may stay; :func:`resident_fraction` tells.

    Returns
    -------
    str
        What ran, for the report.
    """
    n = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            try:
                os.fdatasync(fd)  # DONTNEED skips dirty pages: write them back first
            except OSError:
                pass  # read-only or special filesystems refuse it; clean pages are evicted anyway
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        n += 1
    return f"evicted {n} {'file' if n == 1 else 'files'} with posix_fadvise(POSIX_FADV_DONTNEED)"


def make_warm(paths: Sequence[str], chunk: int = 16 << 20) -> str:
    """Reads every file once so that it sits in the page cache; returns what ran, for reports."""
    view = memoryview(bytearray(chunk))
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(view):
                pass
    return f"read once before the run ({len(paths)} {'file' if len(paths) == 1 else 'files'})"


def make_cold(paths: Sequence[str]) -> str:
    """Makes the next read of ``paths`` come from the device; returns which method ran.

    Drops the whole page cache when root; otherwise (or when /proc/sys/vm is read-only) evicts
    the files, and the returned text says why.
    """
    refusal = drop_page_cache_refusal()
    if refusal is None:
        try:
            return drop_page_cache()
        except OSError as e:  # e.g. EACCES inside a user namespace that reports euid 0
            refusal = str(e)
    return f"{evict_files(paths)} (cannot drop the page cache: {refusal})"


def resident_fraction(paths: Iterable[str]) -> Optional[float]:
    """Fraction of the files' pages in the page cache now (0.0 cold, 1.0 warm); None when unknown: a file
    that cannot be opened or mapped, or whose cache state the kernel keeps from this process (not its owner
    or a writer, nor ``CAP_FOWNER``). Asked as the O_DIRECT engines ask (``_C.cached_pages``: cachestat, else
    mincore)."""
    from dlstore import _C

    resident = total = 0
    for p in paths:
        try:
            counted = _C.cached_pages(p)
        except (OSError, DlstoreError):
            return None
        if counted is None:
            return None
        resident += counted[0]
        total += counted[1]
    return resident / total if total else 1.0
