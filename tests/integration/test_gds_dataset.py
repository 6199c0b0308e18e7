"""``Dataset(io="gds")``: an epoch's read plan through the gds engine (:class:`dlstore.io.gds.GdsPlanReader`),
run over the kvikio and CuPy stand-ins and the kernels compiled for the host (``stand_in_gds``). It must hand
out exactly what a host engine
hands out for the same seed, epoch and world (every shuffle, mounts, batches, resume), refuse what gds
cannot read, and name or skip corrupt records as the host Dataset does."""
import collections
import os

import numpy as np
import pytest

import dlstore
from dlstore.io import gds
from dlstore.placement.world import World
from dlstore.sources.dataset import Dataset
from dlstore.sources.indexing import ensure_index
from tests.helpers import flip_data_byte, records_until_error, replicate, write_tfrecord
from tests.resume import assert_resumes_exactly

SHUFFLES = ["none", "block", "buffer", "global"]


def _shards(directory, counts=(23, 0, 31, 17, 40), seed=4):
    """Shards of records that name themselves, of sizes from 1 byte to ~24 KiB (blocks of 64 KiB hold
    a few records each, so the block shuffle reorders within and across shards)."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    data = {}
    for s, n in enumerate(counts):
        recs = [b"%d.%d|" % (s, i) + rng.bytes(int(rng.integers(0, 24_000))) for i in range(n)]
        data[write_tfrecord(os.path.join(directory, f"part-{s}.tfrecord"), recs)] = recs
    return data


def records_of(batch):
    """The records of a batch as bytes: a DeviceBatch (its buffer) or a host RecordBatch."""
    view = memoryview(batch.buffer.get() if getattr(batch, "on_gpu", False) else batch).cast("B")
    return [bytes(view[o:o + n]) for o, n in zip(batch.offsets.tolist(), batch.lengths.tolist())]


def _epoch(ds, epoch):
    ds.set_epoch(epoch)
    return [records_of(b) for b in ds.batches()]


def _flat(batches):
    return [r for b in batches for r in b]


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("shuffle", SHUFFLES)
def test_gds_hands_out_what_a_host_engine_does_in_the_same_order(tmp_path, stand_in_gds, shuffle, ranks):
    data = _shards(tmp_path / "d")
    everything = collections.Counter(r for recs in data.values() for r in recs)
    in_file_order = [r for path in sorted(data) for r in data[path]]
    kw = dict(shuffle=shuffle, batch_size=5, buffer_size=9, block_size=64 << 10, seed=11, remainder="uneven",
              chunk_size=64 << 10)
    for epoch in (0, 1):
        seen = collections.Counter()
        for rank in range(ranks):
            host = Dataset(tmp_path / "d", world=World(rank=rank, size=ranks), io="buffered", **kw)
            dev = Dataset(tmp_path / "d", world=World(rank=rank, size=ranks), io="gds", **kw)
            assert dev.engine == "gds"
            want, got = _epoch(host, epoch), _epoch(dev, epoch)
            assert got == want  # the same records, in the same order, in the same batches
            assert all(len(b) == 5 for b in got[:-1]) and len(_flat(got)) == len(dev)
            assert dev.state_dict()["epoch"] == epoch + 1 and dev.state_dict()["sample_in_epoch"] == 0
            if shuffle != "none" and ranks == 1:  # so a reader that ignored the emission order would fail
                assert _flat(want) != in_file_order
            seen.update(_flat(got))
        assert seen == everything  # every record exactly once across the ranks


def test_the_emission_order_matters_between_epochs(tmp_path, stand_in_gds):
    """Two epochs of a shuffled gds dataset differ, each as the host engine's does."""
    _shards(tmp_path / "d")
    ds = Dataset(tmp_path / "d", io="gds", shuffle="block", batch_size=4, buffer_size=6, block_size=64 << 10)
    assert _flat(_epoch(ds, 0)) != _flat(_epoch(ds, 1))


@pytest.mark.parametrize("shuffle", SHUFFLES)
def test_mounts_two_per_rank_through_gds_as_through_a_host_engine(tmp_path, stand_in_gds, shuffle):
    """Replicated mounts, two read at once by each rank (their blocks in turns): the same as buffered."""
    data = _shards(tmp_path / "src")
    mounts = replicate(tmp_path / "src", tmp_path, 4)
    kw = dict(mounts=mounts, mounts_per_rank=2, shuffle=shuffle, batch_size=4, buffer_size=6,
              block_size=64 << 10, seed=5, remainder="pad")
    for rank in range(2):
        host = Dataset("*.tfrecord", world=World(rank=rank, size=2), io="buffered", **kw)
        dev = Dataset("*.tfrecord", world=World(rank=rank, size=2), io="gds", **kw)
        assert len(dev.rank_mounts) == 2
        assert _epoch(dev, 1) == _epoch(host, 1)
        assert set(os.path.dirname(p) for p in dev.stats()["mounts"]) <= set(os.path.dirname(m) for m in mounts)
    assert len(data) == 5


