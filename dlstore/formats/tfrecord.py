"""TFRecord framing: ``uint64 length | masked crc32c(length) | data | masked crc32c(data)``,
little-endian. Reading is done by the C++ core; this module frames records for writing."""
from __future__ import annotations

import struct
from typing import Optional, Tuple

import numpy as np

from dlstore.formats import index

__all__ = ["HEADER_BYTES", "FOOTER_BYTES", "frame_parts", "masked_crc32c", "looks_like_tfrecord",
           "SUFFIXES", "index_beside", "format_index", "parse_index"]

HEADER_BYTES = 12
FOOTER_BYTES = 4
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


def masked_crc32c(data) -> int:
    """The masked CRC-32C that TFRecord stores, computed by the C++ core (hardware CRC when present)."""
    from dlstore import _C

    return _C.masked_crc32c(data)


def frame_parts(data) -> tuple:
    """The header and footer that surround ``data`` in a TFRecord file.

    Returns
    -------
    (bytes, bytes)
        The 12-byte header and the 4-byte footer; the record is ``header + data + footer``.
    """
    length = _U64.pack(len(memoryview(data).cast("B")))
    header = length + _U32.pack(masked_crc32c(length))
    return header, _U32.pack(masked_crc32c(data))


def looks_like_tfrecord(head: bytes) -> bool:
    """True when the first 12 bytes are a TFRecord header whose length CRC checks."""
    if len(head) < HEADER_BYTES:
        return False
    return masked_crc32c(head[:8]) == _U32.unpack_from(head, 8)[0]


#: File-name endings that say TFRecord.
SUFFIXES = (".tfrecord", ".tfrec", ".tfrecords")


def index_beside(path: str) -> str:
    """The index beside a shard: ``x.idx``."""
    return path + index.INDEX_SUFFIX


def format_index(offsets: np.ndarray, lengths: np.ndarray) -> str:
    """``offset size`` lines (DALI's and the ``tfrecord`` package's), ``size`` the whole frame."""
    return index.format_tfrecord_index(offsets, index.frame_sizes(lengths))


def parse_index(text: str, source: str) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """``(frame offsets, frame sizes)`` from ``offset size`` lines."""
    return index.parse_tfrecord_index(text, source)
