"""Byte ranges of shards through every engine, and a Dataset failing over between replica mounts (no root
needed).

The loop-mounted version, where a mount goes away mid-epoch, is in test_testbed_failover.py.
"""
import collections
import functools
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import dlstore
from dlstore import _C, Dataset, ReadOptions
from dlstore.sources.indexing import ensure_index
from dlstore.placement.world import World
from tests.helpers import REPO, batch_records, write_tfrecord


def _records(rng, n):
    return [rng.bytes(int(k)) for k in rng.integers(0, 30_000, n)]


def _core(engine, chunk=64 << 10, timeout_s=0.0):
    options = ReadOptions(chunk_size=chunk, depth=4, io_threads=2, verify_threads=1, read_timeout=timeout_s)

    def make(paths, ranges):
        return _C.Reader(paths, "tfrecord", ["none"] * len(paths), options.core(engine), ranges)
    return make


def _read(core):
    out = []
    while True:
        b = core.next_batch()
        if b is None:
            return out
        out += batch_records(b)


@pytest.mark.parametrize("chunk", [64 << 10, 1 << 20])
def test_ranges_read_exactly_their_records(engine_dir, engine, chunk):
    rng = np.random.default_rng(7)
    recs = _records(rng, 200)
    path = write_tfrecord(engine_dir / "r.tfrecord", recs)
    _, offs = ensure_index(path)
    ends = np.append(offs, os.path.getsize(path))
    # Starts that are not block-aligned, empty ranges, one record, the last record, the same file
    # several times in a row (one open file shared) and out of order.
    cuts = [(7, 123), (123, 124), (150, 200), (199, 200), (5, 5), (0, 200), (60, 61), (0, 3)]
    core = _core(engine, chunk)([path] * len(cuts), [(int(ends[a]), int(ends[b])) for a, b in cuts])
    assert _read(core) == [r for a, b in cuts for r in recs[a:b]]


def test_range_outside_the_file_is_an_error_naming_it(tmp_path):
    path = write_tfrecord(tmp_path / "x.tfrecord", [b"abc"] * 3)
    size = os.path.getsize(path)
    core = _core("buffered")([path], [(0, size + 100)])
    with pytest.raises(dlstore.DlstoreIOError, match="outside the file") as e:
        _read(core)
    assert e.value.path == path


def test_range_ending_inside_a_record_is_reported_truncated(tmp_path):
    path = write_tfrecord(tmp_path / "x.tfrecord", [b"a" * 100] * 3)
    core = _core("buffered")([path], [(0, 116 + 50)])
    with pytest.raises(dlstore.CorruptRecordError, match="truncated"):
        _read(core)


def test_compressed_files_refuse_ranges(tmp_path):
    path = os.fspath(tmp_path / "x.tfrecord")
    with dlstore.TFRecordWriter(path, compression="gzip") as w:
        w.write(b"abc")
    with pytest.raises(dlstore.DlstoreError, match="compressed"):
        _C.Reader([path], "tfrecord", ["gzip"], ReadOptions().core("buffered"), [(0, 10)])


# ---- failover: a Dataset over replica mounts ----------------------------------------------------

def _replicated(tmp_path, shards=4, n=50, mounts=2):
    rng = np.random.default_rng(3)
    data = [_records(rng, n) for _ in range(shards)]
    roots = [tmp_path / f"mnt{m}" for m in range(mounts)]
    for root in roots:
        root.mkdir()
        for s, recs in enumerate(data):
            write_tfrecord(root / f"shard-{s}.tfrecord", recs)
    return data, [os.fspath(r) for r in roots]


def _in_order(roots, **kw):
    """This rank (0 of 1, reading mount 0) over the mounts, records in shard order."""
    return Dataset("shard-*.tfrecord", mounts=roots, world=World(rank=0, size=1), shuffle="none",
                   shuffle_shards=False, remainder="uneven", block_size=64 << 10, chunk_size=64 << 10, **kw)


def _drain(ds):
    out = []
    for b in ds.batches():
        out += batch_records(b)
    return out


@pytest.fixture
def no_delay(monkeypatch):
    """Retries in place without the growing delay between them."""
    from dlstore.io import failover

    monkeypatch.setattr(failover.MountHealth, "__init__", functools.partialmethod(
        failover.MountHealth.__init__, retry_delay=0.0))