@pytest.mark.parametrize("shuffle", SHUFFLES)
def test_gds_resumes_mid_epoch_exactly(tmp_path, stand_in_gds, shuffle):
    """The shared save/resume check: a worker of a rank, stops mid-batch-plan and in the next epoch."""
    _shards(tmp_path / "d")

    def make():
        return Dataset(tmp_path / "d", world=World(rank=1, size=2, worker=0, num_workers=2), io="gds",
                       shuffle=shuffle, buffer_size=7, batch_size=3, block_size=64 << 10, remainder="pad", seed=9,
                       chunk_size=64 << 10)

    assert_resumes_exactly(make, stops=[0, 1, 2, 5, 9, 13], run=lambda ds: ds.batches(), values=records_of)


def test_a_resume_at_any_sample_gives_the_host_engines_rest(tmp_path, stand_in_gds):
    """A state saved mid-batch (sample 7 with batches of 3): the rest and its batches as buffered gives them."""
    _shards(tmp_path / "d")
    kw = dict(shuffle="buffer", buffer_size=5, batch_size=3, block_size=64 << 10, seed=2)
    host, dev = Dataset(tmp_path / "d", io="buffered", **kw), Dataset(tmp_path / "d", io="gds", **kw)
    for ds in (host, dev):
        ds.load_state_dict({"epoch": 1, "sample_in_epoch": 7, "seed": 2})
    want = [records_of(b) for b in host.batches()]
    got = [records_of(b) for b in dev.batches()]
    assert got == want and len(got[0]) == 2  # the first batch completes the one under way


@pytest.mark.parametrize("shuffle", ["none", "block", "global"])
def test_a_corrupt_record_is_raised_after_the_good_ones_naming_file_and_offset(tmp_path, stand_in_gds, shuffle):
    data = _shards(tmp_path / "d")
    path = sorted(data)[2]
    ds = Dataset(tmp_path / "d", io="gds", shuffle=shuffle, batch_size=4, seed=1, buffer_size=8,
                 block_size=64 << 10, remainder="uneven")
    host = Dataset(tmp_path / "d", io="buffered", shuffle=shuffle, batch_size=4, seed=1, buffer_size=8,
                   block_size=64 << 10, remainder="uneven")  # made before the damage, as ds
    order = _flat(_epoch(ds, 0))  # the planned order, before the damage
    _, frames = ensure_index(path)
    offset = flip_data_byte(path, 7, frames)
    ds.set_epoch(0)
    got, err = records_until_error(ds, dlstore.CorruptRecordError, records_of)
    assert err.path == path and err.offset == offset
    assert str(err).startswith(f"{path}: at byte {offset}: bad data CRC in a record of {len(data[path][7])} bytes")
    _, host_err = records_until_error(host, dlstore.CorruptRecordError, records_of)
    assert str(host_err) == str(err)  # the host engines' words, their CRC values included
    assert got == order[:order.index(data[path][7])]  # every record planned before it, and nothing else
    assert ds.state_dict() == host.state_dict()  # the one schedule: the same position after the error


@pytest.mark.parametrize("cut", [6, 13, 100])  # into the last record: its header, its length's CRC, its data
def test_a_shard_cut_inside_its_last_record_is_named_as_the_host_names_it(tmp_path, stand_in_gds, cut):
    records = [b"%d|" % i + b"x" * (300 + 41 * i) for i in range(9)]
    whole = write_tfrecord(tmp_path / "whole.tfrecord", records)
    path = os.fspath(tmp_path / "d" / "x.tfrecord")
    os.makedirs(os.path.dirname(path))
    last = os.path.getsize(whole) - (16 + len(records[-1]))
    with open(whole, "rb") as f, open(path, "wb") as out:
        out.write(f.read(last + cut))  # indexed as it is: the cut tail is a frame of its own
    errors = []
    for io in ("gds", "buffered"):
        ds = Dataset(path, io=io, shuffle="global", batch_size=4, seed=2, remainder="uneven")
        errors.append(records_until_error(ds, dlstore.CorruptRecordError, records_of)[1])
        skipping = Dataset(path, io=io, shuffle="global", batch_size=4, seed=2, remainder="uneven", on_error="skip")
        assert collections.Counter(_flat(_epoch(skipping, 0))) == collections.Counter(records[:-1])
    assert str(errors[0]) == str(errors[1]) and errors[0].offset == last
    assert "truncated record" in str(errors[0])


