"""The exception hierarchy. Every error from the C++ core arrives as one of these classes, with the
file and the byte offset where it happened when they are known."""
from __future__ import annotations

import re
from typing import Optional, Tuple

__all__ = [
    "DlstoreError",
    "DlstoreIOError",
    "CorruptRecordError",
    "GdsUnavailableError",
    "PlacementError",
]


class DlstoreError(Exception):
    """Base class of dlstore's errors. The message says it all in words; the attributes say it to code.

    Attributes
    ----------
    path : str or None
        The file concerned, when there is one.
    offset : int or None
        The byte offset in that file (for compressed files: in the uncompressed stream).
    record : int or None
        The index of the record concerned within the batch (or call) that failed, when it is about one.
    errno : int or None
        The ``errno`` of the system call that failed, when one did.
    reason : str
        What went wrong, without the file, offset and record that the message starts with.
    """

    def __init__(self, message: str, path: Optional[str] = None, offset: Optional[int] = None, *,
                 record: Optional[int] = None, errno: Optional[int] = None, reason: Optional[str] = None):
        super().__init__(message)
        if path is None and offset is None and reason is None and message.startswith("Caught "):
            path, offset, reason = _from_worker(message)
        self.path = path
        self.offset = offset
        self.record = record
        self.errno = errno
        self.reason = _without_location(message, path, offset, record) if reason is None else reason

    @classmethod
    def of_record(cls, record: int, reason: str, **fields) -> "DlstoreError":
        """An error about record ``record`` of a batch: the message reads ``record N: reason``."""
        return cls(f"record {record}: {reason}", record=record, reason=reason, **fields)


def _from_worker(message: str) -> Tuple[Optional[str], Optional[int], Optional[str]]:
    """``(path, offset, reason)`` of an error a PyTorch DataLoader worker raised, which torch re-creates in
    the main process from one string, the worker's traceback ("Caught X in DataLoader worker process N.
    ... dlstore.errors.X: MESSAGE"): the fields come back from the location of the last such line (the
    error raised; those before it are its causes). ``record at byte N`` is a pipeline error's location."""
    if "DataLoader worker" not in message.split("\n", 1)[0]:
        return None, None, None
    raised = [line for line in message.splitlines() if line.startswith("dlstore.errors.")]
    if not raised:
        return None, None, None
    found = re.match(r"dlstore\.errors\.\w+: (.+?): (?:record )?at byte (\d+)[:,]? ?(.*)$", raised[-1])
    if found is None:
        return None, None, None
    return found.group(1), int(found.group(2)), found.group(3)


def _without_location(message: str, path: Optional[str], offset: Optional[int], record: Optional[int]) -> str:
    """The message less the ``path: ``, ``at byte N: `` and ``record N: `` it starts with (as every
    located message does), so that ``reason`` says what went wrong only."""
    for prefix in (f"{path}: " if path is not None else None, f"at byte {offset}: " if offset is not None else None,
                   f"record {record}: " if record is not None else None):
        if prefix and message.startswith(prefix):
            message = message[len(prefix):]
    return message


class DlstoreIOError(DlstoreError, OSError):
    """A system call failed (open, pread, mmap); ``errno`` says which error, the message its text."""

    def __init__(self, message: str, path: Optional[str] = None, offset: Optional[int] = None, **fields):
        DlstoreError.__init__(self, message, path, offset, **fields)


class CorruptRecordError(DlstoreError):
    """A record's framing or checksum is wrong: bad CRC, truncated record, impossible length."""


class GdsUnavailableError(DlstoreError):
    """GPUDirect Storage was asked for but cannot run here; the message says why."""


class PlacementError(DlstoreError):
    """Shards and mounts cannot be placed as asked (missing shard, empty mount, bad world)."""
