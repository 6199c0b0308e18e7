"""Writing TFRecord (optionally GZIP or ZLIB compressed) and RecordIO files."""
from __future__ import annotations

import gzip
import os
import zlib
from typing import Optional

from dlstore.formats import index as index_format
from dlstore.formats import recordio, tfrecord

__all__ = ["TFRecordWriter", "RecordIOWriter"]


class _ZlibFile:
    """A write-only file object that deflates with a zlib wrapper, as TensorFlow's ZLIB option does."""

    def __init__(self, path: str, level: int):
        self._f = open(path, "wb")
        self._z = zlib.compressobj(level, zlib.DEFLATED, zlib.MAX_WBITS)

    def write(self, data) -> None:
        self._f.write(self._z.compress(data))

    def close(self) -> None:
        if self._f.closed:
            return
        self._f.write(self._z.flush())
        self._f.close()


class TFRecordWriter:
    """Writes records in TFRecord framing, with masked CRC-32C.

    Parameters
    ----------
    path : str or path-like
    compression : {None, "gzip", "zlib"}
        Readable by TensorFlow with ``compression_type="GZIP"`` / ``"ZLIB"``.
    level : int
        Compression level (1..9).

    Examples
    --------
    >>> with dlstore.TFRecordWriter("/tmp/a.tfrecord") as w:   # doctest: +SKIP
    ...     w.write(b"payload")
    """

    def __init__(self, path, compression: Optional[str] = None, level: int = 6):
        self.path = os.fspath(path)
        comp = (compression or "none").lower()
        if comp == "none":
            self._f = open(self.path, "wb")
        elif comp == "gzip":
            self._f = gzip.open(self.path, "wb", compresslevel=level)
        elif comp == "zlib":
            self._f = _ZlibFile(self.path, level)
        else:
            raise ValueError(f"compression must be None, 'gzip' or 'zlib', not {compression!r}")
        self.records = 0

    def write(self, data) -> None:
        """Appends one record."""
        header, footer = tfrecord.frame_parts(data)
        self._f.write(header)
        self._f.write(data)
        self._f.write(footer)
        self.records += 1

    def flush(self) -> None:
        if hasattr(self._f, "flush"):
            self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "TFRecordWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RecordIOWriter:
    """Writes MXNet RecordIO, splitting payloads that contain the magic word as MXNet does.

    Parameters
    ----------
    path : str or path-like
        The ``.rec`` file.
    idx_path : str or path-like, optional
        Also write an MXNet ``.idx`` file (``key<TAB>offset`` per record).
    """

    def __init__(self, path, idx_path=None):
        self.path = os.fspath(path)
        self.idx_path = os.fspath(idx_path) if idx_path is not None else None
        # The index first, neither emptied nor kept until the .rec opens too: a writer that fails to
        # start leaves no empty file behind and empties none that was there.
        existed = self.idx_path is not None and os.path.lexists(self.idx_path)
        self._idx = open(self.idx_path, "a") if self.idx_path else None
        try:
            self._f = open(self.path, "wb")
        except BaseException:
            if self._idx is not None:
                self._idx.close()
                if not existed:
                    os.remove(self.idx_path)
            raise
        if self._idx is not None:
            self._idx.truncate(0)
        self._offset = 0
        self.records = 0

    def write(self, payload, key=None) -> None:
        """Appends one record; ``key`` (default: the record's number) goes to the ``.idx`` file."""
        if self._idx is not None:
            self._idx.write(index_format.format_recordio_index([self.records if key is None else key], [self._offset]))
        for frame in recordio.frame_parts(payload):
            self._f.write(frame)
            self._offset += len(frame)
        self.records += 1

    def close(self) -> None:
        self._f.close()
        if self._idx is not None:
            self._idx.close()

    def __enter__(self) -> "RecordIOWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