@pytest.mark.parametrize("policy", ["skip", "warn"])
def test_corrupt_records_can_be_skipped_counted_and_listed(tmp_path, stand_in_gds, policy):
    data = _shards(tmp_path / "d")
    path = sorted(data)[0]
    ds = Dataset(tmp_path / "d", io="gds", shuffle="block", batch_size=6, on_error=policy, buffer_size=5,
                 block_size=64 << 10, remainder="uneven", seed=3)
    order = _flat(_epoch(ds, 0))
    _, frames = ensure_index(path)
    offsets = [flip_data_byte(path, r, frames) for r in (3, 11)]
    ds.set_epoch(0)
    if policy == "warn":
        with pytest.warns(RuntimeWarning, match="bad data CRC") as caught:
            got = [records_of(b) for b in ds.batches()]
        assert len([w for w in caught if "skipped" in str(w.message)]) == 2
    else:
        got = [records_of(b) for b in ds.batches()]
    bad = {data[path][3], data[path][11]}
    assert _flat(got) == [r for r in order if r not in bad]  # the rest in the planned order
    assert all(len(b) == 6 for b in got[:-1])
    assert ds.stats()["skipped"] == 2
    assert sorted((p, o) for p, o, _ in ds.corruptions()) == [(path, offsets[0]), (path, offsets[1])]
    assert ds.state_dict() == {**ds.state_dict(), "epoch": 1, "sample_in_epoch": 0}


def test_a_skipped_record_counts_in_the_position_a_resume_starts_from(tmp_path, stand_in_gds):
    """Skipped records are consumed positions: a state saved after them resumes at the right record."""
    data = _shards(tmp_path / "d")
    path = sorted(data)[0]
    kw = dict(io="gds", shuffle="none", shuffle_shards=False, batch_size=4, on_error="skip", remainder="uneven")
    ds, again = Dataset(tmp_path / "d", **kw), Dataset(tmp_path / "d", **kw)  # indexed before the damage
    order = _flat(_epoch(ds, 0))
    _, frames = ensure_index(path)
    flip_data_byte(path, 2, frames)
    ds.set_epoch(0)
    it = ds.batches()
    first = records_of(next(it))
    it.close()
    assert first == order[:2] + order[3:5]
    assert ds.state_dict()["sample_in_epoch"] == 5
    again.load_state_dict(ds.state_dict())
    assert _flat(records_of(b) for b in again.batches()) == order[5:]


def test_failover_to_a_replica_loses_nothing(tmp_path, stand_in_gds):
    data = _shards(tmp_path / "src")
    mounts = replicate(tmp_path / "src", tmp_path, 2)
    ds = Dataset("*.tfrecord", mounts=mounts, world=World(rank=0, size=1), io="gds", remainder="uneven",
                 block_size=64 << 10, batch_size=4)
    os.unlink(os.path.join(mounts[0], "part-3.tfrecord"))  # gone from this rank's mount after the layout scan
    got = _flat(_epoch(ds, 0))
    assert collections.Counter(got) == collections.Counter(r for recs in data.values() for r in recs)
    stats = ds.stats()
    assert stats["failovers"] >= 1 and stats["failed_mounts"][0] == mounts[0]
    assert any("part-3" in e or "shard 3" in e for e in stats["failover_events"]), stats["failover_events"]


def test_recordio_is_refused_with_the_reason(tmp_path, stand_in_gds):
    path = os.fspath(tmp_path / "x.rec")
    with dlstore.RecordIOWriter(path, idx_path=os.fspath(tmp_path / "x.idx")) as w:
        w.write(b"abc")
    with pytest.raises(dlstore.DlstoreError, match=f"^io='gds' reads uncompressed TFRecord files; {path} is "
                                                   "recordio: use a host engine$"):
        Dataset(path, format="recordio", io="gds")


