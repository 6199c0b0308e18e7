"""``dlstore.Dataset`` over real files on several "mounts" (directories here; loop mounts in test_testbed_failover)."""
import collections
import os
import shutil

import numpy as np
import pytest

import dlstore
from dlstore.dataset import Dataset
from dlstore.placement.world import World
from tests.conftest import batch_records


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
@pytest.mark.parametrize("shuffle", ["none", "buffer", "global"])
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


def test_a_new_world_size_only_at_an_epoch_boundary(tmp_path):
    _write_shards(tmp_path / "d")
    ds = Dataset(tmp_path / "d", world=World(rank=0, size=4), batch_size=2)
    ds.load_state_dict({"epoch": 3, "sample_in_epoch": 0, "seed": 0, "num_consumers": 2})
    assert ds.epoch == 3
    with pytest.raises(dlstore.PlacementError, match="epoch boundary"):
        ds.load_state_dict({"epoch": 3, "sample_in_epoch": 5, "seed": 0, "num_consumers": 2})
    with pytest.raises(dlstore.PlacementError, match="seed"):
        ds.load_state_dict({"epoch": 3, "sample_in_epoch": 0, "seed": 1, "num_consumers": 4})


def test_a_block_is_read_through_the_same_mount_every_epoch(tmp_path):
    _, mounts = _mounts(tmp_path, "replicated")
    chosen = {}
    for epoch in range(4):
        for rank in range(3):
            ds = Dataset("*.tfrecord", mounts=mounts, world=World(rank=rank, size=3), shuffle="global",
                         block_size=64 << 10, seed=1)
            for piece in ds._reading_order(epoch):
                for r in range(piece.start, piece.stop):
                    key = (rank, piece.shard, r)
                    assert chosen.setdefault(key, piece.places[0].mount) == piece.places[0].mount


def test_a_rank_with_two_mounts_alternates_between_them(tmp_path):
    _, mounts = _mounts(tmp_path, "replicated", n=4)
    ds = Dataset("*.tfrecord", mounts=mounts, world=World(rank=1, size=2), mounts_per_rank=2,
                 block_size=64 << 10, seed=1)
    assert ds.rank_mounts == mounts[2:4]
    used = [p.places[0].mount for p in ds._reading_order(0)]
    assert set(used) == set(mounts[2:4])
    switches = sum(a != b for a, b in zip(used, used[1:]))
    assert switches >= len(used) // 2  # taking turns, not one mount after the other


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
    with pytest.raises(dlstore.DlstoreError, match="compressed shards cannot be split"):
        Dataset(tmp_path / "x.tfrecord.gz")
