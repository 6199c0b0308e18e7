"""MXNet RecordIO: framing (magic ``0xced7230a``, ``cflag << 29 | length``, 4-byte padding,
multi-part records) and the ``IRHeader`` that image records start with.

``IRHeader`` is ``flag:uint32, label:float32, id:uint64, id2:uint64``; when ``flag > 0`` the label
is an array of ``flag`` float32 values stored right after the header.
"""
from __future__ import annotations

import math
import numbers
import struct
from typing import List, NamedTuple, Optional, Tuple, Union

import numpy as np

from dlstore.formats import index

__all__ = ["MAGIC", "IRHeader", "IRHEADER_BYTES", "pack", "unpack", "frame_parts", "looks_like_recordio",
           "SUFFIXES", "index_beside", "format_index", "parse_index"]

MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_HEADER = struct.Struct("<IfQQ")
IRHEADER_BYTES = _HEADER.size  # 24: flag, label, id, id2
_U32x2 = struct.Struct("<II")
_MAX_PART = (1 << 29) - 1
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class IRHeader(NamedTuple):
    """The image-record header. ``label`` is a float, or a float32 array when ``flag > 0``."""

    flag: int
    label: Union[float, np.ndarray]
    id: int
    id2: int


def pack(flag: int, label, id: int, id2: int, data: bytes) -> bytes:
    """Builds a RecordIO payload: an IRHeader, the extra labels if any, then ``data``.

    As in MXNet, a scalar ``label`` is stored in the header (``flag`` is written as 0), and an
    array-like ``label`` is stored after the header with ``flag`` set to its length.

    Examples
    --------
    >>> header, data = unpack(pack(0, 3.0, 7, 0, b"jpeg"))
    >>> (header.label, header.id, data)
    (3.0, 7, b'jpeg')

    Raises
    ------
    ValueError
        When ``id`` or ``id2`` is not an integer in uint64's range, or a label is outside float32's.
    """
    for name, value in (("id", id), ("id2", id2)):
        if not (isinstance(value, numbers.Integral) and 0 <= value < 1 << 64):
            raise ValueError(f"{name} must be an integer from 0 to 2**64-1 (uint64), not {value!r}")
    if isinstance(label, numbers.Number):  # per record in a writer: no numpy on this path
        value = float(label)
        if math.isfinite(value) and abs(value) > _FLOAT32_MAX:  # inf and nan are float32 values
            raise ValueError(_label_out_of_range(value))
        return _HEADER.pack(0, value, id, id2) + bytes(data)
    values = np.asarray(label, dtype=np.float64).ravel()
    too_large = np.flatnonzero(np.isfinite(values) & (np.abs(values) > _FLOAT32_MAX))
    if too_large.size:
        raise ValueError(_label_out_of_range(float(values[too_large[0]])))
    labels = values.astype("<f4")
    return _HEADER.pack(labels.size, 0.0, id, id2) + labels.tobytes() + bytes(data)


def _label_out_of_range(value: float) -> str:
    return f"label {value!r} is outside float32's range (magnitude at most {_FLOAT32_MAX:.2g})"


def unpack(payload) -> Tuple[IRHeader, bytes]:
    """Splits a payload written by :func:`pack` (or MXNet's ``recordio.pack``) into header and data.

    Raises
    ------
    ValueError
        When the payload is shorter than its header says.
    """
    mv = memoryview(payload).cast("B")
    if len(mv) < _HEADER.size:
        raise ValueError(f"RecordIO payload of {len(mv)} bytes is shorter than an IRHeader ({_HEADER.size})")
    flag, label, id_, id2 = _HEADER.unpack_from(mv, 0)
    start = _HEADER.size
    if flag > 0:
        end = start + 4 * flag
        if end > len(mv):
            raise ValueError(f"IRHeader says {flag} labels but the payload has {len(mv)} bytes")
        label = np.frombuffer(mv[start:end], dtype="<f4").astype(np.float32)
        start = end
    return IRHeader(flag, label, id_, id2), bytes(mv[start:])


def frame_parts(payload) -> List[bytes]:
    """The on-disk frames of one record, as MXNet's writer lays them out.

    The payload is cut wherever the magic word sits at a 4-byte-aligned position (the cut drops
    those four bytes; the reader puts them back), giving parts flagged 1 (first), 2 (middle) and
    3 (last), or one part flagged 0. Each frame is padded to 4 bytes.
    """
    data = memoryview(payload).cast("B")
    n = len(data)
    aligned = n - n % 4
    cuts = []
    if aligned:
        words = np.frombuffer(data[:aligned], dtype="<u4")
        cuts = (np.flatnonzero(words == MAGIC) * 4).tolist()
    pieces = []
    start = 0
    for c in cuts:
        pieces.append(data[start:c])
        start = c + 4
    pieces.append(data[start:])
    frames = []
    for i, piece in enumerate(pieces):
        if len(piece) > _MAX_PART:
            raise ValueError(f"a RecordIO part of {len(piece)} bytes exceeds the format's limit of {_MAX_PART}")
        if len(pieces) == 1:
            cflag = 0
        else:
            cflag = 1 if i == 0 else (3 if i == len(pieces) - 1 else 2)
        pad = (-len(piece)) % 4
        frames.append(_U32x2.pack(MAGIC, (cflag << 29) | len(piece)) + bytes(piece) + b"\0" * pad)
    return frames


def looks_like_recordio(head: bytes) -> bool:
    """True when a file starts with the RecordIO magic word."""
    return head[:4] == _MAGIC_BYTES


#: File-name endings that say RecordIO.
SUFFIXES = (".rec",)


def index_beside(path: str) -> str:
    """The index beside a shard: MXNet's ``x.rec -> x.idx`` (``x -> x.idx`` otherwise)."""
    return (path[:-4] if path.endswith(".rec") else path) + index.INDEX_SUFFIX  # MXNet's x.rec -> x.idx


def format_index(offsets: np.ndarray, lengths: np.ndarray) -> str:
    """MXNet's ``key<TAB>offset`` lines, keys 0, 1, ..."""
    return index.format_recordio_index(range(len(offsets)), offsets)


def parse_index(text: str, source: str) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """``(frame offsets, None)`` from ``key<TAB>offset`` lines (their sizes are not in them)."""
    return index.parse_recordio_index(text, source)[1], None