@pytest.mark.slow
def test_a_missing_shard_fails_over_to_the_replica(tmp_path, engine):
    data, roots = _replicated(tmp_path)
    ds = _in_order(roots, io=engine)
    assert ds.rank_mounts == [roots[0]]
    os.unlink(os.path.join(roots[0], "shard-2.tfrecord"))  # gone from the primary mount
    assert _drain(ds) == [r for recs in data for r in recs]
    stats = ds.stats()
    assert stats["failovers"] == 1 and stats["retries"] == 0
    assert stats["failed_mounts"] == [roots[0]]
    assert "shard 2" in stats["failover_events"][0]
    assert stats["records"] == sum(len(recs) for recs in data)  # nothing read twice was handed out twice


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", ["none", "block", "global"])
def test_failover_mid_shard_neither_loses_nor_repeats(tmp_path, monkeypatch, shuffle):
    monkeypatch.setenv("DLSTORE_PLAN_WINDOW_FILES", "0")  # a global pass in windows, as at scale
    data, roots = _replicated(tmp_path, shards=2, n=200)
    ds = Dataset("shard-*.tfrecord", mounts=roots, world=World(rank=0, size=1), shuffle=shuffle, buffer_size=50,
                 remainder="uneven", batch_size=16, block_size=64 << 10, chunk_size=64 << 10, seed=4)
    reference = _drain(ds)
    plans = []
    make = Dataset._core

    def flaky(self, plan, start=0):
        # The first reader over mnt0 hands out three batches, then its mount "fails" (EIO).
        core = make(self, plan, start)
        plans.append((start, plan))
        if len(plans) > 1:
            return core

        class Failing:
            n = 0

            def next_batch(self):
                Failing.n += 1
                if Failing.n > 3:
                    raise dlstore.DlstoreIOError(f"{plan.paths[0]}: at byte 1234: pread failed: Input/output error "
                                                 f"(errno 5)", path=plan.paths[0], offset=1234)
                return core.next_batch()

            def __getattr__(self, name):
                return getattr(core, name)
        return Failing()

    monkeypatch.setattr(Dataset, "_core", flaky)
    ds.set_epoch(0)
    assert _drain(ds) == reference
    assert ds.stats()["failovers"] == 1
    # The reader made after the failure starts at the first record not yet handed out, reading the mount
    # that failed no more: every record is on the replica. (Under a shuffle planned in windows the next
    # window's reader may have been made ahead, before the failure: it was dropped.)
    second = [plan for start, plan in plans[1:] if start == 3 * 16][-1]
    assert all(p.startswith(roots[1]) for p in second.paths)
    rest = len(reference) - 3 * 16
    if ds.shuffle_kind.planned_in_windows:  # the restarted pass's first window
        rest = min(rest, ds._window(3 * 16, 0))
    assert len(second.file) == rest or second.emit is not None


def test_without_a_replica_bounded_retries_then_an_error_naming_mount_file_offset(tmp_path, no_delay):
    data, roots = _replicated(tmp_path, shards=2, mounts=1)
    ds = _in_order(roots)
    os.unlink(os.path.join(roots[0], "shard-1.tfrecord"))
    got = []
    with pytest.raises(dlstore.DlstoreIOError) as e:
        for b in ds.batches():
            got.append(b.num_records)
    assert sum(got) == 50  # every record before the failure was delivered
    msg = str(e.value)
    assert roots[0] in msg and "shard-1.tfrecord" in msg and "record 0 of shard 1" in msg
    assert e.value.offset == 0
    assert ds.stats()["retries"] == 2


def test_a_file_missing_on_each_mount_is_read_from_the_other(tmp_path):
    data, roots = _replicated(tmp_path)
    ds = Dataset("shard-*.tfrecord", mounts=roots, world=World(rank=0, size=1), remainder="uneven",
                 block_size=64 << 10, chunk_size=64 << 10, buffer_size=8, seed=2)
    os.unlink(os.path.join(roots[0], "shard-3.tfrecord"))
    os.unlink(os.path.join(roots[1], "shard-1.tfrecord"))
    assert collections.Counter(_drain(ds)) == collections.Counter(r for recs in data for r in recs)
    assert ds.stats()["failovers"] >= 1


