"""``dlstore plan --json`` lists exactly the reads a Dataset performs: every file, byte range and mount, in
reading order, checked against the arrays the Dataset hands its C++ reader."""
import json
import os

import numpy as np
import pytest

import dlstore
from dlstore import _C, cli
from dlstore.placement.world import World
from dlstore.sources.dataset import Dataset

MOUNTS = 4


def _mounts(tmp_path, layout, shards=8):
    rng = np.random.default_rng(5)
    mounts = [os.fspath(tmp_path / f"mnt{m}") for m in range(MOUNTS)]
    for m in mounts:
        os.makedirs(m)
    for s in range(shards):
        holders = (range(MOUNTS) if layout == "replicated" else [s % MOUNTS] if layout == "striped"
                   else [s % MOUNTS, (s + 1) % MOUNTS] if s % 2 else [s % MOUNTS])
        sizes = rng.integers(200, 3000, size=int(rng.integers(30, 90)))
        for m in holders:
            with dlstore.TFRecordWriter(os.path.join(mounts[m], f"d-{s}.tfrecord")) as w:
                for n in sizes:
                    w.write(b"x" * int(n))
    return mounts


def _given_reads(monkeypatch, ds):
    """The reads the Dataset hands its reader over one epoch: ``(path, start, stop, mount)``, neighbouring
    frames of one file merged, in reading order; the mount is the one whose directory holds the path."""
    given = []
    real = _C.PlanReader

    def spy(paths, file, offset, size, *args, **kwargs):
        given.append((list(paths), np.asarray(file).copy(), np.asarray(offset).copy(), np.asarray(size).copy()))
        return real(paths, file, offset, size, *args, **kwargs)

    monkeypatch.setattr(_C, "PlanReader", spy)
    for _ in ds.batches():
        pass
    monkeypatch.setattr(_C, "PlanReader", real)
    # No failover: one plan for the epoch, or one per window where the shuffle is planned in windows.
    assert len(given) == 1 + len(ds.window_starts(len(ds)))
    reads = []
    for paths, file, offset, size in given:
        window = len(reads)
        for f, o, n in zip(file.tolist(), offset.tolist(), size.tolist()):
            path = paths[f]
            mount = next(m for m in ds.mounts if path.startswith(m + os.sep))
            if len(reads) > window and reads[-1][0] == path and reads[-1][2] == o:
                reads[-1] = (path, reads[-1][1], o + n, mount)
            else:
                reads.append((path, o, o + n, mount))
    return reads


@pytest.mark.parametrize("layout", ["replicated", "striped", "mixed"])
@pytest.mark.parametrize("per_rank", [1, 2, 4])
@pytest.mark.parametrize("shuffle", ["block", "global"])
def test_plan_json_lists_the_reads_the_dataset_performs(tmp_path, monkeypatch, capsys, layout, per_rank, shuffle):
    monkeypatch.setenv("DLSTORE_PLAN_WINDOW_FILES", "0")  # a global pass in windows, as at scale
    mounts = _mounts(tmp_path, layout)
    world = 2
    assert cli.main(["plan", "--mounts", *mounts, "--world-size", str(world), "--mounts-per-rank", str(per_rank),
                     "--shuffle", shuffle, "--seed", "3", "--epoch", "1", "--batch-size", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["layout"]["kind"] == layout and len(doc["consumers"]) == world
    for rank in range(world):
        ds = Dataset(None, mounts=mounts, world=World(rank=rank, size=world), mounts_per_rank=per_rank,
                     shuffle=shuffle, seed=3, batch_size=4, io="buffered")
        ds.set_epoch(1)
        performed = _given_reads(monkeypatch, ds)
        listed = [(r["path"], r["start"], r["stop"], r["mount"]) for r in doc["consumers"][rank]["reads"]]
        assert listed == performed
        assert doc["consumers"][rank]["mounts"] == ds.rank_mounts
        if layout == "replicated":  # every read through one of the rank's own mounts
            assert {r[3] for r in performed} <= set(ds.rank_mounts)


@pytest.mark.parametrize("world, batch, remainder", [(3, 100, "drop"), (201, 1, "uneven"), (201, 1, "drop")])
def test_plan_lists_a_rank_with_nothing_to_read(tmp_path, capsys, world, batch, remainder):
    mounts = _mounts(tmp_path, "replicated", shards=2)[:1]
    assert cli.main(["plan", "--mounts", *mounts, "--world-size", str(world), "--batch-size", str(batch),
                     "--remainder", remainder, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    empty = [c for c in doc["consumers"] if not c["reads"]]
    assert empty and all(not c["reads"] for c in empty)


def test_plan_refuses_a_shard_rewritten_in_any_rank_shown(tmp_path, capsys):
    from tests.helpers import write_tfrecord

    for s in range(2):
        write_tfrecord(tmp_path / f"d-{s}.tfrecord", [b"x" * 100] * 50)
    assert cli.main(["index", str(tmp_path)]) == 0
    write_tfrecord(tmp_path / "d-1.tfrecord", [b"y" * 90] * 7)  # rank 1's shard, in the plan below
    capsys.readouterr()
    args = ["plan", "--mounts", str(tmp_path), "--world-size", "2", "--shuffle", "none", "--no-shard-shuffle"]
    for rank in ([], ["--rank", "1"]):
        assert cli.main(args + rank) == 2
        err = capsys.readouterr().err
        assert "d-1.tfrecord: rewritten since" in err and len(err.splitlines()) == 1
    assert cli.main(args + ["--rank", "0"]) == 0  # rank 0's shard is as indexed


@pytest.mark.parametrize("layout", ["replicated", "striped", "mixed"])
def test_a_glob_over_mounts_reads_what_every_file_under_them_gives(tmp_path, monkeypatch, layout):
    """One glob over mounts is answered on the first mount from its manifest (the other mounts compared by
    their listings); the records, their order and the reads are those of the plain layout scan."""
    from dlstore.sources import layout as layout_module

    mounts = _mounts(tmp_path, layout)
    kw = dict(mounts=mounts, world=World(rank=1, size=2), mounts_per_rank=2, shuffle="block", seed=4,
              batch_size=4, io="buffered")
    plain = Dataset(None, **kw)
    firsts = []
    real = layout_module.scan_layout

    def spy(mounts, shards=None, first=None):
        firsts.append(first)
        return real(mounts, shards, first=first)

    import dlstore.sources.dataset as dataset_module

    indexed = []
    real_index = dataset_module._index_good_copies
    monkeypatch.setattr(dataset_module, "_index_good_copies", lambda *a: indexed.append(1) or real_index(*a))
    monkeypatch.setattr(dataset_module, "scan_layout", spy)
    globbed = Dataset("d-*.tfrecord", **kw)
    assert firsts[0] is not None  # the first mount's listing came from its manifest
    assert bool(indexed) == (layout != "replicated")  # its index serves when it holds every shard
    assert globbed.layout.holders == plain.layout.holders and globbed.shards == plain.shards

    def records(ds):
        return [bytes(memoryview(b).cast("B")) for b in ds.batches()]

    assert records(globbed) == records(plain)
    assert _given_reads(monkeypatch, globbed) == _given_reads(monkeypatch, plain)
