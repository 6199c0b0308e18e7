"""TFRecord framing against the pure-Python oracle, and every corruption case."""
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dlstore
from dlstore import _C
from tests.helpers import ENGINES, oracle_crc32c, oracle_masked, oracle_read_tfrecord, write_tfrecord


@given(st.binary(max_size=5000), st.integers(0, 2**32 - 1))
def test_crc32c_matches_oracle(data, seed):
    assert _C.crc32c(data) == oracle_crc32c(data)
    assert _C.masked_crc32c(data) == oracle_masked(data)


def test_crc32c_long_buffers_use_the_interleaved_path():
    # The hardware path splits buffers of >= 12 KiB into three streams and joins them.
    rng = np.random.default_rng(1)
    for n in [12287, 12288, 12289, 40000, 100_003]:
        data = rng.bytes(n)
        assert _C.crc32c(data) == oracle_crc32c(data), n
    assert _C.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value


def test_writer_output_equals_oracle(tmp_path, payloads):
    path = tmp_path / "w.tfrecord"
    with dlstore.TFRecordWriter(path) as w:
        for r in payloads:
            w.write(r)
    assert oracle_read_tfrecord(path.read_bytes()) == payloads
    raw = path.read_bytes()
    n = struct.unpack_from("<Q", raw)[0]
    assert struct.unpack_from("<I", raw, 8)[0] == oracle_masked(raw[:8])
    assert struct.unpack_from("<I", raw, 12 + n)[0] == oracle_masked(raw[12:12 + n])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.binary(max_size=3000), max_size=40), st.sampled_from(ENGINES),
       st.sampled_from([None, "gzip", "zlib"]))
def test_round_trip(tmp_path_factory, records, engine, compression):
    path = tmp_path_factory.mktemp("rt") / "r.tfrecord"
    with dlstore.TFRecordWriter(path, compression=compression) as w:
        for r in records:
            w.write(r)
    got = [bytes(r) for r in dlstore.open_records(path, io=engine, chunk_size=64 << 10)]
    assert got == records


def _corrupt(tmp_path, records, mutate, name="bad.tfrecord"):
    blob = bytearray(Path(write_tfrecord(tmp_path / "good.tfrecord", records)).read_bytes())
    blob = mutate(blob)
    path = tmp_path / name
    path.write_bytes(bytes(blob))
    return str(path)


@pytest.mark.parametrize("engine", ENGINES)
def test_bad_data_crc_names_file_and_offset(tmp_path, engine):
    records = [b"a" * 100, b"b" * 200, b"c" * 300]
    second = 16 + 100

    def flip(b):
        b[second + 12 + 50] ^= 0x01
        return b

    path = _corrupt(tmp_path, records, flip)
    with pytest.raises(dlstore.CorruptRecordError) as e:
        list(dlstore.open_records(path, io=engine))
    assert e.value.path == path and e.value.offset == second
    assert "bad data CRC" in str(e.value) and path in str(e.value) and str(second) in str(e.value)


def test_bad_length_crc(tmp_path):
    path = _corrupt(tmp_path, [b"x" * 10, b"y" * 10], lambda b: b[:26] + bytes([b[26] ^ 4]) + b[27:])
    with pytest.raises(dlstore.CorruptRecordError, match="bad length CRC") as e:
        list(dlstore.open_records(path))
    assert e.value.offset == 26


def test_truncated_record(tmp_path):
    path = _corrupt(tmp_path, [b"x" * 1000, b"y" * 1000], lambda b: b[:-7])
    with pytest.raises(dlstore.CorruptRecordError, match="truncated record") as e:
        list(dlstore.open_records(path))
    assert e.value.offset == 1016


def test_truncated_header(tmp_path):
    path = _corrupt(tmp_path, [b"x" * 10], lambda b: b + b"\x05\x00\x00")
    with pytest.raises(dlstore.CorruptRecordError, match="truncated record header") as e:
        list(dlstore.open_records(path, format="tfrecord"))
    assert e.value.offset == 26


@pytest.mark.parametrize("verify", [True, False])
def test_hostile_length_is_refused_without_allocating(tmp_path, verify):
    # A length of 2**62 with a valid length CRC: the reader must say so, not try to allocate it.
    n = struct.pack("<Q", 1 << 62)
    blob = n + struct.pack("<I", oracle_masked(n)) + b"tiny"
    path = tmp_path / "hostile.tfrecord"
    path.write_bytes(blob)
    with pytest.raises(dlstore.CorruptRecordError, match="remain in the file|larger than the rest"):
        list(dlstore.open_records(path, format="tfrecord", verify=verify))


