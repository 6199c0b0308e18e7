"""``io="auto"``: pick an engine once, and say why.

- The dataset is larger than the memory the page cache can have: O_DIRECT, so the read neither
  thrashes the cache nor pays a copy out of it, through ``io_uring`` where the kernel allows it, so
  that many reads are in flight at once instead of one per I/O thread (a global shuffle's records;
  the 1 MiB pieces of the other shuffles' chunks), else ``direct``.
- ``io_uring`` refused by the kernel (a seccomp filter, ``kernel.io_uring_disabled``, before 5.6):
  ``direct``, saying so.
- It fits: ``buffered``, so every epoch after the first is served from RAM; or ``mmap`` when the
  records are read one by one in random order (a global shuffle): each is copied out of the page
  cache without a system call.
- O_DIRECT refused by the filesystem (tmpfs, some FUSE mounts): ``buffered``, saying so.
- A GPU target (``device="cuda:N"``): ``gds`` when cuFile would read true GPUDirect Storage there
  (:func:`dlstore.io.cuda.gds_verdict`); else the host choice above, saying why not gds (no GPU,
  no kvikio, nvidia-fs not loaded: a compat mode is no faster than reading into pinned memory).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple

from dlstore import _C
from dlstore.errors import GdsUnavailableError
from dlstore.io import cuda  # cuda.cuda_facts looked up at each call: tests stand in for the machine
from dlstore.io.cuda import gds_verdict, parse_device
from dlstore.io.deadline import waiting_on
from dlstore.io.system import available_page_cache_bytes, filesystem_of, format_bytes

__all__ = ["ENGINES", "REQUESTS", "EngineChoice", "resolve_engine", "gds_device", "probe_direct", "probe_io_uring",
           "io_uring_depth"]

#: The engines that read into host memory: the C++ core's registry (csrc/src/engine_registry.cpp).
ENGINES = tuple(_C.engine_names())
# What ``io=`` accepts: the host engines, ``auto``, and ``gds`` (GPU memory, through kvikio), which
# raises GdsUnavailableError naming what is missing where it cannot run.
REQUESTS = ("auto",) + ENGINES + ("gds",)


@dataclass(frozen=True)
class EngineChoice:
    """The engine that will run, what was asked for, and why they are what they are."""

    engine: str
    requested: str
    reason: str
    #: For ``gds``: ``gds`` (true GPUDirect Storage) or ``compat`` (through host memory).
    gds_mode: str = ""

    def __str__(self) -> str:
        return f"{self.engine} ({self.reason})"


def probe_direct(path: str) -> Optional[str]:
    """None when ``path`` can be opened with O_DIRECT, else the reason it cannot."""
    flag = getattr(os, "O_DIRECT", None)
    if flag is None:
        return "this platform has no O_DIRECT"
    try:
        with waiting_on(path, "an open"):
            fd = os.open(path, os.O_RDONLY | flag)
    except OSError as e:
        return f"{filesystem_of(path)['fstype']} at {path} refuses O_DIRECT ({e.strerror})"
    os.close(fd)
    return None


def probe_io_uring() -> Optional[str]:
    """None when this kernel lets this process use io_uring, else the reason it does not."""
    return _C.io_uring_refusal() or None


def io_uring_depth(path: str) -> Tuple[int, str]:
    """The reads io_uring keeps in flight per I/O thread on ``path``'s device (the ``queue_depth``
    setting, else the device's nr_requests, at most 64), and why that many: what the C++ engine uses."""
    from dlstore import settings  # settings imports this module

    with waiting_on(path, "a look at its device's queue"):
        depth, why = _C.io_uring_queue_depth(path, settings.get("queue_depth"))
    return int(depth), why


def _ring_text(paths: Sequence[str]) -> str:
    if not paths:
        return ""
    depth, why = io_uring_depth(paths[0])
    return f"; up to {depth} reads in flight per I/O thread ({why})"


