"""The C++ plan reader behind ``Dataset``: records located by the index, read in large reads, handed out
in the planned order. What it must do beyond the exactly-once tests of test_dataset.py: check every frame
(corrupt data raised or skipped, named by file and offset), join multi-part RecordIO records, notice a
file that changed since its index was made, keep the shuffle buffer within its bounds, and hand out
views where it can."""
import collections
import os
import struct

import numpy as np
import pytest

import dlstore
from dlstore.sources.dataset import Dataset
from dlstore.sources.indexing import ensure_index
from dlstore.placement.world import World
from dlstore.placement import SHUFFLES
from tests.helpers import ENGINES, batch_records, check_engine, flip_data_byte, records_until_error, write_tfrecord


def _shards(directory, counts, seed=0, size=(100, 20_000)):
    rng = np.random.default_rng(seed)
    data = {}
    for s, n in enumerate(counts):
        recs = [b"%d.%d|" % (s, i) + rng.bytes(int(rng.integers(*size))) for i in range(n)]
        data[write_tfrecord(os.path.join(directory, f"part-{s}.tfrecord"), recs)] = recs
    return data


def _read(ds):
    return [r for b in ds.batches() for r in batch_records(b)]



@pytest.mark.parametrize("shuffle", ["none", "block", "global"])
def test_a_corrupt_record_is_raised_after_the_good_ones_naming_file_and_offset(tmp_path, shuffle):
    data = _shards(tmp_path, [30, 30])
    path = sorted(data)[1]
    ds = Dataset(tmp_path, shuffle=shuffle, batch_size=4, seed=1, buffer_size=8, block_size=64 << 10,
                 remainder="uneven")
    order = _read(ds)  # the planned order, before the damage
    offset = flip_data_byte(path, 7, ensure_index(path)[1])
    bad = data[path][7]
    ds.set_epoch(0)
    got, err = records_until_error(ds, dlstore.CorruptRecordError)
    assert err.path == path and err.offset == offset
    assert f"{path}: at byte {offset}: bad data CRC" in str(err)
    assert got == order[:order.index(bad)]  # every record planned before it, and nothing else


@pytest.mark.parametrize("policy", ["skip", "warn"])
def test_corrupt_records_can_be_skipped_counted_and_listed(tmp_path, policy):
    data = _shards(tmp_path, [20, 25])
    path = sorted(data)[0]
    ds = Dataset(tmp_path, shuffle="block", batch_size=6, on_error=policy, buffer_size=5, block_size=64 << 10,
                 remainder="uneven")  # indexed before the damage: the index is sound, the data not
    _, frames = ensure_index(path)
    offsets = [flip_data_byte(path, r, frames) for r in (3, 11)]
    if policy == "warn":
        with pytest.warns(RuntimeWarning, match="bad data CRC") as caught:
            got = _read(ds)
        assert len(caught) == 2
    else:
        got = _read(ds)
    good = [r for recs in data.values() for r in recs]
    del good[11], good[3]
    assert collections.Counter(got) == collections.Counter(good)
    assert ds.stats()["skipped"] == 2
    assert sorted((p, o) for p, o, _ in ds.corruptions()) == [(path, offsets[0]), (path, offsets[1])]


@pytest.mark.parametrize("policy", ["skip", "warn"])
def test_a_corrupt_record_padded_into_another_window_is_counted_once(tmp_path, monkeypatch, policy):
    # A global shuffle planned in windows: the epoch's first record (corrupt) is padded into its last window,
    # whose reader skipped it again: counted and listed twice. Nine one-record shards, batch 2: 8 records in
    # the first window (4 batches), then the ninth and the pad repeat of the first. The ninth is corrupt too:
    # under warn, the second window's reader's first skip went unwarned (the counts were the first reader's).
    monkeypatch.setenv("DLSTORE_PLAN_WINDOW_FILES", "1")
    for d in ("clean", "damaged"):
        (tmp_path / d).mkdir()
    clean, damaged = ([write_tfrecord(tmp_path / d / f"s{k}.tfrecord", [b"%d" % k * 50]) for k in range(9)]
                      for d in ("clean", "damaged"))
    ds = Dataset(clean, batch_size=2, shuffle="global", seed=3, on_error=policy)
    assert ds.plan(0).num_samples(0) == 10
    order = _read(ds)
    assert order[9] == order[0]  # the pad repeat
    for record in (order[0], order[8]):
        bad = damaged[int(record[:1])]
        flip_data_byte(bad, 0, ensure_index(bad)[1])
    ds = Dataset(damaged, batch_size=2, shuffle="global", seed=3, on_error=policy)
    if policy == "warn":
        with pytest.warns(RuntimeWarning, match="bad data CRC") as caught:
            got = _read(ds)
        assert sorted(str(w.message).split(":")[0] for w in caught) == sorted(
            str(damaged[int(record[:1])]) for record in (order[0], order[8]))  # each bad record, once
    else:
        got = _read(ds)
    assert got == order[1:8]
    assert ds.stats()["skipped"] == 2 and ds.stats()["life"]["skipped"] == 2 and len(ds.corruptions()) == 2


