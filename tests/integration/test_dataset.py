"""``dlstore.Dataset`` over real files on several "mounts" (directories here; loop mounts in test_testbed_failover)."""
import collections
import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlstore
from dlstore.sources.dataset import Dataset
from dlstore.placement.world import World
from tests.helpers import batch_records
from tests.resume import assert_resumes_exactly


def _write_shards(root, shards=6, seed=2):
    rng = np.random.default_rng(seed)
    data = {}
    os.makedirs(root, exist_ok=True)
    for s in range(shards):
        recs = [f"s{s}r{i}|".encode() * int(rng.integers(1, 3000)) for i in range(int(rng.integers(0, 40)))]
        with dlstore.TFRecordWriter(os.path.join(root, f"part-{s}.tfrecord")) as w:
            for r in recs:
                w.write(r)
        data[f"part-{s}.tfrecord"] = recs
    return data


def _mounts(tmp_path, layout, n=3):
    src = tmp_path / "src"
    data = _write_shards(src)
    mounts = []
    for m in range(n):
        d = tmp_path / f"mnt{m}"
        d.mkdir()
        mounts.append(os.fspath(d))
    for i, name in enumerate(sorted(data)):
        targets = range(n) if layout == "replicated" else [i % n] if layout == "striped" else [i % n, (i + 1) % n]
        for m in targets:
            shutil.copy(src / name, os.path.join(mounts[m], name))
    return data, mounts


def _read(ds):
    out = []
    for b in ds.batches():
        out += batch_records(b)
    return out


@pytest.mark.parametrize("layout", ["replicated", "striped", "mixed"])
@pytest.mark.parametrize("shuffle", ["none", "block", "buffer", "global"])
def test_every_record_once_across_ranks_and_workers(tmp_path, layout, shuffle):
    data, mounts = _mounts(tmp_path, layout)
    everything = collections.Counter(r for recs in data.values() for r in recs)
    for epoch in range(2):
        seen = collections.Counter()
        for rank in range(2):
            for worker in range(2):
                world = World(rank=rank, size=2, worker=worker, num_workers=2)
                ds = Dataset("*.tfrecord", mounts=mounts, world=world, shuffle=shuffle, remainder="uneven",
                             batch_size=4, block_size=64 << 10, io="buffered", seed=3)
                assert ds.layout.kind == layout
                ds.set_epoch(epoch)
                got = _read(ds)
                assert len(got) == len(ds)
                seen.update(got)
        assert seen == everything


