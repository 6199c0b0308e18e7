"""Errors carry their facts as fields (path, offset, record, errno, reason), so that no caller has to
parse a message to learn which record failed or why."""
from __future__ import annotations

import errno

import numpy as np
import pytest

from dlstore.errors import CorruptRecordError, DlstoreError, DlstoreIOError
from dlstore.formats.example import bytes_feature_spans, encode_example, parse_batch
from dlstore.pipeline.decode import decode_batch

from tests.helpers import SpanBatch


def test_a_parse_error_names_its_record_in_a_field():
    records = [encode_example({"a": [1]}), encode_example({"a": [1]}), encode_example({"a": [1, 2]})]
    with pytest.raises(DlstoreError) as info:
        bytes_feature_spans(SpanBatch(records), "a")
    e = info.value
    assert e.record == 0 and str(e) == f"record 0: {e.reason}" and not e.reason.startswith("record")
    batch = SpanBatch(records)
    with pytest.raises(DlstoreError) as info:
        parse_batch(batch, {"a": (np.int64, 1)})
    e = info.value
    assert e.record == 2 and "has 2 values, expected 1" in e.reason and str(e).startswith("record 2: ")


def test_a_corrupt_record_in_the_middle_keeps_its_class_and_index():
    records = [encode_example({"image/encoded": b"x"})] * 3 + [b"\x0a\xff"]
    with pytest.raises(CorruptRecordError) as info:
        bytes_feature_spans(SpanBatch(records), "image/encoded")
    assert info.value.record == 3 and info.value.errno is None


def test_a_jpeg_that_fails_names_its_image():
    images = [b"\xff\xd8\xff\xe0 not really a jpeg", b"\xff\xd8 nor this"]
    buffer = b"".join(images)
    offsets = np.array([0, len(images[0])], np.uint64)
    lengths = np.array([len(i) for i in images], np.uint64)
    out = np.zeros((2, 8, 8, 3), np.uint8)
    with pytest.raises(CorruptRecordError) as info:
        decode_batch(buffer, offsets, lengths, out, train=False)
    e = info.value
    assert e.record in (0, 1) and e.reason.startswith("JPEG decode failed") and e.reason in str(e)


def test_a_failed_system_call_carries_its_errno(tmp_path):
    # The core reader, given a directory (dlstore's own path expansion would look inside it): open()
    # works, pread() fails with EISDIR.
    from dlstore import _C
    from dlstore.sources.source import ReadOptions

    reader = _C.Reader([str(tmp_path)], "tfrecord", [""], ReadOptions().core("buffered"))
    with pytest.raises(DlstoreIOError) as info:
        reader.next_batch()
    e = info.value
    assert (e.errno, e.path, e.offset) == (errno.EISDIR, str(tmp_path), 0)
    assert isinstance(e, OSError) and e.reason.startswith("pread") and str(e).endswith(e.reason)


def test_of_record_builds_the_message_from_the_fields():
    e = CorruptRecordError.of_record(4, "IRHeader says 9 extra labels")
    assert (str(e), e.record, e.reason, e.path, e.offset, e.errno) == (
        "record 4: IRHeader says 9 extra labels", 4, "IRHeader says 9 extra labels", None, None, None)
    assert DlstoreError("plain").reason == "plain"


def test_reason_never_repeats_the_location(tmp_path):
    # A bad CRC found by the reader, and errors raised in Python with a located message: reason held the
    # whole message, path and offset included (the README says it is the message without its location).
    from pathlib import Path

    import dlstore
    from tests.helpers import write_tfrecord

    path = write_tfrecord(tmp_path / "a.tfrecord", [b"a" * 100, b"b" * 100])
    blob = bytearray(Path(path).read_bytes())
    blob[116 + 20] ^= 0xFF
    Path(path).write_bytes(bytes(blob))
    with pytest.raises(CorruptRecordError) as info:
        list(dlstore.open_records(path).batches())
    e = info.value
    assert (e.path, e.offset) == (path, 116) and e.reason.startswith("bad data CRC in a record of 100 bytes")
    assert str(e) == f"{path}: at byte 116: {e.reason}"
    with pytest.raises(DlstoreError) as info:
        dlstore.open_records(str(tmp_path / "nope.tfrecord"))
    assert info.value.reason == "no such file or directory"
    e = DlstoreError("f: at byte 3: record 2: bad", "f", 3, record=2)
    assert e.reason == "bad"
    assert DlstoreError("f: bad", "g").reason == "f: bad"  # another file's name is not a location of this one


def test_an_error_rebuilt_from_a_dataloader_workers_traceback_keeps_its_location():
    # torch re-creates a worker's exception in the main process from one string, the worker's traceback:
    # path and offset were None there. They come back from the message's last line.
    text = ("Caught CorruptRecordError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
            '  File "x.py", line 1, in f\n    raise error\n'
            "dlstore.errors.CorruptRecordError: /data/p: 1.tfrecord: at byte 29971: bad data CRC in a record of 815 "
            "bytes\n")
    e = CorruptRecordError(text)
    assert (e.path, e.offset, e.reason) == ("/data/p: 1.tfrecord", 29971, "bad data CRC in a record of 815 bytes")
    assert str(e) == text  # what torch shows is torch's
    # A chained error: the one raised is the last line's, and a pipeline error's location reads "record at byte".
    chained = "\n".join([
        "Caught CorruptRecordError in DataLoader worker process 0.",
        "Original Traceback (most recent call last):",
        "dlstore.errors.CorruptRecordError: /m0/p: at byte 7: bad data CRC",
        "",
        "The above exception was the direct cause of the following exception:",
        '  File "x.py", line 2, in g',
        "dlstore.errors.CorruptRecordError: /m1/p: record at byte 105 (sample 0 of epoch 0), bert pipeline: bad", ""])
    e = CorruptRecordError(chained)
    assert (e.path, e.offset, e.reason) == ("/m1/p", 105, "(sample 0 of epoch 0), bert pipeline: bad")
    e = DlstoreError("Caught DlstoreError in DataLoader worker process 1.\n...\ndlstore.errors.DlstoreError: nowhere\n")
    assert (e.path, e.offset) == (None, None)
    assert DlstoreError("Caught a cold: at byte 3: x").path is None  # only a worker's traceback is read
