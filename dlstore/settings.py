"""One table for every knob: default, validation, environment variable and help text.

``--help`` texts and docs/settings.md are generated from :data:`SETTINGS`, so they cannot drift.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from dlstore.io.select import REQUESTS as _IO_REQUESTS

__all__ = ["Setting", "SETTINGS", "get", "is_default", "markdown_table"]

MiB = 1 << 20


def _size(text: Any) -> int:
    """Parses 8388608, '8M', '8MiB', '64k'."""
    if isinstance(text, int):
        return text
    s = str(text).strip().lower().replace("ib", "").replace("b", "")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if mult > 1 else s) * mult)


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    env: str
    help: str
    parse: Callable[[Any], Any] = str
    check: Optional[Callable[[Any], bool]] = None
    check_text: str = ""


def _positive(v: Any) -> bool:
    return v > 0


SETTINGS: Dict[str, Setting] = {
    s.name: s
    for s in [
        Setting("io", "auto", "DLSTORE_IO",
                "I/O engine: auto, buffered, mmap or direct. auto picks and says why. gds (GPUDirect "
                "Storage into GPU memory through kvikio) names what is missing where it cannot run.",
                str, lambda v: v in _IO_REQUESTS, "one of " + ", ".join(_IO_REQUESTS)),
        Setting("chunk_size", 8 * MiB, "DLSTORE_CHUNK_SIZE",
                "Bytes per read. Large reads keep O_DIRECT streaming; records are split out in C++.",
                _size, lambda v: v >= 64 << 10, "at least 64 KiB"),
        Setting("headroom", 1 * MiB, "DLSTORE_HEADROOM",
                "Space before each chunk that joins a record split across two reads without a copy "
                "of the whole record; larger records are assembled apart.",
                _size, lambda v: v >= 64 << 10, "at least 64 KiB"),
        Setting("depth", 4, "DLSTORE_DEPTH", "Chunks in flight per reader (read-ahead).", int, _positive,
                "a positive integer"),
        Setting("io_threads", 2, "DLSTORE_IO_THREADS",
                "Threads issuing reads for one reader; a Dataset checks each record's frame and CRCs on them "
                "too.", int, _positive, "a positive integer"),
        Setting("verify_threads", max(1, min(4, (os.cpu_count() or 2) - 1)), "DLSTORE_VERIFY_THREADS",
                "Threads besides the consumer that check TFRecord data CRCs of each batch of files read "
                "in order (open_records; 0: the consumer alone). One core reads memory at about CRC "
                "speed, so a second one helps.",
                int, lambda v: v >= 0, "a non-negative integer"),
        Setting("read_timeout", 120.0, "DLSTORE_READ_TIMEOUT",
                "Seconds an open or a read may take before it counts as failed (a hung mount) and is "
                "retried on a replica mount; 0 waits forever.", float, lambda v: v >= 0, "a non-negative number"),
        Setting("max_retries", 2, "DLSTORE_MAX_RETRIES",
                "Retries of a failed read at the same place, once no replica mount is left to fail over to.",
                int, lambda v: v >= 0, "a non-negative integer"),
        Setting("block_size", 8 * MiB, "DLSTORE_BLOCK_SIZE",
                "Bytes of a shard read in one go through one mount, and the unit the block shuffle "
                "reorders. A rank reading several mounts alternates between them block by block, so "
                "all of them stream at once.",
                _size, lambda v: v >= 64 << 10, "at least 64 KiB"),
        Setting("shuffle_window", 128 * MiB, "DLSTORE_SHUFFLE_WINDOW",
                "Bytes of a consumer's shard-shuffled sequence within which the block shuffle reorders "
                "its blocks (0: the whole share). Reads jump about within a few shards at a time, which "
                "seek-bound storage serves faster than jumps across the whole data set (docs/placement.md).",
                _size, lambda v: v >= 0, "0 or more bytes"),
        Setting("shuffle_buffer", 64 * MiB, "DLSTORE_SHUFFLE_BUFFER",
                "Bytes of records the shuffle buffer of Dataset's block and buffer shuffles holds (in "
                "records: this over the dataset's mean record size, unless buffer_size is given).",
                _size, lambda v: v >= 64 << 10, "at least 64 KiB"),
        Setting("cache_dir", "~/.cache/dlstore", "DLSTORE_CACHE",
                "Where generated datasets and indexes of read-only data are kept.", os.path.expanduser),
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
        raw, source = s.default, "default"
    try:
        value = s.parse(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={raw!r} (from {source}) is not valid: expected {s.check_text or 'a value'}") from None
    if s.check is not None and not s.check(value):
        raise ValueError(f"{name}={raw!r} (from {source}) is not valid: expected {s.check_text}")
    return value


def markdown_table() -> str:
    """The settings as a markdown table, for docs/settings.md."""
    rows = ["| setting | default | environment | meaning |", "|---|---|---|---|"]
    for s in SETTINGS.values():
        rows.append(f"| `{s.name}` | `{s.default}` | `{s.env}` | {s.help} |")
    return "\n".join(rows) + "\n"
