"""What the framework adapters share: last-batch policy, the rank's source, lazy imports, a batch wrapper.

A *consumer* is one reader of the data: a rank, or one DataLoader worker of a rank. Every adapter
reads through a :class:`~dlstore.sources.source.Source`, a :class:`dlstore.Dataset` when given files
(:func:`dlstore.sources.dataset.dataset_for`), so every consumer takes its share of one epoch plan;
it names its last-batch policies as DALI does (``FILL``, ``DROP``, ``PARTIAL``), imports its framework only when used
(:func:`import_framework`), and converts the native loader's numpy batches without per-sample
Python (:class:`BatchAdapter`). Nothing here imports a framework.
"""
from __future__ import annotations

import importlib
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np

from dlstore.pipeline.stages import LAST_BATCH_POLICIES, check_last_batch
from dlstore.placement.world import detect_world

__all__ = ["LastBatch", "check_last_batch", "import_framework", "current_world", "BatchAdapter"]


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

    return detect_world()


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

    def stall_report(self) -> Dict[str, Any]:
        """The loader's :meth:`~dlstore.pipeline.Loader.stall_report`: how often, and why, the loop waited."""
        return self.loader.stall_report()

    def state_dict(self) -> Dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.loader.load_state_dict(state)
