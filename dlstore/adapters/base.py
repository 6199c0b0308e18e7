"""What the framework adapters share: last-batch policy, consumer sharding, lazy imports, a batch wrapper.

A *consumer* is one reader of the data: a rank, or one DataLoader worker of a rank. Every adapter
splits the records among consumers the same way (:class:`ConsumerShard`), names its last-batch
policies as DALI does (``FILL``, ``DROP``, ``PARTIAL``), imports its framework only when used
(:func:`import_framework`), and converts the native loader's numpy batches without per-sample
Python (:class:`BatchAdapter`). Nothing here imports a framework.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from dlstore.pipeline.stages import LAST_BATCH_POLICIES, check_last_batch

__all__ = ["LastBatch", "check_last_batch", "import_framework", "current_world", "ConsumerShard",
           "shuffled_files", "BatchAdapter"]


class LastBatch:
    """What to do with the last, incomplete batch of an epoch; the names of DALI's ``LastBatchPolicy``.

    ``FILL``
        The batch is completed by repeating the consumer's last sample of the epoch, so every
        batch has ``batch_size`` samples (DALI's ``FILL`` with ``pad_last_batch=True``).
    ``DROP``
        The batch is dropped: fixed shapes, a few samples not seen this epoch.
    ``PARTIAL``
        The batch is yielded smaller: every sample exactly once, the batch dimension varies.
    """

    FILL = "FILL"
    DROP = "DROP"
    PARTIAL = "PARTIAL"
    ALL = LAST_BATCH_POLICIES


def import_framework(module: str, install: str):
    """Imports ``module`` (e.g. ``torch``) when an adapter is first used, or says how to install it.

    Raises
    ------
    ImportError
        With the pip command that installs the framework.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"this dlstore adapter needs {module.split('.')[0]}: {install} ({e})") from e


# ---- who reads what --------------------------------------------------------------------------------


def current_world(world: Any = None):
    """``world`` if given, else this process's from :func:`dlstore.placement.world.detect_world`
    (mpirun, torchrun, Horovod, PopRun, SLURM...). Anything with ``rank``, ``size``, ``local_rank``,
    ``with_worker``, ``consumer`` and ``num_consumers`` serves as a world."""
    if world is not None:
        return world
    from dlstore.placement.world import detect_world

    return detect_world()


def shuffled_files(paths: Sequence[str], seed: int, epoch: int) -> List[str]:
    """``paths`` in the order :func:`dlstore.placement.sharding.shard_order` draws from ``(seed, epoch)``:
    the same on every rank, new each epoch."""
    from dlstore.placement.sharding import shard_order

    return [paths[i] for i in shard_order(len(paths), seed, epoch).tolist()]


class _RecordSubset(np.ndarray):
    """Some records of one ``RecordBatch``, with no copy: a uint8 view of the whole chunk plus the
    offsets and lengths of the records kept. Being an ndarray it exposes the buffer protocol, so it
    goes wherever a ``RecordBatch`` goes (the loader, :func:`dlstore.formats.example.parse_batch`).
    """

    @property
    def nbytes(self) -> int:  # payload bytes of the records kept, as RecordBatch.nbytes means
        lengths = getattr(self, "lengths", None)  # a slice of a subset is a plain view: its own size
        return int(lengths.sum()) if lengths is not None else np.ndarray.nbytes.__get__(self)


def _subset(batch, keep: np.ndarray) -> _RecordSubset:
    view = np.frombuffer(batch, dtype=np.uint8).view(_RecordSubset)
    view.offsets = np.ascontiguousarray(np.asarray(batch.offsets)[keep])
    view.lengths = np.ascontiguousarray(np.asarray(batch.lengths)[keep])
    view.file_offsets = np.ascontiguousarray(np.asarray(batch.file_offsets)[keep])
    view.file_index = batch.file_index
    view.num_records = int(view.offsets.size)
    return view


