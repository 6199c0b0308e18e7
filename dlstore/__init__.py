"""dlstore: a storage-aware data loader for deep-learning training.

``import dlstore`` needs only numpy; frameworks are imported by their adapters when used.
"""
from dlstore.errors import (AlignmentError, CorruptRecordError, DlstoreError, DlstoreIOError,
                            GdsUnavailableError, PlacementError)
from dlstore.formats import recordio
from dlstore.reader import RecordReader, open_records
from dlstore.writers import RecordIOWriter, TFRecordWriter

__version__ = "0.1.0"

__all__ = [
    "open_records",
    "RecordReader",
    "TFRecordWriter",
    "RecordIOWriter",
    "parse_example",
    "recordio",
    "DlstoreError",
    "DlstoreIOError",
    "CorruptRecordError",
    "AlignmentError",
    "GdsUnavailableError",
    "PlacementError",
]


def parse_example(record) -> dict:
    """Parses one serialized ``tf.train.Example`` without TensorFlow; see :mod:`dlstore.formats.example`."""
    from dlstore.formats.example import parse_example as _parse

    return _parse(record)
