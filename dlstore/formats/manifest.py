"""A dataset manifest: what every shard of a directory holds, in one compact binary file.

One file describes the record files of a directory: per shard its name, size, modification time
(ns), record count and the byte offset of each record's frame, so that a rank learns the whole
dataset by opening one file instead of one index per shard; and the directory's listing of record
files with the directory's modification time when it was taken (the *stamp*), so that while the
directory is unchanged a rank learns its shards without listing it.

Its sections are laid out so that a rank reads the small ones (names, counts, sizes, mtimes) and,
of the large one (the frame offsets), only its own shards' entries: the arrays are views of the
mapped file, and a page is read when a rank first touches it.

Layout (version 2), little-endian::

    b"DLSTMAN\\x02"        magic and version
    i64                    stamp: the directory's mtime (ns) when the listing was taken; 0: unknown
    u64                    length H of the header
    H bytes                JSON: {"format", "shards", "records", "offset_bytes", "names_bytes",
                           "listing_bytes", "total_bytes"}
    names_bytes            shard names, sorted, "\\n" between them (UTF-8)
    listing_bytes          the directory's record files, sorted, "\\n" between them; empty when they
                           are the shard names
    i64[shards] x 3        record counts, sizes, mtimes (ns)
    u32|u64[records]       frame offsets, shard after shard (u32 when every shard is under 4 GiB)

Every section starts on an 8-byte boundary (zero padding). A record's frame ends where the next one
of its shard starts, or at the end of the shard. Version 1 (names in the JSON header, no listing) is
still read. This module packs and unpacks bytes; :mod:`dlstore.sources.indexing` reads and writes
the files.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["MAGIC", "MAGIC_V1", "MANIFEST_NAME", "STAMP_AT", "Manifest", "encode_manifest", "decode_manifest",
           "encode_stamp"]

MAGIC = b"DLSTMAN\x02"
MAGIC_V1 = b"DLSTMAN\x01"
#: The manifest's name inside the directory it describes (hidden, so globs and listings skip it).
MANIFEST_NAME = ".dlstore-manifest"
#: Where the stamp lies in the file: it is rewritten in place once the listing is known to be current.
STAMP_AT = 8


def _pad(n: int) -> int:
    return -n % 8


@dataclass(frozen=True)
class Manifest:
    """The shards of one directory.

    Attributes
    ----------
    format : str
        ``tfrecord`` or ``recordio`` (every shard is uncompressed).
    names_blob : bytes or memoryview
        Shard file names relative to the directory, sorted, ``\\n`` between them (:attr:`names` as a list).
    listing_blob : bytes, memoryview or None
        The directory's record files when the listing was taken, likewise; None: the same as the names
        (or, in a version 1 manifest, not known).
    stamp : int
        The directory's mtime (ns) when the listing was taken; 0 when unknown.
    sizes, mtimes, counts : numpy.ndarray
        Per shard: bytes, modification time in ns, records (int64).
    first : numpy.ndarray
        Per shard, the position of its first record in :attr:`offsets`; one more entry at the end.
    offsets : numpy.ndarray
        Every record's frame offset in its shard, shard after shard (uint32 or uint64; possibly a
        view of a mapped file).
    offsets_at : int
        Where the offsets start in the file (what a reader maps for random access).
    version : int
    """

    format: str
    names_blob: object
    listing_blob: Optional[object]
    stamp: int
    sizes: np.ndarray
    mtimes: np.ndarray
    counts: np.ndarray
    first: np.ndarray
    offsets: np.ndarray
    offsets_at: int = 0
    version: int = 2

    @functools.cached_property
    def names(self) -> List[str]:
        """The shard names as a list (decoded once, when asked for)."""
        blob = bytes(self.names_blob)
        return blob.decode().split("\n") if blob else []

    def frames(self, shards: np.ndarray, records: np.ndarray,
               take: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> Tuple[np.ndarray, np.ndarray]:
        """``(offset, size)`` of the frames of ``records[i]`` of shard ``shards[i]`` (indices into
        :attr:`names`), as int64; touches only those records' entries. ``take``: how entries of
        :attr:`offsets` are fetched (positions -> values; default: indexing the array)."""
        shards = np.asarray(shards, dtype=np.int64)
        records = np.asarray(records, dtype=np.int64)
        at = self.first[shards] + records
        last = records + 1 >= self.counts[shards]
        both = np.concatenate([at, np.where(last, at, at + 1)])
        values = (self.offsets[both] if take is None else take(both)).astype(np.int64)
        offset, following = values[:len(at)], values[len(at):]
        return offset, np.where(last, self.sizes[shards], following) - offset

    def shard_offsets(self, shard: int) -> np.ndarray:
        """The frame offsets of one shard (int64)."""
        return self.offsets[self.first[shard]:self.first[shard + 1]].astype(np.int64)


def _blob(names: Sequence[str]) -> bytes:
    blob = "\n".join(names).encode()
    if any("\n" in n for n in names):
        raise ValueError("a shard name holds a newline; a manifest cannot describe it")
    return blob


def encode_manifest(fmt: str, names: Sequence[str], sizes: Sequence[int], mtimes: Sequence[int],
                    counts: Sequence[int], offsets: np.ndarray, listing: Optional[Sequence[str]] = None,
                    stamp: int = 0) -> List[bytes]:
    """The manifest's bytes, as pieces to write one after the other (the offsets are not copied
    into one buffer). ``names`` sorted; ``listing`` (sorted) when the directory holds other record
    files than ``names``."""
    sizes, mtimes, counts = (np.asarray(a, dtype="<i8") for a in (sizes, mtimes, counts))
    if not len(names) == len(sizes) == len(mtimes) == len(counts):
        raise ValueError("a manifest needs one size, mtime and record count per shard")
    if int(counts.sum()) != len(offsets):
        raise ValueError(f"{int(counts.sum())} records counted but {len(offsets)} offsets given")
    names_blob = _blob(names)
    listing_blob = b"" if listing is None or list(listing) == list(names) else _blob(listing)
    wide = len(sizes) and int(sizes.max()) >= 1 << 32
    width = 8 if wide else 4
    header = json.dumps({"format": fmt, "shards": len(names), "records": len(offsets), "offset_bytes": width,
                         "names_bytes": len(names_blob), "listing_bytes": len(listing_blob),
                         "total_bytes": int(sizes.sum())}).encode()
    head = MAGIC + np.int64(stamp).astype("<i8").tobytes() + np.uint64(len(header)).astype("<u8").tobytes() + header
    head += b"\0" * _pad(len(head))
    table = np.asarray(offsets, dtype="<u8" if wide else "<u4")
    return [head, names_blob + b"\0" * _pad(len(names_blob)), listing_blob + b"\0" * _pad(len(listing_blob)),
            counts.tobytes(), sizes.tobytes(), mtimes.tobytes(), memoryview(table).cast("B")]


def encode_stamp(stamp: int) -> bytes:
    """The bytes to write at :data:`STAMP_AT` to set a version 2 manifest's stamp."""
    return np.int64(stamp).astype("<i8").tobytes()


