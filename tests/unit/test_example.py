"""tf.train.Example: the C++ parser and the Python encoder against a pure-Python protobuf oracle,
every corruption case, the batch path, and TensorFlow itself when it is installed."""

import re
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlstore
from dlstore.formats.example import encode_example, parse_batch, parse_example
from tests.helpers import Bad, oracle_decode

# ---- wire-format builders, for records no encoder would write -----------------------------------


def varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    return bytes(out + bytes([v]))


def ld(field: int, payload: bytes) -> bytes:
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def entry(name: bytes, feature: bytes) -> bytes:
    return ld(1, ld(1, name) + ld(2, feature))


def example(*entries: bytes) -> bytes:
    return ld(1, b"".join(entries))


# ---- the oracle (tests/helpers.py: a tiny, strict, pure-Python decoder) --------------------------


def oracle_as_parsed(decoded: dict) -> dict:
    """The oracle's result in parse_example's types."""
    out = {}
    for name, (kind, vals) in decoded.items():
        if kind == "int64":
            out[name] = np.array(vals, dtype=np.uint64).view(np.int64)
        elif kind == "float":
            out[name] = np.frombuffer(b"".join(vals), dtype="<f4")
        else:
            out[name] = list(vals)
    return out


def assert_same(got: dict, want: dict):
    assert list(got) == list(want)
    for name, w in want.items():
        g = got[name]
        if isinstance(w, np.ndarray):
            assert isinstance(g, np.ndarray) and g.dtype == w.dtype and g.ndim == 1, name
            assert g.tobytes() == w.tobytes(), name  # bitwise: NaN payloads and -0.0 included
        else:
            assert g == w, name


def expected_from_input(features: dict) -> dict:
    out = {}
    for name, v in features.items():
        if isinstance(v, np.ndarray) and v.dtype == np.float32:
            out[name] = v
        elif isinstance(v, np.ndarray) and v.dtype == object:
            out[name] = list(v)
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            out[name] = v
        else:
            out[name] = np.array(v, dtype=np.int64)
    return out


# ---- strategies ---------------------------------------------------------------------------------

int64s = st.integers(-(1 << 63), (1 << 63) - 1)
feature_values = st.one_of(
    st.lists(int64s, max_size=40),
    st.lists(st.floats(width=32), max_size=40).map(lambda v: np.array(v, dtype=np.float32)),
    st.lists(st.binary(max_size=30), min_size=1, max_size=6),
    st.lists(st.binary(max_size=30), max_size=0).map(lambda v: np.array(v, dtype=object)),
)
feature_dicts = st.dictionaries(st.text(max_size=12), feature_values, max_size=8)


# ---- the encoder --------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(feature_dicts, st.booleans())
def test_round_trip_through_oracle_and_parser(features, packed):
    record = encode_example(features, packed=packed)
    want = expected_from_input(features)
    assert_same(oracle_as_parsed(oracle_decode(record)), want)
    assert_same(parse_example(record), want)


def test_encoder_value_kinds():
    rec = encode_example(
        {
            "i": 3,
            "f": 0.5,
            "mixed": [1, 2.5],
            "b": b"x",
            "s": "h\u00e9",
            "bl": [b"a", b""],
            "u8": np.arange(3, dtype=np.uint8),
            "f64": np.array([1.5]),
            "e": [],
            "ef": np.array([], np.float32),
            "eb": np.array([], object),
            "t": True,
        }
    )
    got = parse_example(rec)
    assert got["i"].tolist() == [3] and got["i"].dtype == np.int64
    assert got["f"].tolist() == [0.5] and got["f"].dtype == np.float32
    assert got["mixed"].tolist() == [1.0, 2.5]
    assert got["b"] == [b"x"] and got["s"] == ["h\u00e9".encode()] and got["bl"] == [b"a", b""]
    assert got["u8"].tolist() == [0, 1, 2] and got["f64"].tolist() == [1.5]
    assert got["e"].dtype == np.int64 and got["e"].size == 0
    assert got["ef"].dtype == np.float32 and got["ef"].size == 0
    assert got["eb"] == [] and got["t"].tolist() == [1]
    assert encode_example({}) == b"\n\x00" and parse_example(b"") == {} and parse_example(b"\n\x00") == {}
    with pytest.raises(OverflowError):
        encode_example({"x": [1 << 63]})
    with pytest.raises(TypeError):
        encode_example({"x": [b"a", 1]})


