"""``dlstore expand``: K copies of every shard, as the Dell EMC Isilon reference architecture made 150,
to make a dataset larger than every cache (the host's page cache and the storage system's own).

Copy ``k`` of ``shard-00001.tfrecord`` is ``shard-00001.copy003.tfrecord`` (the number has at least
three digits); a valid index beside a shard is copied beside each of its copies, so readers do not
rebuild K identical indexes.

Modes, and what each does to caches:

- ``copy`` (the default): new inodes and new blocks. Each copy has its own page-cache pages and its
  own blocks on the storage, so reading copies defeats both the host's and the storage's caches.
- ``reflink``: new inodes sharing blocks (``ioctl(FICLONE)``; xfs with reflink, btrfs). The page
  cache is per inode, so host caching is defeated, but a storage-side block cache or deduplication
  may serve the shared blocks.
- ``hardlink``: new names for the same inode. All copies share one set of page-cache pages, so
  they do **not** defeat caches: reading copy 2 after copy 1 comes from RAM. Useful only to test
  naming, planning or listing at no space cost.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple, Union

from dlstore._progress import Progress
from dlstore.errors import DlstoreError, DlstoreIOError
from dlstore.formats.detect import detect
from dlstore.io.system import format_bytes
from dlstore.sources import indexing
from dlstore.sources.indexing import index_dataset, index_path_for, record_manifest
from dlstore.sources.reader import distinct_files, expand_paths, same_name
from dlstore.synthetic.shards import refuse_other_sets

__all__ = ["EXPAND_MODES", "ExpandResult", "copy_name", "format_of", "valid_index", "copy_file", "expand_shards"]

EXPAND_MODES = ("copy", "reflink", "hardlink")
# Compression suffixes stay with the record suffix: x.tfrecord.gz -> x.copy000.tfrecord.gz.
_COMPRESSION_SUFFIXES = (".gz", ".gzip", ".zlib", ".zz")
_FICLONE = 0x40049409  # _IOW(0x94, 9, int), linux/fs.h
_COPY_CHUNK = 8 << 20  # large enough that the syscalls cost nothing next to the bytes
_TMP_SUFFIX = ".tmp-expand"  # names with ".tmp" are never taken for shards (dlstore.sources.reader)


@dataclass
class ExpandResult:
    """What :func:`expand_shards` did.

    Attributes
    ----------
    outputs : list of str
        Every copy, in (source, copy number) order, including those that already existed.
    written_bytes : int
        Bytes of shard data written (0 for hardlinks; for reflinks the size of the clones).
    skipped : int
        Copies that already existed with the source's size and were left alone.
    indexes : int
        Index files placed beside copies.
    manifest : str or None
        The manifest of ``out_dir`` the copies were added to (from the sources' offsets, without
        reading the copies); None for compressed shards, which have none.
    notes : list of str
        Sources whose index could not be copied, and why.
    seconds : float
        Wall time.
    """

    outputs: List[str] = field(default_factory=list)
    written_bytes: int = 0
    skipped: int = 0
    indexes: int = 0
    manifest: Optional[str] = None
    notes: List[str] = field(default_factory=list)
    seconds: float = 0.0


def copy_name(name: str, copy: int, copies: int) -> str:
    """The name of copy ``copy`` (0-based) of ``name`` among ``copies`` copies.

    The tag ``.copyNNN`` goes before the record suffix (a compression suffix stays with it); a name
    without a suffix gets the tag at its end. The number has at least three digits, more when
    ``copies`` needs them, so that copies sort in order.

    Examples
    --------
    >>> copy_name("shard-00001.tfrecord", 3, 150)
    'shard-00001.copy003.tfrecord'
    >>> copy_name("train-00000-of-01024", 0, 1500)
    'train-00000-of-01024.copy0000'
    >>> copy_name("part.tfrecord.gz", 7, 10)
    'part.copy007.tfrecord.gz'
    """
    if copies < 1 or not 0 <= copy < copies:
        raise ValueError(f"copy {copy} of {copies}: need 0 <= copy < copies")
    tag = f".copy{copy:0{max(3, len(str(copies - 1)))}d}"
    base, ext = os.path.splitext(name)
    if ext.lower() in _COMPRESSION_SUFFIXES:
        inner_base, inner_ext = os.path.splitext(base)
        if inner_ext:
            base, ext = inner_base, inner_ext + ext
    if not ext:  # no suffix, or a name like ".hidden"
        return name + tag
    return base + tag + ext


def copy_file(src: str, dst: str, progress=None, chunk: int = _COPY_CHUNK) -> int:
    """Copies the bytes of ``src`` to ``dst`` with plain reads and writes; returns the size.

    ``copy_file_range`` and ``sendfile`` are avoided on purpose: on xfs and btrfs the kernel may
    turn ``copy_file_range`` into a reflink, and a copy meant to defeat storage caches must own
    its blocks. ``progress`` (a :class:`dlstore._progress.Progress`) is advanced per chunk.
    """
    buf = bytearray(chunk)
    view = memoryview(buf)
    done = 0
    with open(src, "rb", buffering=0) as fin, open(dst, "wb", buffering=0) as fout:
        while True:
            n = fin.readinto(view)
            if not n:
                break
            written = 0
            while written < n:  # a short write is continued, never dropped
                written += fout.write(view[written:n])
            done += n
            if progress is not None:
                progress.update(n)
    return done


def _reflink(src: str, tmp: str, dst: str) -> None:
    with open(src, "rb") as fin, open(tmp, "wb") as fout:
        try:
            fcntl.ioctl(fout.fileno(), _FICLONE, fin.fileno())
        except OSError as e:
            raise DlstoreIOError(f"{dst}: cannot reflink {src}: {e.strerror} (errno {e.errno}); reflinks need a "
                                 f"filesystem that has them (xfs with reflink=1, btrfs) holding both files: "
                                 f"use --mode copy", path=dst) from e


def format_of(path: str) -> str:
    """``"tfrecord"`` or ``"recordio"``, from the file's name and first bytes (TFRecord when unsure)."""

    with open(path, "rb") as f:
        head = f.read(16)
    try:
        return detect(os.path.basename(path), head)[0]
    except ValueError:
        return "tfrecord"


