"""RecordIO: framing, multi-part records, IRHeader, .idx files."""
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dlstore
from dlstore.formats import recordio
from tests.helpers import ENGINES, oracle_read_recordio

MAGIC = struct.pack("<I", 0xCED7230A)


def test_pack_unpack_scalar_label():
    header, data = dlstore.recordio.unpack(dlstore.recordio.pack(0, 7.0, 12, 3, b"jpegbytes"))
    assert header.flag == 0 and header.label == 7.0 and header.id == 12 and header.id2 == 3
    assert data == b"jpegbytes"


def test_pack_unpack_extra_labels():
    payload = dlstore.recordio.pack(0, [1.5, 2.5, 3.5], 1, 0, b"img")
    assert struct.unpack_from("<I", payload)[0] == 3  # flag = number of labels
    header, data = dlstore.recordio.unpack(payload)
    assert header.flag == 3 and np.allclose(header.label, [1.5, 2.5, 3.5]) and data == b"img"


@pytest.mark.parametrize("args, words", [
    ((0, 1.0, -1, 0, b"a"), "id must be an integer from 0 to 2**64-1 (uint64), not -1"),
    ((0, 1.0, 0, 1 << 64, b"a"), f"id2 must be an integer from 0 to 2**64-1 (uint64), not {1 << 64}"),
    ((0, 1.0, 1.5, 0, b"a"), "id must be an integer from 0 to 2**64-1 (uint64), not 1.5"),
    ((0, 1e39, 0, 0, b"a"), "label 1e+39 is outside float32's range (magnitude at most 3.4e+38)"),
    ((0, [1.0, -1e39], 0, 0, b"a"), "label -1e+39 is outside float32's range (magnitude at most 3.4e+38)"),
])
def test_pack_names_the_argument_out_of_range(args, words):
    # A bare struct.error: argument out of range, naming nothing.
    with pytest.raises(ValueError) as e:
        dlstore.recordio.pack(*args)
    assert str(e.value) == words
    assert dlstore.recordio.pack(0, 1.0, (1 << 64) - 1, np.uint64(5), b"a")  # the ends of the range, numpy integers


def test_unpack_rejects_short_payload():
    with pytest.raises(ValueError, match="shorter than an IRHeader"):
        dlstore.recordio.unpack(b"abc")
    with pytest.raises(ValueError, match="labels"):
        dlstore.recordio.unpack(struct.pack("<IfQQ", 100, 0, 0, 0))


def test_multipart_frames_match_mxnet_layout():
    payload = b"abcd" + MAGIC + b"efgh" + MAGIC + b"ij"
    frames = recordio.frame_parts(payload)
    flags = [struct.unpack_from("<I", f, 4)[0] >> 29 for f in frames]
    assert flags == [1, 2, 3]
    assert oracle_read_recordio(b"".join(frames)) == [payload]
    # a magic word that is not 4-byte aligned is not a split point
    unaligned = b"ab" + MAGIC + b"cd"
    assert len(recordio.frame_parts(unaligned)) == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_read_multipart_and_plain(tmp_path, engine):
    rng = np.random.default_rng(3)
    payloads = [dlstore.recordio.pack(0, float(i), i, 0, rng.bytes(int(rng.integers(0, 5000)))) for i in range(40)]
    payloads.insert(5, MAGIC + b"starts with magic")
    payloads.insert(9, b"x" * 8 + MAGIC + MAGIC + b"ends with magic" + b"\0" + MAGIC)
    payloads.append(MAGIC)
    path = tmp_path / "d.rec"
    with dlstore.RecordIOWriter(path, tmp_path / "d.idx") as w:
        for p in payloads:
            w.write(p)
    assert oracle_read_recordio(path.read_bytes()) == payloads
    got = [bytes(r) for r in dlstore.open_records(path, io=engine, chunk_size=64 << 10)]
    assert got == payloads


@settings(max_examples=20, deadline=None)
@given(st.lists(st.binary(max_size=2000).map(lambda b: b.replace(b"\x00\x00", MAGIC)), max_size=30))
def test_round_trip(tmp_path_factory, payloads):
    path = tmp_path_factory.mktemp("rio") / "r.rec"
    with dlstore.RecordIOWriter(path) as w:
        for p in payloads:
            w.write(p)
    assert [bytes(r) for r in dlstore.open_records(path)] == payloads


def test_a_writer_that_cannot_open_both_files_leaves_neither_behind(tmp_path):
    # An index path in a missing folder raised FileNotFoundError but left an empty .rec behind.
    with pytest.raises(FileNotFoundError) as e:
        dlstore.RecordIOWriter(tmp_path / "r1.rec", idx_path=tmp_path / "nodir" / "r1.idx")
    assert e.value.filename == str(tmp_path / "nodir" / "r1.idx")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError) as e:  # the .rec cannot be made: the index made for it goes
        dlstore.RecordIOWriter(tmp_path / "nodir" / "r1.rec", idx_path=tmp_path / "r1.idx")
    assert e.value.filename == str(tmp_path / "nodir" / "r1.rec") and list(tmp_path.iterdir()) == []
    (tmp_path / "r1.idx").write_text("0\t0\n1\t99999\n")  # one there before is neither emptied nor removed
    with pytest.raises(FileNotFoundError):
        dlstore.RecordIOWriter(tmp_path / "nodir" / "r1.rec", idx_path=tmp_path / "r1.idx")
    assert (tmp_path / "r1.idx").read_text() == "0\t0\n1\t99999\n"
    with dlstore.RecordIOWriter(tmp_path / "r1.rec", idx_path=tmp_path / "r1.idx") as w:  # rewritten when both open
        w.write(b"abcd")
    assert (tmp_path / "r1.idx").read_text() == "0\t0\n"


