"""Frames placed byte by byte around 64 KiB chunk boundaries, on every engine; and the good records
delivered before an error in the second of two files.

Each case is built, not sampled: a first record of the right size puts the next frame boundary
exactly where the case needs it, so a failure names the offset that broke.
"""
import os
from pathlib import Path

import numpy as np
import pytest

import dlstore
from tests.helpers import batch_records, check_engine, oracle_read_tfrecord, oracle_tfrecord_bytes, write_tfrecord

CHUNK = 64 << 10  # the smallest chunk_size: boundaries come often
FRAME = 16  # TFRecord framing: 8-byte length, 4-byte length CRC, data, 4-byte data CRC


def _read(path, engine):
    """Records and where each frame starts, from the batches of one pass; and the reader."""
    reader = dlstore.open_records(path, io=engine, chunk_size=CHUNK)
    records, starts = [], []
    for batch in reader.batches():
        records += batch_records(batch)
        starts += batch.file_offsets.tolist()
    return records, starts, reader


def _frame_starts(records):
    return np.cumsum([0] + [FRAME + len(r) for r in records])[:-1].tolist()


@pytest.mark.parametrize("shift", range(-15, 16))
def test_frame_boundary_at_each_offset_around_a_chunk_boundary(engine_dir, engine, shift):
    # The first frame ends `shift` bytes after the end of the first chunk (before it when negative):
    # 0..15 puts the next header (12 bytes) and a short record's footer across the boundary,
    # -15..-1 splits the first frame's footer or the next frame's header.
    rng = np.random.default_rng(100 + shift)
    records = [rng.bytes(CHUNK + shift - FRAME), b"", b"a", rng.bytes(11), rng.bytes(12), rng.bytes(CHUNK),
               rng.bytes(3)]
    path = write_tfrecord(engine_dir / "edge.tfrecord", records)
    assert _frame_starts(records)[1] == CHUNK + shift
    assert oracle_read_tfrecord(Path(path).read_bytes()) == records
    got, starts, reader = _read(path, engine)
    assert got == records, f"frame boundary at chunk boundary {shift:+d}"
    assert starts == _frame_starts(records)
    check_engine(reader, engine)


@pytest.mark.parametrize("payload", [CHUNK - FRAME, CHUNK], ids=["frame-fills-chunk", "data-fills-chunk"])
def test_record_exactly_filling_a_chunk(engine_dir, engine, payload):
    rng = np.random.default_rng(payload)
    records = [rng.bytes(payload), rng.bytes(payload), b"", rng.bytes(payload), b"z"]
    path = write_tfrecord(engine_dir / "full.tfrecord", records)
    got, starts, reader = _read(path, engine)
    assert got == records
    assert starts == _frame_starts(records)
    check_engine(reader, engine)


def _two_files(directory):
    """Two files of several chunks each; the second one's record 20 has at least 100 bytes of data."""
    rng = np.random.default_rng(3)
    first = [rng.bytes(int(n)) for n in rng.integers(0, 20_000, 60)]  # about 600 KB: many chunks
    second = [rng.bytes(int(n)) for n in rng.integers(100, 20_000, 40)]
    a = write_tfrecord(directory / "a.tfrecord", first)
    b = write_tfrecord(directory / "b.tfrecord", second)
    assert os.path.getsize(a) > 4 * CHUNK  # more than the chunks in flight: the reader runs ahead
    return a, first, b, second


def test_good_records_before_a_corrupt_record_in_the_second_file(engine_dir, engine):
    a, first, b, second = _two_files(engine_dir)
    at = 20
    offset = _frame_starts(second)[at]
    blob = bytearray(oracle_tfrecord_bytes(second))
    blob[offset + 12 + 50] ^= 0x01  # a byte of record 20's data
    with open(b, "wb") as f:
        f.write(blob)
    got = []
    with pytest.raises(dlstore.CorruptRecordError) as e:
        for r in dlstore.open_records([a, b], io=engine, chunk_size=CHUNK):
            got.append(bytes(r))
    assert got == first + second[:at]
    assert e.value.path == b and e.value.offset == offset


def test_good_records_before_a_missing_second_file(engine_dir, engine):
    a, first, b, _ = _two_files(engine_dir)
    reader = dlstore.open_records([a, b], io=engine, chunk_size=CHUNK)
    os.unlink(b)  # gone between open_records and the read
    got = []
    with pytest.raises(dlstore.DlstoreError) as e:
        for r in reader:
            got.append(bytes(r))
    assert got == first  # every record of the first file, then the error
    assert e.value.path == b and b in str(e.value)
