"""``open_records``: records from TFRecord or RecordIO files, through one of the I/O engines.

The C++ core reads big chunks, splits them into records and checks CRCs; Python only sees batches
(one per chunk). Iterating a reader record by record is a convenience built on those batches, with the
same position. A
:class:`RecordReader` is the no-placement :class:`~dlstore.sources.source.Source`: files read in order, for
one consumer; :class:`dlstore.Dataset` places records over ranks, workers and mounts, and shuffles.
"""
from __future__ import annotations

import contextlib
import fnmatch
import glob
import operator
import os
import re
import stat
import warnings
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from dlstore.errors import DlstoreError, DlstoreIOError
from dlstore.formats.detect import detect
from dlstore.formats.index import INDEX_SUFFIX, MANIFEST_SUFFIX
from dlstore.io.deadline import waiting_on
from dlstore.io.select import EngineChoice, resolve_engine
from dlstore.sources.source import ReadOptions, ReadsWithOptions, SourcePosition

__all__ = ["open_records", "RecordReader", "expand_paths", "distinct_files", "same_name", "record_file_names",
           "list_record_files", "refuse_unreadable", "unreadable_reason", "split_glob", "detect_files",
           "CorruptionWarnings"]

PathSpec = Union[str, bytes, os.PathLike, Sequence[Union[str, bytes, os.PathLike]]]
# Files that sit beside record files and are not records, besides dlstore's own companions
# (indexes, manifests, locks: formats.index.is_companion_file): other tools' indexes and image
# lists (DALI's .index, MXNet's .lst), and metadata or notes.
_NOT_RECORD_SUFFIXES = (".index", ".lst", ".json", ".txt", ".md", ".csv", ".yaml", ".yml", ".log")
# Writers write a temporary and rename it into place; one left by a crash, or still being
# written, is not a shard.
_TEMP_MARK = ".tmp"
_GLOB_CHARS = "*?["


# Which files may hold records, as one regular expression over names joined by newlines: hidden names
# (dlstore's .dlstore* among them), temporaries, indexes (.idx, and .idx.tmp<pid> as a temporary),
# manifests and the suffixes above are left out, whatever their case. The one rule for every place that
# expands paths (here and dlstore.sources.layout).
_SKIPPED = "|".join(re.escape(x) for x in (INDEX_SUFFIX, MANIFEST_SUFFIX) + _NOT_RECORD_SUFFIXES)
_RECORD_LINE = rf"(?!\.)(?![^\n]*(?i:{re.escape(_TEMP_MARK)}))(?![^\n]*(?i:{_SKIPPED})$)"


def _line_pattern(pattern: Optional[str]) -> str:
    """A glob's last part as a regular expression matching one whole name among names joined by newlines."""
    if pattern is None:
        return "[^\\n]*"
    text = fnmatch.translate(pattern)  # "(?s:...)\\Z"
    inner = text[len("(?s:"):-len(")\\Z")] if text.startswith("(?s:") and text.endswith(")\\Z") else text
    return inner.replace("[^", "[^\\n")  # a negated set must not cross into the next name


def record_file_names(names: Sequence[str], pattern: Optional[str] = None) -> List[str]:
    """Those of ``names`` (file names of one directory) that may hold records (not dlstore's companion
    files, hidden files, other tools' indexes, metadata or temporaries) and match the glob ``pattern``
    (a last path part; None: any), sorted: one regular expression over them all, no Python step per name."""
    found = re.findall(f"^{_RECORD_LINE}(?=[^\\n])(?:{_line_pattern(pattern)})$", "\n".join(names), flags=re.M)
    found.sort()
    return found


def _is_record_file_name(name: str) -> bool:
    """Whether a file a glob matched or a directory listed may hold records (:func:`record_file_names`
    for one name): not one of dlstore's companion files, hidden, another tool's index, metadata or a
    temporary."""
    return bool(record_file_names([os.path.basename(name)]))


