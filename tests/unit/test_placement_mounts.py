"""Layouts, rank -> mount assignment, shard -> mount choice, the world's mount plan, scanning mounts
on disk, and ``dlstore plan``."""
from __future__ import annotations

import json
import os
import warnings
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlstore import cli
from dlstore.errors import PlacementError
from dlstore.sources.layout import scan_layout
from dlstore.placement.mounts import Layout, assign_all_mounts, assign_mounts, mount_for, mounts_for
from dlstore.placement.rank import plan_rank
from dlstore.placement.sharding import EpochPlan
from dlstore.placement.world import World

SHARDS = [f"train-{i:05d}.tfrecord" for i in range(12)]
MOUNTS = [f"/mnt/isilon{i}" for i in range(1, 17)]


def world(rank, size, local_rank=0, local_size=1):
    return World(rank=rank, size=size, local_rank=local_rank, local_size=local_size)


# ---- layouts ----------------------------------------------------------------------------------------

def test_layout_kinds():
    assert Layout.replicated(MOUNTS[:4], SHARDS).kind == "replicated"
    assert Layout.striped(MOUNTS[:4], SHARDS).kind == "striped"
    assert Layout.replicated(MOUNTS[:1], SHARDS).kind == "replicated"  # one mount
    mixed = Layout(MOUNTS[:3], SHARDS[:3], ((0, 1), (2,), (0, 1, 2)))
    assert mixed.kind == "mixed"
    assert mixed.replicas(0) == (0, 1) and mixed.replicas(SHARDS[1]) == (2,)
    assert mixed.path(1, 2) == os.path.join(MOUNTS[2], SHARDS[1])
    assert mixed.holder_matrix.tolist() == [[True, True, False], [False, False, True], [True, True, True]]


@pytest.mark.parametrize("holders,message", [
    (((0,), ()), "on no mount"),
    (((0,), (5,)), "outside"),
    (((0,),), "holder lists"),
])
def test_bad_layouts(holders, message):
    with pytest.raises(PlacementError, match=message):
        Layout(MOUNTS[:2], SHARDS[:2], holders)
    with pytest.raises(PlacementError, match="at least one mount"):
        Layout((), (), ())
    with pytest.raises(PlacementError, match="not a shard"):
        Layout.replicated(MOUNTS[:2], SHARDS[:2]).replicas("nope")


def test_one_directory_given_twice_is_not_two_mounts(tmp_path, capsys):
    """--mounts m0 m0/ was two replicas (both ranks on one storage, failover to the mount that failed, a scrub
    counting every copy twice)."""
    (tmp_path / "m0").mkdir()
    (tmp_path / "m0" / "a.tfrecord").write_bytes(b"")
    m0 = os.fspath(tmp_path / "m0")
    with pytest.raises(PlacementError, match=f"mount points {m0} and {m0}/ are the same directory"):
        scan_layout([m0, m0 + "/"])
    os.symlink(m0, tmp_path / "alias")
    with pytest.raises(PlacementError, match="are the same directory"):
        scan_layout([m0, os.fspath(tmp_path / "alias")])
    for command in (["verify", "--mounts", m0, m0], ["plan", "--mounts", m0, m0 + "/", "--world-size", "2"]):
        assert cli.main(command) == 2
        assert "are the same directory: give each mount once" in capsys.readouterr().err


# ---- rank -> mounts --------------------------------------------------------------------------------

def test_round_robin_by_rank_like_the_seeds():
    layout = Layout.replicated(MOUNTS, SHARDS)
    # round_robin_mpi.py: rank r uses --data_dir number r % 16
    for size in (1, 16, 40):
        for r in range(size):
            assert assign_mounts(layout, world(r, size)) == [r % 16]
    four = Layout.replicated(MOUNTS[:4], SHARDS)
    assert [assign_mounts(four, world(r, 3), mounts_per_rank=2) for r in range(3)] == [[0, 1], [2, 3], [0, 1]]
    assert assign_all_mounts(four, 3, mounts_per_rank=2) == [[0, 1], [2, 3], [0, 1]]