@pytest.fixture
def hung_file(tmp_path):
    """A path whose open() blocks (a FIFO with no writer), as a file on a hung mount does; released after."""
    path = os.fspath(tmp_path / "hung.tfrecord")
    os.mkfifo(path)
    yield path
    # Let the abandoned open() return, so its pool thread ends: a writer that opens and goes.
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # nobody was waiting any more


@pytest.mark.slow
def test_an_open_that_hangs_times_out_after_the_earlier_records(tmp_path, hung_file):
    good = write_tfrecord(tmp_path / "good.tfrecord", [b"a" * 100] * 5)
    core = _core("buffered", timeout_s=0.5)([good, hung_file], [])
    got = []
    with pytest.raises(dlstore.DlstoreIOError, match="open timed out") as e:
        while (b := core.next_batch()) is not None:
            got.append(b.num_records)
    assert sum(got) == 5 and e.value.path == hung_file


@pytest.mark.slow
def test_a_hung_open_fails_over_to_the_replica(tmp_path):
    data, roots = _replicated(tmp_path, shards=2, n=20)
    ds = _in_order(roots, read_timeout=0.5)
    hung = os.path.join(roots[0], "shard-1.tfrecord")
    os.unlink(hung)
    os.mkfifo(hung)  # opening it blocks, as a file on a hung mount does
    try:
        assert _drain(ds) == data[0] + data[1]
        stats = ds.stats()
        assert stats["failovers"] == 1 and "open timed out" in stats["failover_events"][0]
    finally:
        try:  # let the abandoned open() return, so its pool thread ends
            os.close(os.open(hung, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


# A file cut short (truncated, or rewritten in place) while a mapping of it is read: the views read
# ahead outlived its bytes, and touching them killed the process with SIGBUS, no message, no failover
# (the whole job under MPI). Run apart, so that a crash is a failed test, not a dead test run.
TRUNCATED = r"""
import collections, os, sys
import dlstore
from dlstore.placement.world import World

which, root = sys.argv[1], sys.argv[2]
if which.startswith("open_records"):
    path = os.path.join(root, "mnt0", "shard-0.tfrecord")
    if which == "open_records_gzip":  # zlib reads the views: a compressed copy of the shard
        records = [bytes(r) for r in dlstore.open_records(path)]
        path += ".gz"
        with dlstore.TFRecordWriter(path, compression="gzip") as w:
            for r in records:
                w.write(r)
    n = 0
    try:
        for record in dlstore.open_records(path, io="mmap", chunk_size=64 << 10):
            n += 1
            if n == 3:
                os.truncate(path, 20000)
        print("read", n, "records: no error")
    except dlstore.DlstoreIOError as e:
        print("error:", e)
else:
    mounts = [os.path.join(root, m) for m in ("mnt0", "mnt1")]
    ds = dlstore.Dataset("shard-*.tfrecord", mounts=mounts, world=World(rank=0, size=1), shuffle=which,
                         remainder="uneven", io="mmap", chunk_size=64 << 10, block_size=64 << 10, batch_size=4,
                         depth=1, io_threads=1, seed=1)
    seen = collections.Counter()
    for i, batch in enumerate(ds.batches()):
        for k in range(batch.num_records):
            seen[bytes(memoryview(batch)[batch.offsets[k]:batch.offsets[k] + batch.lengths[k]])] += 1
        if i == 1:  # the rank's mount loses its files' tails under the reader
            for name in os.listdir(mounts[0]):
                if name.startswith("shard-"):
                    os.truncate(os.path.join(mounts[0], name), 5000)
    print("records", sum(seen.values()), "distinct", len(seen), "counted", ds.stats()["records"], "failovers",
          ds.stats()["failovers"])
    for event in ds.stats()["failover_events"]:
        print("event", event)
"""


@pytest.mark.parametrize("which", ["open_records", "open_records_gzip", "none", "block", "global"])
def test_a_mapped_file_cut_short_under_the_reader_is_an_io_error_not_sigbus(tmp_path, which):
    data, roots = _replicated(tmp_path, shards=3, n=40)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", TRUNCATED, which, os.fspath(tmp_path)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    if which.startswith("open_records"):
        assert "error:" in proc.stdout and "shard-0.tfrecord" in proc.stdout, proc.stdout
        assert "shrank while being read" in proc.stdout or "outside the file" in proc.stdout, proc.stdout
    else:  # read from the replica: every record once
        total = sum(len(r) for r in data)
        # Counted as handed out: a batch picked from a chunk whose mapping had shrunk was counted before it failed
        # over, and again when read from the replica (found by a user trial: one batch too many).
        distinct = len(set(r for recs in data for r in recs))
        assert f"records {total} distinct {distinct} counted {total} failovers" in proc.stdout, proc.stdout
        assert int(proc.stdout.split("failovers")[1].split()[0]) >= 1, proc.stdout
        # The record an event names holds the byte it names: after a batch's build failed, the reader's
        # position was past that batch, and the event named the next batch's first record.
        for event in re.findall(r"event .* at record (\d+) of shard \d+: (\S+): at byte (\d+)", proc.stdout):
            record, path, byte = int(event[0]), event[1], int(event[2])
            frames = dlstore.Dataset(os.path.join(tmp_path, "mnt1", os.path.basename(path))).index.frames(
                [0], [record])
            start, size = int(frames[0][0]), int(frames[1][0])
            assert start <= byte < start + size, (event, start, size)


# The same with the default reads in flight, no replica: chunks were still loading when the files shrank,
# and their frames were checked where they lie in the mapping, unprobed (a SIGBUS in an I/O thread).
CUT_WHILE_LOADING = r"""
import os, sys
import dlstore

root = sys.argv[1]
ds = dlstore.Dataset(root, shuffle="none", remainder="uneven", batch_size=10, io="mmap", chunk_size=64 << 10,
                     block_size=64 << 10)
try:
    for i, batch in enumerate(ds.batches()):
        if i == 0:
            for name in sorted(os.listdir(root)):
                if name.endswith(".tfrecord"):
                    path = os.path.join(root, name)
                    os.truncate(path, os.path.getsize(path) // 3)
    print("no error")
except dlstore.DlstoreIOError as e:
    print("error:", e)
"""


def test_mapped_files_cut_short_while_chunks_load_are_an_io_error_not_sigbus(tmp_path):
    rng = np.random.default_rng(3)
    for s in range(4):
        with dlstore.TFRecordWriter(os.fspath(tmp_path / f"part-{s}.tfrecord")) as w:
            for _ in range(40):
                w.write(rng.bytes(int(rng.integers(2000, 6000))))
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", CUT_WHILE_LOADING, os.fspath(tmp_path)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.startswith("error: ") and "part-" in proc.stdout, proc.stdout


def test_the_error_that_ends_a_pass_keeps_the_failed_calls_errno(tmp_path):
    """A read that fails on every copy ends the pass with a DlstoreIOError whose .errno is the failed system
    call's (README: every DlstoreError carries it); it was None, the errno only in the message."""
    rng = np.random.default_rng(0)
    for s in range(4):
        with dlstore.TFRecordWriter(os.fspath(tmp_path / f"part-{s}.tfrecord")) as w:
            for _ in range(50):
                w.write(rng.bytes(3000))
    ds = Dataset(tmp_path, shuffle="none", batch_size=10, chunk_size=64 << 10, max_retries=1, remainder="uneven")
    with pytest.raises(dlstore.DlstoreIOError, match="cannot read record 0 of shard 3") as info:
        for i, _ in enumerate(ds.batches()):
            if i == 0:
                os.remove(tmp_path / "part-3.tfrecord")
    assert info.value.errno == 2 and info.value.path.endswith("part-3.tfrecord")


def test_a_mapping_cut_short_is_named_at_its_first_missing_page(tmp_path):
    """The error names the first page the file no longer holds, not the start of the range being read; a
    page the device cannot read under a mapping (EIO, also EFAULT to madvise) is told apart by the file's
    size (a fault-injection trial saw "the file shrank ... bytes 0..3220400" for an EIO on an intact file)."""
    path = tmp_path / "a.tfrecord"
    rng = np.random.default_rng(0)
    with dlstore.TFRecordWriter(os.fspath(path)) as w:
        for _ in range(100):
            w.write(rng.bytes(3000))
    page = os.sysconf("SC_PAGE_SIZE")
    with pytest.raises(dlstore.DlstoreIOError, match="shrank while being read") as info:
        for n, _ in enumerate(dlstore.open_records(os.fspath(path), io="mmap", chunk_size=64 << 10)):
            if n == 2:
                os.truncate(path, 100000)
    assert info.value.offset == -(-100000 // page) * page  # the page holding byte 100000 is still there