def resolve_engine(requested: str, paths: Sequence[str], total_bytes: int,
                   available: Optional[int] = None, random_reads: bool = False, device: Optional[str] = None,
                   probe: Optional[Callable[[], object]] = None) -> EngineChoice:
    """Resolves ``requested`` (``auto`` or an engine name) for these files, once.

    Parameters
    ----------
    requested : str
        ``auto``, one of :data:`ENGINES` or ``gds`` (GPU memory through kvikio).
    paths : sequence of str
        The files to be read (the first one is probed for O_DIRECT).
    total_bytes : int
        Their total size.
    available : int, optional
        Memory available to the page cache; read from /proc/meminfo when omitted.
    random_reads : bool
        Records are read one by one in random order (a global shuffle) rather than in large runs.
    device : str, optional
        Where the records go: ``cuda:N`` makes ``auto`` consider ``gds``; ``None`` or ``"cpu"``: host memory.
    probe : callable, optional
        Returns the :class:`~dlstore.io.cuda.CudaFacts` (default: :func:`~dlstore.io.cuda.cuda_facts`).

    Returns
    -------
    EngineChoice

    Raises
    ------
    GdsUnavailableError
        For ``gds`` where it cannot run, naming what is missing (no CUDA driver, no GPU, kvikio not
        installed, libcufile not found...).
    ValueError
        For any other name, or ``gds`` with ``device="cpu"``.
    """
    if requested not in REQUESTS:
        raise ValueError(f"io must be one of {', '.join(REQUESTS)}, not {requested!r}")

    gpu = gds_device(device) if requested == "gds" else parse_device(device)
    not_gds = ""
    if requested == "gds" or (requested == "auto" and gpu is not None):
        verdict = gds_verdict((probe or cuda.cuda_facts)(), gpu or 0)
        if requested == "gds":
            if verdict.missing:

                raise GdsUnavailableError(verdict.missing)
            return EngineChoice("gds", requested, f"requested; {verdict.reason}", verdict.mode)
        if verdict.mode == "gds":
            return EngineChoice("gds", requested, f"GPU target cuda:{gpu}, and {verdict.reason}", "gds")
        not_gds = (f"GPU target cuda:{gpu}, but not gds ({verdict.reason}): read into host memory and copied; ")
    choice = _resolve_host(requested, paths, total_bytes, available, random_reads)
    return EngineChoice(choice.engine, requested, not_gds + choice.reason) if not_gds else choice


def gds_device(device: object, local_rank: int = 0) -> int:
    """The GPU ``io="gds"`` reads into: ``device`` (as :func:`~dlstore.io.cuda.parse_device` reads it), cuda:0
    when None.

    Raises
    ------
    ValueError
        ``"cpu"``, which asks for host memory, or a device name that is not one.
    """
    gpu = parse_device(device, local_rank)
    if device is not None and gpu is None:
        raise ValueError(f"io='gds' reads into GPU memory, but device={str(device)!r} asks for host memory: pass "
                         "device='cuda:N', or omit it for cuda:0")
    return gpu or 0


def _resolve_host(requested: str, paths: Sequence[str], total_bytes: int, available: Optional[int],
                  random_reads: bool) -> EngineChoice:
    if requested in ("buffered", "mmap"):
        return EngineChoice(requested, requested, "requested")
    refused = probe_direct(paths[0]) if paths else None
    if requested == "io_uring":
        no_ring = probe_io_uring()
        if no_ring is None:
            return EngineChoice("io_uring", requested, "requested" + (f"; {refused}: through the page cache"
                                                                      if refused else "") + _ring_text(paths))
        requested_but = f"io_uring requested, but {no_ring}"
        if refused:
            return EngineChoice("buffered", requested, f"{requested_but}, and {refused}: reading buffered")
        return EngineChoice("direct", requested, f"{requested_but}: reading direct")
    if requested == "direct":
        if refused:
            return EngineChoice("buffered", requested, f"direct requested, but {refused}: reading buffered")
        return EngineChoice("direct", requested, "requested")
    if available is None:
        available = available_page_cache_bytes()
    if total_bytes > available:
        exceeds = (f"dataset {format_bytes(total_bytes)} exceeds the {format_bytes(available)} available to the "
                   "page cache")
        if refused:
            return EngineChoice("buffered", requested, f"{exceeds}, but {refused}")
        no_ring = probe_io_uring()
        if no_ring is None:
            many = ("a global shuffle reads record by record, and io_uring keeps many O_DIRECT record reads in "
                    "flight at once" if random_reads else
                    "io_uring keeps every 1 MiB piece of each chunk in flight at once, where direct reads "
                    "one piece per I/O thread")
            return EngineChoice("io_uring", requested, f"{exceeds}: O_DIRECT avoids thrashing the cache and a copy "
                                                       f"out of it; {many}" + _ring_text(paths))
        return EngineChoice("direct", requested, f"{exceeds}: O_DIRECT avoids thrashing the cache and a copy "
                                                 f"out of it (not io_uring: {no_ring})")
    fits = f"dataset {format_bytes(total_bytes)} fits in the {format_bytes(available)} available to the page cache"
    if random_reads:
        return EngineChoice("mmap", requested,
                            f"{fits}, and a global shuffle reads record by record: mmap copies each out of the "
                            f"page cache without a system call")
    return EngineChoice("buffered", requested, f"{fits}: buffered, so later epochs are served from RAM")
