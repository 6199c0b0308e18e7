"""What a :class:`~dlstore.pipeline.Loader` runs on records: the pipeline interface and its pieces.

A pipeline turns runs of records into rows of fixed-shape batch arrays. The loader hands it a
contiguous run of records of one ``RecordBatch`` (buffer, offsets, lengths) and a row offset into
the output arrays; the pipeline makes one C++ call (or a few) per run, never Python per sample.
A batch that takes the tail of one chunk and the head of the next is two runs into one output.

Random augmentation draws from per-sample seeds that are a pure function of
``(seed, epoch, sample position in the epoch)`` (:func:`sample_seeds`), so a resumed run, or a run
with another prefetch depth or thread count, produces the same samples.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Tuple

import numpy as np

from dlstore.errors import DlstoreError

__all__ = ["Pipeline", "PipelineRun", "Field", "sample_seeds", "LAST_BATCH_POLICIES", "check_last_batch",
           "naming_missing_features"]

#: ``(per-sample shape, numpy dtype)`` of one output array.
Field = Tuple[Tuple[int, ...], np.dtype]

#: What happens to an epoch's last, incomplete batch; the names are DALI's ``LastBatchPolicy``.
#: ``DROP``: dropped. ``PARTIAL``: yielded with fewer rows. ``FILL``: padded to the full size by
#: repeating the epoch's last sample; the loader says how many rows are padding.
LAST_BATCH_POLICIES = ("FILL", "DROP", "PARTIAL")  # the order of DALI's LastBatchPolicy


def check_last_batch(policy: Any) -> str:
    """``policy`` as one of :data:`LAST_BATCH_POLICIES`; any case, and DALI's ``LastBatchPolicy`` members.

    Raises
    ------
    ValueError
        For anything else, listing the policies.
    """
    name = getattr(policy, "name", policy)  # nvidia.dali.plugin.base_iterator.LastBatchPolicy.FILL -> "FILL"
    if isinstance(name, str) and name.upper() in LAST_BATCH_POLICIES:
        return name.upper()
    raise ValueError(f"last_batch must be one of {', '.join(LAST_BATCH_POLICIES)}, got {policy!r}")

#: A bound pipeline: ``run(buffer, offsets, lengths, out, row, epoch, position)`` writes records
#: ``offsets[i], lengths[i]`` of ``buffer`` into rows ``row + i`` of each array of ``out``;
#: ``position`` is the epoch position of the first record (for seeds).
PipelineRun = Callable[[Any, np.ndarray, np.ndarray, Dict[str, np.ndarray], int, int, int], None]

_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a uint64 array, in place (numpy uint64 arithmetic wraps)."""
    x ^= x >> np.uint64(30)
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    return x


def sample_seeds(seed: int, epoch: int, first_position: int, count: int) -> np.ndarray:
    """Per-sample seeds for positions ``first_position .. first_position + count - 1`` of an epoch.

    A pure function of ``(seed, epoch, position)``: the same sample gets the same seed whatever
    the batch size, prefetch depth, thread count or resume point. Seeds of neighbouring positions,
    epochs and seeds are decorrelated (SplitMix64 finaliser over a combined key).

    Parameters
    ----------
    seed, epoch, first_position, count : int
        Non-negative.

    Returns
    -------
    numpy.ndarray
        ``count`` uint64 values.

    Examples
    --------
    >>> bool((sample_seeds(0, 1, 5, 3)[1:] == sample_seeds(0, 1, 6, 2)).all())
    True
    """
    base = _splitmix(np.array([(int(seed) * 0x9E3779B97F4A7C15 + int(epoch)) & _MASK64], dtype=np.uint64))
    key = np.arange(first_position, first_position + count, dtype=np.uint64)
    key *= _GOLDEN
    key ^= base
    return _splitmix(key)


def naming_missing_features(run: PipelineRun, features: Mapping[str, str], hint: str) -> PipelineRun:
    """``run``, whose errors about a record lacking features name every feature it lacks.

    Parameters
    ----------
    run : PipelineRun
        A bound pipeline over ``tf.train.Example`` records.
    features : mapping
        The pipeline's option -> the feature name it reads (e.g. ``image_feature -> image/encoded``).
    hint : str
        How to name them, for the message (e.g. ``ResNet50(image_feature=..., label_feature=...)``).

    Notes
    -----
    The C++ parser stops at the first missing feature; only then, on that one record, is the record
    parsed again in full to list what it lacks and what it has: nothing is added to a good run.
    """
    from dlstore.formats.example import parse_example

    def checked(buffer: Any, offsets: np.ndarray, lengths: np.ndarray, out: Dict[str, np.ndarray], row: int,
                epoch: int, position: int) -> None:
        try:
            run(buffer, offsets, lengths, out, row, epoch, position)
        except DlstoreError as e:
            k = e.record
            if k is None or not 0 <= k < len(offsets) or "missing" not in e.reason:
                raise
            start = int(offsets[k])
            try:
                present = parse_example(np.frombuffer(buffer, dtype=np.uint8)[start:start + int(lengths[k])])
            except DlstoreError:
                raise e from None
            missing = [f"{option}={name!r}" for option, name in features.items() if name not in present]
            if not missing:
                raise
            raise DlstoreError.of_record(k, f"the record lacks {len(missing)} of the features the pipeline reads: "
                                            f"{', '.join(missing)}; it has {sorted(present)}: name them with "
                                            f"{hint}") from e

    return checked


class Pipeline:
    """Base of the pipelines a :class:`~dlstore.pipeline.Loader` runs (:class:`Bert`, :class:`ResNet50`).

    A subclass says what one sample becomes (:meth:`fields`), which record formats it reads
    (:attr:`formats`), how many threads its C++ work uses by default, and returns from
    :meth:`bind` the function the loader calls once per contiguous run of records.
    """

    #: Short name, for stats and messages.
    name = "pipeline"
    #: Record formats the pipeline reads (``RecordReader.format``).
    formats: Tuple[str, ...] = ("tfrecord",)

    def fields(self) -> Dict[str, Field]:
        """Output name -> ``(per-sample shape, numpy dtype)``, in the order batches list them."""
        raise NotImplementedError

    def default_threads(self) -> int:
        """Threads the batch function uses when the loader is given none."""
        return 1

    def bind(self, *, format: str, seed: int, threads: int) -> PipelineRun:
        """The batch function for records of ``format``, with the loader's seed and thread count.

        Raises
        ------
        ValueError
            When the pipeline cannot read ``format``.
        """
        raise NotImplementedError

    def describe(self) -> Dict[str, Any]:
        """What runs, for :meth:`Loader.stats` (e.g. which decoder and why)."""
        return {"pipeline": self.name}

    def counters(self) -> Dict[str, int]:
        """What the pipeline counted since :meth:`bind` (e.g. images a fallback decoder took), for
        :meth:`Loader.stats`; none by default."""
        return {}

    def check_format(self, format: str) -> None:
        """Raises ValueError, naming the formats it reads, when the pipeline cannot read ``format``."""
        if format not in self.formats:
            raise ValueError(f"the {self.name} pipeline reads {' or '.join(self.formats)} records, "
                             f"not {format}")

