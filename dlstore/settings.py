"""One table for every knob: default, validation, environment variable and help text.

``--help`` texts and docs/settings.md are generated from :data:`SETTINGS` (and the build's variables
from :mod:`dlstore.build_settings`), so they cannot drift. A default may depend on the machine (a
:class:`Default`: its formula is what the docs show) and on the case a reader runs in (its
:class:`Adjust` rules: the engine, the number of mounts, whether records are reordered); both are
defined here, once, and :func:`effective` applies them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from dlstore.build_settings import BUILD_VARIABLES
from dlstore.io.select import REQUESTS as _IO_REQUESTS
from dlstore.io.system import available_cores

__all__ = ["Setting", "Default", "Adjust", "Case", "SETTINGS", "IO_HOST_HELP", "get", "is_default", "effective",
           "markdown_table", "MAX_THREADS"]

MiB = 1 << 20
GiB = 1 << 30
_CACHE_DIR = "~/.cache/dlstore"
TiB = 1 << 40
#: Threads one thread-count setting may ask for: far more than storage or CRC checks keep busy (io_uring keeps
#: its reads in flight with queue_depth, not threads), and well under the thread limits of processes, so a
#: typo is refused here, naming the setting, rather than failing to start threads in the C++ core.
MAX_THREADS = 1024


def _size(text: Any) -> int:
    """Parses 8388608, '8M', '8MiB', '64k'."""
    if isinstance(text, int):
        return text
    s = str(text).strip().lower().replace("ib", "").replace("b", "")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if mult > 1 else s) * mult)


def _port(text: Any) -> Any:
    """A port number, or None for an unset or empty value."""
    return None if text is None or str(text).strip() == "" else int(text)


def _flag(text: Any) -> bool:
    """Parses a switch: unset, '' , '0', 'false', 'no' and 'off' are off; anything else is on."""
    if isinstance(text, bool):
        return text
    return str(text).strip().lower() not in ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Default:
    """A default that depends on the machine: ``value(cores)`` for the cores this process may use, and
    ``formula``, the same rule in words, which the docs show."""

    formula: str
    value: Callable[[int], Any]


@dataclass(frozen=True)
class Case:
    """What a reader is about to do, which some defaults depend on.

    Attributes
    ----------
    engine : str
        The I/O engine that runs (``io="auto"`` resolved).
    in_order : bool
        Files read front to back (:func:`~dlstore.open_records`), rather than a read plan.
    mounts : int
        Mount points read at once.
    reorders : bool
        A read plan whose records go through a shuffle buffer.
    """

    engine: str
    in_order: bool = True
    mounts: int = 1
    reorders: bool = False


@dataclass(frozen=True)
class Adjust:
    """A rule that changes a setting's default (never an explicit value) in some cases: ``when`` says
    which, ``apply`` gives the new value from the default, ``text`` says both in words for the docs,
    and ``why`` says the reason."""

    text: str
    when: Callable[[Case], bool]
    apply: Callable[[Any, Case], Any]
    why: str = ""


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    env: str
    help: str
    parse: Callable[[Any], Any] = str
    check: Optional[Callable[[Any], bool]] = None
    check_text: str = ""
    adjust: Tuple[Adjust, ...] = ()

    def base_default(self) -> Any:
        """The default on this machine, before any case's adjustment."""
        return self.default.value(available_cores()) if isinstance(self.default, Default) else self.default

    def default_text(self) -> str:
        """The default as the docs show it: the value, or the formula of a machine-dependent one."""
        return self.default.formula if isinstance(self.default, Default) else str(self.default)


#: The ``io`` setting's help on the host engines alone, for a command that offers no gds (the pipeline benches).
IO_HOST_HELP = "I/O engine: auto, buffered, mmap, direct or io_uring. auto picks and says why."


def _positive(v: Any) -> bool:
    return v > 0


