"""The record formats dlstore reads, by name: what each one's bytes and names look like, whether it
comes compressed, how its index reads and writes, and whether the GPU path parses its frames.

A format is its own module (its framing, name endings, first-bytes test and index text) plus one
entry in :data:`FORMATS`; detection (:func:`dlstore.formats.detect.detect`), indexes and manifests
(:mod:`dlstore.sources.indexing`), the commands' choices and the Dataset's engine checks read it from
here. The C++ core frames the records it reads (``csrc``), so a new format also needs its scanner there.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from dlstore.errors import DlstoreError
from dlstore.formats import recordio, tfrecord

__all__ = ["RecordFormat", "FORMATS", "format_named"]


@dataclass(frozen=True)
class RecordFormat:
    """What dlstore knows of one record format.

    Attributes
    ----------
    name : str
    title : str
        The format's name in prose (``TFRecord``).
    suffixes : tuple of str
        File-name endings that say the format (lower case), a hint after the bytes.
    looks_like : callable
        ``(first bytes) -> bool``: whether a file starts as this format does.
    compressible : bool
        Whether files of it come GZIP or ZLIB compressed (read as one stream).
    device_reads : bool
        Whether ``io="gds"`` parses its frames on the GPU.
    index_beside : callable
        ``path -> index path`` beside the data (``x.idx``, or MXNet's ``x.rec -> x.idx``).
    format_index : callable
        ``(frame offsets, payload lengths) -> text`` of its index file.
    parse_index : callable
        ``(text, source) -> (frame offsets, frame sizes or None)``; a ValueError names ``source`` and the line.
    """

    name: str
    title: str
    suffixes: Tuple[str, ...]
    looks_like: Callable[[bytes], bool]
    compressible: bool
    device_reads: bool
    index_beside: Callable[[str], str]
    format_index: Callable[[np.ndarray, np.ndarray], str]
    parse_index: Callable[[str, str], Tuple[np.ndarray, Optional[np.ndarray]]]


#: The formats by name, the first one the default where nothing tells.
FORMATS: Dict[str, RecordFormat] = {f.name: f for f in (
    RecordFormat("tfrecord", "TFRecord", tfrecord.SUFFIXES, tfrecord.looks_like_tfrecord, compressible=True,
                 device_reads=True, index_beside=tfrecord.index_beside, format_index=tfrecord.format_index,
                 parse_index=tfrecord.parse_index),
    RecordFormat("recordio", "RecordIO", recordio.SUFFIXES, recordio.looks_like_recordio, compressible=False,
                 device_reads=False, index_beside=recordio.index_beside, format_index=recordio.format_index,
                 parse_index=recordio.parse_index),
)}


def format_named(name: str) -> RecordFormat:
    """The format called ``name``.

    Raises
    ------
    DlstoreError
        Naming the formats there are.
    """
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        raise DlstoreError(f"unknown record format {name!r}; choose one of {sorted(FORMATS)}") from None
