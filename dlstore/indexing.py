"""Index files built on the fly: one sequential pass over a file, written beside it, or in the cache
directory when the data is read-only, and checked against the data before use."""
from __future__ import annotations

import hashlib
import os
from typing import Optional, Tuple

import numpy as np

from dlstore import settings
from dlstore.formats import index as index_format

__all__ = ["index_path_for", "build_index", "load_index", "find_index", "ensure_index"]


def index_path_for(path: str, fmt: str = "tfrecord", writable: Optional[bool] = None) -> str:
    """Where the index of ``path`` lives: beside it (``path + .idx``, or MXNet's ``x.rec -> x.idx``),
    or under ``<cache_dir>/indexes/`` when its directory is not writable."""
    if fmt == "recordio" and path.endswith(".rec"):
        beside = path[:-4] + ".idx"
    else:
        beside = path + ".idx"
    if writable is None:
        writable = os.access(os.path.dirname(os.path.abspath(path)) or ".", os.W_OK)
    if writable:
        return beside
    digest = hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:16]
    return os.path.join(settings.get("cache_dir"), "indexes", f"{os.path.basename(path)}.{digest}.idx")


def build_index(path: str, fmt: str = "auto", out: Optional[str] = None, verify: bool = True) -> Tuple[str, int]:
    """Scans ``path`` once and writes its index; returns ``(index path, records)``.

    TFRecord indexes are ``offset size`` lines (DALI and the ``tfrecord`` package read them);
    RecordIO indexes are MXNet's ``key<TAB>offset`` with keys 0, 1, ...

    Parameters
    ----------
    path : str
        One record file (a glob or directory is accepted when it names exactly one file).
    fmt : {"auto", "tfrecord", "recordio"}
    out : str, optional
        Where to write the index; :func:`index_path_for` by default.
    verify : bool
        Check CRCs while scanning, so that an index never points into corrupt data.

    Raises
    ------
    ValueError
        When ``path`` names more than one file (an index describes one file), or the file is
        compressed.
    """
    from dlstore.reader import expand_paths, open_records

    files = expand_paths(path)
    if len(files) != 1:
        shown = ", ".join(files[:3]) + (", ..." if len(files) > 3 else "")
        raise ValueError(f"{path!r} names {len(files)} files ({shown}); an index describes one file: "
                         f"build one per file")
    path = files[0]
    reader = open_records(path, format=fmt, io="buffered", verify=verify)
    if reader.compression[0] != "none":
        raise ValueError(f"{path}: compressed files cannot be indexed by byte offset")
    offsets, lengths = [], []
    for batch in reader.batches():
        offsets.append(np.array(batch.file_offsets))
        lengths.append(np.array(batch.lengths))
    offs = np.concatenate(offsets) if offsets else np.zeros(0, np.uint64)
    lens = np.concatenate(lengths) if lengths else np.zeros(0, np.uint64)
    if reader.format == "tfrecord":
        text = index_format.format_tfrecord_index(offs, index_format.frame_sizes(lens))
    else:
        text = index_format.format_recordio_index(range(len(offs)), offs)
    dest = out or index_path_for(path, reader.format)
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    tmp = dest + f".tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, dest)  # a reader never sees half an index
    return dest, len(offs)


def load_index(path: str, index_path: str, fmt: str = "tfrecord") -> np.ndarray:
    """Record offsets from an index file, after checking it against the data.

    Raises
    ------
    ValueError
        When the index is older than the data, cannot be parsed, or (TFRecord) does not describe
        contiguous frames from byte 0 to the end of the file; the message says which.
    """
    if os.path.getmtime(index_path) < os.path.getmtime(path):
        raise ValueError(f"{index_path} is older than {path}: rebuild it")
    try:
        with open(index_path) as f:
            text = f.read()
        parsed = (index_format.parse_tfrecord_index(text, index_path) if fmt == "tfrecord"
                  else index_format.parse_recordio_index(text, index_path))
    except UnicodeDecodeError as e:
        raise ValueError(f"{index_path} is not a text index ({e.reason} at byte {e.start}): rebuild it") from e
    except OverflowError as e:  # a number beyond 64 bits
        raise ValueError(f"{index_path}: an entry does not fit in 64 bits: rebuild it") from e
    size = os.path.getsize(path)
    if fmt == "tfrecord":
        offs, sizes = parsed
        if len(offs):
            if int(offs[0]) != 0:
                raise ValueError(f"{index_path}: its first record starts at byte {int(offs[0])}, not 0: rebuild it")
            # A frame is a 12-byte header and a 4-byte footer at least, and no larger than the file;
            # bounding sizes also keeps the sums below from wrapping around in uint64.
            if np.any(sizes < 16) or np.any(sizes > size):
                raise ValueError(f"{index_path}: a frame size is below 16 bytes or beyond the {size} bytes "
                                 f"of {path}: rebuild it")
            if int(offs[-1]) + int(sizes[-1]) != size:
                raise ValueError(f"{index_path}: its last record ends at byte {int(offs[-1]) + int(sizes[-1])} but "
                                 f"{path} has {size} bytes: rebuild it")
            if np.any(offs[1:] != offs[:-1] + sizes[:-1]):
                raise ValueError(f"{index_path}: entries are not contiguous frames of {path}")
        elif size:
            raise ValueError(f"{index_path} is empty but {path} has {size} bytes")
        return offs
    _, offs = parsed
    if len(offs) and int(offs.max()) >= size:
        raise ValueError(f"{index_path}: an offset points past the end of {path} ({size} bytes)")
    return offs


def find_index(path: str, fmt: str = "tfrecord") -> Tuple[Optional[str], Optional[np.ndarray], Optional[str]]:
    """An existing index of ``path`` (beside it, else in the cache), checked against the data.

    Returns ``(index path, offsets, None)`` for a valid one; ``(index path, None, why)`` for the last
    one found and refused (stale, damaged or foreign); ``(None, None, None)`` when there is none.
    """
    refused: Tuple[Optional[str], Optional[np.ndarray], Optional[str]] = (None, None, None)
    for candidate in (index_path_for(path, fmt), index_path_for(path, fmt, writable=False)):
        if os.path.isfile(candidate):
            try:
                return candidate, load_index(path, candidate, fmt), None
            except ValueError as e:
                refused = (candidate, None, str(e))
    return refused


def ensure_index(path: str, fmt: str = "tfrecord") -> Tuple[str, np.ndarray]:
    """The index of ``path``, loaded when present and valid, else built (beside the data or in the cache).

    An existing index that is stale or cannot be parsed in any way is rebuilt, not reported.
    """
    found, offsets, _ = find_index(path, fmt)
    if offsets is not None:
        return found, offsets
    dest, _ = build_index(path, fmt)
    return dest, load_index(path, dest, fmt)
