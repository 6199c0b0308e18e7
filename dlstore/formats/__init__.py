"""What the bytes mean: TFRecord and RecordIO framing, tf.train.Example, index files.

Nothing here opens files; :mod:`dlstore.io` and the reader do.

May import: the C++ core (``dlstore._C``), ``errors`` and numpy; nothing else of dlstore.
"""
from dlstore.formats import example, index, recordio, tfrecord
from dlstore.formats.detect import detect
from dlstore.formats.registry import FORMATS, RecordFormat, format_named

__all__ = ["detect", "example", "index", "recordio", "tfrecord", "FORMATS", "RecordFormat", "format_named"]
