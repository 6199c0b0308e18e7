"""A shuffle planned in windows (``global``): a pass gives the reader a window of batches at a time and
fetches only that window's frame offsets, yet hands out exactly the records of the whole plan, in its
order, across windows, resumes and ranks."""
import os

import numpy as np
import pytest

import dlstore
from dlstore.placement.world import World
from dlstore.sources import dataset as dataset_module
from dlstore.sources.dataset import Dataset


@pytest.fixture(autouse=True)
def windows_for_few_files(monkeypatch):
    """Windows wherever the shuffle is planned in them (by default only over more files than these tests write)."""
    monkeypatch.setenv("DLSTORE_PLAN_WINDOW_FILES", "0")


@pytest.fixture
def shards(tmp_path):
    for s in range(5):
        with dlstore.TFRecordWriter(os.fspath(tmp_path / f"train-{s:03d}")) as w:
            for i in range(37):
                w.write(f"s{s}r{i}|".encode() * (1 + (i * 7 + s) % 9))
    return os.fspath(tmp_path / "train-*")


def _keys(ds, batches):
    out = []
    for b in batches:
        shard, record = ds.record_keys(b)
        out += list(zip(shard.tolist(), record.tolist()))
    return out


def _planned(ds, epoch=0, emitted=0):
    """The whole plan's records from ``emitted`` on, as one reader would be given them."""
    plan = ds.read_plan(epoch, emitted)
    return list(zip(plan.shards.tolist(), plan.records.tolist()))


def _fetched(monkeypatch, ds):
    """Records whose frames each call of the index fetches."""
    calls = []
    frames = ds.index.frames

    def counting(shards, records):
        calls.append(len(shards))
        return frames(shards, records)

    monkeypatch.setattr(ds.index, "frames", counting)
    return calls


def test_the_first_batch_fetches_its_window_only_and_the_pass_every_frame_once(shards, monkeypatch):
    ds = Dataset(shards, shuffle="global", batch_size=3, remainder="uneven", seed=5)
    whole = _planned(ds)
    calls = _fetched(monkeypatch, ds)
    it = ds.batches()
    first = next(it)
    assert calls == [dataset_module.FIRST_WINDOW_BATCHES * 3]
    got = _keys(ds, [first]) + _keys(ds, it)
    assert got == whole and len(got) == 5 * 37
    assert len(calls) >= 3 and sum(calls) == 5 * 37  # several windows, each frame fetched once
    assert calls[1] == 4 * calls[0]  # windows grow
    assert ds.stats()["records"] == 5 * 37


@pytest.mark.parametrize("shuffle, files", [("block", "0"), ("none", "0"), ("global", "5")])
def test_other_passes_are_planned_whole(shards, monkeypatch, shuffle, files):
    # Other shuffles, and a global pass over no more files than plan_window_files: one plan for the pass.
    monkeypatch.setenv("DLSTORE_PLAN_WINDOW_FILES", files)
    ds = Dataset(shards, shuffle=shuffle, batch_size=3, remainder="uneven")
    calls = _fetched(monkeypatch, ds)
    assert sum(b.num_records for b in ds.batches()) == 5 * 37
    assert calls == [5 * 37] and len(ds.window_starts(5 * 37)) == 0
    monkeypatch.setenv("DLSTORE_PLAN_WINDOW_FILES", "4")
    assert len(ds.window_starts(5 * 37)) == (2 if shuffle == "global" else 0)  # over the setting: windows


@pytest.mark.parametrize("at", [5, 12, 13, 51, 60, 184])  # inside, at and past window ends
def test_a_resume_anywhere_continues_the_whole_plan(shards, at):
    ds = Dataset(shards, shuffle="global", batch_size=4, remainder="uneven", seed=2)
    whole = _planned(ds, epoch=1)
    ds.load_state_dict({"epoch": 1, "sample_in_epoch": at, "seed": 2, "num_consumers": 1})
    batches = list(ds.batches())
    assert _keys(ds, batches) == whole[at:]
    sizes = [b.num_records for b in batches]
    # the epoch's batch boundaries hold across windows
    assert sizes[0] == min(4 - at % 4, 5 * 37 - at) and all(n == 4 for n in sizes[1:-1])


@pytest.mark.parametrize("remainder", ["pad", "drop", "uneven"])
def test_ranks_read_each_record_once_across_windows(shards, remainder):
    seen = []
    for rank in range(3):
        ds = Dataset(shards, shuffle="global", world=World(rank=rank, size=3), batch_size=2, remainder=remainder)
        got = _keys(ds, ds.batches())
        assert got == _planned(ds) and len(got) == len(ds)
        seen += got
    counts = np.bincount([s * 37 + r for s, r in seen], minlength=5 * 37)
    if remainder == "uneven":
        assert (counts == 1).all()
    elif remainder == "drop":
        assert counts.max() == 1 and counts.sum() == len(seen)
    else:
        assert counts.min() == 1 and counts.sum() == len(seen)


def test_each_next_window_is_made_ahead_and_used(shards, monkeypatch):
    ds = Dataset(shards, shuffle="global", batch_size=3, remainder="uneven", seed=1)
    made, ahead = [], []
    core, read_ahead = Dataset._core, Dataset._read_ahead

    def counting_core(self, plan, start=0):
        made.append(start)
        return core(self, plan, start)

    def counting_ahead(self, *args):
        got = read_ahead(self, *args)
        ahead.append(got[0])
        return got

    monkeypatch.setattr(Dataset, "_core", counting_core)
    monkeypatch.setattr(Dataset, "_read_ahead", counting_ahead)
    assert sum(b.num_records for b in ds.batches()) == 5 * 37
    starts = [0] + ds.window_starts(5 * 37).tolist()
    assert len(starts) >= 3 and made == starts and ahead == starts[1:]  # one reader a window, all but the first ahead


@pytest.mark.parametrize("shuffle", ["none", "global"])
def test_record_keys_are_right_when_a_consumer_reads_fewer_records_than_there_are_shards(tmp_path, shuffle):
    # The reader is given only the shards its plan reads; record_keys took its file indices for shard
    # indices, so every key of such a consumer named another shard (each record carries its own name).
    for s in range(40):
        with dlstore.TFRecordWriter(os.fspath(tmp_path / f"s{s:03d}.tfrecord")) as w:
            for i in range(2):
                w.write(f"s{s}r{i}".encode())
    for rank in range(4):
        ds = dlstore.Dataset(os.fspath(tmp_path), world=World(rank=rank, size=4), shuffle=shuffle,
                             remainder="uneven", batch_size=4, seed=3)
        for b in ds.batches():
            shard, record = ds.record_keys(b)
            view = memoryview(b)
            named = [bytes(view[o:o + n]).decode() for o, n in zip(b.offsets, b.lengths)]
            shard_names = [int(os.path.basename(ds.shards[s])[1:4]) for s in shard.tolist()]
            keyed = [f"s{s}r{r}" for s, r in zip(shard_names, record.tolist())]
            assert keyed == named