def test_negative_int64_takes_ten_bytes():
    lo, hi = -(1 << 63), (1 << 63) - 1
    rec = encode_example({"n": [-1]})
    assert varint(-1) in rec and len(varint(-1)) == 10
    assert parse_example(encode_example({"n": [lo, -1, 0, hi]}))["n"].tolist() == [lo, -1, 0, hi]
    assert parse_example(encode_example({"n": [lo, -1]}, packed=False))["n"].tolist() == [lo, -1]


def test_packed_and_unpacked_parse_the_same():
    features = {"i": [1, 300, -5, 1 << 40], "f": [0.25, -1.0, 3.5]}
    packed, unpacked = encode_example(features), encode_example(features, packed=False)
    assert packed != unpacked
    for rec in (packed, unpacked):
        got = parse_example(rec)
        assert got["i"].tolist() == features["i"] and got["f"].tolist() == features["f"]
    # One list may mix packed runs and single values; protobuf concatenates them.
    mixed = example(
        entry(
            b"i", ld(3, varint(1 << 3) + varint(7) + ld(1, varint(8) + varint(9)) + varint(8) + varint(10))
        ),
        entry(b"f", ld(2, b"\x0d" + struct.pack("<f", 1.0) + ld(1, struct.pack("<2f", 2, 3)))),
    )
    got = parse_example(mixed)
    assert got["i"].tolist() == [7, 8, 9, 10] and got["f"].tolist() == [1.0, 2.0, 3.0]


def test_empty_lists_and_a_feature_with_no_kind():
    rec = example(
        entry(b"e64", ld(3, b"")), entry(b"ef", ld(2, b"")), entry(b"eb", ld(1, b"")), entry(b"none", b"")
    )
    got = parse_example(rec)
    assert got["e64"].dtype == np.int64 and got["e64"].size == 0
    assert got["ef"].dtype == np.float32 and got["ef"].size == 0
    assert got["eb"] == [] and got["none"] == []


def test_protobuf_merge_rules():
    # A repeated name: the last entry wins (position of the first kept).
    rec = example(
        entry(b"a", ld(3, ld(1, varint(1)))),
        entry(b"b", ld(1, ld(1, b"x"))),
        entry(b"a", ld(2, ld(1, b"\0\0\x80?"))),
    )
    got = parse_example(rec)
    assert list(got) == ["a", "b"] and got["a"].tolist() == [1.0]
    # The same kind twice in one Feature concatenates; another kind replaces.
    rec = example(
        entry(b"a", ld(3, ld(1, varint(1))) + ld(3, ld(1, varint(2))) + ld(1, ld(1, b"z"))),
        entry(b"c", ld(1, ld(1, b"z")) + ld(3, ld(1, varint(5)))),
    )
    got = parse_example(rec)
    assert got["a"] == [b"z"] and got["c"].tolist() == [5]
    # Value before key, two Features sections, unknown fields anywhere: all accepted.
    unknown = (
        varint(15 << 3 | 0) + varint(99) + varint(14 << 3 | 5) + b"abcd" + varint(13 << 3 | 1) + b"12345678"
    )
    rec = (
        ld(1, ld(1, ld(2, ld(3, ld(1, varint(4)) + unknown) + unknown) + ld(1, b"k") + unknown) + unknown)
        + unknown
        + ld(1, entry(b"j", ld(1, unknown + ld(1, b"v"))))
    )
    got = parse_example(rec)
    assert got["k"].tolist() == [4] and got["j"] == [b"v"]
    assert_same(got, oracle_as_parsed(oracle_decode(rec)))