class ConsumerShard:
    """The records one consumer of ``num_consumers`` reads, as a source (``.batches()``) for the Loader.

    Across consumers every record of ``paths`` is read exactly once per epoch. The source follows
    the epoch: :class:`dlstore.pipeline.Loader` calls :meth:`set_epoch` before each one, which with
    ``shuffle`` draws a new file order (the same on every consumer).

    Parameters
    ----------
    paths : sequence of str
        Record files (already expanded), in the order every consumer agrees on.
    consumer, num_consumers : int
        ``0 <= consumer < num_consumers`` (``world.consumer`` and ``world.num_consumers``).
    shard : {"auto", "files", "records"}
        ``files``: consumer ``c`` reads files ``c, c + n, c + 2n ...`` (each file read once in
        all; a consumer may get none when there are fewer files than consumers). ``records``:
        every consumer reads every file and keeps records ``c, c + n, ...`` (even shares, ``n``
        times the I/O). ``auto``: ``files`` when the files divide evenly among consumers, else
        ``records``.
    shuffle, seed, epoch
        With ``shuffle``, the file order is drawn from ``(seed, epoch)`` before sharding.
    **open_kwargs
        For :func:`dlstore.open_records` (``io``, ``format``, ``verify``, ``on_error``...).

    Attributes
    ----------
    paths : list of str
        The files of the current epoch's reader (``file_index`` of its batches points here).
    """

    def __init__(self, paths: Sequence[str], consumer: int, num_consumers: int, *, shard: str = "auto",
                 shuffle: bool = False, seed: int = 0, epoch: int = 0, **open_kwargs: Any):
        if not 0 <= consumer < num_consumers:
            raise ValueError(f"consumer {consumer} is not in 0..{num_consumers - 1}")
        if shard not in ("auto", "files", "records"):
            raise ValueError(f"shard must be 'auto', 'files' or 'records', got {shard!r}")
        self.all_paths = list(paths)
        if shard == "auto":
            shard = "files" if len(self.all_paths) % num_consumers == 0 else "records"
        self.shard = shard
        self.consumer, self.num_consumers = consumer, num_consumers
        self.shuffle, self.seed = shuffle, seed
        self.open_kwargs = open_kwargs
        self.set_epoch(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Reads epoch ``epoch``'s share from the next :meth:`batches` on."""
        from dlstore.reader import open_records

        self.epoch = int(epoch)
        paths = shuffled_files(self.all_paths, self.seed, self.epoch) if self.shuffle else self.all_paths
        if self.shard == "files":
            paths = paths[self.consumer::self.num_consumers]
        self.reader = open_records(paths, **self.open_kwargs) if paths else None

    @property
    def paths(self) -> List[str]:
        return self.reader.paths if self.reader is not None else []

    def batches(self) -> Iterator:
        if self.reader is None:  # no file for this consumer
            return
        if self.shard == "files" or self.num_consumers == 1:
            yield from self.reader.batches()
            return
        seen = 0
        for batch in self.reader.batches():
            n = int(batch.num_records)
            first = (self.consumer - seen) % self.num_consumers
            seen += n
            if first < n:
                yield _subset(batch, np.arange(first, n, self.num_consumers))

    def describe(self) -> str:
        """What this consumer reads this epoch, in a line: e.g. ``consumer 1 of 4: records 1, 5, 9, ...``."""
        who = f"consumer {self.consumer} of {self.num_consumers}: "
        if self.shard == "records" and self.num_consumers > 1:
            c, n = self.consumer, self.num_consumers
            return who + f"records {c}, {c + n}, {c + 2 * n}, ... of {len(self.all_paths)} files"
        names = [os.path.basename(p) for p in self.paths]
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return who + f"{len(names)} of {len(self.all_paths)} files ({shown or 'none'})"

    @property
    def format(self) -> str:
        """``tfrecord`` or ``recordio`` (what the Loader's pipeline needs to know)."""
        return self.reader.format if self.reader is not None else self.open_kwargs.get("format", "tfrecord")

    @property
    def engine(self) -> str:
        return self.reader.engine if self.reader is not None else "none"

    @property
    def engine_reason(self) -> str:
        return self.reader.engine_reason if self.reader is not None else "no file for this consumer"

    def stats(self) -> Dict[str, Any]:
        return self.reader.stats() if self.reader is not None else {}


# ---- the native loader seen from a framework ---------------------------------------------------------


class BatchAdapter:
    """Wraps a :class:`dlstore.pipeline.Loader`; each framework's adapter says how to convert a batch.

    Subclasses implement :meth:`convert` (one numpy array -> the framework's tensor) and
    :meth:`convert_spec` (``(shape, dtype)`` -> the framework's description); iteration, the
    element spec, stats and resumable state are the loader's, passed through.
    """

    def __init__(self, loader):
        self.loader = loader

    def convert(self, name: str, array: np.ndarray) -> Any:
        raise NotImplementedError

    def convert_spec(self, name: str, shape: Tuple[Optional[int], ...], dtype: np.dtype) -> Any:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        convert = self.convert
        for batch in self.loader:
            yield {name: convert(name, array) for name, array in batch.items()}

    @property
    def element_spec(self) -> Dict[str, Any]:
        """Name -> the framework's description of that output, batch dimension first (None under ``PARTIAL``)."""
        return {name: self.convert_spec(name, tuple(shape), np.dtype(dtype))
                for name, (shape, dtype) in self.loader.element_spec.items()}

    def stats(self) -> Dict[str, Any]:
        return self.loader.stats()

    def state_dict(self) -> Dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.loader.load_state_dict(state)
