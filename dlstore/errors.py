"""The exception hierarchy. Every error from the C++ core arrives as one of these classes, with the
file and the byte offset where it happened when they are known."""
from __future__ import annotations

from typing import Optional

__all__ = [
    "DlstoreError",
    "DlstoreIOError",
    "CorruptRecordError",
    "AlignmentError",
    "GdsUnavailableError",
    "PlacementError",
]


class DlstoreError(Exception):
    """Base class of dlstore's errors.

    Attributes
    ----------
    path : str or None
        The file concerned, when there is one.
    offset : int or None
        The byte offset in that file (for compressed files: in the uncompressed stream).
    """

    def __init__(self, message: str, path: Optional[str] = None, offset: Optional[int] = None):
        super().__init__(message)
        self.path = path
        self.offset = offset


class DlstoreIOError(DlstoreError, OSError):
    """A system call failed (open, pread, mmap); the message carries errno and its text."""

    def __init__(self, message: str, path: Optional[str] = None, offset: Optional[int] = None):
        DlstoreError.__init__(self, message, path, offset)


class CorruptRecordError(DlstoreError):
    """A record's framing or checksum is wrong: bad CRC, truncated record, impossible length."""


class AlignmentError(DlstoreError):
    """Direct I/O could not be used with the alignment this file or buffer needs."""


class GdsUnavailableError(DlstoreError):
    """GPUDirect Storage was asked for but cannot run here; the message says why."""


class PlacementError(DlstoreError):
    """Shards and mounts cannot be placed as asked (missing shard, empty mount, bad world)."""