def valid_index(path: str, fmt: Optional[str] = None, build: bool = False) -> Tuple[Optional[str], Optional[str]]:
    """``(index, note)``: an index of ``path`` that matches it (beside it or in dlstore's cache
    directory), or ``None`` and why not.

    With ``build``, a missing or stale index is built (:func:`dlstore.sources.indexing.ensure_index`).
    Without it, a stale or damaged index is not returned: copying it would give it a newer time
    than the copy of the data, and its staleness could no longer be seen.
    """

    fmt = fmt or format_of(path)
    if build:
        return indexing.ensure_index(path, fmt)[0], None
    found, offsets, why = indexing.find_index(path, fmt)
    if offsets is not None:
        return found, None
    return None, (None if why is None else f"{found}: not copied ({why}); pass index=True (--index) to rebuild it")


def expand_shards(paths: Union[str, Sequence[str]], out_dir: str, copies: int, *, mode: str = "copy",
                  index: bool = False, overwrite: bool = False, progress: Optional[bool] = None) -> ExpandResult:
    """Writes ``copies`` copies of every shard named by ``paths`` into ``out_dir``.

    Parameters
    ----------
    paths : str or list of str
        Files, globs or directories (as :func:`dlstore.sources.reader.expand_paths` reads them: indexes and
        metadata a glob matches or a directory holds are not shards).
    out_dir : str
        Created if missing; must not be a directory that holds a source shard (copies would then
        be taken for sources the next time).
    copies : int
        K >= 1. Copy 0 is a copy too: the sources are not part of the output.
    mode : {"copy", "reflink", "hardlink"}
        See the module's docstring: only ``copy`` defeats every cache; ``hardlink`` defeats none.
    index : bool
        Build a missing or stale source index (beside the source, or in dlstore's cache directory)
        so that every copy gets one. Without it, a valid existing index is copied and a stale one
        is left out (and reported in ``notes``).
    overwrite : bool
        Rewrite copies that already exist. Without it a copy that exists with the source's size is
        kept, so an interrupted run resumes where it stopped.
    progress : bool, optional
        Draw a progress bar (by default only on a terminal).

    Raises
    ------
    ValueError
        On a bad argument, two sources with the same file name, or ``out_dir`` holding a source.
    DlstoreError
        When there is not enough free space for the copies, or a file cannot be read or written.
    """

    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies must be a whole number >= 1, not {copies!r}")
    if mode not in EXPAND_MODES:
        raise ValueError(f"mode must be one of {EXPAND_MODES}, not {mode!r}")
    sources = distinct_files(expand_paths(paths))  # a file named twice is copied once
    clash = same_name(sources)
    if clash:
        raise ValueError(f"{clash[0]} and {clash[1]} have the same file name: their copies would collide in {out_dir}")
    out_real = os.path.realpath(out_dir)
    for s in sources:
        home = os.path.realpath(os.path.dirname(os.path.abspath(s)))
        if out_real == home:
            raise ValueError(f"{out_dir} holds the source {s}: write the copies to another directory")
        if out_real.startswith(home + os.sep):  # a directory of shards is listed with its subdirectories
            raise ValueError(f"{out_dir} is inside {home}, which holds the source {s}: the copies would read as "
                             f"part of that set; write them outside it")
    plan = [(s, os.path.join(out_dir, copy_name(os.path.basename(s), k, copies)))
            for s in sources for k in range(copies)]
    # Another set's shards already there would read as one dataset with the copies (resuming this run is fine).
    refuse_other_sets(out_dir, [os.path.basename(d) for _, d in plan])
    os.makedirs(out_dir, exist_ok=True)

    result = ExpandResult()
    start = time.monotonic()
    sizes = {s: os.path.getsize(s) for s in sources}
    todo = [(s, d) for s, d in plan if overwrite or not _already_there(s, d, mode, sizes[s])]
    if mode == "copy":
        need = sum(sizes[s] for s, _ in todo)
        free = shutil.disk_usage(out_dir).free
        if need > free:
            raise DlstoreError(f"{out_dir}: {copies} copies need {format_bytes(need)} more but the filesystem has "
                               f"{format_bytes(free)} free", path=out_dir)
    indexes = {}
    for s in sources:
        fmt = format_of(s)
        idx, note = valid_index(s, fmt, build=index)
        indexes[s] = (idx, fmt) if idx else None
        if note:
            result.notes.append(note)

    try:  # the sources' record offsets, for the copies' manifest (one pass over the sources if unindexed)

        source_index = index_dataset(sources)
    except DlstoreError as e:
        source_index = None
        result.notes.append(f"no manifest for the copies: {e}")
    todo_set = set(d for _, d in todo)
    total = sum(sizes[s] for s, _ in todo)
    with Progress(total, f"expand x{copies}", unit="B", enabled=progress) as bar:
        for s, d in plan:
            if d in todo_set:
                _make_copy(s, d, mode, bar)
                result.written_bytes += sizes[s] if mode != "hardlink" else 0
            else:
                result.skipped += 1
            result.outputs.append(d)
            if indexes[s] is not None:
                _place_index(indexes[s][0], indexes[s][1], d, mode)
                result.indexes += 1
    if source_index is not None:

        where = {s: i for i, s in enumerate(sources)}
        result.manifest = record_manifest(out_dir, source_index.format, {
            os.path.basename(d): source_index.shard_offsets(where[s]) for s, d in plan})
    result.seconds = time.monotonic() - start
    return result


