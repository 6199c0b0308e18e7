"""``dlstore convert``: an ImageNet-style tree of class folders of images -> TFRecord or RecordIO shards.

The input is ``SRC/<class>/<image>`` (files in subfolders of a class folder count too): one folder
per class, as ImageNet's ``train/n01440764/*.JPEG`` or torchvision's ``ImageFolder``. Classes are
the folder names in sorted order; hidden files and folders, and files directly in ``SRC``, are
not read.

TFRecord records are ``tf.train.Example`` protos with the features of TensorFlow's ImageNet
converter (``build_imagenet_data.py``): ``image/encoded`` (the file's bytes, unchanged),
``image/class/label`` (1-based in sorted folder order; 0 is left for "background"),
``image/class/synset`` (the folder name), ``image/height``, ``image/width``,
``image/colorspace`` (``RGB``), ``image/channels`` (3), ``image/format`` (``JPEG``, or the real
format: ``PNG``, ``GIF``...) and ``image/filename`` (the file's name). Unlike that converter, a PNG
or a CMYK JPEG is stored as it is, not re-encoded: colorspace and channels say what a decoder
that converts to RGB gives (dlstore's ResNet-50 pipeline does, see :mod:`dlstore.pipeline.decode`).

RecordIO records are as MXNet's ``im2rec`` packs them: an ``IRHeader`` (flag 0, the 0-based label
as float32, the record's number as id, id2 0) then the file's bytes; each ``.rec`` gets im2rec's
``.idx`` (``id<TAB>offset``) and ``.lst`` (``id<TAB>label<TAB>path relative to SRC``) beside it.

The records are in a seeded shuffle of all files (the same seed, the same bytes, whatever the
number of workers), split into shards of consecutive runs named as ``dlstore gen`` names them
(``train-00000-of-00004``, ``.rec`` for RecordIO). Every file is decoded once by Pillow, in a
pool of threads (Pillow releases the GIL while decoding), to check it and to read its size; a
file that does not decode as an image is reported and left out, never written.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from dlstore._progress import Progress
from dlstore.formats import recordio
from dlstore.formats.index import INDEX_SUFFIX
from dlstore.formats.example import encode_example
from dlstore.errors import DlstoreError
from dlstore.io.system import available_cores
from dlstore.synthetic.shards import refuse_other_sets, shard_names
from dlstore.writers import RecordIOWriter, TFRecordWriter

__all__ = ["FORMATS", "ImageFile", "ConvertResult", "scan_tree", "check_image", "shard_names", "convert_tree"]

FORMATS = ("tfrecord", "recordio")
_JPEG_MAGIC = b"\xff\xd8\xff"
_BYTESIO_REPR = re.compile(r" <_io\.BytesIO object at 0x[0-9a-fA-F]+>")


class ImageFile(NamedTuple):
    """One file of the tree: where it is and its class."""

    path: str  # as found: os.path.join(src, relpath)
    relpath: str  # relative to the tree's root, "/"-separated ("n01440764/a.JPEG")
    label: int  # 0-based index of its class in sorted folder order
    synset: str  # the class folder's name


@dataclass
class ConvertResult:
    """What :func:`convert_tree` wrote."""

    outputs: List[str]  # the shard files, in order
    records: int  # images written
    classes: int  # class folders
    bytes: int  # image bytes written (the files' sizes)
    left_out: List[Tuple[str, str]] = field(default_factory=list)  # (path, why) of each file not written
    companions: List[str] = field(default_factory=list)  # RecordIO: the .idx and .lst files
    shards_asked: int = 0  # shards asked for: more than ``outputs`` where files left out emptied some


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("dlstore convert decodes every image with Pillow, which is not installed: "
                          "pip install 'dlstore[convert]' (or pip install pillow)") from None
    return Image


def scan_tree(src) -> Tuple[List[str], List[ImageFile]]:
    """The classes (sorted folder names) and files (sorted within each class) of an image tree.

    Raises
    ------
    FileNotFoundError
        ``src`` does not exist.
    ValueError
        ``src`` is not a directory, or holds no class folder with a file in it.
    """
    src = os.fspath(src)
    if not os.path.exists(src):
        raise FileNotFoundError(2, "no such directory", src)
    if not os.path.isdir(src):
        raise ValueError(f"{src}: not a directory (give the folder holding one folder per class)")
    classes = sorted(e.name for e in os.scandir(src) if e.is_dir() and not e.name.startswith("."))
    files: List[ImageFile] = []
    for label, name in enumerate(classes):
        top = os.path.join(src, name)
        for root, dirs, names in os.walk(top):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for n in sorted(names):
                if n.startswith("."):
                    continue
                path = os.path.join(root, n)
                rel = os.path.relpath(path, src).replace(os.sep, "/")
                files.append(ImageFile(path, rel, label, name))
    if not files:
        what = "no class folders" if not classes else f"{len(classes)} class folders but no files in them"
        raise ValueError(f"{src}: {what} (expected SRC/<class>/<image files>)")
    return classes, files


class _Checked(NamedTuple):
    data: Optional[bytes]  # None: left out
    height: int
    width: int
    format: str  # "JPEG", "PNG"...; or why the file was left out


def check_image(data: bytes) -> Tuple[int, int, str]:
    """Decodes ``data`` with Pillow: ``(height, width, format)``, format ``JPEG`` for every JPEG
    (Pillow's ``MPO``, a camera's multi-picture JPEG, included).

    Raises
    ------
    Exception
        Whatever Pillow raises for data that is not a whole, decodable image.
    """
    Image = _pillow()
    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
        kind = "JPEG" if data[:3] == _JPEG_MAGIC else str(image.format)
        if kind == "JPEG":
            # Every byte is still entropy-decoded (a truncated file fails), but the IDCT runs at 1/8.
            image.draft(image.mode, (max(width // 8, 1), max(height // 8, 1)))
        image.load()
    return height, width, kind


def _read_and_check(f: ImageFile) -> _Checked:
    try:
        with open(f.path, "rb") as fh:
            data = fh.read()
    except OSError as e:
        return _Checked(None, 0, 0, f"cannot read: {e.strerror}")
    try:
        height, width, kind = check_image(data)
    except ImportError:
        raise
    except Exception as e:  # noqa: BLE001 - Pillow raises many kinds for bad data; each is reported
        said = _BYTESIO_REPR.sub("", str(e)) or type(e).__name__
        return _Checked(None, 0, 0, f"not a decodable image ({said})")
    return _Checked(data, height, width, kind)


def _checked_in_order(files: Sequence[ImageFile], workers: int) -> Iterator[_Checked]:
    """:func:`_read_and_check` of each file, in order, ``workers`` at a time, a bounded window ahead."""
    if workers <= 1:
        for f in files:
            yield _read_and_check(f)
        return
    window = 4 * workers  # enough to keep the pool busy; bounds the images held in memory
    with ThreadPoolExecutor(workers, thread_name_prefix="dlstore-convert") as pool:
        pending: deque = deque()
        it = iter(files)
        for f in it:
            pending.append(pool.submit(_read_and_check, f))
            if len(pending) >= window:
                break
        while pending:
            done = pending.popleft().result()
            nxt = next(it, None)
            if nxt is not None:
                pending.append(pool.submit(_read_and_check, nxt))
            yield done


def _tfrecord_example(f: ImageFile, c: _Checked) -> bytes:

    return encode_example({
        "image/height": [c.height],
        "image/width": [c.width],
        "image/colorspace": b"RGB",
        "image/channels": [3],
        "image/class/label": [f.label + 1],
        "image/class/synset": os.fsencode(f.synset),  # a name's own bytes, UTF-8 or not
        "image/format": c.format.encode(),
        "image/filename": os.fsencode(os.path.basename(f.path)),
        "image/encoded": c.data,
    })


def convert_tree(src, out, *, format: str = "tfrecord", shards: int = 1, seed: int = 0,
                 workers: Optional[int] = None, prefix: str = "train", progress: Optional[bool] = None,
                 on_left_out: Optional[Callable[[str, str], None]] = None) -> ConvertResult:
    """Writes the images of a class-folder tree as TFRecord or RecordIO shards.

    Parameters
    ----------
    src : str or path-like
        The tree: one folder per class (see the module's docstring).
    out : str or path-like
        Created if missing; existing shards of the same names are overwritten, other record files refused.
        Not inside ``src``.
    format : {"tfrecord", "recordio"}
    shards : int
        Files to write. The shuffled file list is cut into ``shards`` runs of equal length (to
        one); files left out make their shard that much shorter, and a shard they would leave empty is
        not written (the others are named for their count).
    seed : int
        The record order is a shuffle of all files drawn from this seed alone.
    workers : int, optional
        Threads reading and decoding images; default: the cores this process may use.
    prefix : str
        Shard names start with it (``train``, ``validation``).
    progress : bool, optional
        ``None``: a progress bar on a terminal, a plain line now and then in a pipe; ``False``: none.
    on_left_out : callable, optional
        Called with ``(path, why)`` for each file left out, as it is met.

    Returns
    -------
    ConvertResult

    Raises
    ------
    FileNotFoundError, ValueError
        ``src`` is missing or holds no image files; an argument is out of range.
    DlstoreError
        ``out`` holds another set's record files (this one would read as one dataset with them), or
        none of the files is a decodable image.
    ImportError
        Pillow is not installed.

    On any error while writing, the shards this run wrote are removed: half a set is no set.
    """

    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
    if int(shards) < 1:
        raise ValueError(f"shards must be at least 1, got {shards}")
    if int(seed) < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    if not prefix or "/" in prefix or prefix.startswith("."):
        raise ValueError(f"prefix must be a plain file name start, got {prefix!r}")
    _pillow()  # fail before creating anything
    classes, files = scan_tree(src)
    if int(shards) > len(files):
        raise ValueError(f"{int(shards)} shards of {len(files)} image files would leave {int(shards) - len(files)} of "
                         f"them empty: give {len(files)} shards or fewer")
    src, out = os.path.abspath(os.fspath(src)), os.path.abspath(os.fspath(out))
    if out == src or out.startswith(src + os.sep):
        raise ValueError(f"{out}: the output must not be inside the image tree {src} (it would become a class)")
    shards = int(shards)
    if workers is None:

        workers = available_cores()
    workers = max(1, int(workers))
    order = np.random.default_rng(int(seed)).permutation(len(files))
    ordered = [files[i] for i in order]
    # Shard k takes files [bounds[k], bounds[k + 1]) of the shuffled list, as np.array_split cuts.
    bounds = [len(files) * k // shards for k in range(shards + 1)]
    names = shard_names(prefix, shards)
    refuse_other_sets(out, names)
    os.makedirs(out, exist_ok=True)
    result = ConvertResult([], 0, len(classes), 0, shards_asked=shards)
    written = [0] * shards  # images in each shard
    bar = Progress(len(files), f"convert {format}", unit="img", enabled=False if progress is False else None,
                   piped="lines")
    checked = _checked_in_order(ordered, workers)
    try:
        for k, name in enumerate(names):
            base = os.path.join(out, name)
            if format == "tfrecord":
                with contextlib.suppress(FileNotFoundError):  # an index of an earlier run's shard: stale now
                    os.unlink(base + INDEX_SUFFIX)
                writer = TFRecordWriter(base)
                lst = None
            else:
                writer = RecordIOWriter(base + ".rec", idx_path=base + ".idx")
                # im2rec's list: a file name that is not UTF-8 keeps its own bytes
                lst = open(base + ".lst", "w", encoding="utf-8", errors="surrogateescape")
                result.companions += [base + ".idx", base + ".lst"]
            result.outputs.append(writer.path)
            try:
                for f in ordered[bounds[k]:bounds[k + 1]]:
                    c = next(checked)
                    if c.data is None:
                        bar.total -= 1  # the bar counts the images written, out of those that will be
                        result.left_out.append((f.path, c.format))
                        if on_left_out is not None:
                            on_left_out(f.path, c.format)
                        continue
                    if format == "tfrecord":
                        writer.write(_tfrecord_example(f, c))
                    else:
                        # im2rec: the record's number is its id and its .idx key; .lst labels as "%f".
                        record_id = result.records
                        writer.write(recordio.pack(0, float(f.label), record_id, 0, c.data), key=record_id)
                        lst.write(f"{record_id}\t{float(f.label):f}\t{f.relpath}\n")
                    result.records += 1
                    written[k] += 1
                    result.bytes += len(c.data)
                    bar.update()
            finally:
                writer.close()
                if lst is not None:
                    lst.close()
        if result.records == 0:
            raise DlstoreError(f"{src}: none of its {len(files)} image files is a decodable image: nothing to write")
        if 0 in written:
            _drop_empty_shards(result, written, out, prefix, format)
    except BaseException:
        # Half a set would read as a whole one (verify calls it OK): what this run wrote goes
        for path in result.outputs + result.companions:
            try:
                os.unlink(path)
            except OSError:
                pass
        raise
    finally:
        checked.close()
        bar.close()
    return result


def _drop_empty_shards(result: ConvertResult, written: List[int], out: str, prefix: str, format: str) -> None:
    # Files left out emptied whole shards: the set is the shards that hold images, named anew for their
    # count (those names are free: refuse_other_sets let no other set's files stay in ``out``).
    suffixes = ("",) if format == "tfrecord" else (".rec", ".idx", ".lst")
    old = shard_names(prefix, len(written))
    kept = [k for k, n in enumerate(written) if n]
    new = shard_names(prefix, len(kept))
    for k, n in enumerate(written):
        if not n:
            for suffix in suffixes:
                os.unlink(os.path.join(out, old[k] + suffix))
    for name, k in zip(new, kept):
        if format == "tfrecord":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(out, name + INDEX_SUFFIX))
        for suffix in suffixes:
            os.replace(os.path.join(out, old[k] + suffix), os.path.join(out, name + suffix))
    result.outputs = [os.path.join(out, name + suffixes[0]) for name in new]
    result.companions = [os.path.join(out, name + suffix) for name in new for suffix in suffixes[1:]]