def test_accepts_any_buffer():
    rec = encode_example({"x": [1, 2, 3]})
    for obj in (
        rec,
        bytearray(rec),
        memoryview(rec),
        np.frombuffer(rec, np.uint8),
        memoryview(b"??" + rec)[2:],
    ):
        assert parse_example(obj)["x"].tolist() == [1, 2, 3]
    with pytest.raises(TypeError):
        parse_example("not bytes")
    with pytest.raises(ValueError):
        parse_example(memoryview(rec * 2)[::2])


def test_parse_example_is_exported_at_top_level():
    assert dlstore.parse_example(encode_example({"x": [7]}))["x"].tolist() == [7]


# ---- hostile input -------------------------------------------------------------------------------

GOOD = encode_example({"input_ids": list(range(100, 140)), "w": [0.5, 1.5], "img": [b"\xff\xd8" * 10]})

CORRUPT = {
    "truncated varint in a packed list": (
        example(entry(b"a", ld(3, ld(1, varint(5) + b"\x80\x80")))),
        "truncated varint",
        14,
    ),
    "truncated unpacked value": (example(entry(b"a", ld(3, b"\x08\xff"))), "truncated varint", 12),
    "varint longer than 10 bytes": (
        example(entry(b"a", ld(3, ld(1, b"\xff" * 11)))),
        "longer than 10 bytes",
        13,
    ),
    "length past the end of its message": (
        example(entry(b"a", ld(3, b"\x0a\x05\x01"))),
        "runs past the end",
        12,
    ),
    "Features with a varint wire type": (ld(1, b"\x08\x01"), "wire type 0", 2),
    "Example.features with a varint wire type": (b"\x08\x01", "wire type 0", 0),
    "int64_list as a varint": (example(entry(b"a", b"\x18\x01")), "wire type 0", 9),
    "int64 value as fixed32": (example(entry(b"a", ld(3, b"\x0d\0\0\0\0"))), "wire type 5", 11),
    "float value as a varint": (example(entry(b"a", ld(2, b"\x08\x01"))), "wire type 0", 11),
    "bytes value as a varint": (example(entry(b"a", ld(1, b"\x08\x01"))), "wire type 0", 11),
    "feature name as a varint": (ld(1, ld(1, b"\x08\x01")), "wire type 0", 4),
    "packed floats not a multiple of 4": (
        example(entry(b"a", ld(2, ld(1, b"\0" * 6)))),
        "not a multiple of 4",
        12,
    ),
    "truncated unpacked float": (example(entry(b"a", ld(2, b"\x0d\0\0"))), "truncated 4-byte", 12),
    "group wire type": (example(b"\x13"), "group", 2),
    "invalid wire type": (example(entry(b"a", ld(3, b"\x17"))), "invalid wire type", 11),
    "field number 0": (example(entry(b"a", ld(3, b"\x00\x01"))), "invalid field number 0", 11),
    "truncated record": (GOOD[:-1], "runs past the end", 1),
    "absurd length": (ld(1, b"")[:1] + varint((1 << 64) - 1), "runs past the end", 1),
}


@pytest.mark.parametrize("name", list(CORRUPT))
def test_corrupt_records_raise_with_the_byte(name):
    record, what, byte = CORRUPT[name]
    with pytest.raises(Bad):
        oracle_decode(record)
    with pytest.raises(dlstore.CorruptRecordError) as info:
        parse_example(record)
    message = str(info.value)
    assert what in message, message
    assert f"at byte {byte} of the record" in message, message


def test_every_truncation_raises():
    for n in range(1, len(GOOD)):
        with pytest.raises(dlstore.CorruptRecordError):
            parse_example(GOOD[:n])


def test_invalid_utf8_name_is_corrupt():
    with pytest.raises(dlstore.CorruptRecordError, match="not valid UTF-8"):
        parse_example(example(entry(b"\xff\xfe", ld(3, b""))))


def test_hostile_names_are_escaped_in_messages():
    rec = example(entry(b"\x00\n" + b"n" * 100, ld(3, ld(1, b"\x80"))))
    with pytest.raises(dlstore.CorruptRecordError) as info:
        parse_example(rec)
    assert "\\x00\\x0a" in str(info.value) and "..." in str(info.value)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(feature_dicts, st.booleans(), st.data())
