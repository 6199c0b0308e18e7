"""Index files, in the text formats other tools use:

- TFRecord: one ``offset size`` line per record (DALI's ``tfrecord2idx`` and the ``tfrecord``
  package), ``size`` being the whole frame (header, data and CRCs);
- RecordIO: one ``key<TAB>offset`` line per record (MXNet's ``.idx``).

Also which files beside the data are dlstore's own companions rather than records
(:func:`is_companion_file`), so that a glob such as ``train-*`` never reads them as shards.
"""
from __future__ import annotations

import os
from typing import Tuple, Union

import numpy as np

__all__ = ["format_tfrecord_index", "parse_tfrecord_index", "format_recordio_index", "parse_recordio_index",
           "frame_sizes", "is_companion_file", "INDEX_SUFFIX", "MANIFEST_SUFFIX", "PRIVATE_PREFIX"]

#: Index files, ours and MXNet's (``x.rec -> x.idx``, ``x -> x.idx``).
INDEX_SUFFIX = ".idx"
#: A dataset's manifest: any name ending so (``train.dlstore-manifest``, ``.dlstore-manifest``).
MANIFEST_SUFFIX = ".dlstore-manifest"
#: dlstore's private files (locks and the like): any name starting so.
PRIVATE_PREFIX = ".dlstore"


def is_companion_file(path: Union[str, os.PathLike]) -> bool:
    """Whether ``path`` names one of the files dlstore keeps beside record files, not records.

    Those are index files (``*.idx``, and an index still being written, ``*.idx.tmp<pid>``),
    dataset manifests (``*.dlstore-manifest``) and dlstore's private files (names starting with
    ``.dlstore``, such as locks). Only the name is looked at; nothing is opened.
    """
    name = os.path.basename(os.fspath(path)).lower()
    if name.startswith(PRIVATE_PREFIX) or name.endswith((INDEX_SUFFIX, MANIFEST_SUFFIX)):
        return True
    stem, tmp, _ = name.rpartition(".tmp")  # build_index writes x.idx.tmp<pid>, then renames it
    return bool(tmp) and stem.endswith(INDEX_SUFFIX)


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
