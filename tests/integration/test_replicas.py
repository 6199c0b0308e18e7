"""Reading around corrupt replicas (issue 21): a record that fails its CRC on one mount is read from
another mount holding the shard; the batches are a clean read's, each bad copy is reported once, and
``on_error`` applies only to a record no copy holds good. No root needed: the mounts are directories."""
import collections
import os
import warnings

import numpy as np
import pytest

import dlstore
from dlstore import Dataset
from dlstore.placement.world import World
from tests.helpers import batch_records, corrupt_unnoticed, flip_data_byte, write_tfrecord
from tests.resume import assert_resumes_exactly

MOUNTS = 3


def _records(rng, n):
    return [rng.bytes(int(k)) for k in rng.integers(10, 9_000, n)]


@pytest.fixture
def replicas(tmp_path):
    """``(data, roots)``: 5 shards of 40 records on each of 3 replicated mounts, manifests made."""
    data, roots = _mounts_of(tmp_path, np.random.default_rng(21), shards=5, records=40)
    _dataset(roots)  # the manifests, made before any damage
    return data, roots


def _mounts_of(tmp_path, rng, shards, records):
    """``(data, roots)``: ``shards`` shards of ``records`` records each, the same on every mount."""
    data = [_records(rng, records) for _ in range(shards)]
    roots = []
    for m in range(MOUNTS):
        root = tmp_path / f"mnt{m}"
        root.mkdir()
        for s, recs in enumerate(data):
            write_tfrecord(root / f"shard-{s}.tfrecord", recs)
        roots.append(os.fspath(root))
    return data, roots


def _dataset(roots, **kw):
    """Rank 0 of 1 reading mount 0 (mounts 1 then 2 are its failover order)."""
    kw = {"world": World(rank=0, size=1), "remainder": "uneven", "batch_size": 7, "block_size": 64 << 10,
          "chunk_size": 64 << 10, "buffer_size": 9, "seed": 3, **kw}
    return Dataset("shard-*.tfrecord", mounts=roots, **kw)


def _records_of(batch):
    """A batch's records as bytes: a host RecordBatch, or a DeviceBatch (its buffer)."""
    view = memoryview(batch.buffer.get() if getattr(batch, "on_gpu", False) else batch).cast("B")
    return [bytes(view[o:o + n]) for o, n in zip(batch.offsets.tolist(), batch.lengths.tolist())]


def _batches(ds):
    return [_records_of(b) for b in ds.batches()]


def _damage(roots, plan):
    """Flips a data byte of ``record`` of ``shard`` on each mount listed: ``{(shard, record): mounts}``."""
    per_file = collections.defaultdict(list)
    for (shard, record), mounts in plan.items():
        for m in mounts:
            per_file[os.path.join(roots[m], f"shard-{shard}.tfrecord")].append(record)
    for path, records in per_file.items():
        corrupt_unnoticed(path, records)


# Bit rot on all but one replica of several shards: the good copy on each of the three mounts in turn,
# and one shard whose copies each hold a different bad record (every record still has a good copy).
ROT = {(0, 3): (0, 1), (1, 17): (0, 2), (2, 0): (1, 2), (3, 39): (0, 1), (4, 5): (0,), (4, 30): (1,)}
PLANTED = {(m, s, r) for (s, r), mounts in ROT.items() for m in mounts}
# What rank 0 finds whatever the order: it reads mount 0, then 1, then 2, and a shard moves off a copy
# found bad (shard 4's copy on mount 1 is read only when its record 5 comes before its record 30).
FOUND = {(0, 0, 3), (1, 0, 3), (0, 1, 17), (0, 3, 39), (1, 3, 39), (0, 4, 5)}


def _found(roots, ds):
    """``{(mount, shard, record)}`` of the bad copies in ``ds.stats()``, from their lines."""
    out = set()
    index = ds.index
    for line in ds.stats()["bad_copies"]:
        mount, path, at = line.split(": ")[:3]
        shard = int(os.path.basename(path).split("-")[1].split(".")[0])
        offset = int(at.split()[-1])
        frames = index.shard_offsets(shard)
        record = int(np.searchsorted(frames, offset, side="right") - 1)
        out.add((roots.index(mount), shard, record))
    return out


