"""``open_records``: records from TFRecord or RecordIO files, through one of the I/O engines.

The C++ core reads big chunks, splits them into records and checks CRCs; Python only sees batches
(one per chunk). Iterating a reader record by record is a convenience built on those batches.
"""
from __future__ import annotations

import glob
import os
import warnings
from typing import Iterator, List, Optional, Sequence, Tuple, Union

from dlstore import settings
from dlstore.errors import DlstoreError, DlstoreIOError
from dlstore.formats.detect import detect
from dlstore.io.select import EngineChoice, resolve_engine

__all__ = ["open_records", "RecordReader", "expand_paths"]

PathSpec = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]
# Files that sit beside record files and are not records: indexes (ours, DALI's, MXNet's .idx),
# MXNet's image lists, and metadata or notes.
_NOT_RECORD_SUFFIXES = (".idx", ".index", ".lst", ".json", ".txt", ".md", ".csv", ".yaml", ".yml", ".log")
# Writers write a temporary and rename it into place (the index writer: ``x.idx.tmp<pid>``); one
# left by a crash, or still being written, is not a shard.
_TEMP_MARK = ".tmp"


def _is_record_file_name(name: str) -> bool:
    """Whether a file found in a directory may hold records (not hidden, an index, metadata or a temporary)."""
    lower = name.lower()
    return not (lower.startswith(".") or lower.endswith(_NOT_RECORD_SUFFIXES) or _TEMP_MARK in lower)


def _list_directory(path: str) -> List[str]:
    try:
        names = os.listdir(path)
    except OSError as e:
        raise DlstoreIOError(f"{path}: cannot list the directory: {e.strerror} (errno {e.errno})", path=path) from e
    return sorted(os.path.join(path, n) for n in names
                  if _is_record_file_name(n) and os.path.isfile(os.path.join(path, n)))