def test_mutated_records_agree_with_the_oracle(features, packed, data):
    """Random byte edits: the parser accepts exactly what the oracle accepts, with the same values."""
    record = bytearray(encode_example(features, packed=packed))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["set", "insert", "delete", "truncate"]))
        pos = data.draw(st.integers(0, len(record)))
        if op == "set" and pos < len(record):
            record[pos] = data.draw(st.integers(0, 255))
        elif op == "insert":
            record[pos:pos] = data.draw(st.binary(min_size=1, max_size=3))
        elif op == "delete":
            del record[pos : pos + data.draw(st.integers(1, 3))]
        else:
            del record[pos:]
    record = bytes(record)
    try:
        want = oracle_as_parsed(oracle_decode(record))
    except Bad:
        with pytest.raises(dlstore.CorruptRecordError):
            parse_example(record)
    else:
        assert_same(parse_example(record), want)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_crash(blob):
    try:
        oracle_decode(blob)
    except Bad:
        with pytest.raises(dlstore.CorruptRecordError):
            parse_example(blob)
    else:
        parse_example(blob)


# ---- the batch path ------------------------------------------------------------------------------


class Batch:
    """What parse_batch needs: a buffer and where each record lies in it."""

    def __init__(self, records, lead=0):
        offsets, blob = [], bytearray(b"\xaa" * lead)
        for r in records:
            offsets.append(len(blob))
            blob += r + b"\xbb"  # a gap between records, so no record may run into the next
        self.buffer = memoryview(bytes(blob))
        self.offsets = np.array(offsets, dtype=np.uint64)
        self.lengths = np.array([len(r) for r in records], dtype=np.uint64)


BERT_SPEC = {
    "input_ids": (np.int32, 128),
    "input_mask": (np.int32, 128),
    "segment_ids": (np.int32, 128),
    "masked_lm_positions": (np.int32, 20),
    "masked_lm_ids": (np.int32, 20),
    "masked_lm_weights": (np.float32, 20),
    "next_sentence_labels": (np.int64, 1),
}


def bert_records(n, seed=0, packed=True):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        f = {
            "input_ids": rng.integers(0, 30522, 128),
            "input_mask": rng.integers(0, 2, 128),
            "segment_ids": rng.integers(0, 2, 128),
            "masked_lm_positions": rng.integers(0, 128, 20),
            "masked_lm_ids": rng.integers(0, 30522, 20),
            "masked_lm_weights": rng.random(20).astype(np.float32),
            "next_sentence_labels": rng.integers(0, 2, 1),
        }
        names = list(f)
        rng.shuffle(names)  # records need not list features in the same order
        out.append((encode_example({k: f[k] for k in names}, packed=packed), f))
    return out


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("lead", [0, 1, 4093])
def test_batch_matches_per_record_parse(packed, lead):
    recs = bert_records(33, packed=packed)
    got = parse_batch(Batch([r for r, _ in recs], lead=lead), BERT_SPEC)
    assert list(got) == list(BERT_SPEC)
    for name, (dtype, length) in BERT_SPEC.items():
        arr = got[name]
        assert arr.shape == (33, length) and arr.dtype == dtype and arr.flags.c_contiguous
        want = np.stack([f[name] for _, f in recs]).astype(dtype)
        np.testing.assert_array_equal(arr, want)


def test_batch_through_the_reader(tmp_path):
    recs = bert_records(50, seed=3)
    path = tmp_path / "bert.tfrecord"
    with dlstore.TFRecordWriter(path) as w:
        for r, _ in recs:
            w.write(r)
    rows = []
    for batch in dlstore.open_records(path).batches():
        rows.append(parse_batch(batch, {"input_ids": (np.int64, 128), "masked_lm_weights": (np.float32, 20)}))
    ids = np.concatenate([r["input_ids"] for r in rows])
    np.testing.assert_array_equal(ids, np.stack([f["input_ids"] for _, f in recs]))