def test_resume_mid_epoch_gives_exactly_the_rest(tmp_path):
    data, mounts = _mounts(tmp_path, "replicated")
    kw = dict(mounts=mounts, world=World(rank=1, size=3), shuffle="buffer", buffer_size=8, remainder="pad",
              batch_size=2, block_size=64 << 10, io="mmap", seed=9)
    for epoch in range(2):
        ds = Dataset("*.tfrecord", **kw)
        ds.set_epoch(epoch)
        full = _read(ds)
        assert ds.state_dict()["epoch"] == epoch + 1  # a finished epoch moves the position on
        for k in sorted({0, 1, 5, len(full) // 2, len(full) - 1, len(full)}):
            again = Dataset("*.tfrecord", **kw)
            again.load_state_dict({"epoch": epoch, "sample_in_epoch": k, "seed": 9, "num_consumers": 3})
            assert _read(again) == full[k:]


@pytest.mark.parametrize("shuffle,io", [("none", "mmap"), ("block", "buffered"), ("buffer", "direct"),
                                        ("global", "mmap")])
def test_every_shuffle_resumes_exactly(tmp_path, shuffle, io):
    """The shared save/resume check over a Dataset: a worker of a rank, on replicated mounts."""
    _, mounts = _mounts(tmp_path, "replicated")

    def make():
        return Dataset("*.tfrecord", mounts=mounts, world=World(rank=1, size=2, worker=1, num_workers=2),
                       shuffle=shuffle, buffer_size=7, remainder="pad", batch_size=3, block_size=64 << 10, io=io,
                       seed=9)

    assert_resumes_exactly(make, stops=[0, 1, 2, 5, 9, 13], run=lambda ds: ds.batches(), values=batch_records)


@pytest.mark.parametrize("shuffle", ["none", "global"])
def test_a_loop_that_sets_each_epoch_resumes_where_the_state_says(tmp_path, shuffle):
    """The README's loop, ``for epoch in range(state["epoch"], n): ds.set_epoch(epoch)``, after
    ``load_state_dict``: set_epoch of the loaded epoch threw the resume point away, and the epoch's first
    samples were read again, without a word."""
    _write_shards(tmp_path / "d")

    def make():
        return Dataset(tmp_path / "d", shuffle=shuffle, batch_size=8, seed=0)

    def run(ds):  # one epoch of the loop
        ds.set_epoch(ds.epoch)
        return ds.batches()

    epoch_batches = -(-len(make()) // 8)
    assert_resumes_exactly(make, stops=[1, 5, epoch_batches, epoch_batches + 5], run=run, values=batch_records,
                           epochs=3)


def test_set_epoch_keeps_a_loaded_point_for_its_epoch_only_until_the_pass_starts(tmp_path):
    """A loaded point stays for its epoch and is forgotten at another; once a pass has started, set_epoch is the
    epoch's start again, as it is without a loaded state (a loop broken off mid-epoch starts it over)."""
    _write_shards(tmp_path / "d")
    ds = Dataset(tmp_path / "d", shuffle="global", batch_size=4, seed=0)
    ds.load_state_dict({"epoch": 1, "sample_in_epoch": 12, "seed": 0})
    ds.set_epoch(1)
    ds.set_epoch(1)
    assert ds.state_dict()["sample_in_epoch"] == 12
    ds.set_epoch(2)
    ds.set_epoch(1)  # forgotten at another epoch
    assert (ds.epoch, ds.sample_in_epoch) == (1, 0)
    ds.load_state_dict({"epoch": 1, "sample_in_epoch": 12, "seed": 0})
    ds.set_epoch(1)
    batches = ds.batches()
    next(batches)
    batches.close()  # a loop broken off mid-epoch
    assert ds.sample_in_epoch == 16
    ds.set_epoch(1)
    assert (ds.epoch, ds.sample_in_epoch) == (1, 0)
    for _ in ds.batches():  # and without a loaded state, as before
        break
    ds.set_epoch(1)
    assert (ds.epoch, ds.sample_in_epoch) == (1, 0)


def test_a_consumer_starting_an_epoch_starts_it_at_its_first_sample(tmp_path):
    """start_at (how the Loader and the adapters put their source where they are) means the epoch's start at
    sample 0, also over a point loaded into the Dataset for that epoch, which set_epoch alone keeps: the
    consumer counts its position from there."""
    from dlstore.sources.source import start_at

    _write_shards(tmp_path / "d")
    ds = Dataset(tmp_path / "d", shuffle="global", batch_size=4, seed=0)
    whole = _read(ds)
    ds.load_state_dict({"epoch": 0, "sample_in_epoch": 12, "seed": 0})
    start_at(ds, 0)
    assert _read(ds) == whole


@pytest.mark.parametrize("shuffle", ["none", "block", "buffer", "global"])
def test_two_mounts_per_rank_read_every_record_once_and_resume_exactly(tmp_path, shuffle):
    """A rank reading two mounts at once (their blocks in turns) under every shuffle: every record once
    across the ranks, and a resume anywhere gives exactly the rest."""
    data, mounts = _mounts(tmp_path, "replicated", n=4)
    everything = collections.Counter(r for recs in data.values() for r in recs)

    def make(rank=0):
        return Dataset("*.tfrecord", mounts=mounts, world=World(rank=rank, size=2), mounts_per_rank=2,
                       shuffle=shuffle, buffer_size=6, remainder="uneven", batch_size=4, block_size=64 << 10,
                       seed=5)

    seen = collections.Counter(r for rank in range(2) for r in _read(make(rank)))
    assert seen == everything
    assert_resumes_exactly(make, stops=[1, 4, 9], run=lambda ds: ds.batches(), values=batch_records)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(counts=st.lists(st.integers(0, 30), min_size=1, max_size=5), ranks=st.integers(1, 3),
       workers=st.integers(1, 2), shuffle=st.sampled_from(["none", "block", "buffer", "global"]),
       batch=st.integers(1, 6), buffer=st.integers(1, 12), block=st.sampled_from([1 << 16, 1 << 20]),
       seed=st.integers(0, 1000))
def test_real_reads_are_exactly_once_for_every_shuffle(tmp_path, counts, ranks, workers, shuffle, batch, buffer,
                                                       block, seed):
    """Property: whatever the shards, world, shuffle, batch and buffer sizes, the records the consumers
    read from real files are each record exactly once (remainder uneven), in batches of batch_size."""
    d = tempfile.mkdtemp(dir=tmp_path)
    rng = np.random.default_rng(seed)
    everything = collections.Counter()
    for s, n in enumerate(counts):
        recs = [b"%d.%d|" % (s, i) + rng.bytes(int(rng.integers(0, 9000))) for i in range(n)]
        everything.update(recs)
        with dlstore.TFRecordWriter(os.path.join(d, f"p{s}.tfrecord")) as w:
            for r in recs:
                w.write(r)
    seen = collections.Counter()
    for rank in range(ranks):
        for worker in range(workers):
            ds = Dataset(d, world=World(rank=rank, size=ranks, worker=worker, num_workers=workers), shuffle=shuffle,
                         remainder="uneven", batch_size=batch, buffer_size=buffer, block_size=block, seed=seed,
                         chunk_size=64 << 10)
            sizes = []
            for b in ds.batches():
                sizes.append(b.num_records)
                seen.update(batch_records(b))
            assert all(n == batch for n in sizes[:-1]) and sum(sizes) == len(ds)
    assert seen == everything


def test_a_new_world_size_only_at_an_epoch_boundary(tmp_path):
    _write_shards(tmp_path / "d")
    ds = Dataset(tmp_path / "d", world=World(rank=0, size=4), batch_size=2)
    ds.load_state_dict({"epoch": 3, "sample_in_epoch": 0, "seed": 0, "num_consumers": 2})
    assert ds.epoch == 3
    with pytest.raises(dlstore.PlacementError, match="epoch boundary"):
        ds.load_state_dict({"epoch": 3, "sample_in_epoch": 5, "seed": 0, "num_consumers": 2})
    with pytest.raises(dlstore.PlacementError, match="seed"):
        ds.load_state_dict({"epoch": 3, "sample_in_epoch": 0, "seed": 1, "num_consumers": 4})


@pytest.mark.parametrize("shuffle", ["none", "block", "global"])
def test_a_state_saved_after_an_epochs_last_batch_resumes_with_another_world(tmp_path, shuffle):
    """A checkpoint taken in the loop after the epoch's last batch said sample N (the share's end) of that epoch,
    which another world size refused as mid-epoch; it is the next epoch's start."""
    _write_shards(tmp_path / "d")
    states = []
    for rank in range(3):
        ds = Dataset(tmp_path / "d", world=World(rank=rank, size=3), batch_size=4, shuffle=shuffle, seed=2)
        for _ in ds.batches():
            state = ds.state_dict()
        states.append(state)
    assert all((s["epoch"], s["sample_in_epoch"]) == (1, 0) for s in states)
    seen = []
    for rank in range(2):
        ds = Dataset(tmp_path / "d", world=World(rank=rank, size=2), batch_size=4, shuffle=shuffle, seed=2)
        ds.load_state_dict(states[0])
        seen += [r for b in ds.batches() for r in batch_records(b)]
    whole = []  # epoch 1 over 2 ranks, read afresh
    for rank in range(2):
        ds = Dataset(tmp_path / "d", world=World(rank=rank, size=2), batch_size=4, shuffle=shuffle, seed=2)
        ds.set_epoch(1)
        whole += [r for b in ds.batches() for r in batch_records(b)]
    assert seen == whole


def _mounts_read(ds, epoch):
    """``(shard, record, mount)`` of every record ``ds`` reads in ``epoch``, in reading order."""
    from dlstore.io.failover import MountHealth

    plan = ds._reader_plan(epoch, 0, MountHealth(ds.mounts, 2))
    mounts = [ds.mounts[plan.places[f][1]] for f in plan.file.tolist()]
    return list(zip(plan.shards.tolist(), plan.records.tolist(), mounts))


@pytest.mark.parametrize("shuffle", ["none", "block", "global"])
def test_a_block_is_read_through_the_same_mount_every_epoch(tmp_path, shuffle):
    _, mounts = _mounts(tmp_path, "replicated")
    chosen = {}
    for epoch in range(4):
        for rank in range(3):
            ds = Dataset("*.tfrecord", mounts=mounts, world=World(rank=rank, size=3), shuffle=shuffle,
                         block_size=64 << 10, seed=1)
            for shard, record, mount in _mounts_read(ds, epoch):
                assert chosen.setdefault((rank, shard, record), mount) == mount


@pytest.mark.parametrize("shuffle", ["none", "block", "buffer"])
def test_a_rank_with_two_mounts_alternates_between_them(tmp_path, shuffle):
    _, mounts = _mounts(tmp_path, "replicated", n=4)
    ds = Dataset("*.tfrecord", mounts=mounts, world=World(rank=1, size=2), mounts_per_rank=2, shuffle=shuffle,
                 block_size=64 << 10, seed=1)
    assert ds.rank_mounts == mounts[2:4]
    read = _mounts_read(ds, 0)
    used = [m for i, (_, _, m) in enumerate(read) if i == 0 or m != read[i - 1][2]]  # one entry per run
    assert set(used) == set(mounts[2:4])
    switches = sum(a != b for a, b in zip(used, used[1:]))
    assert switches >= len(used) // 2  # taking turns, not one mount after the other
    assert len(used) > 2


@pytest.mark.parametrize("shuffle", ["none", "block", "global"])
@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_batches_hold_exactly_batch_size_records(tmp_path, shuffle, remainder):
    """Every batch holds batch_size records (only an epoch's last may hold fewer), whatever the shuffle."""
    _write_shards(tmp_path / "d")
    for rank in range(3):
        ds = Dataset(tmp_path / "d", world=World(rank=rank, size=3), batch_size=16, shuffle=shuffle,
                     remainder=remainder, block_size=64 << 10, buffer_size=20, seed=rank)
        for epoch in range(2):
            ds.set_epoch(epoch)
            sizes = [b.num_records for b in ds.batches()]
            assert sizes and all(n == 16 for n in sizes[:-1]) and 0 < sizes[-1] <= 16
            assert sum(sizes) == len(ds) and len(sizes) == ds.num_batches


def test_failover_inside_a_dataset_is_counted_and_loses_nothing(tmp_path):
    data, mounts = _mounts(tmp_path, "replicated", n=2)
    ds = Dataset("*.tfrecord", mounts=mounts, world=World(rank=0, size=1), remainder="uneven", io="buffered",
                 block_size=64 << 10)
    os.unlink(os.path.join(mounts[0], "part-3.tfrecord"))
    os.unlink(os.path.join(mounts[1], "part-4.tfrecord"))
    got = _read(ds)
    assert collections.Counter(got) == collections.Counter(r for recs in data.values() for r in recs)
    stats = ds.stats()
    # part-3 fails on mnt0 (this rank's mount) and is read from mnt1; mnt1 lacks part-4, which
    # is either read before the first failure (from mnt0) or after it (mnt1 fails, back to mnt0).
    assert stats["failovers"] >= 1 and stats["failed_mounts"][0] == mounts[0]
    assert any("part-3" in e or "shard 3" in e for e in stats["failover_events"])


def test_compressed_shards_are_refused_with_the_reason(tmp_path):
    with dlstore.TFRecordWriter(tmp_path / "x.tfrecord.gz", compression="gzip") as w:
        w.write(b"abc")
    with pytest.raises(dlstore.DlstoreError, match="cannot read compressed shards .* even on one rank"):
        Dataset(tmp_path / "x.tfrecord.gz")


def test_mixed_formats_are_refused_naming_the_odd_file_out(tmp_path):
    os.makedirs(tmp_path / "tf")
    for i in range(3):
        with dlstore.TFRecordWriter(tmp_path / "tf" / f"{i}.tfrecord") as w:
            w.write(b"abc")
    odd = os.fspath(tmp_path / "tf" / "odd.rec")
    with dlstore.RecordIOWriter(odd) as w:
        w.write(b"abc")
    said = f"recordio in 1 file ({odd}) and tfrecord in 3 files (e.g. {tmp_path / 'tf' / '0.tfrecord'})"
    for opened in (lambda: dlstore.open_records(tmp_path / "tf"), lambda: Dataset(tmp_path / "tf")):
        with pytest.raises(dlstore.DlstoreError) as e:
            opened()
        assert str(e.value) == f"the files mix formats, {said}; read each format apart" and e.value.path == odd
    # Directories of one format each, already indexed: told from their manifests, in the same words.
    os.makedirs(tmp_path / "rec")
    shutil.move(odd, tmp_path / "rec" / "odd.rec")
    Dataset(tmp_path / "tf"), Dataset(tmp_path / "rec")
    with pytest.raises(dlstore.DlstoreError) as e:
        Dataset([tmp_path / "tf", tmp_path / "rec"]).batches()
    moved = os.fspath(tmp_path / "rec" / "odd.rec")
    assert str(e.value) == f"the shards mix formats, {said.replace(odd, moved)}; read each format apart"
    assert e.value.path == moved


def test_a_resume_mid_epoch_over_other_records_or_order_is_refused(tmp_path):
    _write_shards(tmp_path / "d", shards=4)
    ds = Dataset(tmp_path / "d", batch_size=5, seed=3, remainder="uneven")
    it = ds.batches()
    for _ in range(4):
        next(it)
    state = ds.state_dict()
    it.close()
    assert state["sample_in_epoch"] == 20 and state["shards"] == 4 and state["order"].startswith("block:")
    Dataset(tmp_path / "d", batch_size=7, seed=3, remainder="uneven").load_state_dict(state)  # batch size may change
    legacy = {k: state[k] for k in ("epoch", "sample_in_epoch", "seed", "num_consumers")}
    Dataset(tmp_path / "d", batch_size=5, seed=3, remainder="uneven").load_state_dict(legacy)  # saved before: as then
    for other in (dict(shuffle="global"), dict(buffer_size=3)):
        with pytest.raises(dlstore.PlacementError, match="would read some records twice and others never"):
            Dataset(tmp_path / "d", batch_size=5, seed=3, remainder="uneven", **other).load_state_dict(state)
    shutil.copy(tmp_path / "d" / "part-1.tfrecord", tmp_path / "d" / "part-9.tfrecord")
    grown = Dataset(tmp_path / "d", batch_size=5, seed=3, remainder="uneven")
    with pytest.raises(dlstore.PlacementError, match=r"saved at sample 20 of epoch 0 over 4 shards, .* this dataset "
                                                     r"has 5 shards"):
        grown.load_state_dict(state)
    grown.load_state_dict(dict(state, sample_in_epoch=0, epoch=1))  # from an epoch's start: the new records count


@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_a_resume_mid_epoch_with_another_batch_size_is_refused_where_batches_cut_the_epoch(tmp_path, remainder):
    """pad and drop give each consumer whole batches: with another batch size the same sample position is other
    records (4 consumers, pad 8 -> 7: 308 records read, 272 distinct of 300), which a resume took in silence."""
    _write_shards(tmp_path / "d", shards=6)
    states = []
    for rank in range(4):
        ds = Dataset(tmp_path / "d", world=World(rank=rank, size=4), batch_size=8, seed=3, remainder=remainder)
        it = ds.batches()
        next(it)
        states.append(ds.state_dict())
        it.close()
    assert states[0]["batch_size"] == 8
    for batch in (7, 32):
        said = f"saved at sample 8 of epoch 0 with batch size 8; this dataset has batch size {batch}, and remainder="
        with pytest.raises(dlstore.PlacementError, match=f"{said}'{remainder}'"):
            Dataset(tmp_path / "d", world=World(rank=0, size=4), batch_size=batch, seed=3,
                    remainder=remainder).load_state_dict(states[0])
    seen = collections.Counter()  # the same batch size resumes exactly: what the epoch gives, every rank together
    whole = collections.Counter()
    for rank in range(4):
        ds = Dataset(tmp_path / "d", world=World(rank=rank, size=4), batch_size=8, seed=3, remainder=remainder)
        whole.update(_read(ds))
        resumed = Dataset(tmp_path / "d", world=World(rank=rank, size=4), batch_size=8, seed=3, remainder=remainder)
        first = list(batch_records(next(resumed.batches())))
        resumed.load_state_dict(states[rank])
        seen.update(first + _read(resumed))
    assert seen == whole
    legacy = {k: states[0][k] for k in states[0] if k != "batch_size"}  # saved before the check: taken as then
    Dataset(tmp_path / "d", world=World(rank=0, size=4), batch_size=7, seed=3, remainder=remainder).load_state_dict(
        legacy)
    Dataset(tmp_path / "d", world=World(rank=0, size=4), batch_size=7, seed=3,  # from an epoch's start: any size
            remainder=remainder).load_state_dict(dict(states[0], sample_in_epoch=0, epoch=1))


def test_an_empty_list_of_paths_is_no_dataset(tmp_path):
    with pytest.raises(dlstore.DlstoreError, match=r"no files to read in \[\]: the list of paths is empty"):
        Dataset([])  # a glob.glob that found nothing: refused as an empty directory is


def test_a_shard_named_twice_is_refused(tmp_path):
    # It was read twice per epoch, its records given twice: 2 x 3 records from one shard of 3.
    _write_shards(tmp_path, shards=2)
    one = os.fspath(tmp_path / "part-0.tfrecord")
    for spec in ([one, one], [os.fspath(tmp_path / "*.tfrecord"), one], [os.fspath(tmp_path), one]):
        with pytest.raises(dlstore.DlstoreError, match=f"^{one}: named more than once in shards"):
            Dataset(spec)
    assert len(Dataset([one, os.fspath(tmp_path / "part-1.tfrecord")])) == len(Dataset(os.fspath(tmp_path)))
    # The same directory through a symbolic link is the same shards.
    os.symlink(tmp_path, tmp_path.parent / f"{tmp_path.name}-link")
    through = os.fspath(tmp_path.parent / f"{tmp_path.name}-link" / "part-0.tfrecord")
    with pytest.raises(dlstore.DlstoreError, match=f"^{through}: named more than once in shards"):
        Dataset([one, through])


def test_arguments_and_states_of_the_wrong_kind_are_refused_in_one_line(tmp_path):
    # batch_size=2.5 became 2; world=(0, 2) and a state without its keys failed with Python's own errors.
    _write_shards(tmp_path, shards=2)
    with pytest.raises(TypeError, match=r"^batch_size must be an integer \(or None: the loader's\), not 2.5$"):
        Dataset(os.fspath(tmp_path), batch_size=2.5)
    with pytest.raises(TypeError, match=r"^world must be a dlstore.placement.World .*, not \(0, 2\) \(it has no "
                                        r"consumer, num_consumers, local_rank, with_worker\)$"):
        Dataset(os.fspath(tmp_path), world=(0, 2))

    class Delegating:  # anything with a World's members will do, as the torch adapter documents
        def __init__(self, world):
            self._world = world

        def __getattr__(self, name):
            return getattr(self._world, name)

    delegating = Delegating(World(rank=0, size=1))
    assert len(Dataset(os.fspath(tmp_path), world=delegating)) == len(Dataset(os.fspath(tmp_path)))
    ds = Dataset(os.fspath(tmp_path))
    with pytest.raises(dlstore.PlacementError, match=r"^not a dataset state \(it lacks epoch, sample_in_epoch"):
        ds.load_state_dict({})
    with pytest.raises(dlstore.PlacementError, match="^not a dataset state: its epoch is 'x', not an integer$"):
        ds.load_state_dict({"epoch": "x", "sample_in_epoch": 0})
    with pytest.raises(dlstore.PlacementError, match=r"^not a dataset state: None \(state_dict\(\) gives one\)$"):
        ds.load_state_dict(None)
    # The adapters check their counts the same way (they truncated 2.5 to 2).
    from dlstore.adapters.dali import EncodedSamples
    from dlstore.adapters.torch import DlstoreIterableDataset
    from dlstore.pipeline import Bert

    with pytest.raises(TypeError, match="^batch_size must be an integer, not 2.5$"):
        DlstoreIterableDataset(os.fspath(tmp_path), Bert(128), batch_size=2.5)
    with pytest.raises(TypeError, match="^prefetch must be an integer, not 1.5$"):
        DlstoreIterableDataset(os.fspath(tmp_path), Bert(128), batch_size=2, prefetch=1.5)
    with pytest.raises(TypeError, match="^batch_size must be an integer, not True$"):
        EncodedSamples(ds, True)


def test_bytes_paths_are_paths(tmp_path):
    """os.listdir(b".") gives bytes names: open_records and Dataset failed on them with "expected str, bytes or
    os.PathLike object, not int" (a bytes path was taken as a list of byte values)."""
    _write_shards(tmp_path / "d", shards=2)
    names = sorted(os.listdir(os.fsencode(tmp_path / "d")))
    files = [os.path.join(os.fsencode(tmp_path / "d"), n) for n in names]
    want = [bytes(r) for f in files for r in dlstore.open_records(os.fsdecode(f))]
    assert [bytes(r) for f in files for r in dlstore.open_records(f)] == want
    as_str = sorted(_read(Dataset(tmp_path / "d", batch_size=2)))
    assert len(as_str) >= len(want) - 1 and sorted(_read(Dataset(files, batch_size=2))) == as_str
    assert sorted(_read(Dataset(names, mounts=[os.fsencode(tmp_path / "d")], batch_size=2))) == as_str
    for wrong in (3, [3]):
        with pytest.raises(TypeError, match="paths must be a path .* not \\[?3"):
            dlstore.open_records(wrong)
        with pytest.raises(TypeError, match="paths must be a path"):
            Dataset(wrong)


@pytest.mark.parametrize("epoch", [1.5, "1", None])
def test_an_epoch_is_an_integer(tmp_path, epoch):
    _write_shards(tmp_path / "d", shards=2)
    ds = Dataset(tmp_path / "d", batch_size=2)
    with pytest.raises(TypeError, match=f"epoch must be an integer, not {epoch!r}"):
        ds.set_epoch(epoch)  # 1.5 was taken as epoch 1, "1" failed comparing str and int
    ds.set_epoch(np.int64(2))
    assert ds.epoch == 2


def test_a_shard_whose_name_holds_glob_characters_is_read_as_itself(tmp_path):
    """part[1].tfrecord: names from a directory's own listing, and a file named exactly, were matched again as
    globs ([1] matches '1'), so the directory and the file were refused ("no record file matches")."""
    for name in ("part-0.tfrecord", "part[1].tfrecord"):
        with dlstore.TFRecordWriter(os.fspath(tmp_path / name)) as w:
            w.write(name.encode())

    def read(spec):
        return sorted(r for b in Dataset(spec, batch_size=1, remainder="uneven").batches() for r in batch_records(b))

    assert read(tmp_path) == [b"part-0.tfrecord", b"part[1].tfrecord"]
    assert read(tmp_path / "part[1].tfrecord") == [b"part[1].tfrecord"]
    assert [bytes(r) for r in dlstore.open_records(os.fspath(tmp_path / "part[1].tfrecord"))] == [b"part[1].tfrecord"]
    assert read(os.fspath(tmp_path / "part-[0]*")) == [b"part-0.tfrecord"]  # a glob is still one


def test_a_glob_in_a_missing_directory_is_a_dlstore_error(tmp_path):
    """As open_records says it; before, a bare FileNotFoundError from the manifest's stat of the directory."""
    with pytest.raises(dlstore.DlstoreError, match="no record file matches") as e:
        Dataset(os.fspath(tmp_path / "nodir" / "train-*"), world=World(rank=0, size=1))
    assert e.value.path == os.fspath(tmp_path / "nodir" / "train-*")


def test_relative_mounts_hold_after_the_working_directory_changes(tmp_path, monkeypatch):
    """Frameworks that change the working directory (Hydra does) after the Dataset is made; before, every
    read of the pass failed with ENOENT on every mount."""
    from tests.helpers import replicate, write_tfrecord

    (tmp_path / "src").mkdir()
    records = []
    for s in range(3):
        rows = [f"{s}/{i}".encode() * 20 for i in range(10)]
        write_tfrecord(tmp_path / "src" / f"train-{s}.tfrecord", rows)
        records += rows
    replicate(tmp_path / "src", tmp_path / "r", 2)
    monkeypatch.chdir(tmp_path / "r")
    ds = Dataset("train-*", mounts=["mnt0", "mnt1/"], world=World(rank=0, size=1), remainder="uneven")
    monkeypatch.chdir(tmp_path)
    got = [r for b in ds.batches() for r in batch_records(b)]
    assert collections.Counter(got) == collections.Counter(records)
    assert ds.mounts == [os.fspath(tmp_path / "r" / "mnt0"), os.fspath(tmp_path / "r" / "mnt1")]