def _already_there(src: str, dst: str, mode: str, size: int) -> bool:
    try:
        st = os.stat(dst)
    except FileNotFoundError:
        return False
    if mode == "hardlink":
        return os.path.samefile(src, dst)
    return st.st_size == size


def _make_copy(src: str, dst: str, mode: str, bar) -> None:
    """One copy, written under a temporary name and renamed, so a half-written copy never looks done."""
    tmp = dst + _TMP_SUFFIX
    try:
        if mode == "copy":
            copy_file(src, tmp, bar)
        elif mode == "reflink":
            _reflink(src, tmp, dst)
            bar.update(os.path.getsize(src))
        else:
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.link(src, tmp)
            bar.update(os.path.getsize(src))
        os.replace(tmp, dst)
    except OSError as e:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        if isinstance(e, DlstoreIOError):
            raise
        raise DlstoreIOError(f"{dst}: cannot {mode} {src}: {e.strerror} (errno {e.errno})", path=dst) from e


def _place_index(src_index: str, fmt: str, dst: str, mode: str) -> None:
    """The index beside the copy ``dst``, where dlstore looks for it (``x.idx`` for a RecordIO
    ``x.rec``, else ``dst + .idx``); written after the data, so it is never older than it. A hardlinked
    copy gets a hardlinked index: both keep the source's times, in the same order."""

    dest = index_path_for(dst, fmt, writable=True)
    tmp = dest + _TMP_SUFFIX
    if os.path.lexists(tmp):
        os.unlink(tmp)
    try:
        if mode != "hardlink":
            raise OSError("copied, not linked")
        os.link(src_index, tmp)
    except OSError:  # also an index in the cache directory, on another filesystem than the copy
        shutil.copyfile(src_index, tmp)
    os.replace(tmp, dest)
