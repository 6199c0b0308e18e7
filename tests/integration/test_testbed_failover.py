"""A replica mount goes away mid-epoch on real loop-mounted filesystems (``dlstore testbed``), and the epoch
still completes with every record once, the failovers counted. Root only: skipped, saying why, otherwise."""
import collections
import os
import shutil

import numpy as np
import pytest

import dlstore
from dlstore.sources.dataset import Dataset
from dlstore.placement.world import World
from dlstore.tools.testbed import create_testbed, destroy_testbed, missing_tools, root_refusal
from tests.helpers import batch_records

pytestmark = [pytest.mark.slow, pytest.mark.root]


@pytest.fixture
def testbed(tmp_path_factory):
    why = root_refusal() or (f"missing tools: {', '.join(missing_tools())}" if missing_tools() else None)
    if why:
        pytest.skip(f"the testbed needs root and loop devices: {why}")
    src = tmp_path_factory.mktemp("src")
    rng = np.random.default_rng(4)
    records = []
    for s in range(6):
        with dlstore.TFRecordWriter(os.fspath(src / f"part-{s}.tfrecord")) as w:
            for i in range(60):
                rec = f"{s}/{i}:".encode() + rng.bytes(int(rng.integers(1000, 40_000)))
                w.write(rec)
                records.append(rec)
    base = os.fspath(tmp_path_factory.mktemp("testbed"))
    tb = create_testbed(base, 2, size_bytes=64 << 20, data=os.fspath(src), layout="replicated", progress=False)
    try:
        yield tb, records
    finally:
        destroy_testbed(base)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("how", ["eio", "umount"])
def test_losing_a_mount_mid_epoch_fails_over_and_loses_nothing(testbed, how):
    tb, records = testbed
    # A shuffle buffer of a few records: reading goes on through the epoch (a large one would read the
    # whole of this small set before the mount breaks). A lazy umount spares the files already open, so
    # there the shards are read in order, each opened when its turn comes; EIO fails open files too.
    shuffle = "block" if how == "eio" else "none"
    ds = Dataset("*.tfrecord", mounts=tb.mountpoints, world=World(rank=0, size=1), remainder="uneven",
                 io="buffered", chunk_size=256 << 10, block_size=256 << 10, buffer_size=8, shuffle=shuffle,
                 shuffle_shards=False, seed=1)
    assert ds.layout.kind == "replicated" and ds.rank_mounts == [tb.mountpoints[0]]
    tb.evict()
    got, broke = [], False
    for batch in ds.batches():
        got += batch_records(batch)
        if not broke and len(got) > len(records) // 3:
            tb.break_mount(0, how)  # this rank's mount, a third into the epoch
            broke = True
    assert broke
    assert collections.Counter(got) == collections.Counter(records)
    stats = ds.stats()
    assert stats["failovers"] >= 1 and stats["failed_mounts"] == [tb.mountpoints[0]]
    del ds, batch
    tb.restore()


@pytest.mark.parametrize("io", ["direct", "io_uring"])  # io_uring: the read stalls inside the ring's wait
def test_a_stalled_mount_times_out_and_fails_over(testbed, io):
    tb, records = testbed
    ds = Dataset("*.tfrecord", mounts=tb.mountpoints, world=World(rank=0, size=1), remainder="uneven",
                 io=io, chunk_size=256 << 10, block_size=256 << 10, read_timeout=1.0, seed=2)
    assert ds.engine == io, ds.engine_reason
    tb.evict()
    tb.break_mount(0, "stall")  # reads from mnt0 crawl at 4 KiB/s
    try:
        got = [r for batch in ds.batches() for r in batch_records(batch)]
    finally:
        tb.restore()  # the abandoned read finishes, so the mount can be unmounted
    assert collections.Counter(got) == collections.Counter(records)
    stats = ds.stats()
    assert stats["failovers"] == 1 and "timed out" in stats["failover_events"][0]


@pytest.mark.parametrize("io", ["buffered", "io_uring"])  # io_uring: EIO comes back in a completion
def test_without_a_replica_the_error_names_mount_file_and_offset(testbed, io):
    tb, _ = testbed
    ds = Dataset("part-1.tfrecord", mounts=tb.mountpoints[:1], world=World(rank=0, size=1), io=io,
                 chunk_size=256 << 10, max_retries=1)
    tb.evict()
    tb.break_mount(0, "eio")
    with pytest.raises(dlstore.DlstoreIOError) as e:
        for _ in ds.batches():
            pass
    msg = str(e.value)
    assert tb.mountpoints[0] in msg and "part-1.tfrecord" in msg and "at byte" in msg
    assert ds.stats()["retries"] == 1
    del ds
    tb.restore()