def decode_manifest(buffer, source: str = "manifest") -> Manifest:
    """Reads a manifest from ``buffer`` (bytes or a mapped file; the arrays are views of it).

    Raises
    ------
    ValueError
        When the bytes are not a manifest or are cut short; the message names ``source``.
    """
    view = memoryview(buffer)
    magic = bytes(view[:8])
    if magic == MAGIC_V1:
        return _decode_v1(view, source)
    if magic != MAGIC:
        raise ValueError(f"{source} is not a dlstore manifest (bad magic)")
    if len(view) < 24:
        raise ValueError(f"{source} is cut short: {len(view)} bytes")
    stamp = int(np.frombuffer(view, "<i8", 1, 8)[0])
    length = int(np.frombuffer(view, "<u8", 1, 16)[0])
    if 24 + length > len(view):
        raise ValueError(f"{source} is cut short: its header needs {length} bytes")
    try:
        header = json.loads(bytes(view[24:24 + length]))
        fmt, n, total, width = (header["format"], int(header["shards"]), int(header["records"]),
                                int(header["offset_bytes"]))
        names_bytes, listing_bytes = int(header["names_bytes"]), int(header["listing_bytes"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{source}: unreadable header ({e})") from e
    if width not in (4, 8) or min(n, total, names_bytes, listing_bytes) < 0:
        raise ValueError(f"{source}: inconsistent header")
    at = 24 + length + _pad(24 + length)
    names_blob = view[at:at + names_bytes]
    at += names_bytes + _pad(names_bytes)
    listing_blob = view[at:at + listing_bytes] if listing_bytes else None
    at += listing_bytes + _pad(listing_bytes)
    need = at + 3 * 8 * n + width * total
    if len(view) != need:
        raise ValueError(f"{source} has {len(view)} bytes, its header describes {need}")
    if (names_bytes and n == 0) or (n and bytes(names_blob).count(b"\n") != n - 1):
        raise ValueError(f"{source}: its names do not number its {n} shards")
    counts, sizes, mtimes = (np.frombuffer(view, "<i8", n, at + 8 * n * i) for i in range(3))
    offsets_at = at + 24 * n
    offsets = np.frombuffer(view, "<u8" if width == 8 else "<u4", total, offsets_at)
    return Manifest(fmt, names_blob, listing_blob, stamp, sizes, mtimes, counts, _first(counts, total, source),
                    offsets, offsets_at, 2)


def _first(counts: np.ndarray, total: int, source: str) -> np.ndarray:
    if len(counts) and (counts.min() < 0 or int(counts.sum()) != total):
        raise ValueError(f"{source}: record counts do not add up to its {total} records")
    first = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=first[1:])
    return first


def _decode_v1(view: memoryview, source: str) -> Manifest:
    """Version 1: names in the JSON header, then sizes, mtimes, counts and the offsets; no listing."""
    if len(view) < 16:
        raise ValueError(f"{source} is cut short")
    length = int(np.frombuffer(view, "<u8", 1, 8)[0])
    if 16 + length > len(view):
        raise ValueError(f"{source} is cut short: its header needs {length} bytes")
    try:
        header = json.loads(bytes(view[16:16 + length]))
        fmt, n, total, width, names = (header["format"], int(header["shards"]), int(header["records"]),
                                       int(header["offset_bytes"]), list(header["names"]))
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{source}: unreadable header ({e})") from e
    if width not in (4, 8) or len(names) != n:
        raise ValueError(f"{source}: inconsistent header")
    at = 16 + length + _pad(16 + length)
    need = at + 3 * 8 * n + width * total
    if len(view) != need:
        raise ValueError(f"{source} has {len(view)} bytes, its header describes {need}")
    sizes, mtimes, counts = (np.frombuffer(view, "<i8", n, at + 8 * n * i) for i in range(3))
    offsets = np.frombuffer(view, "<u8" if width == 8 else "<u4", total, at + 24 * n)
    return Manifest(fmt, "\n".join(names).encode(), None, 0, sizes, mtimes, counts, _first(counts, total, source),
                    offsets, at + 24 * n, 1)
