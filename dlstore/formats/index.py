"""Index files, in the text formats other tools use:

- TFRecord: one ``offset size`` line per record (DALI's ``tfrecord2idx`` and the ``tfrecord``
  package), ``size`` being the whole frame (header, data and CRCs);
- RecordIO: one ``key<TAB>offset`` line per record (MXNet's ``.idx``).
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

__all__ = ["format_tfrecord_index", "parse_tfrecord_index", "format_recordio_index", "parse_recordio_index",
           "frame_sizes"]


def frame_sizes(lengths: np.ndarray) -> np.ndarray:
    """TFRecord frame sizes from payload lengths (12-byte header and 4-byte footer each)."""
    return np.asarray(lengths, dtype=np.uint64) + np.uint64(16)


def format_tfrecord_index(offsets: np.ndarray, sizes: np.ndarray) -> str:
    return "".join(f"{o} {s}\n" for o, s in zip(np.asarray(offsets).tolist(), np.asarray(sizes).tolist()))


def parse_tfrecord_index(text: str, source: str = "index") -> Tuple[np.ndarray, np.ndarray]:
    """``(offsets, sizes)`` from ``offset size`` lines.

    Raises
    ------
    ValueError
        On a malformed line, naming ``source`` and the line number.
    """
    offsets, sizes = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[0].isdigit() or not parts[1].isdigit():
            raise ValueError(f"{source}: line {n} is not 'offset size': {line!r}")
        offsets.append(int(parts[0]))
        sizes.append(int(parts[1]))
    return np.array(offsets, dtype=np.uint64), np.array(sizes, dtype=np.uint64)


def format_recordio_index(keys, offsets: np.ndarray) -> str:
    return "".join(f"{k}\t{o}\n" for k, o in zip(list(keys), np.asarray(offsets).tolist()))


def parse_recordio_index(text: str, source: str = "index") -> Tuple[list, np.ndarray]:
    """``(keys, offsets)`` from MXNet ``key<TAB>offset`` lines; integer keys become ints."""
    keys, offsets = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not parts[1].strip().isdigit():
            raise ValueError(f"{source}: line {n} is not 'key<TAB>offset': {line!r}")
        k = parts[0].strip()
        keys.append(int(k) if k.lstrip("-").isdigit() else k)
        offsets.append(int(parts[1]))
    return keys, np.array(offsets, dtype=np.uint64)