def test_batch_skips_unrequested_features_and_handles_empty():
    recs = [encode_example({"skip": [b"x"] * 3, "a": [1, 2], "extra": [0.5]}), encode_example({"a": [3, 4]})]
    got = parse_batch(Batch(recs), {"a": (np.int64, 2)})
    assert got["a"].tolist() == [[1, 2], [3, 4]]
    empty = parse_batch(Batch([]), {"a": (np.int64, 2), "w": (np.float32, 0)})
    assert empty["a"].shape == (0, 2) and empty["w"].shape == (0, 0)
    assert parse_batch(Batch(recs), {}) == {}


def test_batch_defaults():
    recs = [encode_example({"a": [1, 2]}), encode_example({}), example(entry(b"a", b""))]
    got = parse_batch(
        Batch(recs), {"a": (np.int64, 2, -1), "w": (np.float32, 3, [0.5, 1, 2]), "z": (np.int32, 0, 0)}
    )
    assert got["a"].tolist() == [[1, 2], [-1, -1], [-1, -1]]
    assert got["w"].tolist() == [[0.5, 1, 2]] * 3 and got["z"].shape == (3, 0)


def test_batch_last_entry_wins_and_lists_merge():
    rec = example(
        entry(b"a", ld(3, ld(1, varint(9)))), entry(b"a", ld(3, ld(1, varint(1))) + ld(3, ld(1, varint(2))))
    )
    assert parse_batch(Batch([rec]), {"a": (np.int64, 2)})["a"].tolist() == [[1, 2]]
    rec = example(entry(b"a", ld(2, ld(1, b"\0" * 12)) + ld(3, ld(1, varint(5) + varint(6)))))
    assert parse_batch(Batch([rec]), {"a": (np.int64, 2)})["a"].tolist() == [[5, 6]]


@pytest.mark.parametrize(
    "record, spec, pattern",
    [
        (encode_example({"b": [1]}), {"a": (np.int64, 1)}, r"record 1: feature 'a': missing"),
        (example(entry(b"a", b"")), {"a": (np.int64, 1)}, r"record 1: feature 'a': has no value list"),
        (
            encode_example({"a": [1, 2, 3]}),
            {"a": (np.int64, 2)},
            r"record 1: feature 'a': has 3 values, expected 2",
        ),
        (
            encode_example({"a": [1]}),
            {"a": (np.int64, 2)},
            r"record 1: feature 'a': has 1 values, expected 2",
        ),
        (
            encode_example({"a": [0.5, 1.5]}),
            {"a": (np.int64, 2)},
            r"feature 'a': is a float_list, expected int64_list",
        ),
        (
            encode_example({"a": [1, 2]}),
            {"a": (np.float32, 2)},
            r"feature 'a': is a int64_list, expected float_list",
        ),
        (encode_example({"a": [b"x", b"y"]}), {"a": (np.int32, 2)}, r"feature 'a': is a bytes_list"),
        (
            encode_example({"a": [1, 1 << 31]}),
            {"a": (np.int32, 2)},
            r"value 2147483648 does not fit in int32",
        ),
        (encode_example({"a": [-(1 << 31) - 1]}), {"a": (np.int32, 1)}, r"does not fit in int32"),
    ],
)
def test_batch_mismatches_name_record_and_feature(record, spec, pattern):
    good = encode_example({"a": np.zeros(spec["a"][1], dtype=spec["a"][0])})
    with pytest.raises(dlstore.DlstoreError, match=pattern) as info:
        parse_batch(Batch([good, record]), spec)
    assert not isinstance(info.value, dlstore.CorruptRecordError)


@pytest.mark.parametrize("name", list(CORRUPT))
def test_batch_corruption_names_the_record(name):
    record = CORRUPT[name][0]
    good = encode_example({"a": [1]})
    with pytest.raises(dlstore.CorruptRecordError, match=r"^record 2: .*at byte \d+ of the record"):
        parse_batch(Batch([good, good, record]), {"a": (np.int64, 1)})


def test_batch_spec_errors():
    b = Batch([encode_example({"a": [1]})])
    with pytest.raises(ValueError, match="not supported"):
        parse_batch(b, {"a": (np.bytes_, 1)})
    with pytest.raises(ValueError, match="not supported"):
        parse_batch(b, {"a": (np.float64, 1)})
    with pytest.raises(ValueError, match=">= 0"):
        parse_batch(b, {"a": (np.int64, -1)})
    with pytest.raises(ValueError, match="default"):
        parse_batch(b, {"a": (np.int64, 3, [1, 2])})
    with pytest.raises(ValueError):
        parse_batch(b, {"a": (np.int64,)})


