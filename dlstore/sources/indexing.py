"""Index files built on the fly: one sequential pass over a file, written beside it, or in the cache
directory when the data is read-only, and checked against the data before use.

Two kinds: a per-file index (``x.idx``, in the text formats DALI and MXNet read), and a dataset
manifest per directory (:mod:`dlstore.formats.manifest`), which is what :class:`dlstore.Dataset`
opens: one file for every shard of the directory. While the directory is unchanged (its mtime is the
manifest's stamp), the manifest's listing stands for the directory's: a rank learns its shards
without listing it or a ``stat`` of each. Shards added or removed show in the listing and bring the
manifest up to date under a lock; a shard rewritten in place is found by the rank that reads it
(:meth:`DatasetIndex.check`, a ``stat`` of each of its own shards; a frame check at read time catches
the rest), or by ``dlstore index``, which checks every shard."""
from __future__ import annotations

import bisect
import concurrent.futures
import contextlib
import fcntl
import functools
import hashlib
import mmap
import os
import warnings
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from dlstore import settings
from dlstore._progress import Progress
from dlstore.errors import DlstoreError
from dlstore.formats.registry import format_named
from dlstore.io import deadline
from dlstore.formats.manifest import MANIFEST_NAME, STAMP_AT, Manifest, decode_manifest, encode_manifest, encode_stamp
from dlstore.sources.reader import (PathSpec, RecordReader, detect_files, expand_paths, list_record_files, path_list,
                                    mixed_formats, open_records, record_file_names, refuse_unreadable, split_glob)

__all__ = ["index_path_for", "build_index", "write_index", "scan_offsets", "load_index", "find_index", "ensure_index",
           "manifest_path_for", "read_manifest", "write_manifest", "record_manifest", "DatasetIndex",
           "index_dataset", "open_shards", "ShardChanged"]


def index_path_for(path: str, fmt: str = "tfrecord", writable: Optional[bool] = None) -> str:
    """Where the index of ``path`` lives: beside it (``path + .idx``, or MXNet's ``x.rec -> x.idx``),
    or under ``<cache_dir>/indexes/`` when its directory is not writable."""
    beside = format_named(fmt).index_beside(path)
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
    return write_index(path, fmt, offs, lens, out), len(offs)


def write_index(path: str, fmt: str, offsets: np.ndarray, lengths: np.ndarray, out: Optional[str] = None) -> str:
    """Writes the index of ``path`` from its frame offsets and payload lengths (:func:`scan_offsets`) to ``out``
    (:func:`index_path_for` by default); returns where."""
    text = format_named(fmt).format_index(offsets, lengths)
    dest = out or index_path_for(path, fmt)
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    tmp = dest + f".tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, dest)  # a reader never sees half an index
    return dest


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
        offs, sizes = format_named(fmt).parse_index(text, index_path)
    except UnicodeDecodeError as e:
        raise ValueError(f"{index_path} is not a text index ({e.reason} at byte {e.start}): rebuild it") from e
    except OverflowError as e:  # a number beyond 64 bits
        raise ValueError(f"{index_path}: an entry does not fit in 64 bits: rebuild it") from e
    size = os.path.getsize(path)
    if sizes is not None:  # whole frames: they must tile the file
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
    if len(offs) and int(offs.max()) >= size:
        raise ValueError(f"{index_path}: an offset points past the end of {path} ({size} bytes)")
    # Record starts only (RecordIO): MXNet writes its .idx in its list's order, by key, not the file's; the
    # reads take them in file order. (That each one spans exactly one record is checked as it is read.)
    offs = np.sort(offs)
    if len(offs) and int(offs[0]) != 0:
        raise ValueError(f"{index_path}: its first record starts at byte {int(offs[0])}, not 0: it lists fewer "
                         f"records than {path} holds: rebuild it")
    if len(offs) > 1 and np.any(offs[1:] == offs[:-1]):
        raise ValueError(f"{index_path}: a record's offset is listed twice: rebuild it")
    elif not len(offs) and size:
        raise ValueError(f"{index_path} is empty but {path} has {size} bytes")
    return offs