def test_by_local_rank():
    layout = Layout.replicated(MOUNTS[:4], SHARDS)
    # two hosts of 4 ranks: each host spreads its ranks over all four mounts
    got = [assign_mounts(layout, world(r, 8, r % 4, 4), policy="local_rank") for r in range(8)]
    assert got == [[0], [1], [2], [3], [0], [1], [2], [3]]
    assert assign_all_mounts(layout, 8, "local_rank", local_size=2) == [[0], [1]] * 4


def test_weighted_by_throughput():
    layout = Layout.replicated(MOUNTS[:4], SHARDS)
    throughput = [1.0, 1.0, 2.0, 0.0]  # mount 3 is dead
    per_rank = assign_all_mounts(layout, 8, "weighted", throughput=throughput)
    assert Counter(m for ms in per_rank for m in ms) == {0: 2, 1: 2, 2: 4}
    assert per_rank == assign_all_mounts(layout, 8, "weighted", throughput=throughput)  # deterministic
    assert [assign_mounts(layout, world(r, 8), "weighted", throughput=throughput) for r in range(8)] == per_rank
    two = assign_all_mounts(layout, 6, "weighted", mounts_per_rank=2, throughput=[3, 1, 1, 1])
    assert all(len(set(ms)) == 2 for ms in two)  # a rank's mounts are distinct
    assert Counter(m for ms in two for m in ms)[0] == 6  # half the throughput, half the reads


@pytest.mark.parametrize("kwargs,message", [
    ({"policy": "random"}, "unknown mount policy"),
    ({"mounts_per_rank": 5}, "mounts_per_rank"),
    ({"mounts_per_rank": 0}, "mounts_per_rank"),
    ({"policy": "weighted"}, "needs throughput"),
    ({"policy": "weighted", "throughput": [1, 2]}, "one finite figure"),
    ({"policy": "weighted", "throughput": [1, -1, 1, 1]}, "one finite figure"),
    ({"policy": "weighted", "throughput": [1, 0, 0, 0], "mounts_per_rank": 2}, "only 1 mounts"),
])
def test_bad_assignments(kwargs, message):
    with pytest.raises(PlacementError, match=message):
        assign_mounts(Layout.replicated(MOUNTS[:4], SHARDS), world(0, 2), **kwargs)


# ---- shard -> mount --------------------------------------------------------------------------------

def test_mount_for_prefers_the_ranks_mounts_and_lists_failovers():
    layout = Layout(MOUNTS[:4], SHARDS[:4], ((0, 1, 2, 3), (2,), (1, 3), (0, 2)))
    mount, fallbacks = mount_for(layout, 0, [1, 3])
    assert mount in (1, 3) and set(fallbacks) == {0, 1, 2, 3} - {mount}
    assert fallbacks[0] in (1, 3)  # the rank's other mount first
    assert mount_for(layout, 1, [0]) == (2, ())  # striped shard: through its only holder
    mount, fallbacks = mount_for(layout, 3, [1])  # not on the rank's mount: one of its holders
    assert mount in (0, 2) and fallbacks == tuple({0, 2} - {mount})
    assert mount_for(layout, SHARDS[2], [3]) == (3, (1,))


@settings(max_examples=100, deadline=None)
@given(data=st.data(), num_mounts=st.integers(1, 6), num_shards=st.integers(1, 20))
def test_mounts_for_agrees_with_mount_for(data, num_mounts, num_shards):
    holders = [tuple(data.draw(st.sets(st.integers(0, num_mounts - 1), min_size=1))) for _ in range(num_shards)]
    layout = Layout([f"/m{i}" for i in range(num_mounts)], [f"s{i}" for i in range(num_shards)], holders)
    mine = data.draw(st.lists(st.integers(0, num_mounts - 1), min_size=1, max_size=num_mounts, unique=True))
    vector = mounts_for(layout, np.arange(num_shards), mine)
    for s in range(num_shards):
        mount, fallbacks = mount_for(layout, s, mine)
        assert vector[s] == mount and mount in layout.holders[s]
        assert sorted((mount,) + fallbacks) == list(layout.holders[s])
        if set(mine) & set(layout.holders[s]):
            assert mount in mine