def test_batch_records_outside_the_buffer():
    b = Batch([encode_example({"a": [1]})])
    b.lengths = b.lengths + np.uint64(10)
    with pytest.raises(dlstore.DlstoreError, match="outside the buffer"):
        parse_batch(b, {"a": (np.int64, 1)})
    b.offsets = np.array([2**64 - 1], dtype=np.uint64)
    with pytest.raises(dlstore.DlstoreError, match="outside the buffer"):
        parse_batch(b, {"a": (np.int64, 1)})


# ---- TensorFlow itself -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip(
        "tensorflow", reason="tensorflow is not installed; the TF comparison is skipped"
    )


def _tf_example(tf, features):
    def feature(v):
        if isinstance(v, np.ndarray) and v.dtype == np.float32:
            return tf.train.Feature(float_list=tf.train.FloatList(value=v.tolist()))
        if (
            isinstance(v, np.ndarray)
            and v.dtype == object
            or (isinstance(v, list) and v and isinstance(v[0], bytes))
        ):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(v)))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=list(v)))

    return tf.train.Example(features=tf.train.Features(feature={k: feature(v) for k, v in features.items()}))


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(feature_dicts)
def test_against_tensorflow_serialization(tf, features):
    serialized = _tf_example(tf, features).SerializeToString()
    want = expected_from_input(features)
    got = parse_example(serialized)
    assert sorted(got) == sorted(want)
    assert_same({k: got[k] for k in want}, want)
    # TensorFlow's map order is its own; one feature at a time, the bytes must be identical.
    for name, value in features.items():
        assert encode_example({name: value}) == _tf_example(tf, {name: value}).SerializeToString()
    # Deterministic serialization sorts map keys, so the whole records compare too (NaN included).
    ours = tf.train.Example.FromString(encode_example(features)).SerializeToString(deterministic=True)
    assert ours == _tf_example(tf, features).SerializeToString(deterministic=True)


@pytest.mark.slow
def test_batch_against_tf_io_parse_single_example(tf):
    recs = bert_records(8, seed=11)
    tf_spec = {
        name: tf.io.FixedLenFeature([length], tf.float32 if dtype == np.float32 else tf.int64)
        for name, (dtype, length) in BERT_SPEC.items()
    }
    got = parse_batch(Batch([r for r, _ in recs]), BERT_SPEC)
    for i, (rec, _) in enumerate(recs):
        ref = tf.io.parse_single_example(rec, tf_spec)
        for name, (dtype, _length) in BERT_SPEC.items():
            np.testing.assert_array_equal(got[name][i], ref[name].numpy().astype(dtype))
    # Variable-length reading of a record TensorFlow wrote.
    ex = _tf_example(tf, {"ids": [5, -7, 1 << 40], "w": np.array([0.5, -2], np.float32), "s": [b"ab", b""]})
    parsed = parse_example(ex.SerializeToString())
    ref = tf.io.parse_single_example(
        ex.SerializeToString(),
        {
            "ids": tf.io.VarLenFeature(tf.int64),
            "w": tf.io.VarLenFeature(tf.float32),
            "s": tf.io.VarLenFeature(tf.string),
        },
    )
    assert parsed["ids"].tolist() == ref["ids"].values.numpy().tolist()
    assert parsed["w"].tolist() == ref["w"].values.numpy().tolist()
    assert parsed["s"] == ref["s"].values.numpy().tolist()


def test_message_names_the_problem_clearly():
    with pytest.raises(dlstore.CorruptRecordError) as info:
        parse_example(CORRUPT["length past the end of its message"][0])
    assert re.fullmatch(
        r"feature 'a': at byte 12 of the record: length 5 of packed int64_list runs past the end "
        r"of its message \(1 bytes left\)",
        str(info.value),
    ), str(info.value)
