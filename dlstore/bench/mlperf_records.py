"""DLIO's TFRecord layout: where its files are, how they are made, and the pipeline that parses them.

- **Files**: ``<folder>/train/img_<i>_of_<n>.tfrecord`` (``i`` zero-padded to the digits of ``n``),
  the names DLIO's generator writes and the order its reader lists them in (sorted).
- **Records**: ``tf.train.Example`` s with ``image`` (raw uint8 bytes, ``dim1 x dim2`` per file) and
  ``size`` (int64), see :mod:`dlstore.bench.mlperf_workloads`. :func:`generate` writes such a set
  with dlstore's TFRecord writer (DLIO writes the same layout with TensorFlow; the pixel values
  differ, being random in both).
- **Parsing**: :class:`DlioExample` is the loader pipeline that does what DLIO's TensorFlow reader
  does with a batch (``tf.io.parse_example`` of ``image`` as a string and ``size`` as an int64): one
  C++ parse per run of records, delivering each record's ``size`` and its ``image`` length; the
  image bytes are not copied, as DLIO's reader returns a fixed tensor in their place.
"""
from __future__ import annotations

import glob
import math
import os
import re
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from dlstore.bench.mlperf_workloads import MlperfWorkload
from dlstore.formats.example import encode_example
from dlstore.io.system import available_page_cache_bytes
from dlstore.pipeline.stages import Field, Pipeline, PipelineRun
from dlstore.writers import TFRecordWriter

__all__ = ["FILE_PREFIX", "train_files", "file_name", "promised_files", "layout_files", "record_bytes", "generate",
           "files_to_outgrow_cache", "DlioExample"]

#: DLIO's ``dataset.file_prefix`` default.
FILE_PREFIX = "img"
#: Bytes a record's ``tf.train.Example`` adds around its image (field tags, lengths, the ``size`` entry),
#: and TFRecord's framing (length, two CRCs): a record of DLIO's layout is about image + this.
_OVERHEAD_BYTES = 43 + 16


#: DLIO's file names: ``img_<i>_of_<n>.tfrecord``, ``i`` zero-padded to the digits of ``n``.
_NAME = re.compile(rf"^{FILE_PREFIX}_(\d+)_of_(\d+)\.tfrecord$")


def file_name(index: int, files: int) -> str:
    """DLIO's name of training file ``index`` of ``files``."""
    return f"{FILE_PREFIX}_{str(index).rjust(len(str(files)), '0')}_of_{files}.tfrecord"


def train_files(folder: str) -> List[str]:
    """The training files of a DLIO data folder, sorted as DLIO's reader lists them (empty when none)."""
    return sorted(glob.glob(os.path.join(folder, "train", "*.tfrecord")))


def promised_files(paths: Sequence[str]) -> int:
    """The file count DLIO's names ``img_<i>_of_<n>.tfrecord`` promise: their ``n``.

    Raises
    ------
    ValueError
        When a name is not DLIO's, or names promise different counts (naming the file).
    """
    promised: Optional[int] = None
    for path in paths:
        match = _NAME.match(os.path.basename(path))
        n = int(match.group(2)) if match else 0
        if not match or n < 1 or os.path.basename(path) != file_name(int(match.group(1)), n):
            raise ValueError(f"{path}: not a name of DLIO's layout ({file_name(0, max(n, len(paths)))}, ...)")
        if promised is not None and n != promised:
            raise ValueError(f"{path}: one of {n} files, where {os.path.basename(paths[0])} is one of {promised}: "
                             "two data sets in one folder")
        promised = n
    if promised is None:
        raise ValueError("no file names to read a count from")
    return promised


def layout_files(folder: str) -> List[str]:
    """:func:`train_files`, checked: every name in DLIO's ``img_<i>_of_<n>`` form, and all ``n`` there.

    Raises
    ------
    FileNotFoundError
        When ``folder/train`` holds no TFRecord file.
    ValueError
        When a file's name is not DLIO's (naming the file), or files are missing (an interrupted
        ``--generate``: running it again finishes the set).
    """
    files = train_files(folder)
    if not files:
        raise FileNotFoundError(f"{os.path.join(folder, 'train')}: no *.tfrecord files (DLIO's layout: "
                                f"<folder>/train/{file_name(0, 16)}, ...); --generate makes them")
    n = promised_files(files)
    if len(files) != n:
        present = {os.path.basename(f) for f in files}
        missing = next(file_name(i, n) for i in range(n) if file_name(i, n) not in present)
        raise ValueError(f"{os.path.join(folder, 'train')}: {len(files)} of the {n} files their names promise "
                         f"({missing} is missing): an interrupted --generate? --generate finishes the set")
    return files