@pytest.mark.parametrize("shuffle", ["none", "block", "buffer", "global"])
@pytest.mark.parametrize("io", ["buffered", "mmap", "direct"])
def test_bit_rot_on_all_but_one_replica_reads_the_good_copy(replicas, shuffle, io):
    data, roots = replicas
    clean = _batches(_dataset(roots, shuffle=shuffle, io=io))
    _damage(roots, ROT)
    ds = _dataset(roots, shuffle=shuffle, io=io)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _batches(ds)
    assert got == clean  # the same batches, record for record: the right bytes, each once
    assert collections.Counter(r for b in got for r in b) == collections.Counter(r for d in data for r in d)
    stats = ds.stats()
    found = _found(roots, ds)
    assert FOUND <= found <= PLANTED and stats["corrupt_copies"] == len(found)
    assert stats["skipped"] == 0 and ds.corruptions() == []
    assert stats["records"] == sum(len(d) for d in data)
    reports = [str(w.message) for w in caught if "bad copy on mount" in str(w.message)]
    assert len(reports) == len(found)  # each bad copy reported once, naming mount, file and offset
    for line in stats["bad_copies"]:
        assert sum(line in r for r in reports) == 1
    # The next epoch finds the copies again (the stats count them) but warns no more.
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        _batches(ds)
    assert FOUND <= _found(roots, ds) <= PLANTED
    assert len([w for w in again if "bad copy" in str(w.message)]) == len(_found(roots, ds) - found)


@pytest.mark.filterwarnings("ignore:bad copy on mount")
@pytest.mark.parametrize("shuffle", ["none", "block", "global"])
def test_gds_reads_around_the_same_bad_copies(replicas, stand_in_gds, shuffle):
    """io="gds" (over the kvikio and CuPy stand-ins): the same batches as a clean host read."""
    data, roots = replicas
    clean = _batches(_dataset(roots, shuffle=shuffle, io="buffered"))
    _damage(roots, ROT)
    ds = _dataset(roots, shuffle=shuffle, io="gds")
    assert _batches(ds) == clean
    assert FOUND <= _found(roots, ds) <= PLANTED and ds.stats()["skipped"] == 0


@pytest.mark.filterwarnings("ignore:bad copy on mount")
@pytest.mark.parametrize("shuffle", ["none", "block", "global"])
def test_a_resume_reads_around_the_same_bad_copies(replicas, shuffle):
    _, roots = replicas
    _damage(roots, ROT)

    def make():
        return _dataset(roots, shuffle=shuffle)

    assert_resumes_exactly(make, stops=[1, 4, 9, 20, 31], run=lambda ds: ds.batches(), values=batch_records)


@pytest.mark.filterwarnings("ignore:bad copy on mount")
@pytest.mark.parametrize("shuffle", ["none", "block", "global"])
def test_a_record_bad_on_every_copy_follows_on_error(replicas, shuffle):
    data, roots = replicas
    _damage(roots, {(2, 11): (0, 1, 2), (0, 3): (0,)})
    lost = data[2][11]
    everything = collections.Counter(r for d in data for r in d)
    everything[lost] -= 1

    ds = _dataset(roots, shuffle=shuffle, on_error="skip")
    got = [r for b in _batches(ds) for r in b]
    assert collections.Counter(got) == +everything  # every other record once; that one left out
    assert ds.stats()["skipped"] == 1 and len(ds.corruptions()) == 1
    path, offset, _ = ds.corruptions()[0]
    assert path == os.path.join(roots[2], "shard-2.tfrecord") and offset >= ds.index.shard_offsets(2)[11]

    ds = _dataset(roots, shuffle=shuffle, on_error="warn")
    with pytest.warns(RuntimeWarning, match="bad on every mount holding it.*skipped"):
        got = [r for b in _batches(ds) for r in b]
    assert collections.Counter(got) == +everything

    ds = _dataset(roots, shuffle=shuffle)  # on_error="raise"
    got = []
    with pytest.raises(dlstore.CorruptRecordError) as e:
        for b in ds.batches():
            got += batch_records(b)
    msg = str(e.value)
    assert "record 11 of shard 2" in msg and all(r in msg for r in roots)
    assert lost not in got and len(got) == len(set(got))


@pytest.mark.filterwarnings("ignore:bad copy on mount")
def test_skipping_a_record_no_copy_holds_good_resumes_exactly(replicas):
    _, roots = replicas
    _damage(roots, {(1, 4): (0, 1, 2), (3, 20): (0, 1)})

    def make():
        return _dataset(roots, shuffle="block", on_error="skip")

    assert_resumes_exactly(make, stops=[1, 3, 8, 15, 26], run=lambda ds: ds.batches(), values=batch_records)