def test_blocks_of_a_shard_spread_over_the_ranks_mounts():
    layout = Layout.replicated(MOUNTS[:4], SHARDS)
    got = [mount_for(layout, 5, [2, 3], block=j)[0] for j in range(4)]
    assert got == [3, 2, 3, 2]  # (5 + j) % 2 -> the rank's mounts alternate
    assert mounts_for(layout, [5] * 4, [2, 3], blocks=range(4)).tolist() == got
    assert mount_for(layout, 5, [2, 3]) == mount_for(layout, 5, [2, 3], block=0)


def _reads(layout, size, epoch, per_rank, counts, workers=1, **order):
    """Per rank: its mounts and ``(shard, record, mount)`` of what it reads, planned by the one planner."""
    plan = EpochPlan(counts, size * workers, epoch=epoch, **order)
    out = []
    for rank in range(size):
        mine = assign_mounts(layout, World(rank=rank, size=size), mounts_per_rank=per_rank)
        got = []
        for w in range(workers):
            p = plan_rank(plan, rank * workers + w, mine, layout=layout)
            got += list(zip(p.shards.tolist(), p.records.tolist(), p.mounts.tolist()))
        out.append((mine, got))
    return out


def test_a_shard_stays_on_its_mount_across_epochs():
    layout = Layout.replicated(MOUNTS[:4], [f"s{i}" for i in range(64)])
    # a rank with all four mounts: every shard always through the same one, whichever rank reads it
    chosen = {}
    for epoch in range(6):
        for _, reads in _reads(layout, 4, epoch, 4, [10] * 64, block_records=10):
            for shard, _, mount in reads:
                assert chosen.setdefault(shard, mount) == mount
    assert len(chosen) == 64 and len(set(chosen.values())) == 4  # and all mounts are used
    # one mount per rank: a given rank reads a given shard through the same mount every epoch
    per_rank = {}
    for epoch in range(6):
        for rank, (_, reads) in enumerate(_reads(layout, 8, epoch, 2, [10] * 64, block_records=10)):
            for shard, _, mount in reads:
                assert per_rank.setdefault((rank, shard), mount) == mount


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 20), min_size=1, max_size=10), size=st.integers(1, 9),
       workers=st.integers(1, 3), k=st.integers(1, 3), striped=st.booleans(), seed=st.integers(0, 99),
       block=st.integers(1, 7))
def test_the_plan_reads_every_record_once_through_a_holder(counts, size, workers, k, striped, seed, block):
    shards = [f"s{i}" for i in range(len(counts))]
    layout = (Layout.striped if striped else Layout.replicated)(MOUNTS[:3], shards)
    seen = Counter()
    for mine, reads in _reads(layout, size, 0, k, counts, workers, remainder="uneven", seed=seed,
                              block_records=block, shuffle="block"):
        for shard, record, mount in reads:
            assert mount in layout.holders[shard]
            if not striped:
                assert mount in mine
            seen[(shard, record)] += 1
    assert seen == Counter((s, r) for s, n in enumerate(counts) for r in range(n))


# ---- on disk ---------------------------------------------------------------------------------------

def _write(path, data: bytes):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def test_scan_replicated_striped_mixed(tmp_path):
    mounts = [str(tmp_path / f"m{i}") for i in range(3)]
    for m in mounts:
        os.makedirs(m)
    for i in range(4):  # replicated
        for m in mounts:
            _write(os.path.join(m, "rep", f"a{i}.tfrecord"), b"x" * (10 + i))
    for i in range(3):  # striped
        _write(os.path.join(mounts[i], "str", f"b{i}.tfrecord"), b"y" * 5)
    _write(os.path.join(mounts[0], "rep", "a0.tfrecord.idx"), b"0 26\n")  # an index is not a shard
    _write(os.path.join(mounts[1], ".hidden"), b"z")
    assert scan_layout(mounts, ["rep/*.tfrecord"]).kind == "replicated"
    assert len(scan_layout(mounts, ["rep/a0*"]).shards) == 1  # the glob also matches a0.tfrecord.idx
    lay = scan_layout(mounts, ["str/*"])
    assert lay.kind == "striped" and lay.holders == ((0,), (1,), (2,))
    lay = scan_layout(mounts)
    assert lay.kind == "mixed" and len(lay.shards) == 7
    assert lay.shards[0] == os.path.join("rep", "a0.tfrecord")
    assert scan_layout(mounts, [os.path.join("str", "b1.tfrecord")]).holders == ((1,),)