def test_hostile_length_in_compressed_file(tmp_path):
    import gzip

    n = struct.pack("<Q", 1 << 40)
    path = tmp_path / "hostile.tfrecord.gz"
    path.write_bytes(gzip.compress(n + struct.pack("<I", oracle_masked(n)) + b"tiny"))
    with pytest.raises(dlstore.CorruptRecordError, match="max_record_bytes"):
        list(dlstore.open_records(path))


def test_skip_mode_counts_and_keeps_the_rest(tmp_path):
    records = [bytes([i]) * (100 + i) for i in range(50)]
    offsets = np.cumsum([0] + [16 + len(r) for r in records])

    def damage(b):
        b[int(offsets[10]) + 20] ^= 0xFF  # data CRC of record 10
        b[int(offsets[30]) + 3] ^= 0x01   # length field of record 30: framing lost, resync
        return b

    path = _corrupt(tmp_path, records, damage)
    reader = dlstore.open_records(path, on_error="skip")
    got = [bytes(r) for r in reader]
    assert got == records[:10] + records[11:30] + records[31:]
    assert reader.stats()["skipped"] == 2
    assert [c[1] for c in reader.corruptions()] == [int(offsets[10]), int(offsets[30])]


def test_compressed_truncated_stream(tmp_path):
    path = tmp_path / "t.tfrecord.gz"
    with dlstore.TFRecordWriter(path, compression="gzip") as w:
        for _ in range(100):
            w.write(os.urandom(1000))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(dlstore.CorruptRecordError):
        list(dlstore.open_records(path))


def test_verify_off_reads_corrupt_data(tmp_path):
    path = _corrupt(tmp_path, [b"a" * 100], lambda b: b[:40] + b"Z" + b[41:])
    assert len([bytes(r) for r in dlstore.open_records(path, verify=False)]) == 1


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("where", ["data", "length"])
def test_good_records_before_the_error_are_delivered(tmp_path, engine, where):
    records = [bytes([i]) * 500 for i in range(40)]
    at = 25 * 516

    def damage(b):
        b[at + (100 if where == "data" else 2)] ^= 0x10
        return b

    path = _corrupt(tmp_path, records, damage)
    got = []
    with pytest.raises(dlstore.CorruptRecordError) as e:
        for r in dlstore.open_records(path, io=engine):
            got.append(bytes(r))
    assert got == records[:25] and e.value.offset == at


def test_warn_mode_warns_per_corruption(tmp_path):
    records = [bytes([i]) * 100 for i in range(10)]

    def damage(b):
        b[3 * 116 + 50] ^= 1
        return b

    path = _corrupt(tmp_path, records, damage)
    with pytest.warns(RuntimeWarning, match=f"at byte {3 * 116}: bad data CRC"):
        got = [bytes(r) for r in dlstore.open_records(path, on_error="warn")]
    assert got == records[:3] + records[4:]


def test_crc_of_strided_buffers_is_refused_or_right():
    data = np.arange(10, dtype=np.uint8)
    with pytest.raises((BufferError, ValueError, TypeError)):
        _C.crc32c(data[::2])
    assert _C.crc32c(np.ascontiguousarray(data[::2])) == oracle_crc32c(bytes(data[::2]))


@pytest.mark.parametrize("damage", ["truncate", "corrupt"])
def test_compressed_errors_come_after_the_good_records(tmp_path, damage):
    import zlib

    records = [os.urandom(3000) for _ in range(400)]
    raw = b"".join(dlstore.formats.tfrecord.frame_parts(r)[0] + r + dlstore.formats.tfrecord.frame_parts(r)[1]
                   for r in records)
    comp = zlib.compress(raw, 1)
    comp = comp[:len(comp) * 3 // 4] if damage == "truncate" else comp[:len(comp) * 3 // 4] + b"\xff" * 64
    path = tmp_path / "d.tfrecord.zlib"
    path.write_bytes(comp)
    got = []
    with pytest.raises(dlstore.CorruptRecordError) as e:
        for r in dlstore.open_records(path, chunk_size=64 << 10):
            got.append(bytes(r))
    assert len(got) > 100 and got == records[:len(got)]
    assert e.value.path == str(path) and e.value.offset is not None
