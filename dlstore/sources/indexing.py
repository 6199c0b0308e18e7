"""Index files built on the fly: one sequential pass over a file, written beside it, or in the cache
directory when the data is read-only, and checked against the data before use.

Two kinds: a per-file index (``x.idx``, in the text formats DALI and MXNet read), and a dataset
manifest per directory (:mod:`dlstore.formats.manifest`), which is what :class:`dlstore.Dataset`
opens: one file for every shard of the directory, checked against the shards' sizes and mtimes,
brought up to date under a lock when shards were added, rewritten or removed."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import warnings
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from dlstore import settings
from dlstore._progress import Progress
from dlstore.errors import DlstoreError
from dlstore.formats import index as index_format
from dlstore.formats.manifest import MANIFEST_NAME, Manifest, decode_manifest, encode_manifest
from dlstore.sources.reader import RecordReader, detect_files, expand_paths, open_records

__all__ = ["index_path_for", "build_index", "scan_offsets", "load_index", "find_index", "ensure_index",
           "manifest_path_for", "read_manifest", "write_manifest", "record_manifest", "DatasetIndex",
           "index_dataset"]


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

    files = expand_paths(path)
    if len(files) != 1:
        shown = ", ".join(files[:3]) + (", ..." if len(files) > 3 else "")
        raise ValueError(f"{path!r} names {len(files)} files ({shown}); an index describes one file: "
                         f"build one per file")
    path = files[0]
    fmt, offs, lens = scan_offsets(path, fmt, verify)
    if fmt == "tfrecord":
        text = index_format.format_tfrecord_index(offs, index_format.frame_sizes(lens))
    else:
        text = index_format.format_recordio_index(range(len(offs)), offs)
    dest = out or index_path_for(path, fmt)
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    tmp = dest + f".tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, dest)  # a reader never sees half an index
    return dest, len(offs)


def scan_offsets(path: str, fmt: str = "auto", verify: bool = True) -> Tuple[str, np.ndarray, np.ndarray]:
    """``(format, frame offsets, payload lengths)`` of one uncompressed record file, from one
    sequential pass (CRCs checked when ``verify``).

    Raises
    ------
    ValueError
        When the file is compressed (its records have no byte offsets).
    """

    reader = open_records(path, format=fmt, io="buffered", verify=verify)
    if reader.compression[0] != "none":
        raise ValueError(f"{path}: compressed files cannot be indexed by byte offset")
    offsets, lengths = [], []
    for batch in reader.batches():
        offsets.append(np.array(batch.file_offsets))
        lengths.append(np.array(batch.lengths))
    offs = np.concatenate(offsets) if offsets else np.zeros(0, np.uint64)
    lens = np.concatenate(lengths) if lengths else np.zeros(0, np.uint64)
    return reader.format, offs, lens


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


# ---- dataset manifests ------------------------------------------------------------------------------

_MAP_MANIFESTS_OVER = 64 << 20  # bytes


def manifest_path_for(directory: str, writable: Optional[bool] = None) -> str:
    """Where the manifest of ``directory`` lives: inside it (``.dlstore-manifest``), or under
    ``<cache_dir>/manifests/`` when the directory is not writable."""
    directory = os.path.abspath(directory)
    if writable is None:
        writable = os.access(directory, os.W_OK)
    if writable:
        return os.path.join(directory, MANIFEST_NAME)
    digest = hashlib.sha1(directory.encode()).hexdigest()[:16]
    return os.path.join(os.path.expanduser(settings.get("cache_dir")), "manifests", digest + MANIFEST_NAME)


def read_manifest(directory: str) -> Tuple[Optional[str], Optional[Manifest], Optional[str]]:
    """The manifest of ``directory`` (inside it, else in the cache), mapped, not checked against the
    shards. Returns ``(path, manifest, None)``; ``(path, None, why)`` for one that cannot be read;
    ``(None, None, None)`` when there is none."""
    refused: Tuple[Optional[str], Optional[Manifest], Optional[str]] = (None, None, None)
    for candidate in (manifest_path_for(directory), manifest_path_for(directory, writable=False)):
        try:
            with open(candidate, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                # A large manifest is mapped: a rank's pages are those of its own records, shared with
                # the other ranks of the host through the page cache. A small one is read, so that no
                # mapping holds the data's mount busy while a Dataset lives.
                if size > _MAP_MANIFESTS_OVER:
                    buffer = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
                else:
                    buffer = f.read()
            return candidate, decode_manifest(buffer, candidate), None
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            refused = (candidate, None, str(e))
    return refused


def write_manifest(dest: str, fmt: str, names: Sequence[str], sizes, mtimes, counts, offsets) -> str:
    """Writes a manifest to ``dest`` atomically (a reader sees the old one or the new one)."""
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = f"{dest}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        for piece in encode_manifest(fmt, names, sizes, mtimes, counts, offsets):
            f.write(piece)
    os.replace(tmp, dest)
    return dest


@contextlib.contextmanager
def _locked(dest: str) -> Iterator[None]:
    """Holds an exclusive lock beside ``dest`` while one process builds it; the others wait here."""
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    fd = os.open(dest + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays, so that no two processes lock different inodes


class _Stale(NamedTuple):
    """How a manifest differs from the shards asked for: per shard its entry (-1: none), and what
    changed, in words naming each shard."""

    where: np.ndarray
    problems: List[str]


def _compare(manifest: Manifest, directory: str, names: List[str], stats: List[os.stat_result],
             fmt: str) -> _Stale:
    lookup = {n: i for i, n in enumerate(manifest.names)}
    where = np.array([lookup.get(n, -1) for n in names], dtype=np.int64)
    problems: List[str] = []
    if fmt != "auto" and manifest.format != fmt:
        problems.append(f"it describes {manifest.format} shards, not {fmt}")
    known = where >= 0
    size = np.array([s.st_size for s in stats], dtype=np.int64)
    mtime = np.array([s.st_mtime_ns for s in stats], dtype=np.int64)
    changed = known.copy()
    changed[known] = (manifest.sizes[where[known]] != size[known]) | (manifest.mtimes[where[known]] != mtime[known])
    problems += [f"shard {names[i]} is not in it (added)" for i in np.flatnonzero(~known)]
    problems += [f"shard {names[i]} was rewritten (size or mtime changed)" for i in np.flatnonzero(changed)]
    present = set(os.listdir(directory))
    problems += [f"shard {n} was removed" for n in manifest.names if n not in present]
    return _Stale(np.where(changed, -1, where), problems)


def _scan_shards(paths: List[str], fmt: str, verify: bool, bar=None) -> Tuple[str, List[np.ndarray]]:
    """The format and each shard's frame offsets: from valid per-file indexes where there are, the
    rest in one sequential pass of one reader over all of them."""

    if not paths:
        return fmt, []
    fmt, comps = detect_files(paths, fmt)
    squeezed = [p for p, c in zip(paths, comps) if c != "none"]
    if squeezed:
        raise DlstoreError(f"{squeezed[0]}: compressed shards cannot be split by record between ranks; read them "
                           f"with dlstore.open_records, or store them uncompressed", path=squeezed[0])
    found = [find_index(p, fmt)[1] for p in paths]
    todo = [i for i, offs in enumerate(found) if offs is None]
    if todo:
        # A corrupt record is indexed where it starts rather than raised here: it is a frame of the shard
        # all the same, and the read finds it again and applies the reader's on_error (raise naming it,
        # skip counting it). A truncated tail is a frame that runs to the end of the file.
        reader: RecordReader = open_records([paths[i] for i in todo], format=fmt, io="buffered", verify=verify,
                                            on_error="skip")
        files, offsets = [], []
        for batch in reader.batches():
            files.append(np.array(batch.file_indices, dtype=np.int64))
            offsets.append(np.array(batch.file_offsets, dtype=np.uint64))
            if bar is not None:
                bar.update(batch.nbytes)
        bad = [(reader.paths.index(path), at) for path, at, _ in reader.corruptions() if at is not None]
        files.append(np.array([f for f, _ in bad], dtype=np.int64))
        offsets.append(np.array([at for _, at in bad], dtype=np.uint64))
        file = np.concatenate(files) if files else np.zeros(0, np.int64)
        offset = np.concatenate(offsets) if offsets else np.zeros(0, np.uint64)
        order = np.lexsort((offset, file))
        file, offset = file[order], offset[order]
        bounds = np.searchsorted(file, np.arange(len(todo) + 1))
        for k, i in enumerate(todo):
            found[i] = offset[bounds[k]:bounds[k + 1]]
    return fmt, [np.asarray(o, dtype=np.uint64) for o in found]


def _build(directory: str, dest: str, old: Optional[Manifest], names: List[str], stats: List[os.stat_result],
           fmt: str, progress: bool, verify: bool, given: Optional[Dict[str, np.ndarray]] = None) -> Manifest:
    """A manifest for ``names`` (and the old one's entries whose shards are unchanged), written to ``dest``;
    the frame offsets of the shards in ``given`` are taken from it rather than read."""

    entries: Dict[str, Tuple[int, int, np.ndarray]] = {}  # name -> (size, mtime, offsets)
    fmts = set()
    if old is not None:  # unchanged entries stay, including shards of the directory not asked for now
        asked = dict(zip(names, stats))
        for i, name in enumerate(old.names):
            try:
                st = asked.get(name) or os.stat(os.path.join(directory, name))
            except FileNotFoundError:
                continue
            if (st.st_size, st.st_mtime_ns) == (int(old.sizes[i]), int(old.mtimes[i])):
                entries[name] = (st.st_size, st.st_mtime_ns, old.shard_offsets(i).astype(np.uint64))
                fmts.add(old.format)
    for name, st in zip(names, stats):
        if given is not None and name in given:
            entries[name] = (st.st_size, st.st_mtime_ns, np.asarray(given[name], dtype=np.uint64))
            fmts.add(fmt)
    todo = [(n, s) for n, s in zip(names, stats) if n not in entries]
    if todo:
        total = sum(st.st_size for _, st in todo)
        with Progress(total, f"indexing {len(todo)} shards", unit="B", enabled=None if progress else False) as bar:
            shard_fmt, scans = _scan_shards([os.path.join(directory, n) for n, _ in todo], fmt, verify, bar)
        fmts.add(shard_fmt)
        for (name, st), offsets in zip(todo, scans):
            entries[name] = (st.st_size, st.st_mtime_ns, offsets)
    if len(fmts) > 1:
        raise DlstoreError(f"{directory}: the shards mix formats {sorted(fmts)}; read each format apart",
                           path=directory)
    order = sorted(entries)
    offsets = [entries[n][2] for n in order]
    write_manifest(dest, fmts.pop() if fmts else (fmt if fmt != "auto" else "tfrecord"), order,
                   [entries[n][0] for n in order], [entries[n][1] for n in order],
                   [len(o) for o in offsets], np.concatenate(offsets) if offsets else np.zeros(0, np.uint64))
    found, manifest, why = read_manifest(directory)
    if manifest is None or found != dest:
        raise DlstoreError(f"{dest}: the manifest just written cannot be read back: {why}", path=dest)
    return manifest


def _directory_manifest(directory: str, names: List[str], stats: List[os.stat_result], fmt: str,
                        progress: bool, verify: bool) -> Tuple[str, Manifest, np.ndarray, List[str]]:
    """The manifest of one directory covering ``names``, up to date: ``(path, manifest, entry of each
    name, notes)``. Built or brought up to date under a lock when it is missing or stale."""
    found, manifest, why = read_manifest(directory)
    if manifest is not None:
        stale = _compare(manifest, directory, names, stats, fmt)
        if not stale.problems:
            return found, manifest, stale.where, []
    dest = manifest_path_for(directory)
    try:
        with _locked(dest):
            # Another process may have built it while this one waited for the lock.
            found, manifest, why = read_manifest(directory)
            stale = _compare(manifest, directory, names, stats, fmt) if manifest is not None else None
            if stale is not None and not stale.problems:
                return found, manifest, stale.where, []
            if stale is not None:
                shown = "; ".join(stale.problems[:3]) + (f"; and {len(stale.problems) - 3} more"
                                                         if len(stale.problems) > 3 else "")
                notes = [f"{found} no longer matches its shards: {shown}; rebuilt it"]
                if any(not p.endswith("(added)") for p in stale.problems):  # shards new to it are no news
                    warnings.warn(notes[0], stacklevel=4)
            else:
                refused = f" (the one found was refused: {why})" if why else ""
                notes = [f"indexed {len(names)} shards of {directory} into {dest}{refused}"]
            built = _build(directory, dest, manifest if fmt in ("auto", getattr(manifest, "format", fmt)) else None,
                           names, stats, fmt, progress, verify)
    except PermissionError as e:
        raise DlstoreError(f"{directory}: no manifest can be written ({e}); set DLSTORE_CACHE to a writable "
                           f"directory", path=directory) from e
    where = _compare(built, directory, names, stats, fmt)
    if where.problems:  # a shard changed while it was being indexed
        raise DlstoreError(f"{directory}: the shards changed while they were indexed ({where.problems[0]}); "
                           f"try again", path=directory)
    return dest, built, where.where, notes


def record_manifest(directory: str, fmt: str, offsets: Dict[str, np.ndarray]) -> str:
    """Adds shards whose frame offsets are known (copies of indexed shards) to the manifest of
    ``directory`` without reading them; returns the manifest's path."""
    dest = manifest_path_for(directory)
    names = sorted(offsets)
    stats = [os.stat(os.path.join(directory, n)) for n in names]
    with _locked(dest):
        _, old, _ = read_manifest(directory)
        _build(directory, dest, old if old is not None and old.format == fmt else None, names, stats, fmt,
               False, False, given=offsets)
    return dest


class DatasetIndex:
    """Where every record of a dataset's shards lies, from one manifest per directory.

    Attributes
    ----------
    format : str
    counts, sizes : numpy.ndarray
        Per shard (in the order given): records, bytes.
    manifests : list of str
        The manifest files read (one per directory).
    notes : list of str
        Manifests built or rebuilt, and why.
    """

    def __init__(self, paths: Sequence[str], fmt: str = "auto", progress: bool = False, verify: bool = True):
        groups: Dict[str, List[int]] = {}
        names: List[str] = []
        for i, p in enumerate(paths):
            directory, _, name = (p if p.startswith(os.sep) else os.path.abspath(p)).rpartition(os.sep)
            groups.setdefault(directory or os.sep, []).append(i)
            names.append(name)
        self._group = np.zeros(len(paths), dtype=np.int64)
        self._entry = np.zeros(len(paths), dtype=np.int64)
        self._manifests: List[Manifest] = []
        self.manifests: List[str] = []
        self.notes: List[str] = []
        formats = set()
        for g, (directory, members) in enumerate(groups.items()):
            try:
                stats = [os.stat(paths[i]) for i in members]
            except FileNotFoundError as e:
                raise DlstoreError(f"{e.filename}: no such file", path=e.filename) from None
            found, manifest, where, notes = _directory_manifest(directory, [names[i] for i in members], stats, fmt,
                                                                progress, verify)
            self._group[members] = g
            self._entry[members] = where
            self._manifests.append(manifest)
            self.manifests.append(found)
            self.notes += notes
            formats.add(manifest.format)
        if len(formats) > 1:
            raise DlstoreError(f"the shards mix formats {sorted(formats)}; read each format apart")
        self.format = formats.pop() if formats else (fmt if fmt != "auto" else "tfrecord")
        self.counts = np.zeros(len(paths), dtype=np.int64)
        self.sizes = np.zeros(len(paths), dtype=np.int64)
        for g, m in enumerate(self._manifests):
            mine = self._group == g
            self.counts[mine] = m.counts[self._entry[mine]]
            self.sizes[mine] = m.sizes[self._entry[mine]]

    def frames(self, shards: np.ndarray, records: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """``(offset, size)`` of record ``records[i]`` of shard ``shards[i]`` (int64 arrays)."""
        shards = np.asarray(shards, dtype=np.int64)
        records = np.asarray(records, dtype=np.int64)
        if len(self._manifests) == 1:
            return self._manifests[0].frames(self._entry[shards], records)
        offset = np.empty(len(shards), dtype=np.int64)
        size = np.empty(len(shards), dtype=np.int64)
        group = self._group[shards]
        for g, m in enumerate(self._manifests):
            mine = np.flatnonzero(group == g)
            if len(mine):
                offset[mine], size[mine] = m.frames(self._entry[shards[mine]], records[mine])
        return offset, size

    def shard_offsets(self, shard: int) -> np.ndarray:
        """The frame offsets of shard ``shard`` (int64)."""
        return self._manifests[int(self._group[shard])].shard_offsets(int(self._entry[shard]))

    def describe(self) -> str:
        n = len(self.manifests)
        return f"{self.manifests[0]}" if n == 1 else f"{n} manifests ({self.manifests[0]}, ...)"


def index_dataset(paths: Sequence[str], fmt: str = "auto", progress: bool = False,
                  verify: bool = True) -> DatasetIndex:
    """The :class:`DatasetIndex` of ``paths``: their directories' manifests, built or brought up to
    date where they are missing or no longer match the shards (with a warning naming the shards)."""
    return DatasetIndex(paths, fmt, progress, verify)