def test_without_replicas_on_error_is_the_readers(tmp_path):
    """A shard on one mount only (striped): no other copy, the reader's own policy, as before."""
    rng = np.random.default_rng(2)
    recs = _records(rng, 20)
    roots = [tmp_path / "a", tmp_path / "b"]
    for root in roots:
        root.mkdir()
    write_tfrecord(roots[0] / "shard-0.tfrecord", recs)
    write_tfrecord(roots[1] / "shard-1.tfrecord", recs)
    roots = [os.fspath(r) for r in roots]
    _dataset(roots)
    corrupt_unnoticed(os.path.join(roots[0], "shard-0.tfrecord"), [6])
    ds = _dataset(roots, on_error="skip", shuffle="none", shuffle_shards=False)
    got = [r for b in _batches(ds) for r in b]
    assert got == recs[:6] + recs[7:] + recs
    assert ds.stats()["corrupt_copies"] == 0 and ds.stats()["skipped"] == 1


@pytest.mark.filterwarnings("ignore:bad copy on mount")
def test_an_index_built_while_the_first_copy_is_rotten_comes_from_a_good_one(tmp_path):
    """No manifest yet, and mount 0's copy of a shard holds a bad record: the index is built from the
    next holder's copy, and every record is read once."""
    data, roots = _mounts_of(tmp_path, np.random.default_rng(8), shards=3, records=20)
    frames = np.cumsum([0] + [16 + len(r) for r in data[1]])[:-1]
    flip_data_byte(os.path.join(roots[0], "shard-1.tfrecord"), 4, frames)
    flip_data_byte(os.path.join(roots[1], "shard-1.tfrecord"), 9, frames)
    everything = [r for d in data for r in d]
    for _ in range(2):  # building the manifests, then from them
        ds = _dataset(roots, shuffle="none", shuffle_shards=False)
        assert [r for b in _batches(ds) for r in b] == everything


@pytest.mark.filterwarnings("ignore:bad copy on mount")
@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_a_record_bad_where_it_reads_and_unreadable_elsewhere_ends(replicas, on_error, monkeypatch):
    """Shard 1's record 6 is bad on mounts 1 and 2, and mount 0's copy is gone: no good copy can be read.
    The pass must end (``raise``) or leave that record out (``skip``), not go back and forth between
    the bad copies."""
    import functools
    import signal

    from dlstore.io import failover

    monkeypatch.setattr(failover.MountHealth, "__init__", functools.partialmethod(
        failover.MountHealth.__init__, retry_delay=0.0))
    data, roots = replicas
    _damage(roots, {(1, 6): (1, 2)})
    ds = _dataset(roots, shuffle="none", shuffle_shards=False, on_error=on_error, max_retries=1)
    os.unlink(os.path.join(roots[0], "shard-1.tfrecord"))

    def hung(*_):
        raise TimeoutError("the pass went round in circles")

    signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        if on_error == "skip":
            got = [r for b in _batches(ds) for r in b]
            assert got == [r for d in data for r in d if r != data[1][6]]
            assert ds.stats()["skipped"] == 1
        else:
            with pytest.raises(dlstore.CorruptRecordError, match="record 6 of shard 1") as e:
                _batches(ds)
            assert "could not be read" in str(e.value) and roots[0] in str(e.value)
    finally:
        signal.alarm(0)


def test_a_copy_that_cannot_be_read_while_indexing_is_indexed_from_its_replica(tmp_path, monkeypatch):
    """A device error on the first mount's copy while the Dataset indexes (a job restarted after a disk
    died) indexes that shard from its next holder: it raised, though another mount held a good copy. (The
    error is a stand-in for the EIO a fault-injection trial's loop device gave: index_dataset raising it
    for mount 0's shard-2, as _scan_shards did reading its head.)"""
    from dlstore.errors import DlstoreIOError
    from dlstore.sources import dataset as dataset_module

    data, roots = _mounts_of(tmp_path, np.random.default_rng(5), shards=4, records=30)
    real = dataset_module.index_dataset
    dead = os.path.join(roots[0], "shard-2.tfrecord")

    def failing(paths, *a, **kw):
        if dead in paths:
            raise DlstoreIOError(f"{dead}: cannot read: Input/output error (errno 5)", path=dead, errno=5)
        return real(paths, *a, **kw)

    def no_manifest(pattern, *a, **kw):  # the first mount's glob fails too (its copy of shard-2 is read)
        raise DlstoreIOError(f"{dead}: cannot read: Input/output error (errno 5)", path=dead, errno=5)

    monkeypatch.setattr(dataset_module, "index_dataset", failing)
    monkeypatch.setattr(dataset_module, "open_shards", no_manifest)
    ds = _dataset(roots)
    assert any("shard-2.tfrecord indexed from" in n and "mnt1" in n for n in ds.index.notes), ds.index.notes
    monkeypatch.undo()
    got = collections.Counter(r for b in _batches(ds) for r in b)
    assert got == collections.Counter(r for recs in data for r in recs)