def expand_paths(paths: PathSpec) -> List[str]:
    """Files named by a path, a glob, a directory or a list of them.

    A directory gives its files in sorted order, leaving out those that are not record files:
    hidden files, indexes (``.idx``, ``.index``), MXNet image lists (``.lst``), metadata and notes
    (``.json``, ``.txt``, ``.md``, ``.csv``, ``.yaml``, ``.yml``, ``.log``) and temporaries (names
    containing ``.tmp``). A file named explicitly or matched by a glob is always kept.

    Raises
    ------
    DlstoreError
        When a path does not exist, a glob matches nothing or a directory cannot be listed.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: List[str] = []
    for p in paths:
        p = os.fspath(p)
        if any(ch in p for ch in "*?["):
            matches = sorted(m for m in glob.glob(p) if os.path.isfile(m))
            if not matches:
                raise DlstoreError(f"no file matches {p!r}", path=p)
            out.extend(matches)
        elif os.path.isdir(p):
            out.extend(_list_directory(p))
        elif os.path.isfile(p):
            out.append(p)
        else:
            raise DlstoreError(f"{p}: no such file or directory", path=p)
    if not out:
        raise DlstoreError(f"no files to read in {paths!r}")
    return out


def _head(path: str, n: int = 16) -> bytes:
    """The first ``n`` bytes of ``path``, which tell its format and compression.

    Raises
    ------
    DlstoreIOError
        When the file cannot be opened or read (permissions, a vanished file), naming it.
    """
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError as e:
        raise DlstoreIOError(f"{path}: cannot read: {e.strerror} (errno {e.errno})", path=path) from e


class RecordReader:
    """Records of a list of files. Iterate it for records, or call :meth:`batches` for the fast path.

    Each iteration (``for r in reader`` or ``reader.batches()``) reads the files again from the
    start, so one reader serves several epochs.

    Attributes
    ----------
    paths : list of str
    format : str
        ``tfrecord`` or ``recordio``.
    compression : list of str
        Per file: ``none``, ``gzip`` or ``zlib``.
    engine : str
        The engine that runs (``io="auto"`` resolved).
    engine_reason : str
        Why that engine, e.g. "dataset 3.1 GB fits in the 20.2 GB available to the page cache".
    """

    def __init__(self, paths: List[str], *, format: str, compression: List[str], choice: EngineChoice,
                 verify: bool, on_error: str, chunk_size: int, headroom: int, depth: int, io_threads: int,
                 verify_threads: int, max_records: int = 0):
        self.paths = paths
        self.format = format
        self.compression = compression
        self.choice = choice
        self.verify = verify
        self.on_error = on_error
        self._args = dict(chunk_size=chunk_size, headroom=headroom, depth=depth, threads=io_threads,
                          max_records=max_records, verify_threads=verify_threads)
        self._core = None
        self._last = {"stats": {}, "notes": [], "corruptions": []}

    @property
    def engine(self) -> str:
        return self.choice.engine

    @property
    def engine_reason(self) -> str:
        return self.choice.reason

    def _new_core(self):
        from dlstore import _C

        policy = "skip" if self.on_error == "warn" else self.on_error
        self._core = _C.Reader(self.paths, self.format, self.choice.engine, self.compression, self.verify,
                               policy, **self._args)
        return self._core

    def batches(self) -> Iterator:
        """Yields ``RecordBatch`` objects, one per chunk read.

        A batch exposes the buffer protocol over one contiguous region; record ``i`` is
        ``memoryview(batch)[offsets[i]:offsets[i] + lengths[i]]``. Also ``file_offsets`` (where each
        record's frame starts in its file), ``file_index`` (into :attr:`paths`), ``num_records`` and
        ``nbytes`` (payload bytes).

        A batch, and every view into it, keeps its whole chunk buffer (about ``chunk_size`` bytes)
        alive for as long as it is referenced. Copy what you keep for long (``bytes(record)``), or a
        handful of kept records pins a buffer each.

        The reader's files and buffers are released when the pass ends, also when the consumer
        stops early (``break``, or ``close()`` on the generator); :meth:`stats` then reports that pass.
        """
        return self._batches(warn_stacklevel=2)

    def _batches(self, warn_stacklevel: int) -> Iterator:
        # warn_stacklevel: frames from this generator to the caller a warning should name (2: the
        # one iterating batches(); 3: the one iterating the reader, through __iter__).
        core = self._new_core()
        warn = self.on_error == "warn"
        seen_skipped = reported = 0
        noted_unreported = False
        try:
            while True:
                batch = core.next_batch()
                if warn:
                    skipped = core.stats()["skipped"]
                    # corruptions() copies the whole list: fetch it only when something new was skipped.
                    if skipped > seen_skipped:
                        seen_skipped = skipped
                        found = core.corruptions()
                        for path, offset, what in found[reported:]:
                            warnings.warn(f"{path}: at byte {offset}: {what} (skipped)", RuntimeWarning,
                                          stacklevel=warn_stacklevel)
                        reported = len(found)
                        if skipped > reported and not noted_unreported:
                            noted_unreported = True
                            warnings.warn(f"{skipped - reported} more corrupt records were skipped than reported: "
                                          f"the reader reports the first {reported}; further ones are counted "
                                          f"in stats()['skipped'] without a warning each", RuntimeWarning,
                                          stacklevel=warn_stacklevel)
                if batch is None:
                    return
                yield batch
        finally:
            self._finish(core)

    def _finish(self, core) -> None:
        # Keep the pass's counters but let the core go: its file handles, mappings and buffers are
        # released (a live mapping would pin pages in the page cache across a drop_caches).
        self._last = {"stats": dict(core.stats()), "notes": list(core.notes()),
                      "corruptions": list(core.corruptions())}
        if self._core is core:
            self._core = None

    def __iter__(self) -> Iterator[memoryview]:
        """Yields each record as a read-only ``memoryview``.

        A record is a view into the chunk buffer it was read into and keeps that whole buffer
        (about ``chunk_size`` bytes) alive while it is referenced: copy records kept beyond the
        loop with ``bytes(record)``. Stopping early releases the reader's files and buffers.
        """
        batches = self._batches(warn_stacklevel=3)
        try:
            for batch in batches:
                mv = memoryview(batch)
                for o, n in zip(batch.offsets.tolist(), batch.lengths.tolist()):
                    yield mv[o:o + n]
        finally:
            batches.close()  # runs _batches' finally now, not whenever the generator is collected

    def count(self) -> dict:
        """Reads everything (framing and CRCs checked) without handing records to Python; returns :meth:`stats`."""
        core = self._new_core()
        core.count_all()
        self._finish(core)
        return self.stats()

    def stats(self) -> dict:
        """Counters of the last pass: records, payload bytes, bytes read from files, skipped records,
        bytes moved to join records across reads, records assembled apart, buffers allocated; plus
        the engine, why, and per-file fallback notes."""
        last = self._snapshot()
        out = dict(last["stats"])
        out["engine"] = self.engine
        out["engine_reason"] = self.engine_reason
        out["notes"] = last["notes"]
        return out

    def _snapshot(self) -> dict:
        if self._core is not None:  # a pass under way
            return {"stats": dict(self._core.stats()), "notes": list(self._core.notes()),
                    "corruptions": list(self._core.corruptions())}
        return self._last

    def corruptions(self) -> list:
        """``(path, offset, what)`` for each corruption skipped in the last pass (``on_error="skip"``)."""
        found = self._snapshot()["corruptions"]
        order = {p: i for i, p in enumerate(self.paths)}
        return sorted(found, key=lambda c: (order.get(c[0], 0), c[1] if c[1] is not None else -1))

    def __repr__(self) -> str:
        return (f"RecordReader({len(self.paths)} {self.format} files, io={self.engine!r}: {self.engine_reason}, "
                f"verify={self.verify})")


def _chunk_size(engine: str, requested: Optional[int]) -> int:
    # mmap chunks are views into the mapping, not buffers: a larger one costs no memory and cuts
    # the per-batch hand-offs between the consumer and the CRC thread, which on these VMs cost
    # more than the bytes (warm 3 GB set, interleaved: 32 MiB 9.8 GB/s, 64 MiB 12.2 GB/s).
    if settings.is_default("chunk_size", requested) and engine == "mmap":
        return 8 * settings.get("chunk_size")
    return settings.get("chunk_size", requested)


def _verify_threads(engine: str, requested: Optional[int]) -> int:
    # Direct reads are bound by the device and land in RAM, not in cache: a second CRC thread only
    # adds memory-bandwidth contention (more CPU per GB for the same speed). From the page cache
    # (buffered, mmap) CRC is the bottleneck and a second core nearly doubles the rate.
    if settings.is_default("verify_threads", requested) and engine == "direct":
        return 0
    return settings.get("verify_threads", requested)


def open_records(paths: PathSpec, *, format: str = "auto", io: Optional[str] = None, compression: str = "auto",
                 verify: bool = True, on_error: str = "raise", chunk_size: Optional[int] = None,
                 depth: Optional[int] = None, io_threads: Optional[int] = None,
                 verify_threads: Optional[int] = None) -> RecordReader:
    """Opens TFRecord or RecordIO files for reading.

    Parameters
    ----------
    paths : str, path-like or sequence of them
        Files, globs or directories.
    format : {"auto", "tfrecord", "recordio"}
        ``auto`` tells by the first bytes (and the extension).
    io : {"auto", "buffered", "mmap", "direct", "gds"}, optional
        The I/O engine; by default the ``io`` setting (``DLSTORE_IO``, else ``auto``). ``auto``
        resolves once and the reader says why (``reader.engine_reason``).
        ``gds`` raises :class:`~dlstore.GdsUnavailableError` saying why it cannot run here.
    compression : {"auto", "none", "gzip", "zlib"}
        TFRecord compression; ``auto`` tells per file by name and magic bytes.
    verify : bool
        Check TFRecord CRCs (on by default; hardware CRC-32C where the CPU has it).
    on_error : {"raise", "skip", "warn"}
        ``raise``: the good records before a corrupt one are delivered, then
        :class:`~dlstore.CorruptRecordError` names the file, the offset and what was wrong.
        ``skip``: it is skipped, counted in ``stats()["skipped"]`` and listed by ``corruptions()``.
        ``warn``: as ``skip``, with a ``RuntimeWarning`` per corruption.
    chunk_size, depth, io_threads, verify_threads : int, optional
        Read size, reads in flight, reading threads and CRC-checking threads; defaults from
        :mod:`dlstore.settings`.

    Returns
    -------
    RecordReader

    Raises
    ------
    DlstoreError
        When a path does not exist or cannot be read (:class:`~dlstore.DlstoreIOError`), or the
        files mix formats.
    GdsUnavailableError
        For ``io="gds"``, saying why it cannot run here.
    ValueError
        For an unknown format, setting or ``on_error``.

    Examples
    --------
    >>> reader = dlstore.open_records("/data/train-*", io="auto")   # doctest: +SKIP
    >>> for record in reader:                                        # doctest: +SKIP
    ...     example = dlstore.parse_example(record)
    """
    if on_error not in ("raise", "skip", "warn"):
        raise ValueError(f"on_error must be 'raise', 'skip' or 'warn', not {on_error!r}")
    files = expand_paths(paths)
    fmt, comps = detect_files(files, format, compression)
    choice = resolve_engine(settings.get("io", io), files, sum(os.path.getsize(f) for f in files))
    return RecordReader(files, format=fmt, compression=comps, choice=choice, verify=verify, on_error=on_error,
                        **core_options(choice.engine, chunk_size, depth, io_threads, verify_threads))


def detect_files(files: Sequence[str], format: str = "auto", compression: str = "auto") -> Tuple[str, List[str]]:
    """The format of ``files`` (one for all) and each file's compression, told by their first bytes.

    Raises
    ------
    DlstoreError
        When the files mix formats, or one cannot be read.
    """
    formats, comps = set(), []
    for f in files:
        fmt, comp = detect(f, _head(f), format, compression)
        formats.add(fmt)
        comps.append(comp)
    if len(formats) > 1:
        raise DlstoreError(f"the files mix formats {sorted(formats)}; read each format apart")
    return formats.pop(), comps


def core_options(engine: str, chunk_size: Optional[int] = None, depth: Optional[int] = None,
                 io_threads: Optional[int] = None, verify_threads: Optional[int] = None) -> dict:
    """The C++ reader's options for ``engine``: explicit values, else the settings (with the
    engine-specific defaults of :func:`_chunk_size` and :func:`_verify_threads`)."""
    return dict(chunk_size=_chunk_size(engine, chunk_size), headroom=settings.get("headroom"),
                depth=settings.get("depth", depth), io_threads=settings.get("io_threads", io_threads),
                verify_threads=_verify_threads(engine, verify_threads))