@pytest.mark.parametrize("policy", ["skip", "warn"])
def test_a_corrupt_record_padded_into_an_epoch_again_is_skipped_and_counted_once(tmp_path, policy):
    # One corrupt record, batch_size=4, remainder="pad": the record and its three padded repeats counted as 4
    # skipped, listed and warned of 4 times; the life count (what dlstore.metrics exports) too.
    path = write_tfrecord(tmp_path / "junk.tfrecord", [b"a" * 100])
    flip_data_byte(path, 0, ensure_index(path)[1])
    ds = Dataset(path, batch_size=4, on_error=policy)
    assert ds.plan(0).num_samples(0) == 4  # the record and three repeats
    if policy == "warn":
        with pytest.warns(RuntimeWarning, match="bad data CRC") as caught:
            assert _read(ds) == []
        assert len(caught) == 1
    else:
        assert _read(ds) == []
    assert ds.stats()["skipped"] == 1 and ds.stats()["life"]["skipped"] == 1 and len(ds.corruptions()) == 1
    # Two bad records of five, padded to 8 (three repeats: the first three records again); a Loader's count too.
    from dlstore.formats.example import encode_example
    from dlstore.pipeline.bert import Bert
    from dlstore.pipeline.loader import Loader

    rows = [encode_example({"input_ids": np.arange(8) + i, "input_mask": np.ones(8, np.int64),
                            "segment_ids": np.zeros(8, np.int64), "masked_lm_positions": np.arange(2),
                            "masked_lm_ids": np.full(2, i), "masked_lm_weights": np.ones(2, np.float32),
                            "next_sentence_labels": np.array([i % 2])}) for i in range(5)]
    five = write_tfrecord(tmp_path / "five.tfrecord", rows)
    _, frames = ensure_index(five)
    for r in (0, 3):
        flip_data_byte(five, r, frames)
    ds = Dataset(five, batch_size=8, shuffle="none", shuffle_shards=False, on_error="skip")
    loader = Loader(ds, Bert(8, 2), 8, last_batch="PARTIAL")
    got = [b["input_ids"][:, 0].tolist() for b in loader]
    assert got == [[1, 2, 4, 1, 2]]  # records 1, 2 and 4, and the repeats of 1 and 2
    assert ds.stats()["skipped"] == 2 and ds.stats()["life"]["skipped"] == 2 and len(ds.corruptions()) == 2
    assert loader.stats()["skipped"] == 2


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("shuffle", ["none", "block", "global"])
def test_multipart_recordio_records_are_joined(tmp_path, engine, shuffle):
    magic = struct.pack("<I", 0xCED7230A)
    rng = np.random.default_rng(5)
    payloads = []
    for i in range(40):  # every third record holds the magic word, so it is written in parts
        body = rng.bytes(int(rng.integers(0, 5000)))
        payloads.append(body[:100] + magic + body[100:] + (magic + b"tail" if i % 6 == 0 else b"")
                        if i % 3 == 0 else body)
    path = os.fspath(tmp_path / "x.rec")
    with dlstore.RecordIOWriter(path, idx_path=os.fspath(tmp_path / "x.idx")) as w:
        for p in payloads:
            w.write(p)
    ds = Dataset(path, format="recordio", shuffle=shuffle, batch_size=7, io=engine, buffer_size=9, seed=2,
                 remainder="uneven")
    got = _read(ds)
    assert collections.Counter(got) == collections.Counter(payloads)
    if shuffle != "none":
        assert got != payloads