def record_bytes(workload: MlperfWorkload) -> int:
    """Bytes of one record on disk (mean, with a spread): image, Example fields and TFRecord framing."""
    return workload.image_bytes + _OVERHEAD_BYTES


def files_to_outgrow_cache(workload: MlperfWorkload, margin: float = 1.2,
                           records_per_file: Optional[int] = None) -> int:
    """Files of the workload's layout that hold ``margin`` times the memory the page cache can use,
    as MLPerf Storage sizes a dataset so that its epochs cannot be served from memory."""
    per_file = record_bytes(workload) * (records_per_file or workload.records_per_file)
    cache = available_page_cache_bytes()
    return max(1, math.ceil(margin * cache / per_file))


def generate(folder: str, workload: MlperfWorkload, files: int, records_per_file: Optional[int] = None,
             seed: int = 10, progress: Optional[Any] = None) -> List[str]:
    """Writes ``files`` files of the workload's layout under ``folder/train`` (kept when already there).

    Parameters
    ----------
    folder : str
        DLIO's ``data_folder``.
    workload : MlperfWorkload
        Its ``dimension`` and ``dimension_stdev`` size each file's images, as DLIO's do.
    files : int
        How many files (DLIO's ``num_files_train``).
    records_per_file : int, optional
        DLIO's ``num_samples_per_file`` (default: the workload's).
    seed : int
        The generator's seed (DLIO's is 10).
    progress : callable, optional
        Called with the bytes of each file written.

    Returns
    -------
    list of str
        The files, sorted.
    """
    if files < 1:
        raise ValueError(f"files must be at least 1, not {files}")
    per_file = int(records_per_file or workload.records_per_file)
    if per_file < 1:
        raise ValueError(f"records_per_file must be at least 1, not {per_file}")
    train = os.path.join(folder, "train")
    os.makedirs(train, exist_ok=True)
    rng = np.random.default_rng(seed)
    dim = workload.dimension
    if workload.dimension_stdev > 0:
        sides = np.maximum(rng.normal(dim, workload.dimension_stdev, 2 * files).astype(np.int64), 1)
    else:
        sides = np.full(2 * files, dim, dtype=np.int64)
    out = []
    for i in range(files):
        path = os.path.join(train, file_name(i, files))
        out.append(path)
        if os.path.exists(path):
            continue
        side1, side2 = int(sides[2 * i]), int(sides[2 * i + 1])
        tmp = f"{path}.tmp{os.getpid()}"
        with TFRecordWriter(tmp) as writer:
            for _ in range(per_file):
                image = rng.integers(0, 255, size=side1 * side2, dtype=np.uint8).tobytes()
                writer.write(encode_example({"image": image, "size": dim}))
        os.replace(tmp, path)  # a reader never sees half a file
        if progress is not None:
            progress(os.path.getsize(path))
    return out


class DlioExample(Pipeline):
    """DLIO's records parsed as its TensorFlow reader parses them: ``size`` (int64) and ``image`` (bytes).

    Each batch holds ``size`` and ``image_bytes`` (the length of each record's ``image``): both
    features are found and checked in every record, one C++ call each per run of records, and the
    image bytes stay where they were read.
    """

    name = "dlio-example"
    formats = ("tfrecord",)

    def fields(self) -> Dict[str, Field]:
        return {"size": ((1,), np.dtype(np.int64)), "image_bytes": ((1,), np.dtype(np.int64))}

    def bind(self, *, format: str, seed: int, threads: int) -> PipelineRun:
        from dlstore import _C

        self.check_format(format)
        spec = [("size", "int64", 1, None)]
        parse, spans = _C.parse_example_batch, _C.example_bytes_spans

        def run(buffer: Any, offsets: np.ndarray, lengths: np.ndarray, out: Dict[str, np.ndarray], row: int,
                epoch: int, position: int) -> None:
            parse(buffer, offsets, lengths, spec, out, row, threads)
            out["image_bytes"][row:row + len(offsets), 0] = spans(buffer, offsets, lengths, "image")[1]

        return run

    def describe(self) -> Dict[str, Any]:
        return {"pipeline": self.name, "parser": "C++ tf.train.Example parser: size (int64) and image (bytes, "
                                                 "located, not copied), as DLIO's tf.io.parse_example"}