def test_a_mount_with_no_record_files_is_said(tmp_path):
    """An empty mount point (a network mount that failed to mount) was taken in silence, its ranks reading
    from the other mounts while `plan` showed them on it."""
    full, empty = str(tmp_path / "full"), str(tmp_path / "empty")
    os.makedirs(empty)
    _write(os.path.join(full, "s.rec"), b"1234")
    with pytest.warns(RuntimeWarning, match=f"mount {empty} holds no record files \\(nothing mounted there\\?\\)"):
        lay = scan_layout([full, empty])
    assert lay.holders == ((0,),)
    _write(os.path.join(empty, "other.rec"), b"12")  # holds record files, just not the one asked for: a choice
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert scan_layout([full, empty], ["s.rec"]).holders == ((0,),)


def test_scan_errors_name_the_files(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    _write(os.path.join(a, "s.rec"), b"1234")
    _write(os.path.join(b, "s.rec"), b"123")
    assert scan_layout([a, b]).holders == ((0, 1),)  # listed, not stat-ed: sizes are the Dataset's check
    with pytest.raises(PlacementError, match="on no mount"):
        scan_layout([a], ["missing.rec"])
    with pytest.raises(PlacementError, match="no record file matches"):
        scan_layout([a], ["*.tfrecord"])
    with pytest.raises(PlacementError, match="not a directory"):
        scan_layout([str(tmp_path / "nope")])
    with pytest.raises(PlacementError, match="relative"):
        scan_layout([a], [os.path.join(a, "s.rec")])
    empty = str(tmp_path / "empty")
    os.makedirs(empty)
    with pytest.raises(PlacementError, match="no record files"):
        scan_layout([empty])


def _dataset(tmp_path, mounts=2, shards=3, records=(5, 0, 7)):
    from dlstore.writers import TFRecordWriter

    first = tmp_path / "m0"
    first.mkdir()
    for s in range(shards):
        with TFRecordWriter(str(first / f"d-{s}.tfrecord")) as w:
            for r in range(records[s]):
                w.write(f"shard {s} record {r}".encode())
    dirs = [str(first)]
    for m in range(1, mounts):
        d = tmp_path / f"m{m}"
        d.mkdir()
        for s in range(shards):
            (d / f"d-{s}.tfrecord").write_bytes((first / f"d-{s}.tfrecord").read_bytes())
        dirs.append(str(d))
    return dirs


def test_cli_plan(tmp_path, capsys):
    mounts = _dataset(tmp_path)
    assert cli.main(["plan", "--mounts", *mounts, "--world-size", "3"]) == 0
    out = capsys.readouterr().out
    assert "replicated" in out and "12 records" in out and "remainder pad" in out
    assert cli.main(["plan", "--mounts", *mounts, "--world-size", "4", "--json", "--remainder", "uneven"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["layout"]["kind"] == "replicated" and doc["total_records"] == 12
    assert sum(c["records"] for c in doc["consumers"]) == 12
    assert [c["mounts"] for c in doc["consumers"]] == [[mounts[0]], [mounts[1]], [mounts[0]], [mounts[1]]]
    assert all(r["mount"] in c["mounts"] for c in doc["consumers"] for r in c["reads"])
    assert cli.main(["plan", "--mounts", *mounts, "--world-size", "4", "--rank", "2", "--json"]) == 0
    assert [c["rank"] for c in json.loads(capsys.readouterr().out)["consumers"]] == [2]
    assert cli.main(["plan", "--mounts", *mounts, "--world-size", "2", "--policy", "weighted"]) == 2
    assert "throughput" in capsys.readouterr().err


def test_a_copy_of_another_size_on_a_rank_mount_is_refused_naming_both(tmp_path):
    """The layout scan lists the mounts without a stat per file; a rank compares the copies it reads through
    its own mounts with the copy indexed (they were compared in the scan, a stat per shard per mount)."""
    from dlstore.placement.world import World
    from dlstore.sources.dataset import Dataset
    from dlstore.writers import TFRecordWriter

    a, b = tmp_path / "a", tmp_path / "b"
    for m, n in ((a, 3), (b, 2)):
        m.mkdir()
        with TFRecordWriter(str(m / "s.tfrecord")) as w:
            for _ in range(n):
                w.write(b"x" * 100)
    with pytest.raises(PlacementError) as info:
        Dataset(None, mounts=[str(a), str(b)], mounts_per_rank=2, world=World(rank=0, size=1))
    text = str(info.value)
    assert str(a / "s.tfrecord") in text and str(b / "s.tfrecord") in text and "differs between mounts" in text
    Dataset(None, mounts=[str(a), str(b)], mounts_per_rank=1, world=World(rank=0, size=2))  # rank 0 reads a only


def test_mounts_whose_current_manifests_list_the_same_files_are_not_listed(tmp_path, monkeypatch):
    """Mounts of one export: each directory unchanged since a manifest listing the same files is a replica,
    told from the manifests alone; a mount whose manifest is stale is listed, and its extra shard found."""
    from dlstore.sources.indexing import open_shards
    from dlstore.writers import TFRecordWriter

    mounts = [tmp_path / f"m{i}" for i in range(3)]
    for m in mounts:
        m.mkdir()
        for s in range(3):
            with TFRecordWriter(str(m / f"d-{s}.tfrecord")) as w:
                w.write(b"x" * (10 + s))
        open_shards(str(m / "d-*"))  # a current manifest in each
    listed = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda d=".": listed.append(os.fspath(d)) or real(d))
    lay = scan_layout([str(m) for m in mounts], ["d-*"])
    assert lay.kind == "replicated" and len(lay.shards) == 3 and listed == []
    with TFRecordWriter(str(mounts[2] / "d-9.tfrecord")) as w:  # mount 2 changes: its manifest is stale
        w.write(b"y")
    lay = scan_layout([str(m) for m in mounts], ["d-*"])
    assert lay.kind == "mixed" and lay.holders[-1] == (2,) and str(mounts[2]) in listed


def _shards(mount, names, records=5):
    from dlstore.writers import TFRecordWriter

    for name in names:
        path = os.path.join(mount, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with TFRecordWriter(path) as w:
            for i in range(records):
                w.write(f"{name}:{i}".encode())


def _mount_dirs(tmp_path, n=3):
    out = [str(tmp_path / f"m{i}") for i in range(n)]
    for m in out:
        os.makedirs(m)
    return out


def test_a_copy_of_another_size_is_refused_in_a_later_epoch_too(tmp_path):
    from dlstore.placement.world import World
    from dlstore.sources.dataset import Dataset

    m = _mount_dirs(tmp_path, 2)
    for d in m:
        _shards(d, [f"s{i}.tfrecord" for i in range(4)])
    _shards(m[1], ["s1.tfrecord"], records=9)
    # Rank 1 reads through m1 alone; whichever epoch first gives it s1, that copy is refused.
    ds = Dataset("*.tfrecord", mounts=m, world=World(rank=1, size=2), shuffle="none")
    with pytest.raises(PlacementError, match="s1.tfrecord differs between mounts"):
        for epoch in range(4):
            ds.set_epoch(epoch)
            for _ in ds.batches():
                pass


def test_the_scan_keeps_the_old_answers_for_links_spellings_and_a_first_mount_without_the_glob(tmp_path):
    from dlstore.errors import DlstoreIOError

    # A first mount without the glob's directory: the others' shards (it crashed in the manifest fast path).
    m = _mount_dirs(tmp_path / "a")
    for i in range(4):
        _shards(m[1 + i % 2], [f"sub/s{i}.tfrecord"])
    from dlstore.sources.dataset import Dataset
    from dlstore.placement.world import World

    with pytest.warns(RuntimeWarning, match="holds no record files"):  # m0: nothing there at all
        ds = Dataset("sub/*.tfrecord", mounts=m, world=World(rank=0, size=2))
    assert ds.layout.holders == ((1,), (2,), (1,), (2,))
    with pytest.raises(PlacementError, match="no record file matches"):
        Dataset("nowhere/*.tfrecord", mounts=m, world=World(rank=0, size=2))
    # Links to directories are not followed by the walk (a loop, or another tree joining the set).
    m = _mount_dirs(tmp_path / "b", 2)
    for d in m:
        _shards(d, ["s0.tfrecord"])
    os.symlink(".", os.path.join(m[1], "self"))
    os.makedirs(tmp_path / "b" / "outside")
    _shards(str(tmp_path / "b" / "outside"), ["e.tfrecord"])
    os.symlink(str(tmp_path / "b" / "outside"), os.path.join(m[0], "extra"))
    assert scan_layout(m).shards == ("s0.tfrecord",)
    # One spelling of a glob: a shard it names and the same shard named exactly are one shard.
    m = _mount_dirs(tmp_path / "c")
    for d in m:
        _shards(d, [f"sub/s{i}.tfrecord" for i in range(3)])
    for spec in ("./sub/*.tfrecord", "sub/./*.tfrecord", "sub/../sub/*.tfrecord"):
        assert scan_layout(m, [spec]).shards == tuple(os.path.join("sub", f"s{i}.tfrecord") for i in range(3))
    assert len(scan_layout(m, ["./sub/*.tfrecord", "sub/s0.tfrecord"]).shards) == 3
    # A dangling link on a mount that holds none of the shards asked for does not stop the set...
    m = _mount_dirs(tmp_path / "d", 2)
    _shards(m[0], ["a.tfrecord"])
    _shards(m[1], ["b.tfrecord"])
    os.symlink("/nonexistent", os.path.join(m[1], "junk.tfrecord"))
    assert scan_layout(m, ["a*.tfrecord"]).holders == ((0,),)
    # ...but one among a mount's shards is refused, named, by the rank that reads that copy; so is a
    # directory of a shard's name. (The scan takes another mount's names alone.)
    m = _mount_dirs(tmp_path / "e")
    for d in m:
        _shards(d, ["s0.tfrecord", "s1.tfrecord"])
    os.unlink(os.path.join(m[1], "s1.tfrecord"))
    os.symlink("/nonexistent", os.path.join(m[1], "s1.tfrecord"))
    with pytest.raises(DlstoreIOError, match="s1.tfrecord: named as a shard but a symbolic link"):
        Dataset("*.tfrecord", mounts=m, world=World(rank=1, size=3))
    os.unlink(os.path.join(m[1], "s1.tfrecord"))
    os.makedirs(os.path.join(m[1], "s1.tfrecord"))
    with pytest.raises(DlstoreIOError, match="s1.tfrecord: named as a shard but a directory"):
        Dataset("*.tfrecord", mounts=m, world=World(rank=1, size=3))


def test_each_plan_checks_copies_not_checked_yet(tmp_path, monkeypatch):
    """As the index checks a rank's shards: each plan the first CHECK_SHARDS_PER_PLAN not checked yet, so
    a later plan reaches shards past the first plan's first ones."""
    from dlstore.placement.world import World
    from dlstore.sources import dataset as dataset_module
    from dlstore.sources.dataset import Dataset

    monkeypatch.setattr(dataset_module, "CHECK_SHARDS_PER_PLAN", 2)
    m = _mount_dirs(tmp_path, 2)
    for d in m:
        _shards(d, [f"s{i}.tfrecord" for i in range(6)], records=1)
    stats = []
    real = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: stats.append(os.fspath(p)) or real(p, *a, **k))
    ds = Dataset("*.tfrecord", mounts=m, mounts_per_rank=2, world=World(rank=0, size=1), shuffle="none")
    checked = lambda: sorted({os.path.basename(p) for p in stats if p.startswith(m[1] + os.sep)})  # noqa: E731
    first = checked()
    assert len(first) == 2
    for epoch in range(1, 3):
        ds.set_epoch(epoch)
        for _ in ds.batches():
            pass
    assert len(checked()) == 6 and set(first) < set(checked())