def test_idx_offsets_point_at_records(tmp_path):
    path, idx = tmp_path / "d.rec", tmp_path / "d.idx"
    payloads = [bytes([i]) * (i * 7) for i in range(20)]
    with dlstore.RecordIOWriter(path, idx) as w:
        for p in payloads:
            w.write(p)
    keys, offsets = dlstore.formats.index.parse_recordio_index(idx.read_text())
    assert keys == list(range(20))
    blob = path.read_bytes()
    for o, p in zip(offsets.tolist(), payloads):
        assert blob[o:o + 4] == MAGIC and struct.unpack_from("<I", blob, o + 4)[0] == len(p)
    # the index the reader builds is the same
    from dlstore.sources.indexing import build_index

    out, n = build_index(str(path), out=str(tmp_path / "rebuilt.idx"))
    assert n == 20 and (tmp_path / "rebuilt.idx").read_text() == idx.read_text()


def test_bad_magic_and_truncation(tmp_path):
    path = tmp_path / "d.rec"
    with dlstore.RecordIOWriter(path) as w:
        for _ in range(5):
            w.write(b"z" * 100)
    blob = bytearray(path.read_bytes())
    blob[108] ^= 0xFF  # second record's magic
    (tmp_path / "bad.rec").write_bytes(bytes(blob))
    with pytest.raises(dlstore.CorruptRecordError, match="bad RecordIO magic") as e:
        list(dlstore.open_records(tmp_path / "bad.rec", format="recordio"))
    assert e.value.offset == 108
    (tmp_path / "trunc.rec").write_bytes(path.read_bytes()[:-50])
    with pytest.raises(dlstore.CorruptRecordError, match="truncated"):
        list(dlstore.open_records(tmp_path / "trunc.rec"))
    reader = dlstore.open_records(tmp_path / "bad.rec", format="recordio", on_error="skip")
    assert len(list(reader)) == 4 and reader.stats()["skipped"] == 1


def _frame(cflag, data):
    return struct.pack("<II", 0xCED7230A, (cflag << 29) | len(data)) + data + b"\0" * ((-len(data)) % 4)


@pytest.mark.parametrize("mode", ["raise", "skip"])
@pytest.mark.parametrize("case", ["orphan-end", "orphan-middle", "plain-inside", "restart-inside", "bad-cflag",
                                  "ends-after-start"])
def test_broken_multipart_records(tmp_path, mode, case):
    good = _frame(0, b"good")
    start, middle, end = _frame(1, b"AAAA"), _frame(2, b"BBBB"), _frame(3, b"CC")
    whole = b"AAAA" + MAGIC + b"BBBB" + MAGIC + b"CC"
    body, expect = {
        "orphan-end": (good + end + good, [b"good", b"good"]),
        "orphan-middle": (good + middle + end + good, [b"good", b"good"]),
        "plain-inside": (start + good + start + middle + end, [b"good", whole]),
        "restart-inside": (start + middle + start + middle + end, [whole]),
        "bad-cflag": (good + struct.pack("<II", 0xCED7230A, (5 << 29) | 4) + b"zzzz" + good, [b"good", b"good"]),
        "ends-after-start": (good + start, [b"good"]),
    }[case]
    path = tmp_path / "broken.rec"
    path.write_bytes(body)
    reader = dlstore.open_records(path, format="recordio", on_error=mode)
    if mode == "raise":
        with pytest.raises(dlstore.CorruptRecordError) as e:
            list(reader)
        assert e.value.path == str(path)
        return
    assert [bytes(r) for r in reader] == expect
    assert reader.stats()["skipped"] >= 1 and len(reader.corruptions()) == reader.stats()["skipped"]


def test_truncated_multipart_does_not_swallow_the_next_file(tmp_path):
    a, b = tmp_path / "a.rec", tmp_path / "b.rec"
    a.write_bytes(_frame(0, b"one") + _frame(1, b"AAAA") + _frame(2, b"BBBB"))  # no end part
    b.write_bytes(_frame(0, b"two") + _frame(0, b"three"))
    reader = dlstore.open_records([a, b], format="recordio", on_error="skip")
    assert [bytes(r) for r in reader] == [b"one", b"two", b"three"]
    assert [c[0] for c in reader.corruptions()] == [str(a)]


def test_extra_labels_read_back_through_the_reader(tmp_path):
    path = tmp_path / "labels.rec"
    with dlstore.RecordIOWriter(path) as w:
        for i in range(5):
            w.write(dlstore.recordio.pack(0, [i, i + 0.5], i, 0, bytes([i]) * 10))
    for i, rec in enumerate(dlstore.open_records(path)):
        header, data = dlstore.recordio.unpack(rec)
        assert header.flag == 2 and list(header.label) == [i, i + 0.5] and data == bytes([i]) * 10
