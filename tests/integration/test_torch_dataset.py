"""PyTorch's DataLoader workers over a ``dlstore.Dataset``: 2 ranks x 2 workers read every record once per
epoch, and each worker reads through the dataset's mounts."""
import collections
import os
import shutil

import pytest

import dlstore
from dlstore.sources.dataset import Dataset
from dlstore.placement.world import World

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch (pip install torch==2.13.0)")


@pytest.mark.slow  # spawns DataLoader workers, each importing torch
def test_ranks_and_workers_read_every_record_once(tmp_path):
    from dlstore.adapters.torch import DlstoreIterableDataset

    records = []
    src = tmp_path / "src"
    src.mkdir()
    for s in range(5):
        with dlstore.TFRecordWriter(os.fspath(src / f"part-{s}.tfrecord")) as w:
            for i in range(17 + s):
                rec = f"shard {s} record {i}".encode()
                w.write(rec)
                records.append(rec)
    mounts = []
    for m in range(2):
        shutil.copytree(src, tmp_path / f"mnt{m}")
        mounts.append(os.fspath(tmp_path / f"mnt{m}"))
    for epoch in range(2):
        seen = collections.Counter()
        for rank in range(2):
            ds = Dataset("*.tfrecord", mounts=mounts, world=World(rank=rank, size=2), remainder="uneven",
                         shuffle="global", seed=4)
            with pytest.warns(RuntimeWarning, match="different batch counts"):  # uneven by choice: exactly once
                it = DlstoreIterableDataset(ds)
            it.set_epoch(epoch)
            # Workers are spawned, not forked: a fork copies whatever locks the threads of earlier
            # tests in this process hold at that moment, and a worker can hang on one. (It also
            # checks that the dataset pickles, as spawn and forkserver need.)
            loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2, multiprocessing_context="spawn")
            seen.update(bytes(r) for r in loader)
        assert seen == collections.Counter(records)


@pytest.mark.slow  # spawns DataLoader workers, each importing torch
def test_persistent_workers_follow_set_epoch(tmp_path):
    """With persistent_workers a worker keeps the copy of the dataset it started with: set_epoch reached only
    the main process's, and every epoch had the first one's order. Each epoch must read as with fresh workers."""
    from dlstore.adapters.torch import DlstoreIterableDataset

    with dlstore.TFRecordWriter(os.fspath(tmp_path / "a.tfrecord")) as w:
        for i in range(60):
            w.write(b"record %d" % i)

    def orders(persistent):
        it = DlstoreIterableDataset(Dataset(tmp_path, shuffle="global", seed=4, remainder="uneven", world=World()))
        loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2, multiprocessing_context="spawn",
                                             persistent_workers=persistent)
        out = []
        for epoch in range(3):
            it.set_epoch(epoch)
            out.append([bytes(r) for r in loader])
        return out

    fresh, persistent = orders(False), orders(True)
    assert persistent == fresh
    assert len({tuple(o) for o in fresh}) == 3 and all(sorted(o) == sorted(fresh[0]) for o in fresh)