def test_a_file_changed_since_its_index_is_named(tmp_path):
    data = _shards(tmp_path, [10, 10])
    ds = Dataset(tmp_path, shuffle="none", shuffle_shards=False, batch_size=5, remainder="uneven")
    path = sorted(data)[1]
    size = os.path.getsize(path)
    os.truncate(path, size // 2)
    got = []
    with pytest.raises(dlstore.DlstoreError, match="did the file change since its index was made") as e:
        for b in ds.batches():
            got += batch_records(b)
    assert e.value.path == path and got == data[sorted(data)[0]]


def test_a_frame_that_disagrees_with_the_index_is_corrupt(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", [b"x" * 50, b"y" * 60, b"z" * 70])
    ds = Dataset(path, shuffle="none", batch_size=3)
    with open(path, "r+b") as f:  # record 1 now claims 61 bytes: its length CRC is made to match
        f.seek(66)
        header = struct.pack("<Q", 61)
        f.write(header + struct.pack("<I", _masked_crc(header)))
    with pytest.raises(dlstore.CorruptRecordError, match="length field says 61 bytes .* index is stale"):
        _read(ds)


def test_a_damaged_manifest_is_named_beside_the_healthy_shard_it_misplaces(tmp_path):
    from dlstore.formats.manifest import MANIFEST_NAME

    path = write_tfrecord(tmp_path / "a.tfrecord", [b"x" * 50, b"y" * 60, b"z" * 70])
    Dataset(tmp_path, shuffle="none", batch_size=3)  # writes the manifest
    manifest = os.fspath(tmp_path / MANIFEST_NAME)
    with open(manifest, "r+b") as f:  # the last frame offset, the file's last 4 bytes (u32), 3 bytes off
        f.seek(-4, os.SEEK_END)
        last = struct.unpack("<I", f.read(4))[0]
        f.seek(-4, os.SEEK_END)
        f.write(struct.pack("<I", last + 3))
    with pytest.raises(dlstore.CorruptRecordError) as e:
        _read(Dataset(tmp_path, shuffle="none", batch_size=3))
    assert e.value.path == path and "the index" in e.value.reason
    assert str(e.value).endswith(f"(its frame offsets come from {manifest}: if `dlstore verify {path}` finds the "
                                 f"file sound, `dlstore index {tmp_path}` rebuilds them)")
    # As it says: the shard is unchanged, so only an explicit index mends the manifest.
    import subprocess
    import sys

    from tests.helpers import REPO

    done = subprocess.run([sys.executable, "-m", "dlstore", "index", os.fspath(tmp_path)], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert _read(Dataset(tmp_path, shuffle="none", batch_size=3)) == [b"x" * 50, b"y" * 60, b"z" * 70]


# A shard cut inside its last record, indexed as it is: the cut tail is a frame of its own, and the read
# names it in the words open_records uses (not as an index that disagrees with its file).
_CUTS = {"in the header": 6, "after the length field": 13, "in the data": 100}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("shuffle", ["none", "block", "global"])
@pytest.mark.parametrize("cut", sorted(_CUTS))
@pytest.mark.parametrize("verify", [True, False])
def test_a_shard_cut_inside_its_last_record_is_named_as_open_records_names_it(tmp_path, engine, shuffle, cut,
                                                                              verify):
    records = [b"%d|" % i + b"x" * (200 + 37 * i) for i in range(12)]
    whole = write_tfrecord(tmp_path / "whole.tfrecord", records)
    last = os.path.getsize(whole) - (16 + len(records[-1]))
    path = os.fspath(tmp_path / "cut" / "x.tfrecord")
    os.makedirs(os.path.dirname(path))
    with open(whole, "rb") as f, open(path, "wb") as out:
        out.write(f.read(last + _CUTS[cut]))
    with pytest.raises(dlstore.CorruptRecordError) as scanned:
        list(dlstore.open_records(path, verify=verify))
    assert scanned.value.offset == last and "index" not in str(scanned.value)

    ds = Dataset(path, shuffle=shuffle, batch_size=5, io=engine, seed=3, verify=verify, remainder="uneven")
    got, err = records_until_error(ds, dlstore.CorruptRecordError)
    assert str(err) == str(scanned.value)
    assert (err.path, err.offset) == (path, last)
    assert set(got) <= set(records[:-1])
    skipping = Dataset(path, shuffle=shuffle, batch_size=5, io=engine, seed=3, verify=verify, remainder="uneven",
                       on_error="skip")
    assert collections.Counter(_read(skipping)) == collections.Counter(records[:-1])
    assert skipping.stats()["skipped"] == 1


def test_a_recordio_shard_cut_inside_its_last_record_is_named_as_open_records_names_it(tmp_path):
    payloads = [b"r%d" % i * (50 + i) for i in range(10)]
    whole = os.fspath(tmp_path / "whole.rec")
    with dlstore.RecordIOWriter(whole) as w:
        for p in payloads:
            w.write(p)
    size = os.path.getsize(whole)
    last = size - (8 + (len(payloads[-1]) + 3) // 4 * 4)
    for keep in (5, 20):  # inside the last record's header, inside its data
        path = os.fspath(tmp_path / f"cut{keep}" / "x.rec")
        os.makedirs(os.path.dirname(path))
        with open(whole, "rb") as f, open(path, "wb") as out:
            out.write(f.read(last + keep))
        with pytest.raises(dlstore.CorruptRecordError) as scanned:
            list(dlstore.open_records(path, format="recordio"))
        ds = Dataset(path, format="recordio", shuffle="global", batch_size=4, remainder="uneven")
        _, err = records_until_error(ds, dlstore.CorruptRecordError)
        assert str(err) == str(scanned.value)
        assert (err.path, err.offset) == (path, last)


def _masked_crc(data):
    from dlstore import _C

    return _C.masked_crc32c(data)


@pytest.mark.slow
def test_the_shuffle_buffer_stays_in_its_bounds_and_mixes(tmp_path):
    data = _shards(tmp_path, [200] * 6, size=(4000, 6000))  # ~5 KB records, ~6 MB in all
    chunk = 64 << 10
    ds = Dataset(tmp_path, shuffle="block", batch_size=16, buffer_size=64, block_size=chunk, chunk_size=chunk,
                 seed=3, remainder="uneven")
    got = _read(ds)
    stats = ds.stats()
    everything = [r for recs in data.values() for r in recs]
    assert collections.Counter(got) == collections.Counter(everything)
    # Held chunks: at most twice the buffer's bytes (or two chunks) before the oldest are let go,
    # plus one chunk arriving; records still in the buffer then are copied out, not the chunk kept.
    hold = max(2 * 64 * ds.mean_record_bytes, 2 * chunk)
    assert stats["peak_held_bytes"] <= hold + 2 * chunk, stats
    assert stats["spilled_records"] > 0 and stats["gathered_batches"] == len(got) // 16
    # Consecutive records rarely neighbours in a file: the buffer mixes ~9 blocks of ~12 records.
    where = {r: (p, i) for p, recs in data.items() for i, r in enumerate(recs)}
    neighbours = sum(where[a][0] == where[b][0] and abs(where[a][1] - where[b][1]) == 1
                     for a, b in zip(got, got[1:]))
    assert neighbours < 0.05 * len(got), neighbours


@pytest.mark.parametrize("shuffle", ["none", "global"])
def test_batches_in_read_order_are_views_not_copies(tmp_path, shuffle):
    _shards(tmp_path, [50, 50])
    ds = Dataset(tmp_path, shuffle=shuffle, batch_size=8, world=World(rank=0, size=1), remainder="uneven")
    n = len(_read(ds))
    stats = ds.stats()
    assert n == 100 and stats["gathered_batches"] == 0 and stats["records"] == 100


@pytest.mark.parametrize("shuffle", sorted(SHUFFLES))
def test_every_engine_hands_out_the_batches_buffered_does(engine_dir, engine, shuffle):
    # Records at every alignment and of awkward sizes, chunks of 64 KiB: the same batches, byte for byte
    # and in the same order, whichever engine reads them (io_uring with many reads in flight).
    _shards(engine_dir, [40, 33, 1], seed=9, size=(0, 70_000))

    def batches(io):
        ds = Dataset(engine_dir, io=io, shuffle=shuffle, batch_size=6, seed=3, buffer_size=10,
                     block_size=64 << 10, chunk_size=64 << 10, remainder="uneven")
        got = [batch_records(b) for b in ds.batches()]
        check_engine(ds, io)
        return got

    assert batches(engine) == batches("buffered")