SETTINGS: Dict[str, Setting] = {
    s.name: s
    for s in [
        Setting("io", "auto", "DLSTORE_IO",
                IO_HOST_HELP + " gds (GPUDirect Storage into GPU memory through kvikio) names what is missing "
                "where it cannot run.",
                str, lambda v: v in _IO_REQUESTS, "one of " + ", ".join(_IO_REQUESTS)),
        Setting("chunk_size", 8 * MiB, "DLSTORE_CHUNK_SIZE",
                "Bytes per read. Large reads keep O_DIRECT streaming; records are split out in C++.",
                _size, lambda v: 64 << 10 <= v <= GiB, "at least 64 KiB and at most 1 GiB",
                adjust=(Adjust("mmap reading files in order: 8x", lambda c: c.engine == "mmap" and c.in_order,
                               lambda v, c: v * 8,
                               "its chunks are views of the mapping, so a larger one costs no memory and halves "
                               "the hand-offs between the consumer and the CRC thread per GB; a read plan keeps "
                               "chunk_size, its chunks are its blocks"),)),
        Setting("headroom", 1 * MiB, "DLSTORE_HEADROOM",
                "Space before each chunk that joins a record split across two reads without a copy "
                "of the whole record; larger records are assembled apart.",
                _size, lambda v: 64 << 10 <= v <= GiB, "at least 64 KiB and at most 1 GiB"),
        Setting("depth", 4, "DLSTORE_DEPTH", "Chunks in flight per reader (read-ahead).", int, _positive,
                "a positive integer",
                adjust=(Adjust("a shuffle buffer: 2x", lambda c: c.reorders, lambda v, c: v * 2,
                               "its reads are blocks of about chunk_size in a seeded order, where records read in "
                               "order come in chunks of whole batches: it needs more of them ahead"),
                        Adjust("several mounts: at least 4 per mount", lambda c: c.mounts > 1,
                               lambda v, c: max(v, 4 * c.mounts),
                               "each mount has io_threads threads of its own, so a mount running late does not "
                               "hold the threads the others need"))),
        Setting("io_threads", 2, "DLSTORE_IO_THREADS",
                "Threads issuing reads for one reader; a Dataset checks each record's frame and CRCs on them "
                f"too. At most {MAX_THREADS}.", int, lambda v: 1 <= v <= MAX_THREADS,
                f"a positive integer, at most {MAX_THREADS}"),
        Setting("verify_threads", Default("cores - 1, at least 1, at most 4", lambda cores: max(1, min(4, cores - 1))),
                "DLSTORE_VERIFY_THREADS",
                "Threads besides the consumer that check TFRecord data CRCs of each batch of files read "
                "in order (open_records; 0: the consumer alone). One core reads memory at about CRC "
                f"speed, so a second one helps. At most {MAX_THREADS}.",
                int, lambda v: 0 <= v <= MAX_THREADS, f"a non-negative integer, at most {MAX_THREADS}",
                adjust=(Adjust("direct or io_uring with direct_cache off: 0",
                               lambda c: c.engine in ("direct", "io_uring") and not get("direct_cache"),
                               lambda v, c: 0,
                               "every read comes from the device and lands in RAM, not in cache; a second CRC "
                               "thread only adds memory traffic. With direct_cache on, what the page cache holds "
                               "comes at memory speed, and the CRC threads are what keeps up with it (a GPU "
                               "machine's direct + pinned + copy read a warm set at 0.76x kvikio with none, "
                               "docs/gpu.md run 6)"),)),
        Setting("queue_depth", 0, "DLSTORE_QUEUE_DEPTH",
                "Reads each I/O thread keeps in flight at once with io=io_uring (a read plan's records, a "
                "large read's 1 MiB pieces). 0: the device's own limit, its queue's nr_requests in sysfs, at "
                "most 64 (deeper only queues in the block layer), or 64 where there is no block device.",
                int, lambda v: v >= 0, "0 (the device's limit) or a positive integer"),
        Setting("direct_cache", True, "DLSTORE_DIRECT_CACHE",
                "O_DIRECT engines (direct, io_uring) read what the page cache already holds from it (a read whose"
                " pages are all resident, by cachestat(2), or mincore before Linux 6.5), not from the device "
                "again; the reader's cache_bytes_read stat counts those bytes. Off (0, false, no or off): every "
                "read goes to the device, to measure it. The kernel tells a process the page cache's state only "
                "for files it owns or may write (or as root): for others every read goes to the device.", _flag),
        Setting("read_timeout", 120.0, "DLSTORE_READ_TIMEOUT",
                "Seconds an open or a read may take before it counts as failed (a hung mount) and is "
                "retried on a replica mount; likewise a stat, a listing or a manifest read while a Dataset is "
                "made or plans a pass, which then raises naming the path. 0 waits forever.", float,
                lambda v: 0 <= v <= 1e7,
                "0 (wait forever) or a number of seconds up to 1e7"),
        Setting("max_retries", 2, "DLSTORE_MAX_RETRIES",
                "Retries of a failed read at the same place, once no replica mount is left to fail over to.",
                int, lambda v: v >= 0, "a non-negative integer"),
        Setting("block_size", 8 * MiB, "DLSTORE_BLOCK_SIZE",
                "Bytes of a shard read in one go through one mount, and the unit the block shuffle "
                "reorders. A rank reading several mounts alternates between them block by block, so "
                "all of them stream at once.",
                _size, lambda v: 64 << 10 <= v <= GiB, "at least 64 KiB and at most 1 GiB"),
        Setting("shuffle_window", 128 * MiB, "DLSTORE_SHUFFLE_WINDOW",
                "Bytes of a consumer's shard-shuffled sequence within which the block shuffle reorders "
                "its blocks (0: the whole share). Reads jump about within a few shards at a time, which "
                "seek-bound storage serves faster than jumps across the whole data set (docs/placement.md).",
                _size, lambda v: 0 <= v <= TiB, "0 or more bytes, at most 1 TiB"),
        Setting("plan_window_files", 4096, "DLSTORE_PLAN_WINDOW_FILES",
                "A global pass whose records lie in more files than this (its records or the shards, the "
                "fewer) is given to the reader a window of batches at a time, each window's frame offsets "
                "fetched and files checked when it is planned: a rank of a large job starts after its first "
                "window, not after its whole epoch's (docs/placement.md). 0: every global pass.",
                int, lambda v: v >= 0, "0 or more files"),
        Setting("shuffle_buffer", 64 * MiB, "DLSTORE_SHUFFLE_BUFFER",
                "Bytes of records the shuffle buffer of Dataset's block and buffer shuffles holds (in "
                "records: this over the dataset's mean record size, unless buffer_size is given).",
                _size, lambda v: 64 << 10 <= v <= TiB, "at least 64 KiB and at most 1 TiB"),
        Setting("cache_dir", _CACHE_DIR, "DLSTORE_CACHE",
                "Where generated datasets and indexes of read-only data are kept (empty: the default).",
                lambda t: os.path.expanduser(str(t).strip() or _CACHE_DIR)),
        Setting("no_progress", False, "DLSTORE_NO_PROGRESS",
                "Set (to anything but 0, false, no or off): no progress bars or progress lines, even on a "
                "terminal.", _flag),
        Setting("metrics_port", None, "DLSTORE_METRICS_PORT",
                "Set: the first Loader or Dataset of a process serves Prometheus metrics of every Loader and "
                "Dataset on this port plus the local rank (0: a free port; not in DataLoader workers); a "
                "Dataset a Loader reads is counted in the Loader's series only; see dlstore.metrics.", _port,
                lambda v: v is None or 0 <= v <= 65535, "a port number, 0..65535"),
    ]
}


