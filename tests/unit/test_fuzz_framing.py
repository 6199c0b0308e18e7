"""Hostile input: random damage to valid files never crashes, hangs or over-allocates; it raises a
DlstoreError naming the file, or (on_error="skip") loses only the damaged records."""
import resource

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlstore
from tests.helpers import check_engine, oracle_tfrecord_bytes

RECORDS = [bytes([i % 256]) * (i * 37 % 3000) for i in range(40)]
GOOD_TF = oracle_tfrecord_bytes(RECORDS)


def _rec_bytes():
    import io

    import dlstore.formats.recordio as rio

    buf = io.BytesIO()
    for r in RECORDS:
        for f in rio.frame_parts(r):
            buf.write(f)
    return buf.getvalue()


GOOD_RIO = _rec_bytes()


def damage(blob, edits, cut):
    b = bytearray(blob)
    for pos, val in edits:
        b[pos % len(b)] = val
    return bytes(b[:len(b) - cut % 64]) if cut else bytes(b)


# Each engine in turn (the `engine` fixture), its files where it really runs (`engine_dir`: a
# filesystem accepting O_DIRECT for direct).
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=6),
       cut=st.integers(0, 200), fmt=st.sampled_from(["tfrecord", "recordio"]), mode=st.sampled_from(["raise", "skip"]))
def test_damaged_files(engine_dir, engine, edits, cut, fmt, mode):
    blob = damage(GOOD_TF if fmt == "tfrecord" else GOOD_RIO, edits, cut)
    path = engine_dir / f"f.{fmt}"
    path.write_bytes(blob)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    reader = dlstore.open_records(path, format=fmt, io=engine, on_error=mode, chunk_size=64 << 10)
    try:
        got = [bytes(r) for r in reader]
    except dlstore.DlstoreError as e:
        assert mode == "raise" and e.path == str(path) and str(path) in str(e)
        return
    finally:
        # A hostile length must not become an allocation: resident memory grows by a few MB at most.
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 * 1024
        if blob:  # an empty file is never opened, so it says nothing about the engine
            check_engine(reader, engine)
    if mode == "skip" and fmt == "tfrecord":
        # every record handed out under skip is one that was written (CRC-checked)
        assert all(r in RECORDS for r in got)
    if blob == (GOOD_TF if fmt == "tfrecord" else GOOD_RIO):
        assert got == RECORDS


MAGIC = b"\x0a\x23\xd7\xce"  # RecordIO's magic word, little-endian


@pytest.mark.parametrize("junk, expected", [
    (b"", []),  # an empty file holds no records
    (MAGIC + b"\0\0\0\0", [b""]),  # the smallest valid file: one empty record
    (MAGIC + b"\x03\0\0\0abc\0", [b"abc"]),  # one record, padded to 4 bytes
    (b"\0", dlstore.CorruptRecordError),  # shorter than a header
    (b"\xff" * 11, dlstore.CorruptRecordError),  # no magic
    (MAGIC, dlstore.CorruptRecordError),  # a magic word and nothing else
    (MAGIC + b"\xff\xff\xff\xff", dlstore.CorruptRecordError),  # cflag 7, a length far past the end
])
def test_tiny_hostile_files(tmp_path, junk, expected):
    path = tmp_path / "j.rec"
    path.write_bytes(junk)
    reader = dlstore.open_records(path, format="recordio")
    if isinstance(expected, list):
        assert [bytes(r) for r in reader] == expected
        return
    with pytest.raises(expected) as e:
        list(reader)
    assert e.value.path == str(path)
