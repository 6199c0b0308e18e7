"""MLPerf Storage's training workloads as data: one row per workload and accelerator.

Each row holds what DLIO (MLPerf Storage's engine) is configured with for that workload: the batch
size, the emulated ``computation_time`` per batch, the AU a run must reach, and the record layout
of the TFRecord files DLIO generates and reads (files, records per file, record length and its
spread, the features of each ``tf.train.Example``). A new MLPerf Storage round is one edit here:
add or change rows, with their source.

DLIO's record layout, from its ``record_length`` (bytes) and ``record_length_stdev``: each file
gets an image of ``dim1 x dim2`` random uint8 values, ``dim = int(sqrt(record_length))``; with a
spread, ``dim1`` and ``dim2`` are drawn per file from a normal law of standard deviation
``record_length_stdev / 2 / sqrt(record_length)``. Every record of the file is a ``tf.train.Example``
holding ``image`` (that many raw bytes, not an encoded image) and ``size`` (int64: ``dim``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Tuple

__all__ = ["FEATURES", "MlperfWorkload", "WORKLOADS", "workload", "workload_names", "accelerator_names"]

#: The features DLIO's TFRecord generator writes and its TensorFlow reader parses.
FEATURES: Tuple[Tuple[str, str], ...] = (("image", "bytes"), ("size", "int64"))

_V10 = ("MLPerf Storage v1.0 training workload: mlcommons/storage configs/dlio/workload/{name}.yaml "
        "(commit caa90c9c), the same values as dlio-benchmark 2.0.0's configs/workload/{name}.yaml")


@dataclass(frozen=True)
class MlperfWorkload:
    """One workload on one emulated accelerator, as DLIO is configured for it.

    Attributes
    ----------
    workload, accelerator : str
        ``resnet50``, ``cosmoflow``; ``a100``, ``h100``.
    batch_size : int
        Samples per step of one accelerator.
    computation_time : float
        Seconds one accelerator computes per batch (DLIO sleeps this long).
    au_threshold_pct : float
        The accelerator utilisation a run must reach to count (``metric: au``).
    files, records_per_file : int
        The full dataset's layout (``num_files_train``, ``num_samples_per_file``).
    record_length, record_length_stdev : float
        DLIO's ``record_length`` and ``record_length_stdev`` (bytes).
    read_threads : int
        DLIO's ``reader.read_threads`` (TFRecordDataset's parallel reads).
    sample_shuffle : bool
        DLIO shuffles the samples (``reader.sample_shuffle: seed``).
    shuffle_size : int
        DLIO's shuffle buffer, in samples (when ``sample_shuffle``).
    round : str
        The MLPerf Storage round the values belong to.
    source : str
        Where the values come from.
    """

    workload: str
    accelerator: str
    batch_size: int
    computation_time: float
    au_threshold_pct: float
    files: int
    records_per_file: int
    record_length: float
    record_length_stdev: float
    read_threads: int
    sample_shuffle: bool
    shuffle_size: int
    round: str
    source: str

    @property
    def name(self) -> str:
        """``resnet50_h100``: the name of DLIO's config."""
        return f"{self.workload}_{self.accelerator}"

    @property
    def dimension(self) -> int:
        """The side of DLIO's square image: ``int(sqrt(record_length))``."""
        return int(math.sqrt(self.record_length))

    @property
    def dimension_stdev(self) -> float:
        """The spread of each side, drawn per file (0: every image is ``dimension`` squared)."""
        return self.record_length_stdev / 2.0 / math.sqrt(self.record_length)

    @property
    def image_bytes(self) -> int:
        """Bytes of the ``image`` feature of a record when there is no spread (the mean otherwise)."""
        return self.dimension * self.dimension

    @property
    def samples_per_s(self) -> float:
        """Samples per second one emulated accelerator consumes."""
        return self.batch_size / self.computation_time

    def bytes_per_s(self, record_bytes: float) -> float:
        """Bytes per second one accelerator needs when a record holds ``record_bytes``."""
        return self.samples_per_s * record_bytes

    def describe(self) -> str:
        """The header's words: batch, compute time, rate, AU floor and where they come from."""
        return (f"{self.name}: batch {self.batch_size}, computation_time {self.computation_time:g} s per batch "
                f"({self.samples_per_s:,.0f} samples/s per accelerator), AU >= {self.au_threshold_pct:g}% "
                f"({self.source.format(name=self.name)})")


def _v10(workload: str, accelerator: str, batch_size: int, computation_time: float, au: float, files: int,
         records_per_file: int, record_length: float, stdev: float, threads: int, shuffle: bool,
         shuffle_size: int = 0) -> MlperfWorkload:
    return MlperfWorkload(workload, accelerator, batch_size, computation_time, au, files, records_per_file,
                          record_length, stdev, threads, shuffle, shuffle_size, "v1.0", _V10)


#: ``(workload, accelerator) -> row``.
WORKLOADS: Dict[Tuple[str, str], MlperfWorkload] = {
    (w.workload, w.accelerator): w for w in (
        _v10("resnet50", "a100", 400, 0.435, 90.0, 1024, 1251, 114660.07, 0.0, 8, False),
        _v10("resnet50", "h100", 400, 0.224, 90.0, 1024, 1251, 114660.07, 0.0, 8, False),
        _v10("cosmoflow", "a100", 1, 0.00551, 70.0, 524288, 1, 2828486.0, 71311.0, 4, True, 2),
        _v10("cosmoflow", "h100", 1, 0.00350, 70.0, 524288, 1, 2828486.0, 71311.0, 4, True, 2),
    )
}


def workload_names() -> Tuple[str, ...]:
    """The workloads the table holds."""
    return tuple(sorted({w for w, _ in WORKLOADS}))


def accelerator_names() -> Tuple[str, ...]:
    """The accelerators the table holds."""
    return tuple(sorted({a for _, a in WORKLOADS}))


def workload(name: str, accelerator: str) -> MlperfWorkload:
    """The row of ``name`` on ``accelerator``.

    Raises
    ------
    ValueError
        For a pair the table does not hold, listing those it does.
    """
    try:
        return WORKLOADS[(name, accelerator)]
    except KeyError:
        pairs = ", ".join(f"{w} on {a}" for w, a in sorted(WORKLOADS))
        raise ValueError(f"no MLPerf Storage figures for {name} on {accelerator}; the table holds {pairs}") from None
