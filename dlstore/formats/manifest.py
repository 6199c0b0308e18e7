"""A dataset manifest: what every shard of a directory holds, in one compact binary file.

One file describes the record files of a directory: per shard its name, size, modification time
(ns), record count and the byte offset of each record's frame, so that a rank learns the whole
dataset by opening one file instead of one index per shard, and reads from it only the offsets of
the records it reads (the arrays are views of the mapped file).

Layout, little-endian::

    b"DLSTMAN\\x01"        magic and version
    u64                    length H of the header
    H bytes                JSON: {"format", "shards", "records", "offset_bytes", "names"}
    padding to 8 bytes
    i64[shards]            sizes
    i64[shards]            mtimes (ns)
    i64[shards]            record counts
    u32|u64[records]       frame offsets, shard after shard (u32 when every shard is under 4 GiB)

A record's frame ends where the next one of its shard starts, or at the end of the shard.
This module packs and unpacks bytes; :mod:`dlstore.sources.indexing` reads and writes the files.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np

__all__ = ["MAGIC", "MANIFEST_NAME", "Manifest", "encode_manifest", "decode_manifest"]

MAGIC = b"DLSTMAN\x01"
#: The manifest's name inside the directory it describes (hidden, so globs and listings skip it).
MANIFEST_NAME = ".dlstore-manifest"


@dataclass(frozen=True)
class Manifest:
    """The shards of one directory.

    Attributes
    ----------
    format : str
        ``tfrecord`` or ``recordio`` (every shard is uncompressed).
    names : list of str
        Shard file names, relative to the directory.
    sizes, mtimes, counts : numpy.ndarray
        Per shard: bytes, modification time in ns, records (int64).
    first : numpy.ndarray
        Per shard, the position of its first record in :attr:`offsets`; one more entry at the end.
    offsets : numpy.ndarray
        Every record's frame offset in its shard, shard after shard (uint32 or uint64; possibly a
        view of a mapped file).
    """

    format: str
    names: List[str]
    sizes: np.ndarray
    mtimes: np.ndarray
    counts: np.ndarray
    first: np.ndarray
    offsets: np.ndarray

    def frames(self, shards: np.ndarray, records: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """``(offset, size)`` of the frames of ``records[i]`` of shard ``shards[i]`` (indices into
        :attr:`names`), as int64; touches only those records' entries."""
        shards = np.asarray(shards, dtype=np.int64)
        records = np.asarray(records, dtype=np.int64)
        at = self.first[shards] + records
        offset = self.offsets[at].astype(np.int64)
        last = records + 1 >= self.counts[shards]
        following = self.offsets[np.where(last, at, at + 1)].astype(np.int64)
        return offset, np.where(last, self.sizes[shards], following) - offset

    def shard_offsets(self, shard: int) -> np.ndarray:
        """The frame offsets of one shard (int64)."""
        return self.offsets[self.first[shard]:self.first[shard + 1]].astype(np.int64)


def encode_manifest(fmt: str, names: Sequence[str], sizes: Sequence[int], mtimes: Sequence[int],
                    counts: Sequence[int], offsets: np.ndarray) -> List[bytes]:
    """The manifest's bytes, as pieces to write one after the other (the offsets are not copied
    into one buffer)."""
    sizes, mtimes, counts = (np.asarray(a, dtype="<i8") for a in (sizes, mtimes, counts))
    if not len(names) == len(sizes) == len(mtimes) == len(counts):
        raise ValueError("a manifest needs one size, mtime and record count per shard")
    if int(counts.sum()) != len(offsets):
        raise ValueError(f"{int(counts.sum())} records counted but {len(offsets)} offsets given")
    wide = len(sizes) and int(sizes.max()) >= 1 << 32
    width = 8 if wide else 4
    header = json.dumps({"format": fmt, "shards": len(names), "records": len(offsets), "offset_bytes": width,
                         "names": list(names)}).encode()
    head = MAGIC + np.uint64(len(header)).astype("<u8").tobytes() + header
    head += b"\0" * (-len(head) % 8)
    table = np.asarray(offsets, dtype="<u8" if wide else "<u4")
    return [head, sizes.tobytes(), mtimes.tobytes(), counts.tobytes(), memoryview(table).cast("B")]


def decode_manifest(buffer, source: str = "manifest") -> Manifest:
    """Reads a manifest from ``buffer`` (bytes or a mapped file; the arrays are views of it).

    Raises
    ------
    ValueError
        When the bytes are not a manifest or are cut short; the message names ``source``.
    """
    view = memoryview(buffer)
    if len(view) < 16 or bytes(view[:8]) != MAGIC:
        raise ValueError(f"{source} is not a dlstore manifest (bad magic)")
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
    at = 16 + length + (-(16 + length) % 8)
    need = at + 3 * 8 * n + width * total
    if len(view) != need:
        raise ValueError(f"{source} has {len(view)} bytes, its header describes {need}")
    sizes, mtimes, counts = (np.frombuffer(view, "<i8", n, at + 8 * n * i) for i in range(3))
    offsets = np.frombuffer(view, "<u8" if width == 8 else "<u4", total, at + 24 * n)
    if len(counts) and (counts.min() < 0 or int(counts.sum()) != total):
        raise ValueError(f"{source}: record counts do not add up to its {total} records")
    first = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=first[1:])
    return Manifest(fmt, names, sizes, mtimes, counts, first, offsets)