def test_stats_say_which_mode_backend_and_crc(tmp_path, stand_in_gds):
    _shards(tmp_path / "d")
    ds = Dataset(tmp_path / "d", io="gds", batch_size=8, device="cuda:1")
    assert ds.stats()["gds_mode"] == "gds"  # before a pass: the verdict's
    _epoch(ds, 0)
    stats = ds.stats()
    assert stats["engine"] == "gds" and "GPUDirect Storage" in stats["engine_reason"]
    assert stats["gds_backend"] == "kvikio CuFile" and stats["crc"] == "GPU (frame kernel)"
    # What kvikio says moved the bytes, not the verdict: the stand-in kvikio is in its compat mode (POSIX).
    assert stats["gds_mode"] == "compat" and "through POSIX" in stats["gds_moved"]
    assert stats["records"] == len(ds) and stats["chunks"] >= 1 and stats["file_bytes_read"] >= stats["payload_bytes"]
    host = Dataset(tmp_path / "d", io="buffered", batch_size=8)
    _epoch(host, 0)
    assert set(host.stats()) <= set(stats)  # the host reader's keys, and more
    assert next(iter(ds.batches())).buffer.device.id == 1  # read into the device asked for
    off = Dataset(tmp_path / "d", io="gds", batch_size=8, verify=False)
    _epoch(off, 0)
    assert off.stats()["crc"].startswith("off")


def test_device_picks_gds_for_auto_and_is_checked(tmp_path, stand_in_gds):
    _shards(tmp_path / "d")
    ds = Dataset(tmp_path / "d", device="cuda:0")  # io="auto": true GDS here, so gds
    assert ds.engine == "gds" and "GPU target cuda:0" in ds.engine_reason
    assert Dataset(tmp_path / "d").engine != "gds"  # no GPU target: a host engine
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda', 'cuda:N' or 'cuda:local', not 'gpu0'"):
        Dataset(tmp_path / "d", device="gpu0")


def test_auto_with_a_gpu_target_keeps_recordio_on_a_host_engine(tmp_path, stand_in_gds):
    path = tmp_path / "a.rec"
    with dlstore.RecordIOWriter(os.fspath(path), idx_path=os.fspath(tmp_path / "a.idx")) as w:
        for i in range(5):
            w.write(b"record %d" % i)
    ds = Dataset(path, format="recordio", device="cuda:0")  # io="auto": gds reads TFRecord only
    assert ds.engine != "gds" and len(list(ds.batches())) >= 1


def test_a_loader_refuses_a_gds_source_in_one_line(tmp_path, stand_in_gds):
    from dlstore.pipeline.bert import Bert
    from dlstore.pipeline.loader import Loader

    _shards(tmp_path / "d")
    ds = Dataset(str(tmp_path / "d" / "*"), io="gds", batch_size=8)
    with pytest.raises(dlstore.DlstoreError, match=r"io='gds' reads into GPU memory") as err:
        Loader(ds, Bert(16, 4), 8)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("shuffle", ["block", "buffer"])
def test_shuffled_gds_reads_large_chunks_not_a_read_per_record(tmp_path, stand_in_gds, shuffle):
    """Under a shuffle buffer gds reads the read order in large reads (the host reader's chunks: one
    schedule, far fewer reads than records) and re-orders on the device."""
    _shards(tmp_path / "d")
    ds = Dataset(tmp_path / "d", io="gds", shuffle=shuffle, batch_size=5, buffer_size=9, block_size=64 << 10,
                 chunk_size=64 << 10, seed=11)
    host = Dataset(tmp_path / "d", io="buffered", shuffle=shuffle, batch_size=5, buffer_size=9,
                   block_size=64 << 10, chunk_size=64 << 10, seed=11)
    assert _epoch(ds, 0) == _epoch(host, 0)
    stats, by_host = ds.stats(), host.stats()
    assert stats["chunks"] == by_host["chunks"] < len(ds) / 3  # the one schedule: the host reader's reads
    # each piece (a run of records) rounded out to whole pages on both ends
    assert int(ds.index.sizes.sum()) <= stats["file_bytes_read"] < 1.5 * int(ds.index.sizes.sum())
    assert stats["gathered_batches"] >= 1


def test_gds_holds_at_most_twice_a_tiny_shuffle_buffer_plus_a_read(tmp_path, stand_in_gds):
    """A shuffle buffer of 2 records: the reads held stay within the Dataset's hold (2x the buffer's bytes,
    at least two chunks) plus the read that pushed past it; records as a host engine hands them out."""
    _shards(tmp_path / "d", counts=(300, 200), seed=6)
    kw = dict(shuffle="buffer", batch_size=4, buffer_size=2, chunk_size=64 << 10, seed=3)
    dev, host = Dataset(tmp_path / "d", io="gds", **kw), Dataset(tmp_path / "d", io="buffered", **kw)
    assert _epoch(dev, 0) == _epoch(host, 0)
    stats = dev.stats()
    hold = max(int(2 * dev.buffer_size * dev.mean_record_bytes), 2 * (64 << 10))
    largest_read = (64 << 10) + 24_100 + 2 * gds.ALIGN  # a chunk, one more record, rounded out to pages
    assert 0 < stats["peak_held_bytes"] <= hold + largest_read
    assert stats["chunks"] < len(dev) / 3