def find_index(path: str, fmt: str = "tfrecord") -> Tuple[Optional[str], Optional[np.ndarray], Optional[str]]:
    """An existing index of ``path`` (beside it, else in the cache), checked against the data.

    Returns ``(index path, offsets, None)`` for a valid one; ``(index path, None, why)`` for the last
    one found and refused (stale, damaged or foreign); ``(None, None, None)`` when there is none.
    """
    refused: Tuple[Optional[str], Optional[np.ndarray], Optional[str]] = (None, None, None)
    with deadline.waiting_on(path, "a look for its index"):
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
#: Shards a rank checks (a stat each) per plan, in reading order; a frame check at read time covers the rest.
CHECK_SHARDS_PER_PLAN = 256


def manifest_path_for(directory: str, writable: Optional[bool] = None) -> str:
    """Where the manifest of ``directory`` lives: inside it (``.dlstore-manifest``), or under
    ``<cache_dir>/manifests/`` when the directory is not writable."""
    directory = os.path.abspath(directory)
    if writable is None:
        with deadline.waiting_on(directory, "an access check"):
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
            with deadline.waiting_on(candidate, "a read of the manifest"), open(candidate, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                # A large manifest is mapped: a rank reads its small sections whole and, of the frame
                # offsets, the pages of its own shards' records only (no read-ahead around them), shared
                # with the other ranks of the host through the page cache. A small one is read, so that
                # no mapping holds the data's mount busy while a Dataset lives.
                if size <= _MAP_MANIFESTS_OVER:
                    return candidate, decode_manifest(f.read(), candidate), None
                mapped = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
            manifest = decode_manifest(mapped, candidate)
            page = mmap.PAGESIZE
            start = manifest.offsets_at // page * page
            if start < size:
                mapped.madvise(mmap.MADV_RANDOM, start, size - start)
            return candidate, manifest, None
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            refused = (candidate, None, str(e))
    return refused


_GATHER_THREADS = 8  # reads of a manifest's entries in flight at once


def _read_runs(fd: int, path: str, starts: List[int], lengths: List[int]) -> List[bytes]:
    pieces = []
    for start, length in zip(starts, lengths):
        with deadline.waiting_on(path, "a read"):
            piece = os.pread(fd, length, start)
        if len(piece) != length:
            raise DlstoreError(f"{path}: at byte {start}: read {len(piece)} of {length} bytes of frame offsets "
                               f"(the manifest was cut short)", path=path, offset=start)
        pieces.append(piece)
    return pieces


def _gather_offsets(path: str, manifest: Manifest, positions: np.ndarray) -> np.ndarray:
    """Entries ``positions`` of a large manifest's frame offsets, read from the file: one read per run of
    nearby entries, a few threads reading at once (so that a cold start has its reads in flight
    together). Nothing of the table is mapped, so a rank's memory holds its entries only."""
    width = manifest.offsets.dtype.itemsize
    wanted, back = np.unique(np.asarray(positions, dtype=np.int64), return_inverse=True)
    if len(wanted) == 0:
        return np.zeros(0, dtype=manifest.offsets.dtype)
    new = np.ones(len(wanted), dtype=bool)
    new[1:] = np.diff(wanted) > 512 // width  # entries within 512 bytes are read together
    first = wanted[new]
    last = np.append(wanted[np.flatnonzero(new)[1:] - 1], wanted[-1])  # each run's last entry
    starts = manifest.offsets_at + first * width
    lengths = (last - first + 1) * width
    starts_list, lengths_list = starts.tolist(), lengths.tolist()
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead around the entries: pages a rank needs only
        if len(starts_list) < 4 * _GATHER_THREADS:
            pieces = _read_runs(fd, path, starts_list, lengths_list)
        else:
            step = -(-len(starts_list) // _GATHER_THREADS)
            with concurrent.futures.ThreadPoolExecutor(_GATHER_THREADS) as pool:
                parts = pool.map(deadline.carried(lambda a: _read_runs(fd, path, starts_list[a:a + step],
                                                                       lengths_list[a:a + step])),
                                 range(0, len(starts_list), step))
                pieces = [piece for part in parts for piece in part]
    table = np.frombuffer(b"".join(pieces), dtype=manifest.offsets.dtype)
    run = np.cumsum(new) - 1
    run_at = np.cumsum(last - first + 1) - (last - first + 1)
    return table[run_at[run] + wanted - first[run]][back.reshape(-1)]


def write_manifest(dest: str, fmt: str, names: Sequence[str], sizes, mtimes, counts, offsets,
                   listing: Optional[Sequence[str]] = None) -> str:
    """Writes a manifest to ``dest`` atomically (a reader sees the old one or the new one), without a
    stamp (:func:`_stamp` sets it once the listing is known to be current)."""
    with deadline.waiting_on(dest, "a write of the manifest"):
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = f"{dest}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            for piece in encode_manifest(fmt, names, sizes, mtimes, counts, offsets, listing):
                f.write(piece)
        os.replace(tmp, dest)
    return dest


def _listed(directory: str, odd: Optional[List[str]] = None) -> Tuple[int, List[str]]:
    """The directory's mtime (ns), then its record files: a change after that moment changes the mtime again.
    ``odd`` gets the names that read as record files but are no file (:func:`list_record_files`)."""
    before = deadline.stat(directory).st_mtime_ns
    return before, list_record_files(directory, None, odd)


def _stamp(dest: str, stamp: int) -> None:
    """Sets the stamp of the manifest at ``dest``: the directory's mtime when its listing was taken."""
    with deadline.waiting_on(dest, "a write of the manifest"), open(dest, "r+b") as f:
        f.seek(STAMP_AT)
        f.write(encode_stamp(stamp))


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


def _scan_shards(paths: List[str], fmt: str, verify: bool, bar=None) -> Tuple[str, List[np.ndarray]]:
    """The format and each shard's frame offsets: from valid per-file indexes where there are, the
    rest in one sequential pass of one reader over all of them."""

    if not paths:
        return fmt, []
    fmt, comps = detect_files(paths, fmt)
    squeezed = [p for p, c in zip(paths, comps) if c != "none"]
    if squeezed:
        raise DlstoreError(f"{squeezed[0]}: a Dataset cannot read compressed shards (its plans read records by "
                           f"their byte offsets, which a compressed stream has not, even on one rank): read them in "
                           f"order with dlstore.open_records, or write them again uncompressed (a TFRecordWriter "
                           f"without compression)", path=squeezed[0])
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


def _build(directory: str, dest: str, old: Optional[Manifest], names: Sequence[str], fmt: str, progress: bool,
           verify: bool, given: Optional[Dict[str, np.ndarray]] = None) -> Manifest:
    """A manifest for ``names`` (and the old one's entries whose shards are unchanged, a ``stat`` each),
    with the directory's listing, written to ``dest`` and stamped; the frame offsets of the shards in
    ``given`` are taken from it rather than read."""

    listing = list_record_files(directory)
    try:
        stats = {n: deadline.stat(os.path.join(directory, n)) for n in names}
    except FileNotFoundError as e:
        raise DlstoreError(f"{e.filename}: no such file", path=e.filename) from None
    entries: Dict[str, Tuple[int, int, np.ndarray]] = {}  # name -> (size, mtime, offsets), of the shards named
    others: Dict[str, Tuple[int, int, np.ndarray]] = {}  # likewise, the old manifest's other unchanged shards
    named: Dict[str, List[str]] = {}  # format -> the shards named that hold it
    if old is not None:  # unchanged entries stay, including shards of the directory not asked for now
        for i, name in enumerate(old.names):
            try:
                st = stats.get(name) or deadline.stat(os.path.join(directory, name))
            except FileNotFoundError:
                continue
            if (st.st_size, st.st_mtime_ns) == (int(old.sizes[i]), int(old.mtimes[i])):
                (entries if name in stats else others)[name] = (st.st_size, st.st_mtime_ns,
                                                                old.shard_offsets(i).astype(np.uint64))
                if name in stats:
                    named.setdefault(old.format, []).append(name)
    for name, st in stats.items():
        if given is not None and name in given:
            entries[name] = (st.st_size, st.st_mtime_ns, np.asarray(given[name], dtype=np.uint64))
            named.setdefault(fmt, []).append(name)
    todo = [(n, s) for n, s in stats.items() if n not in entries]
    if todo:
        total = sum(st.st_size for _, st in todo)
        with Progress(total, f"indexing {len(todo)} shards", unit="B", enabled=None if progress else False) as bar:
            shard_fmt, scans = _scan_shards([os.path.join(directory, n) for n, _ in todo], fmt, verify, bar)
        named.setdefault(shard_fmt, []).extend(n for n, _ in todo)
        for (name, st), offsets in zip(todo, scans):
            entries[name] = (st.st_size, st.st_mtime_ns, offsets)
    if len(named) > 1:  # the shards asked for mix formats; the rest of the directory has no say in it
        said, first = mixed_formats({f: [os.path.join(directory, n) for n in sorted(names)]
                                     for f, names in named.items()})
        raise DlstoreError(f"the shards mix formats, {said}; read each format apart", path=first)
    # A manifest holds one format: the old one's other shards stay while they are of the format of those asked
    # for, else it describes the shards asked for (a directory holding both formats has the manifest of the
    # format read last; reading the other one rebuilds it).
    manifest_fmt = (next(iter(named)) if named else old.format if old is not None and others
                    else fmt if fmt != "auto" else "tfrecord")
    if old is not None and old.format == manifest_fmt:
        entries.update(others)
    order = sorted(entries)
    offsets = [entries[n][2] for n in order]
    write_manifest(dest, manifest_fmt, order,
                   [entries[n][0] for n in order], [entries[n][1] for n in order],
                   [len(o) for o in offsets], np.concatenate(offsets) if offsets else np.zeros(0, np.uint64),
                   listing)
    odd: List[str] = []
    before, now = _listed(directory, odd)  # writing the manifest beside the shards changed the directory's mtime
    # Not stamped while the directory holds names that are no file (a dangling link): its listing does not
    # stand for the directory then, so each reader lists it and says so (refuse_unreadable).
    if now == listing and not odd:
        _stamp(dest, before)
    found, manifest, why = read_manifest(directory)
    if manifest is None or found != dest:
        raise DlstoreError(f"{dest}: the manifest just written cannot be read back: {why}", path=dest)
    return manifest


def _listing(manifest: Manifest) -> List[str]:
    """The directory's record files when the manifest's listing was taken (version 1: its shards)."""
    blob = bytes(manifest.listing_blob if manifest.listing_blob is not None else manifest.names_blob)
    return blob.decode().split("\n") if blob else []


def _matching(listing: List[str], pattern: Optional[str]) -> List[str]:
    """The names of a sorted listing of record files that match the glob ``pattern``: a range found by
    bisection for a pattern that is a prefix and one ``*``, else :func:`record_file_names`."""
    if pattern is None:
        return listing
    prefix = pattern[:-1]
    if pattern.endswith("*") and not any(ch in prefix for ch in "*?[") and prefix:
        start = bisect.bisect_left(listing, prefix)
        stop = bisect.bisect_left(listing, prefix[:-1] + chr(ord(prefix[-1]) + 1), lo=start)
        return listing[start:stop]
    return record_file_names(listing, pattern)


def _entries(manifest: Manifest, names: List[str], same: bool = False) -> np.ndarray:
    """The entry of each of ``names`` in the manifest; -1 where it has none. ``same``: the names come
    from the manifest's own listing, sorted."""
    n = len(manifest.counts)
    if same and len(names) == n and manifest.listing_blob is None:
        return np.arange(n, dtype=np.int64)  # every name: the names are its entries, in order
    if not n:
        return np.full(len(names), -1, dtype=np.int64)
    known = np.array(manifest.names)
    asked = np.array(names) if names else np.zeros(0, dtype=known.dtype)
    at = np.minimum(np.searchsorted(known, asked), n - 1)
    return np.where(known[at] == asked, at, -1).astype(np.int64)


def _current(manifest: Manifest, directory: str) -> bool:
    """Whether the directory is unchanged since the manifest's listing was taken."""
    return manifest.stamp != 0 and deadline.stat(directory).st_mtime_ns == manifest.stamp


class _Group(NamedTuple):
    """The shards of one directory: their names, the manifest describing them and the entry of each."""

    directory: str
    names: List[str]
    manifest_path: str
    manifest: Manifest
    entries: np.ndarray


def _directory_group(directory: str, pattern: Optional[str], names: Optional[List[str]], fmt: str, progress: bool,
                     verify: bool, check_all: bool = False) -> Tuple[_Group, List[str]]:
    """The shards of ``directory`` matching ``pattern`` (or exactly ``names``) with an up-to-date manifest
    covering them, and notes on what was built.

    While the directory is unchanged since the manifest's listing (its stamp), that listing is the
    directory's. Else the directory is listed: the same listing restamps the manifest; another one
    (shards added or removed) brings it up to date under a lock, as do shards it lacks. ``check_all``:
    also a ``stat`` of every shard, rebuilding the entries of those that changed."""
    found, manifest, why = read_manifest(directory)
    usable = manifest is not None and (fmt == "auto" or manifest.format == fmt)
    same = False
    listing: Optional[List[str]] = None
    before = 0
    if usable and _current(manifest, directory):
        if names is None:
            names, same = _matching(_listing(manifest), pattern), True
    else:
        odd: List[str] = []
        before, listing = _listed(directory, odd)
        if names is None:  # the directory, or a glob in it: the shards it names are all there, files
            refuse_unreadable([os.path.join(directory, n) for n in record_file_names(odd, pattern)])
            names = record_file_names(listing, pattern)
    if usable:
        entries = _entries(manifest, names, same)
        fresh = listing is None or (manifest.version == 2 and listing == _listing(manifest))
        if fresh and (entries >= 0).all() and not (check_all and _changed(manifest, directory, names, entries)):
            if listing is not None and not odd:  # listed, and the listing is the manifest's: stamp it
                with _locked(found):
                    again = read_manifest(directory)[1]
                    if again is not None and again.version == 2 and _listing(again) == listing:
                        _stamp(found, before)
            return _Group(directory, names, found, manifest, entries), []
    dest = manifest_path_for(directory)
    try:
        with _locked(dest):
            # Another process may have brought it up to date while this one waited for the lock.
            found, manifest, why = read_manifest(directory)
            usable = manifest is not None and (fmt == "auto" or manifest.format == fmt)
            if usable:
                entries = _entries(manifest, names)
                changed = _changed(manifest, directory, names, entries) if check_all else []
                now = list_record_files(directory)
                if not changed and (entries >= 0).all() and manifest.version == 2 and _listing(manifest) == now:
                    return _Group(directory, names, found, manifest, entries), []
                present = set(now)
                problems = ([f"shard {n} is not in it (added)" for n, e in zip(names, entries.tolist()) if e < 0]
                            + [f"shard {n} was rewritten (size or mtime changed)" for n in changed]
                            + [f"shard {n} was removed" for n in manifest.names if n not in present])
                if not problems:
                    problems = ["the directory holds other record files" if manifest.version == 2
                                else "it is a version 1 manifest, without the directory's listing"]
                shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
                notes = [f"{found} no longer matches its shards: {shown}; rebuilt it"]
                if any(p.startswith("shard") and not p.endswith("(added)") for p in problems):
                    warnings.warn(notes[0], stacklevel=5)  # shards new to it, or other files, are no news
            else:
                refused = f" (the one found was refused: {why})" if why else ""
                notes = [f"indexed {len(names)} shards of {directory} into {dest}{refused}"]
            built = _build(directory, dest, manifest if usable else None, names, fmt, progress, verify)
    except PermissionError as e:
        raise DlstoreError(f"{directory}: no manifest can be written ({e}); set DLSTORE_CACHE to a writable "
                           f"directory", path=directory) from e
    entries = _entries(built, names)
    if (entries < 0).any() or (check_all and _changed(built, directory, names, entries)):
        raise DlstoreError(f"{directory}: the shards changed while they were indexed; try again", path=directory)
    return _Group(directory, names, dest, built, entries), notes


def _changed(manifest: Manifest, directory: str, names: Sequence[str], entries: np.ndarray) -> List[str]:
    """Those of ``names`` whose size or mtime differ from their entry (a ``stat`` each)."""
    out = []
    for name, e in zip(names, entries.tolist()):
        if e < 0:
            continue
        st = deadline.stat(os.path.join(directory, name))
        if (st.st_size, st.st_mtime_ns) != (int(manifest.sizes[e]), int(manifest.mtimes[e])):
            out.append(name)
    return out


def record_manifest(directory: str, fmt: str, offsets: Dict[str, np.ndarray]) -> str:
    """Adds shards whose frame offsets are known (copies of indexed shards) to the manifest of
    ``directory`` without reading them; returns the manifest's path."""
    dest = manifest_path_for(directory)
    with _locked(dest):
        _, old, _ = read_manifest(directory)
        _build(directory, dest, old if old is not None and old.format == fmt else None, sorted(offsets), fmt,
               False, False, given=offsets)
    return dest


class ShardChanged(DlstoreError):
    """Shards differ from what their manifest says (rewritten since it was built)."""


class DatasetIndex:
    """Where every record of a dataset's shards lies, from one manifest per directory.

    Build with :func:`open_shards` (paths as a user gives them) or :func:`index_dataset` (files).

    Attributes
    ----------
    paths : list of str
        The shards, in order.
    format : str
    counts, sizes : numpy.ndarray
        Per shard: records, bytes.
    manifests : list of str
        The manifest files read (one per directory).
    notes : list of str
        Manifests built or rebuilt, and why.
    """

    def __init__(self, groups: Sequence[_Group], notes: Sequence[str], fmt: str, progress: bool = False,
                 verify: bool = True, where: Optional[Tuple[np.ndarray, np.ndarray]] = None):
        self._options = (fmt, progress, verify)
        self._groups = list(groups)
        self.notes = list(notes)
        if where is None:  # the groups' shards one group after the other
            sizes = [len(g.names) for g in self._groups]
            where = (np.repeat(np.arange(len(sizes), dtype=np.int64), sizes),
                     np.concatenate([np.arange(n, dtype=np.int64) for n in sizes]) if sizes
                     else np.zeros(0, dtype=np.int64))
        self._group, self._pos = where  # per shard: its group, and its place among the group's names
        self._load()

    def __getstate__(self) -> Dict[str, object]:
        # A manifest may be a mapping of its file (memoryviews, arrays over it): a pickled index (a
        # Dataset sent to DataLoader workers started with spawn or forkserver) names its manifests and
        # maps them again where it is unpickled.
        state = dict(self.__dict__)
        state["_groups"] = [g._replace(manifest=None) for g in self._groups]
        state.pop("_takes", None)
        return state

    def __setstate__(self, state: Dict[str, object]) -> None:
        groups = []
        for g in state["_groups"]:
            found, manifest, why = read_manifest(g.directory)
            if manifest is None:
                raise DlstoreError(f"{g.manifest_path}: cannot read the manifest again in this process"
                                   f"{': ' + why if why else ''}", path=g.manifest_path)
            groups.append(g._replace(manifest_path=found, manifest=manifest))
        self.__dict__.update(state, _groups=groups)
        self._takes = self._offset_takes()

    def _offset_takes(self) -> List[Optional[Callable[[np.ndarray], np.ndarray]]]:
        # A large manifest's offsets are read entry by entry rather than through its mapping.
        return [functools.partial(_gather_offsets, g.manifest_path, g.manifest)
                if g.manifest.offsets_at + g.manifest.offsets.nbytes > _MAP_MANIFESTS_OVER else None
                for g in self._groups]

    def _load(self) -> None:
        formats = {g.manifest.format for g in self._groups}
        if len(formats) > 1:
            shards: Dict[str, List[str]] = {}
            for g in self._groups:
                shards.setdefault(g.manifest.format, []).extend(os.path.join(g.directory, n) for n in g.names)
            said, first = mixed_formats(shards)
            raise DlstoreError(f"the shards mix formats, {said}; read each format apart", path=first)
        fmt = self._options[0]
        self.format = formats.pop() if formats else (fmt if fmt != "auto" else "tfrecord")
        self.manifests = [g.manifest_path for g in self._groups]
        self._entry = np.zeros(len(self._group), dtype=np.int64)
        for g, group in enumerate(self._groups):
            mine = self._group == g
            self._entry[mine] = group.entries[self._pos[mine]]
        self.counts = np.zeros(len(self._entry), dtype=np.int64)
        self.sizes = np.zeros(len(self._entry), dtype=np.int64)
        for g, group in enumerate(self._groups):
            mine = self._group == g
            self.counts[mine] = group.manifest.counts[self._entry[mine]]
            self.sizes[mine] = group.manifest.sizes[self._entry[mine]]
        self._checked = np.zeros(len(self._entry), dtype=bool)
        self._takes = self._offset_takes()

    @property
    def paths(self) -> List[str]:
        if len(self._groups) == 1:
            prefix = self._groups[0].directory.rstrip(os.sep) + os.sep
            names = self._groups[0].names
            if len(self._pos) == len(names):  # each name once, in order
                return [prefix + n for n in names]
            return [prefix + names[i] for i in self._pos.tolist()]
        return [os.path.join(self._groups[g].directory, self._groups[g].names[i])
                for g, i in zip(self._group.tolist(), self._pos.tolist())]

    def manifest_for(self, path: str) -> Optional[Tuple[str, str]]:
        """``(manifest, directory)`` that gave the frame offsets of the shard at ``path``; None when no
        manifest describes its directory (a copy on another mount)."""
        directory = os.path.dirname(os.path.abspath(path))
        for g in self._groups:
            if g.directory == directory:
                return g.manifest_path, g.directory
        return None

    def frames(self, shards: np.ndarray, records: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """``(offset, size)`` of record ``records[i]`` of shard ``shards[i]`` (int64 arrays)."""
        shards = np.asarray(shards, dtype=np.int64)
        records = np.asarray(records, dtype=np.int64)
        offset = np.empty(len(shards), dtype=np.int64)
        size = np.empty(len(shards), dtype=np.int64)
        group = self._group[shards]
        for g, grp in enumerate(self._groups):
            mine = np.flatnonzero(group == g) if len(self._groups) > 1 else np.arange(len(shards))
            if len(mine):
                offset[mine], size[mine] = grp.manifest.frames(self._entry[shards[mine]], records[mine],
                                                               self._takes[g])
        return offset, size

    def shard_offsets(self, shard: int) -> np.ndarray:
        """The frame offsets of shard ``shard`` (int64)."""
        return self._groups[int(self._group[shard])].manifest.shard_offsets(int(self._entry[shard]))

    def check(self, shards: np.ndarray, rebuild: bool = False) -> bool:
        """Checks the size and mtime of each of ``shards`` (the first :data:`CHECK_SHARDS_PER_PLAN` not
        checked yet, in the order given) against the manifest, a ``stat`` each.

        Returns whether the index changed: with ``rebuild``, the manifests of changed shards are brought
        up to date (with a warning naming them) and the counts reloaded.

        Raises
        ------
        ShardChanged
            Without ``rebuild``, when a shard changed, naming it.
        """
        shards = np.asarray(shards, dtype=np.int64)
        shards = shards[~self._checked[shards]]  # after an epoch or two, none: a rank's shards were checked
        _, first = np.unique(shards, return_index=True)
        todo = shards[np.sort(first)][:CHECK_SHARDS_PER_PLAN]
        changed: Dict[int, List[str]] = {}
        for s in todo.tolist():
            g = int(self._group[s])
            group = self._groups[g]
            name = group.names[int(self._pos[s])]
            e = int(self._entry[s])
            path = os.path.join(group.directory, name)
            try:
                st = deadline.stat(path)
            except FileNotFoundError:
                raise ShardChanged(f"{path}: no such file (it is in {group.manifest_path})", path=path) from None
            if (st.st_size, st.st_mtime_ns) != (int(group.manifest.sizes[e]), int(group.manifest.mtimes[e])):
                changed.setdefault(g, []).append(name)
        self._checked[todo] = True
        if not changed:
            return False
        if not rebuild:
            g, names = next(iter(changed.items()))
            group = self._groups[g]
            path = os.path.join(group.directory, names[0])
            raise ShardChanged(f"{path}: rewritten since {group.manifest_path} was built (its size or mtime "
                               f"changed; {len(names)} such shard(s) in this rank's plan): ranks would plan with "
                               f"different record counts; run `dlstore index {group.directory}` before starting",
                               path=path)
        fmt, progress, verify = self._options
        for g in changed:
            group = self._groups[g]
            built, notes = _directory_group(group.directory, None, group.names, fmt, progress, verify,
                                            check_all=True)
            self._groups[g] = built
            self.notes += notes
        self._load()
        return True

    def describe(self) -> str:
        n = len(self.manifests)
        return f"{self.manifests[0]}" if n == 1 else f"{n} manifests ({self.manifests[0]}, ...)"


def open_shards(spec: PathSpec, fmt: str = "auto", progress: bool = False, verify: bool = True) -> DatasetIndex:
    """The shards named by ``spec`` (files, globs, directories, as :func:`~dlstore.sources.reader.expand_paths`
    takes them) and their :class:`DatasetIndex`.

    A glob in one directory, or a directory, is answered from the directory's manifest while the
    directory is unchanged since the manifest's listing (one ``stat`` of the directory), else by
    listing it; manifests are built or brought up to date where shards are new to them or were
    removed. No shard is opened or ``stat``-ed here (:meth:`DatasetIndex.check` does that for a rank's own).
    """
    items = path_list(spec)
    if not items:
        expand_paths(items)  # raises, saying the list is empty
    groups: List[_Group] = []
    notes: List[str] = []
    for item in items:
        absolute = item if item.startswith(os.sep) else os.path.abspath(item)
        one = split_glob(absolute)
        if one is not None:
            directory, pattern = one
            try:
                group, more = _directory_group(directory, pattern, None, fmt, progress, verify)
            except (FileNotFoundError, NotADirectoryError):  # the glob's directory is not there
                expand_paths(item)  # raises, saying what the glob matched
                raise
            if not group.names:
                expand_paths(item)  # raises, saying what the glob matched
            groups.append(group)
            notes += more
            continue
        by_dir: Dict[str, List[str]] = {}
        for p in expand_paths(item):
            directory, _, name = (p if p.startswith(os.sep) else os.path.abspath(p)).rpartition(os.sep)
            by_dir.setdefault(directory or os.sep, []).append(name)
        for directory, names in by_dir.items():
            group, more = _directory_group(directory, None, names, fmt, progress, verify)
            groups.append(group)
            notes += more
    return DatasetIndex(groups, notes, fmt, progress, verify)


def index_dataset(paths: Sequence[str], fmt: str = "auto", progress: bool = False, verify: bool = True,
                  check_all: bool = True) -> DatasetIndex:
    """The :class:`DatasetIndex` of the files ``paths``: their directories' manifests, built or brought
    up to date where they are missing or (``check_all``: a ``stat`` of every shard) no longer match the
    shards, with a warning naming the shards."""
    by_dir: Dict[str, List[str]] = {}
    group = np.zeros(len(paths), dtype=np.int64)
    pos = np.zeros(len(paths), dtype=np.int64)
    for i, p in enumerate(paths):
        directory, _, name = (p if p.startswith(os.sep) else os.path.abspath(p)).rpartition(os.sep)
        names = by_dir.setdefault(directory or os.sep, [])
        group[i], pos[i] = list(by_dir).index(directory or os.sep), len(names)
        names.append(name)
    groups, notes = [], []
    for directory, names in by_dir.items():
        built, more = _directory_group(directory, None, names, fmt, progress, verify, check_all=check_all)
        groups.append(built)
        notes += more
    return DatasetIndex(groups, notes, fmt, progress, verify, where=(group, pos))