def list_record_files(directory: str, pattern: Optional[str] = None, odd: Optional[List[str]] = None) -> List[str]:
    """The names of the record files in ``directory`` matching the glob ``pattern`` (None: all), sorted.
    The directory's entries say whether they are files without a ``stat`` each. ``odd``, when given,
    gets the matching names that are neither a file nor a directory (a symbolic link whose target is
    gone, a FIFO, a device): the caller that was asked for them says so (:func:`refuse_unreadable`).

    Raises
    ------
    DlstoreIOError
        When the directory cannot be listed.
    """
    others: List[str] = []
    try:
        with waiting_on(directory or ".", "a listing"), os.scandir(directory or ".") as entries:
            files = []
            for e in entries:
                if e.is_file():
                    files.append(e.name)
                elif odd is not None and not e.is_dir():
                    others.append(e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise DlstoreIOError(f"{directory}: cannot list the directory: {e.strerror} (errno {e.errno})",
                             path=directory) from e
    if odd is not None:
        odd.extend(record_file_names(others, pattern))
    return record_file_names(files, pattern)


def unreadable_reason(path: str) -> str:
    """The one-line error for ``path``, named as a shard but no file (:func:`refuse_unreadable`)."""
    try:
        what = ("a directory" if stat.S_ISDIR(os.stat(path).st_mode)
                else "not a regular file (a FIFO, a socket or a device)")
    except OSError as e:
        what = f"a symbolic link to {os.readlink(path)}, which cannot be reached ({e.strerror})"
    return f"{path}: named as a shard but {what}"


def refuse_unreadable(paths: Sequence[str]) -> None:
    """Raises for shards a directory or glob named that are no file (a symbolic link whose target is
    gone, a FIFO, a device): left out without a word, the epoch was a shard short.

    Raises
    ------
    DlstoreIOError
        Naming the first of ``paths`` and what it is.
    """
    if not paths:
        return
    more = f" (and {len(paths) - 1} more such)" if len(paths) > 1 else ""
    raise DlstoreIOError(f"{unreadable_reason(paths[0])}{more}: restore it or remove it", path=paths[0])


def split_glob(path: str) -> Optional[Tuple[str, Optional[str]]]:
    """``(directory, pattern)`` when ``path`` is a glob whose wildcards are in its last part only, or
    ``(directory, None)`` for a directory: what one listing of one directory answers. None otherwise."""
    directory, name = os.path.split(path)
    with waiting_on(path, "a stat"):
        if any(ch in path for ch in _GLOB_CHARS) and not os.path.isfile(path):  # part[1].tfrecord is a file's name
            if any(ch in directory for ch in _GLOB_CHARS) or not name or "**" in name:
                return None
            return directory or ".", name
        return (path, None) if os.path.isdir(path) else None


def _glob_record_files(pattern: str, unreadable: Optional[List[str]] = None) -> Tuple[List[str], int]:
    """The record files ``pattern`` matches, sorted, and how many other files it matched. Names that are no
    file (:func:`refuse_unreadable`) raise, or go to ``unreadable`` when it is given."""
    refuse = refuse_unreadable if unreadable is None else unreadable.extend
    one = split_glob(pattern)
    if one is not None:
        directory, name = one
        odd: List[str] = []
        kept = [os.path.join(os.path.dirname(pattern), n) for n in list_record_files(directory, name, odd)]
        refuse([os.path.join(os.path.dirname(pattern), n) for n in odd])
        others = 0
        if not kept:
            with contextlib.suppress(OSError):
                others = len(fnmatch.filter(os.listdir(directory), name))
        return kept, others
    files, odd = [], []
    with waiting_on(pattern, "a glob"):
        for m in glob.glob(pattern, recursive=True):
            if os.path.isfile(m):
                files.append(m)
            elif not os.path.isdir(m) and _is_record_file_name(m):
                odd.append(m)
    files.sort()
    refuse(sorted(odd))
    kept = [f for f in files if _is_record_file_name(f)]
    return kept, len(files) - len(kept)


def _list_directory(path: str, unreadable: Optional[List[str]] = None) -> List[str]:
    odd: List[str] = []
    found = [os.path.join(path, n) for n in list_record_files(path, None, odd)]
    (refuse_unreadable if unreadable is None else unreadable.extend)([os.path.join(path, n) for n in odd])
    return found


def path_list(paths: PathSpec) -> List[str]:
    """``paths`` (one path or a list; str, bytes or os.PathLike) as a list of str.

    Raises
    ------
    TypeError
        When something in it is not a path, saying what it was.
    """
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    try:
        # bytes paths (os.listdir(b".")) are file names too; the rest of dlstore speaks str
        return [os.fsdecode(p) for p in paths]
    except TypeError:
        raise TypeError(f"paths must be a path (str, bytes or os.PathLike), a glob, a directory or a list of them, "
                        f"not {paths!r:.80}") from None


def distinct_files(files: Sequence[str]) -> List[str]:
    """Each file once, as first named: ``f f``, a glob and ``f``, ``f`` and ``./f``, or a path through a
    symbolic link are one file."""
    seen: set = set()
    return [f for f in files if not (os.path.realpath(f) in seen or seen.add(os.path.realpath(f)))]


def same_name(files: Sequence[str]) -> Optional[Tuple[str, str]]:
    """The first two of ``files`` with one file name (in different directories), or None: their copies
    or indexes would be one file in a directory written for them."""
    seen: Dict[str, str] = {}
    for f in files:
        other = seen.setdefault(os.path.basename(f), f)
        if other != f:
            return other, f
    return None


def expand_paths(paths: PathSpec, unreadable: Optional[List[str]] = None) -> List[str]:
    """Files named by a path, a glob, a directory or a list of them.

    ``unreadable``: where a path, a glob or a directory names something that is no file (a symbolic
    link whose target is gone, a FIFO, a device; :func:`refuse_unreadable`), it goes there, else it raises.

    A glob gives the files it matches and a directory its files, sorted, both leaving out those
    that are not record files: dlstore's companion files (indexes, ``*.dlstore-manifest``,
    ``.dlstore*``; :func:`dlstore.formats.index.is_companion_file`), other hidden files, other
    tools' indexes and lists (``.index``, ``.lst``), metadata and notes (``.json``, ``.txt``,
    ``.md``, ``.csv``, ``.yaml``, ``.yml``, ``.log``) and temporaries (names containing ``.tmp``).
    So ``train-*`` reads the shards of a set whose indexes sit beside them. A file named
    explicitly is always kept.

    Raises
    ------
    DlstoreError
        When a path does not exist or is no file (DlstoreIOError, as :func:`refuse_unreadable`), a glob
        matches no record file or a directory cannot be listed;
        when nothing is found, the message says which subfolders were not searched.
    """
    paths = path_list(paths)
    if not paths:  # a glob.glob that found nothing: no dataset, as an empty directory is none
        raise DlstoreError("no files to read in []: the list of paths is empty")
    out: List[str] = []
    for p in paths:
        with waiting_on(p, "a stat"):  # one stat says what p is
            try:
                mode = os.stat(p).st_mode
            except (OSError, ValueError):  # nothing there, a link to nothing, or no path at all
                mode = 0
        if any(ch in p for ch in _GLOB_CHARS) and not stat.S_ISREG(mode):  # a file named part[1].tfrecord is itself
            before = len(unreadable) if unreadable is not None else 0
            matches, others = _glob_record_files(p, unreadable)
            if not matches and (unreadable is None or len(unreadable) == before):
                left_out = (f" (it matches {others} index, metadata or temporary "
                            f"file{'' if others == 1 else 's'}, which are not records)" if others else "")
                raise DlstoreError(f"no record file matches {p!r}{left_out}", path=p)
            out.extend(matches)
        elif stat.S_ISDIR(mode):
            out.extend(_list_directory(p, unreadable))
        elif stat.S_ISREG(mode):
            out.append(p)
        elif mode or os.path.lexists(p):  # a FIFO, a device, a link to nothing: said as a directory's listing says
            (refuse_unreadable if unreadable is None else unreadable.extend)([p])
        else:
            raise DlstoreError(f"{p}: no such file or directory", path=p)
    if not out and not unreadable:
        folders = [p for p in paths if os.path.isdir(p)]
        subfolders = sum(1 for d in folders for e in os.scandir(d) if e.is_dir() and not e.name.startswith("."))
        why = (f": {', '.join(folders)} holds no record file but {subfolders} subfolder(s), which are not searched "
               f"(name the files in them, e.g. with a glob like '{os.path.join(folders[0], '*', '*')}'; a tree of "
               f"images, one folder per class, becomes records with `dlstore convert`)" if subfolders else "")
        raise DlstoreError(f"no files to read in {paths!r}{why}", path=folders[0] if folders else None)
    return out


def _head(path: str, n: int = 16) -> bytes:
    """The first ``n`` bytes of ``path``, which tell its format and compression.

    Raises
    ------
    DlstoreIOError
        When the file cannot be opened or read (permissions, a vanished file), naming it.
    """
    try:
        with waiting_on(path, "a read"), open(path, "rb") as f:
            return f.read(n)
    except OSError as e:
        raise DlstoreIOError(f"{path}: cannot read: {e.strerror} (errno {e.errno})", path=path) from e


class CorruptionWarnings:
    """``on_error="warn"``: a ``RuntimeWarning`` for each corrupt record a C++ reader skipped, as it goes.

    Parameters
    ----------
    enabled : bool
    stacklevel : int
        Frames from :meth:`check` to the code a warning should name.
    """

    def __init__(self, enabled: bool, stacklevel: int):
        self.enabled, self.stacklevel = enabled, stacklevel
        self.seen = self.reported = 0
        self.noted_unreported = False
        self.warned: set = set()  # (path, offset) of each record warned of: one padded into another reader once

    def next_reader(self) -> None:
        """The reader checked from now on is another one (a window of a pass, a restart): its counts start at 0."""
        self.seen = self.reported = 0

    def check(self, core) -> None:
        """Warns of what ``core`` skipped since the last call (its ``stats()`` and ``corruptions()``)."""
        if not self.enabled:
            return
        skipped = core.stats()["skipped"]
        if skipped <= self.seen:  # corruptions() copies the whole list: only when something is new
            return
        self.seen = skipped
        found = core.corruptions()
        for path, offset, what in found[self.reported:]:
            if (path, offset) not in self.warned:
                self.warned.add((path, offset))
                warnings.warn(f"{path}: at byte {offset}: {what} (skipped)", RuntimeWarning, stacklevel=self.stacklevel)
        self.reported = len(found)
        if skipped > self.reported and not self.noted_unreported:
            self.noted_unreported = True
            warnings.warn(f"{skipped - self.reported} more corrupt records were skipped than reported: the reader "
                          f"reports the first {self.reported}; further ones are counted in stats()['skipped'] "
                          f"without a warning each", RuntimeWarning, stacklevel=self.stacklevel)


class RecordReader(SourcePosition, ReadsWithOptions):
    """Records of a list of files, read front to back: a :class:`~dlstore.sources.source.Source`.

    Iterate it for records, or call :meth:`batches` for the fast path.

    It keeps a position (``epoch``, ``sample_in_epoch``) as a :class:`~dlstore.Dataset` does: each
    pass of :meth:`batches`, or over its records, starts at it and moves it on (by the batch, or by the
    record), and a finished pass starts the next epoch
    from the first record, so one reader serves several epochs; :meth:`load_state_dict` resumes
    mid-pass (also after :meth:`set_epoch` of that epoch). The files are read in the same order every
    epoch (use :class:`~dlstore.Dataset` for shuffles and ranks).

    Attributes
    ----------
    paths : list of str
    format : str
        ``tfrecord`` or ``recordio``.
    compression : list of str
        Per file: ``none``, ``gzip`` or ``zlib``.
    options : ReadOptions
    engine : str
        The engine that runs (``io="auto"`` resolved).
    engine_reason : str
        Why that engine, e.g. "dataset 3.1 GB fits in the 20.2 GB available to the page cache".
    """

    #: Batches need no agreement between consumers: a reader has one.
    num_batches = None

    def __init__(self, paths: List[str], *, format: str, compression: List[str], choice: EngineChoice,
                 options: ReadOptions):
        self.paths = paths
        self.format = format
        self.compression = compression
        self.choice = choice
        self.options = options
        #: The CUDA device records are read into (``io="gds"``), else None.
        self.device_index: Optional[int] = None
        # The offsets of the records of the batch under way that an iteration over records has not handed
        # out yet (a list iterator: its length is their number), else None.
        self._batch_left: Optional[Iterator[int]] = None
        self.epoch = 0
        self.sample_in_epoch = 0
        self._core = None
        self._last = {"stats": {}, "notes": [], "corruptions": []}

    def _new_core(self):
        if self.engine == "gds":
            self._core = self._new_gds_core()
            return self._core
        from dlstore import _C

        self._core = _C.Reader(self.paths, self.format, self.compression, self.options.core(self.engine))
        return self._core

    def _new_gds_core(self):
        # Every record in file order, located by the indexes (built where missing), through the GPU
        # executor of the same read schedule the Dataset runs; a batch is about one read of records.
        from dlstore.io.gds import GdsPlanReader
        from dlstore.sources.indexing import index_dataset

        index = index_dataset(self.paths, "tfrecord")
        counts = index.counts
        files = np.repeat(np.arange(len(counts)), counts)
        starts = np.zeros(len(counts), dtype=np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        offset, size = index.frames(files, np.arange(len(files)) - np.repeat(starts, counts))
        chunk = self.options.get("chunk_size")
        per_read = max(1, int(chunk * len(files) // max(1, int(index.sizes.sum()))))
        return GdsPlanReader(self.paths, files, offset, size, None, device=self.device_index or 0,
                             batch_size=per_read, chunk_size=chunk, depth=self.options.get("depth"),
                             verify=self.verify, on_error="skip" if self.on_error == "warn" else self.on_error,
                             mode=self.choice.gds_mode)

    # ---- the Source protocol ----

    @property
    def sample_in_epoch(self) -> int:
        """Records of the epoch handed out: by :meth:`batches` a batch at a time, by iteration a record at a
        time (a pass counts a batch's records when it hands the batch out, less those an iteration over
        records still holds back)."""
        left = self._batch_left
        return self._sample_in_epoch - (operator.length_hint(left) if left is not None else 0)

    @sample_in_epoch.setter
    def sample_in_epoch(self, k: int) -> None:
        self._sample_in_epoch, self._batch_left = k, None

    def use_batch_size(self, batch_size: int) -> None:
        """A reader's batches are its chunks whatever the consumer's batch size: nothing to do."""

    def state_dict(self) -> Dict[str, int]:
        """``epoch`` and ``sample_in_epoch`` (records of the epoch already handed out)."""
        return {"epoch": self.epoch, "sample_in_epoch": self.sample_in_epoch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes at ``state``: the next :meth:`batches` skips the records already handed out
        (read again, not handed out), also after :meth:`set_epoch` of that epoch; another epoch forgets it."""
        epoch, k = int(state["epoch"]), int(state["sample_in_epoch"])
        if epoch < 0 or k < 0:
            raise ValueError(f"epoch and sample_in_epoch must be non-negative, got {epoch} and {k}")
        self._resume_at(epoch, k)

    def batches(self) -> Iterator:
        """Yields ``RecordBatch`` objects, about one per chunk read, from the current position.

        A batch exposes the buffer protocol over one contiguous region; record ``i`` is
        ``memoryview(batch)[offsets[i]:offsets[i] + lengths[i]]``. Also ``file_offsets`` (where each
        record's frame starts in its file), ``file_index`` (into :attr:`paths`), ``path(i)``,
        ``num_records`` and ``nbytes`` (payload bytes).

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
        warner = CorruptionWarnings(self.on_error == "warn", warn_stacklevel + 1)
        self._pass_starts()
        skip = self.sample_in_epoch
        try:
            while True:
                batch = core.next_batch()
                warner.check(core)
                if batch is None:
                    self.epoch, self.sample_in_epoch = self.epoch + 1, 0
                    return
                if skip:
                    n = batch.num_records
                    if skip >= n:
                        skip -= n
                        continue
                    batch, skip = batch.slice(skip, n), 0
                self.sample_in_epoch += batch.num_records
                yield batch
        finally:
            self._finish(core)

    def _finish(self, core) -> None:
        # Keep the pass's counters but let the core go: its file handles, mappings and buffers are
        # released (a live mapping would pin pages in the page cache across a drop_caches).
        self._last = {"stats": dict(core.stats()), "notes": list(core.notes()),
                      "corruptions": list(core.corruptions())}
        close_reader(core)
        if self._core is core:
            self._core = None

    def __iter__(self) -> Iterator[memoryview]:
        """Yields each record of the files as a read-only ``memoryview``, from the current position, as
        :meth:`batches` does: ``sample_in_epoch`` counts each record handed out, a pass starts at a
        position :meth:`load_state_dict` loaded, and a finished pass starts the next epoch.

        A record is a view into the chunk buffer it was read into and keeps that whole buffer
        (about ``chunk_size`` bytes) alive while it is referenced: copy records kept beyond the
        loop with ``bytes(record)``. Stopping early releases the reader's files and buffers.

        Raises
        ------
        DlstoreError
            With ``io="gds"``, whose records are in GPU memory (read them with :meth:`batches`).
        """
        if self.engine == "gds":
            raise DlstoreError("io='gds' puts records in GPU memory: read them with batches() (each batch's buffer "
                               "is a CuPy array), not record by record")
        batches = self._batches(warn_stacklevel=3)
        try:
            for batch in batches:  # the position counts the batch's records; those not handed out yet are taken off
                mv = memoryview(getattr(batch, "buffer", batch))
                offsets = iter(batch.offsets.tolist())
                self._batch_left = offsets  # the zip draws an offset per record handed out: no count of our own
                for o, n in zip(offsets, batch.lengths.tolist()):
                    yield mv[o:o + n]
        finally:
            self.sample_in_epoch = self.sample_in_epoch  # stopped mid-batch: the records handed out, fixed
            batches.close()  # runs _batches' finally now, not whenever the generator is collected

    def count(self) -> dict:
        """Reads everything (framing and CRCs checked) without handing records to Python; returns :meth:`stats`."""
        core = self._new_core()
        try:
            core.count_all()
        finally:  # what was counted before an error stays in stats(); the files are let go either way
            self._finish(core)
        return self.stats()

    def stats(self) -> dict:
        """Counters of the last pass: records, payload bytes, bytes read from files (of those, read by an
        O_DIRECT engine from the page cache: ``cache_bytes_read``), skipped records,
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


def open_records(paths: PathSpec, *, format: str = "auto", compression: Optional[str] = "auto",
                 options: Optional[ReadOptions] = None, device: Optional[str] = None,
                 **read_options: Any) -> RecordReader:
    """Opens TFRecord or RecordIO files for reading, front to back.

    Parameters
    ----------
    paths : str, path-like or sequence of them
        Files, globs or directories.
    format : {"auto", "tfrecord", "recordio"}
        ``auto`` tells by the first bytes (and the extension).
    compression : {"auto", None, "none", "gzip", "zlib"}
        TFRecord compression. ``auto`` (the default) tells per file by name and magic bytes;
        ``None`` (or ``"none"``) means uncompressed, as in tf.data and :class:`~dlstore.TFRecordWriter`.
    options : ReadOptions, optional
        How to read (engine, CRC checks, error policy, read sizes, threads, timeouts).
    device : str, optional
        Where the records are going: ``cuda:N`` lets ``io="auto"`` pick ``gds`` (true GPUDirect
        Storage only), and is the device ``io="gds"`` reads into (default ``cuda:0``).
        ``None`` or ``"cpu"``: host memory (with ``io="gds"``, ``"cpu"`` is a ValueError).
    **read_options
        Or the same as keyword arguments: ``io``, ``verify``, ``on_error``, ``chunk_size``, ``depth``,
        ``io_threads``, ``verify_threads``, ``read_timeout``; see :class:`~dlstore.ReadOptions`.

    Returns
    -------
    RecordReader

    Raises
    ------
    DlstoreError
        When a path does not exist or cannot be read (:class:`~dlstore.DlstoreIOError`), or the
        files mix formats.
    GdsUnavailableError
        For ``io="gds"`` where it cannot run, naming what is missing (no CUDA driver, no GPU, kvikio
        not installed, libcufile not found).
    ValueError
        For an unknown format, setting or ``on_error``.
    TypeError
        For an unknown keyword argument.

    Examples
    --------
    >>> reader = dlstore.open_records("/data/train-*", io="auto")   # doctest: +SKIP
    >>> for record in reader:                                        # doctest: +SKIP
    ...     example = dlstore.parse_example(record)
    """
    options = ReadOptions.take(options, read_options)
    if read_options:
        raise TypeError(f"open_records() got unexpected keyword arguments {', '.join(sorted(read_options))}")
    files = expand_paths(paths)
    fmt, comps = detect_files(files, format, compression)
    from dlstore.io.cuda import parse_device
    from dlstore.placement.world import detect_world

    # cuda:local: the GPU numbered as the launcher's local rank, as a Dataset reads it
    gpu = parse_device(device, detect_world().local_rank) if device is not None else None
    choice = resolve_engine(options.get("io"), files, sum(os.path.getsize(f) for f in files),
                            device=device if gpu is None else f"cuda:{gpu}")
    if choice.engine == "gds":
        from dlstore.io.gds import check_source

        check_source(fmt, files, comps)
    reader = RecordReader(files, format=fmt, compression=comps, choice=choice, options=options)
    reader.device_index = gpu if gpu is not None else (0 if choice.engine == "gds" else None)
    return reader


def close_reader(core: Any) -> None:
    """Ends a core reader's reads in flight (a pass stopped early), waiting for those under way up to the read
    timeout with the GIL released, so that its files and mappings close when it goes. Dropped without this, a
    reader never waits (it may be on a hung mount): its reads finish in the background, holding their files
    till then. The GPU reader has nothing to close."""
    close = getattr(core, "close", None)
    if close is not None:
        close()


def detect_files(files: Sequence[str], format: str = "auto",
                 compression: Optional[str] = "auto") -> Tuple[str, List[str]]:
    """The format of ``files`` (one for all) and each file's compression, told by their first bytes.

    Raises
    ------
    DlstoreError
        When the files mix formats, or one cannot be read.
    """
    formats: Dict[str, List[str]] = {}
    comps = []
    for f in files:
        fmt, comp = detect(f, _head(f), format, compression)
        formats.setdefault(fmt, []).append(f)
        comps.append(comp)
    if len(formats) > 1:
        said, first = mixed_formats(formats)
        raise DlstoreError(f"the files mix formats, {said}; read each format apart", path=first)
    return next(iter(formats)), comps


def mixed_formats(files_by_format: Dict[str, List[str]]) -> Tuple[str, str]:
    """Each format with how many files hold it and one of them, the rarest first (where to look for the odd
    ones out), and that rarest format's first file: ``("recordio in 1 file (/d/b.rec) and tfrecord in 400
    files (e.g. /d/a.tfrecord)", "/d/b.rec")``."""
    ranked = sorted(files_by_format.items(), key=lambda kv: (len(kv[1]), kv[0]))
    said = [f"{fmt} in 1 file ({files[0]})" if len(files) == 1 else f"{fmt} in {len(files)} files (e.g. {files[0]})"
            for fmt, files in ranked]
    return ", ".join(said[:-1]) + " and " + said[-1], ranked[0][1][0]
