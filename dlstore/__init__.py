"""dlstore: a storage-aware data loader for deep-learning training.

``import dlstore`` needs only numpy; frameworks are imported by their adapters when used.

The rooms, from the bytes up (each imports those before it, not those after, but for the exceptions
its own docstring names): ``formats``
(what the bytes mean), ``io`` (how bytes reach memory), ``placement`` (who reads what, pure),
``sources`` (``open_records``, ``Dataset``), ``pipeline`` (records to batches), ``adapters`` (torch,
TensorFlow, DALI); beside them ``synthetic`` (generated data), ``tools`` and ``bench`` (the commands),
``settings`` and ``errors`` (used by all).
"""
from dlstore.errors import (CorruptRecordError, DlstoreError, DlstoreIOError,
                            GdsUnavailableError, PlacementError)
from dlstore.sources.dataset import Dataset
from dlstore.formats import recordio
from dlstore.sources.reader import RecordReader, open_records
from dlstore.sources.source import ReadOptions, Source
from dlstore.writers import RecordIOWriter, TFRecordWriter

__version__ = "0.1.0"

__all__ = [
    "open_records",
    "Dataset",
    "RecordReader",
    "ReadOptions",
    "Source",
    "TFRecordWriter",
    "RecordIOWriter",
    "parse_example",
    "recordio",
    "DlstoreError",
    "DlstoreIOError",
    "CorruptRecordError",
    "GdsUnavailableError",
    "PlacementError",
    "world",
]


def parse_example(record) -> dict:
    """Parses one serialized ``tf.train.Example`` without TensorFlow; see :mod:`dlstore.formats.example`."""
    from dlstore.formats.example import parse_example as _parse

    return _parse(record)


def world(**kwargs):
    """Who this process is: rank, world size, local rank and size, DataLoader worker, and the
    launcher and variables they came from; see :func:`dlstore.placement.world.detect_world`
    (keyword arguments ``rank``, ``size``, ``local_rank``, ``local_size`` win over the environment)."""
    from dlstore.placement.world import detect_world

    return detect_world(**kwargs).with_torch_worker()
