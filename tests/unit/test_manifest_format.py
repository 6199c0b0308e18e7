"""The manifest's bytes (dlstore.formats.manifest): round trip, both offset widths, refusals."""
import numpy as np
import pytest

import json

from dlstore.formats.manifest import MAGIC, MAGIC_V1, STAMP_AT, decode_manifest, encode_manifest, encode_stamp


def _pack(sizes, counts, offsets, names=None):
    names = names or [f"s{i}" for i in range(len(sizes))]
    return b"".join(bytes(p) for p in encode_manifest("tfrecord", names, sizes, [7] * len(sizes), counts, offsets))


def test_round_trip_and_frames():
    # Shard 0: frames at 0, 20, 50 in 80 bytes; shard 1: empty; shard 2: one frame of 16 bytes.
    blob = _pack([80, 0, 16], [3, 0, 1], np.array([0, 20, 50, 0], np.uint64))
    m = decode_manifest(blob)
    assert m.format == "tfrecord" and m.names == ["s0", "s1", "s2"] and m.offsets.dtype == np.dtype("<u4")
    assert m.first.tolist() == [0, 3, 3, 4] and m.mtimes.tolist() == [7, 7, 7]
    offset, size = m.frames(np.array([0, 0, 0, 2]), np.array([0, 1, 2, 0]))
    assert offset.tolist() == [0, 20, 50, 0] and size.tolist() == [20, 30, 30, 16]
    assert m.shard_offsets(0).tolist() == [0, 20, 50] and m.shard_offsets(1).tolist() == []


def test_wide_offsets_for_shards_over_4_gib():
    big = 5 << 30
    m = decode_manifest(_pack([big], [2], np.array([0, big - 100], np.uint64)))
    assert m.offsets.dtype == np.dtype("<u8")
    assert m.frames(np.array([0, 0]), np.array([0, 1]))[1].tolist() == [big - 100, 100]


@pytest.mark.parametrize("damage, match", [
    (lambda b: b"XXXXXXXX" + b[8:], "bad magic"),
    (lambda b: b[:-4], "has .* bytes, its header describes"),
    (lambda b: b[:20], "cut short"),
    (lambda b: MAGIC + b[8:24] + b"{" * (len(b) - 24), "unreadable header"),
])
def test_damage_is_refused_naming_the_file(damage, match):
    blob = _pack([80], [3], np.array([0, 20, 50], np.uint64))
    with pytest.raises(ValueError, match=match) as e:
        decode_manifest(damage(blob), "/data/.dlstore-manifest")
    assert "/data/.dlstore-manifest" in str(e.value)


def test_counts_must_match_offsets():
    with pytest.raises(ValueError, match="3 records counted but 2 offsets"):
        encode_manifest("tfrecord", ["a"], [10], [0], [3], np.array([0, 5], np.uint64))


def test_the_listing_and_the_stamp():
    parts = encode_manifest("tfrecord", ["a", "b"], [16, 16], [1, 2], [1, 1], np.array([0, 0], np.uint64),
                            listing=["a", "b", "c"])
    blob = bytearray(b"".join(bytes(p) for p in parts))
    m = decode_manifest(bytes(blob))
    assert m.stamp == 0 and m.names == ["a", "b"] and bytes(m.listing_blob) == b"a\nb\nc" and m.version == 2
    blob[STAMP_AT:STAMP_AT + 8] = encode_stamp(123456789)  # set in place, once the listing is known current
    assert decode_manifest(bytes(blob)).stamp == 123456789
    same = encode_manifest("tfrecord", ["a"], [16], [1], [1], np.array([0], np.uint64), listing=["a"])
    assert decode_manifest(b"".join(bytes(p) for p in same)).listing_blob is None  # not stored twice
    assert m.offsets_at % 8 == 0 and len(blob) == m.offsets_at + 4 * 2


def test_version_1_is_still_read():
    header = json.dumps({"format": "tfrecord", "shards": 2, "records": 3, "offset_bytes": 4,
                         "names": ["x", "y"]}).encode()
    head = MAGIC_V1 + np.uint64(len(header)).astype("<u8").tobytes() + header
    head += b"\0" * (-len(head) % 8)
    body = np.array([30, 16], "<i8").tobytes() + np.array([5, 6], "<i8").tobytes() + np.array([2, 1], "<i8").tobytes()
    m = decode_manifest(head + body + np.array([0, 14, 0], "<u4").tobytes())
    assert m.version == 1 and m.names == ["x", "y"] and m.counts.tolist() == [2, 1] and m.stamp == 0
    assert m.frames(np.array([0, 0, 1]), np.array([0, 1, 0]))[1].tolist() == [14, 16, 16]


def test_one_registry_of_record_formats(tmp_path):
    from dlstore.formats.detect import detect
    from dlstore.formats.registry import FORMATS, format_named
    from dlstore.sources.indexing import index_path_for

    assert list(FORMATS) == ["tfrecord", "recordio"] and format_named("recordio").title == "RecordIO"
    assert [f.name for f in FORMATS.values() if f.device_reads] == ["tfrecord"]
    assert index_path_for(str(tmp_path / "a.rec"), "recordio") == str(tmp_path / "a.idx")
    assert index_path_for(str(tmp_path / "a.rec"), "tfrecord") == str(tmp_path / "a.rec.idx")
    assert detect("x.rec", b"") == ("recordio", "none") and detect("x", b"\x1f\x8b") == ("tfrecord", "gzip")
    with pytest.raises(ValueError, match="recordio files do not come compressed"):
        detect("x.rec", b"", "recordio", "gzip")
    from dlstore.formats.detect import FormatMismatchError
    from dlstore.formats.recordio import MAGIC
    from dlstore.formats.tfrecord import masked_crc32c

    length = (5).to_bytes(8, "little")
    tf_head, rec_head = length + masked_crc32c(length).to_bytes(4, "little"), MAGIC.to_bytes(4, "little") + bytes(8)
    with pytest.raises(FormatMismatchError, match="x.rec: at byte 0: format 'recordio' was given, but the file "
                                                  "starts as TFRecord files do; pass format='tfrecord' or 'auto'"):
        detect("x.rec", tf_head, "recordio")
    with pytest.raises(FormatMismatchError, match="starts as RecordIO files do"):
        detect("x", rec_head, "tfrecord")
    damaged = bytearray(tf_head)
    damaged[9] ^= 1  # a first record that looks like no format is the corruption it is, read as the format given
    assert detect("x", bytes(damaged), "recordio") == ("recordio", "none")
    assert detect("x", tf_head, "tfrecord") == ("tfrecord", "none") and detect("x", b"", "recordio")[0] == "recordio"
    for f in FORMATS.values():  # an index written by a format is read back by it
        offsets, sizes = f.parse_index(f.format_index(np.array([0, 30], np.uint64), np.array([14, 20], np.uint64)),
                                       "idx")
        assert offsets.tolist() == [0, 30] and (sizes is None or sizes.tolist() == [30, 36])
