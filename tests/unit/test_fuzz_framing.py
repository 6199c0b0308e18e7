"""Hostile input: random damage to valid files never crashes, hangs or over-allocates; it raises a
DlstoreError naming the file, or (on_error="skip") loses only the damaged records."""
import resource

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlstore
from tests.conftest import oracle_tfrecord_bytes

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


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=6),
       cut=st.integers(0, 200), fmt=st.sampled_from(["tfrecord", "recordio"]),
       engine=st.sampled_from(["buffered", "mmap", "direct"]), mode=st.sampled_from(["raise", "skip"]))
def test_damaged_files(tmp_path, edits, cut, fmt, engine, mode):
    blob = damage(GOOD_TF if fmt == "tfrecord" else GOOD_RIO, edits, cut)
    path = tmp_path / f"f.{fmt}"
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
    if mode == "skip" and fmt == "tfrecord":
        # every record handed out under skip is one that was written (CRC-checked)
        assert all(r in RECORDS for r in got)
    if blob == (GOOD_TF if fmt == "tfrecord" else GOOD_RIO):
        assert got == RECORDS


@pytest.mark.parametrize("junk", [b"", b"\0", b"\xff" * 11, b"\x0a\x23\xd7\xce", b"\x0a\x23\xd7\xce\xff\xff\xff\xff"])
def test_tiny_hostile_files(tmp_path, junk):
    path = tmp_path / "j.rec"
    path.write_bytes(junk)
    try:
        assert list(dlstore.open_records(path, format="recordio")) == [] or junk
    except dlstore.CorruptRecordError as e:
        assert e.path == str(path)
