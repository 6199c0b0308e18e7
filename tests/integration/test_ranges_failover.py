"""Byte ranges of shards through every engine, and failover between replica mounts (no root needed).

The loop-mounted version, where a mount goes away mid-epoch, is in test_testbed_failover.py.
"""
import os
import shutil

import numpy as np
import pytest

import dlstore
from dlstore import _C
from dlstore.indexing import ensure_index
from dlstore.io.failover import PieceReader, Place, ReadPiece
from tests.conftest import batch_records, write_tfrecord


def _records(rng, n):
    return [rng.bytes(int(k)) for k in rng.integers(0, 30_000, n)]


def _core(engine, chunk=64 << 10, timeout_s=0.0):
    def make(paths, ranges):
        return _C.Reader(paths, "tfrecord", engine, ["none"] * len(paths), True, "raise", chunk, 64 << 10, 4, 2, 0,
                         1, ranges, timeout_s)
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
        _C.Reader([path], "tfrecord", "buffered", ["gzip"], True, "raise", 1 << 20, 1 << 20, 4, 2, 0, 1,
                  [(0, 10)], 0.0)


# ---- failover -----------------------------------------------------------------------------------

def _replicated(tmp_path, shards=4, n=50, mounts=2):
    rng = np.random.default_rng(3)
    data = [_records(rng, n) for _ in range(shards)]
    roots = [tmp_path / f"mnt{m}" for m in range(mounts)]
    for root in roots:
        root.mkdir()
        for s, recs in enumerate(data):
            write_tfrecord(root / f"shard-{s}.tfrecord", recs)
    return data, [os.fspath(r) for r in roots]


def _pieces(data, roots, cuts):
    pieces = []
    for shard, a, b in cuts:
        path0 = os.path.join(roots[0], f"shard-{shard}.tfrecord")
        _, offs = ensure_index(path0)
        ends = np.append(offs, os.path.getsize(path0))
        places = tuple(Place(r, os.path.join(r, f"shard-{shard}.tfrecord")) for r in roots)
        pieces.append(ReadPiece(shard, a, b, ends[a:b + 1], places))
    return pieces


def _drain(reader, *args):
    out = []
    for b in reader.batches(*args):
        out += batch_records(b)
    return out


@pytest.mark.parametrize("engine", ["buffered", "mmap", "direct"])
def test_a_missing_shard_fails_over_to_the_replica(tmp_path, engine):
    data, roots = _replicated(tmp_path)
    cuts = [(0, 0, 50), (1, 10, 40), (2, 0, 50), (3, 5, 6)]
    pieces = _pieces(data, roots, cuts)
    os.unlink(os.path.join(roots[0], "shard-2.tfrecord"))  # gone from the primary mount
    reader = PieceReader(pieces, _core(engine), retry_delay=0)
    assert _drain(reader) == [r for s, a, b in cuts for r in data[s][a:b]]
    assert reader.stats.failovers == 1 and reader.stats.retries == 0
    assert reader.stats.failed_mounts == [roots[0]]
    assert "shard 2" in reader.stats.events[0]
    # Once a mount failed, later pieces go to the replica directly: shard 3 was read from mnt1.
    assert reader.core_stats["records"] == sum(b - a for _, a, b in cuts)


def test_failover_mid_shard_neither_loses_nor_repeats(tmp_path, monkeypatch):
    data, roots = _replicated(tmp_path, shards=2, n=200)
    cuts = [(0, 0, 200), (1, 0, 200)]
    pieces = _pieces(data, roots, cuts)
    calls = []

    def flaky(paths, ranges):
        # The first reader over mnt0 delivers three batches, then its mount "fails" (EIO).
        core = _core("buffered", 64 << 10)(paths, ranges)
        calls.append((list(paths), list(ranges)))
        if len(calls) > 1:
            return core

        class Failing:
            n = 0

            def next_batch(self):
                Failing.n += 1
                if Failing.n > 3:
                    raise dlstore.DlstoreIOError(f"{paths[0]}: at byte 1234: pread failed: Input/output error "
                                                 f"(errno 5)", path=paths[0], offset=1234)
                return core.next_batch()

            def stats(self):
                return core.stats()
        return Failing()

    reader = PieceReader(pieces, flaky, retry_delay=0)
    got = _drain(reader)
    assert got == data[0] + data[1]
    assert reader.stats.failovers == 1
    # The second reader starts at the first record not yet handed out, on the replica.
    (paths2, ranges2) = calls[1]
    assert paths2[0].startswith(roots[1])
    assert ranges2[0][0] > 0


def test_without_a_replica_bounded_retries_then_an_error_naming_mount_file_offset(tmp_path):
    data, roots = _replicated(tmp_path, shards=2, mounts=1)
    pieces = _pieces(data, roots, [(0, 0, 50), (1, 20, 50)])
    shutil.copy(os.path.join(roots[0], "shard-1.tfrecord"), tmp_path / "keep")
    os.unlink(os.path.join(roots[0], "shard-1.tfrecord"))
    reader = PieceReader(pieces, _core("buffered"), max_retries=2, retry_delay=0)
    got = []
    with pytest.raises(dlstore.DlstoreIOError) as e:
        for b in reader.batches():
            got.append(b.num_records)
    assert sum(got) == 50  # every record before the failure was delivered
    msg = str(e.value)
    assert roots[0] in msg and "shard-1.tfrecord" in msg and "record 20 of shard 1" in msg
    assert e.value.offset == int(pieces[1].frame_offsets[0])
    assert reader.stats.retries == 2


def test_resume_from_a_position(tmp_path):
    data, roots = _replicated(tmp_path, shards=3, mounts=1)
    cuts = [(0, 0, 50), (1, 0, 50), (2, 0, 50)]
    pieces = _pieces(data, roots, cuts)
    full = [r for s, a, b in cuts for r in data[s][a:b]]
    for piece, rec in [(0, 0), (0, 17), (1, 0), (1, 49), (2, 50)]:
        reader = PieceReader(pieces, _core("mmap"))
        assert _drain(reader, piece, rec) == full[piece * 50 + rec:]


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


def test_an_open_that_hangs_times_out_after_the_earlier_records(tmp_path, hung_file):
    good = write_tfrecord(tmp_path / "good.tfrecord", [b"a" * 100] * 5)
    core = _core("buffered", timeout_s=0.5)([good, hung_file], [])
    got = []
    with pytest.raises(dlstore.DlstoreIOError, match="open timed out") as e:
        while (b := core.next_batch()) is not None:
            got.append(b.num_records)
    assert sum(got) == 5 and e.value.path == hung_file


def test_a_hung_open_fails_over_to_the_replica(tmp_path, hung_file):
    recs = [b"r%d" % i for i in range(20)]
    replica = write_tfrecord(tmp_path / "replica.tfrecord", recs)
    _, offs = ensure_index(replica)
    ends = np.append(offs, os.path.getsize(replica))
    piece = ReadPiece(0, 0, 20, ends, (Place("hung-mount", hung_file), Place("replica-mount", replica)))
    reader = PieceReader([piece], _core("buffered", timeout_s=0.5), retry_delay=0)
    assert _drain(reader) == recs
    assert reader.stats.failovers == 1 and "open timed out" in reader.stats.events[0]
