"""Telling a file's format and compression from its name and first bytes."""
from __future__ import annotations

from typing import Optional, Tuple

from dlstore.errors import DlstoreError
from dlstore.formats.registry import FORMATS

__all__ = ["detect", "FORMATS", "COMPRESSIONS", "NotRecordsError", "FormatMismatchError"]

COMPRESSIONS = ("none", "gzip", "zlib")

_GZIP_MAGIC = b"\x1f\x8b"

#: First bytes of files often passed as data by mistake -> what they are.
_OTHER_FILES = ((b"\xff\xd8\xff", "a JPEG image"), (b"\x89PNG", "a PNG image"), (b"GIF8", "a GIF image"),
                (b"BM", "a BMP image"), (b"PK\x03\x04", "a zip archive"), (b"\x93NUMPY", "a numpy array"))


class NotRecordsError(DlstoreError, ValueError):
    """A file that is neither TFRecord nor RecordIO was given as records (a ValueError too, as before)."""


class FormatMismatchError(DlstoreError, ValueError):
    """A format was given, and the file's first bytes are another format's: a usage error, not a corrupt file."""


def _looks_like_zlib(head: bytes) -> bool:
    # RFC 1950: CM=8 (deflate), window <= 32K, and the 16-bit header is a multiple of 31.
    return len(head) >= 2 and head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and ((head[0] << 8) | head[1]) % 31 == 0


def detect(name: str, head: bytes, format: str = "auto", compression: Optional[str] = "auto") -> Tuple[str, str]:
    """Resolves ``(format, compression)`` for one file.

    Parameters
    ----------
    name : str
        The file name (its extension is a hint: ``.rec``, ``.tfrecord``, ``.gz``, ``.zlib``).
    head : bytes
        The file's first bytes (at least 12 when the file has them).
    format : str
        ``"auto"`` or an explicit choice, which wins.
    compression : str or None
        ``"auto"``, or an explicit choice, which wins: ``"none"`` (also ``None`` or ``""``, as in
        tf.data), ``"gzip"`` or ``"zlib"`` (any case).

    Raises
    ------
    FormatMismatchError
        When ``format`` is given and the first bytes are another format's.
    NotRecordsError
        When the bytes are neither TFRecord nor RecordIO; the message names the file, says what it
        seems to be (an image...) and shows its first bytes (and advises no format: a file that is
        not records stays so whatever is passed).
    ValueError
        For an unknown format or compression.
    """
    lower = name.lower()
    # As tf.data's compression_type and TFRecordWriter take it: None or "" is uncompressed, any case.
    compression = "none" if compression in (None, "") else str(compression).lower()
    if compression == "auto":
        if lower.endswith((".gz", ".gzip")) or head[:2] == _GZIP_MAGIC:
            compression = "gzip"
        elif lower.endswith((".zlib", ".zz")):
            compression = "zlib"
        elif head and not any(f.looks_like(head) for f in FORMATS.values()) and _looks_like_zlib(head):
            compression = "zlib"
        else:
            compression = "none"
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, None or 'auto', not {compression!r}")
    if format == "auto":
        # The first bytes first, then the name; a compressed or empty file is of the (first) format
        # that comes compressed.
        told = ([f for f in FORMATS.values() if compression == "none" and f.looks_like(head)]
                or [f for f in FORMATS.values() if lower.endswith(f.suffixes)]
                or [f for f in FORMATS.values() if f.compressible and (compression != "none" or not head)])
        if not told:
            what = next((f" but {kind}" for magic, kind in _OTHER_FILES if head.startswith(magic)), "")
            hint = ("; a folder of images becomes records with `dlstore convert IMAGE_DIR OUT_DIR`" if "image" in what
                    else "")
            raise NotRecordsError(f"{name}: does not look like {' or '.join(f.title for f in FORMATS.values())}"
                                  f"{what} (its first bytes are {head[:12].hex(' ')}){hint}", path=name)
        format = told[0].name
    if format not in FORMATS:
        raise ValueError(f"format must be one of {tuple(FORMATS)} or 'auto', not {format!r}")
    if compression == "none" and head and not FORMATS[format].looks_like(head):
        # A file that opens as another format does is that format: read as the one given, its every
        # record would be "corrupt" (or, skipped, silently nothing). A first record that is damaged
        # looks like no format and is reported as the corruption it is.
        other = next((f for f in FORMATS.values() if f.looks_like(head)), None)
        if other is not None:
            raise FormatMismatchError(f"{name}: at byte 0: format {format!r} was given, but the file starts as "
                                      f"{other.title} files do; pass format={other.name!r} or 'auto'", path=name)
    if compression != "none" and not FORMATS[format].compressible:
        raise ValueError(f"{name}: {format} files do not come compressed ({compression})")
    return format, compression