def is_default(name: str, override: Any = None) -> bool:
    """Whether setting ``name`` is left at its default: no explicit value and no environment variable.

    Code that picks a better default for a case (an engine, a number of mounts) does so only then.
    """
    return override is None and SETTINGS[name].env not in os.environ


def get(name: str, override: Any = None) -> Any:
    """The value of a setting: the explicit override, else the environment variable, else the default.

    Raises
    ------
    ValueError
        When the value does not pass the setting's check; the message names the setting and its source.
    """
    s = SETTINGS[name]
    if override is not None:
        raw, source = override, "argument"
    elif s.env in os.environ:
        raw, source = os.environ[s.env], f"environment variable {s.env}"
    else:
        raw, source = s.base_default(), "default"
    try:
        value = s.parse(raw)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(float("inf"))
        raise ValueError(f"{name}={raw!r} (from {source}) is not valid: expected {s.check_text or 'a value'}") from None
    if s.check is not None and not s.check(value):
        raise ValueError(f"{name}={raw!r} (from {source}) is not valid: expected {s.check_text}")
    return value


def effective(name: str, override: Any, case: Case) -> Any:
    """The value of setting ``name`` for a reader in ``case``: :func:`get`, then, when the setting is
    left at its default, every :class:`Adjust` rule of the setting that applies, in order."""
    value = get(name, override)
    if is_default(name, override):
        for rule in SETTINGS[name].adjust:
            if rule.when(case):
                value = rule.apply(value, case)
    return value


def markdown_table() -> str:
    """The settings as markdown, for docs/settings.md: the run-time table, how defaults change with
    the case, and the build's environment variables."""
    rows = ["| setting | default | environment | meaning |", "|---|---|---|---|"]
    for s in SETTINGS.values():
        rows.append(f"| `{s.name}` | `{s.default_text()}` | `{s.env}` | {s.help} |")
    rows += ["", "Defaults that depend on the case (an explicit value or environment variable always wins):", "",
             "| setting | case: default | why |", "|---|---|---|"]
    for s in SETTINGS.values():
        for rule in s.adjust:
            rows.append(f"| `{s.name}` | {rule.text} | {rule.why} |")
    rows += ["", "Read when the C++ core is built (`pip install`), not at run time:", "",
             "| environment | default | meaning |", "|---|---|---|"]
    for env, (default, meaning) in BUILD_VARIABLES.items():
        rows.append(f"| `{env}` | {default} | {meaning} |")
    return "\n".join(rows) + "\n"
