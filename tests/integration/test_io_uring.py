"""The io_uring engine where it differs from the others (the engine sweep of test_engines.py,
test_plan_reader.py and test_ranges_failover.py runs it through everything else): reads split into
pieces and put in flight together, the end of a file short of a block, a file cut short while read,
the queue depth, and the fallback where the kernel refuses io_uring."""
import os
import subprocess
import sys

import numpy as np
import pytest

import dlstore
from dlstore import _C, ReadOptions
from dlstore.io.select import io_uring_depth, probe_io_uring, resolve_engine
from dlstore.sources.dataset import Dataset
from tests.helpers import REPO, batch_records, check_engine, write_tfrecord

needs_io_uring = pytest.mark.skipif(probe_io_uring() is not None, reason=f"io_uring refused here: {probe_io_uring()}")


@pytest.fixture
def refused():
    """io_uring refused as a seccomp filter refuses it (the core's test hook), for one test."""
    why = "io_uring_setup refused with EPERM (simulated by the test)"
    _C._simulate_io_uring_refusal(why)
    yield why
    _C._simulate_io_uring_refusal("")


def _records(seed, n, sizes=(0, 300_000)):
    rng = np.random.default_rng(seed)
    return [rng.bytes(int(k)) for k in rng.integers(*sizes, n)]


@needs_io_uring
@pytest.mark.parametrize("size", [1, 4095, 4096, 4097, 65535, 65536 * 3 + 17, (3 << 20) + 5])
def test_unaligned_file_tails_end_short_of_a_block(direct_dir, size):
    # O_DIRECT reads whole blocks: the last 1 MiB piece of the read comes back short at the file's end.
    rec = np.random.default_rng(size).bytes(size)
    path = write_tfrecord(direct_dir / "u.tfrecord", [rec])
    reader = dlstore.open_records(path, io="io_uring", chunk_size=8 << 20)
    assert [bytes(r) for r in reader] == [rec]
    check_engine(reader, "io_uring")
    assert reader.stats()["file_bytes_read"] == os.path.getsize(path)


@needs_io_uring
@pytest.mark.parametrize("chunk", [64 << 10, 3 << 20])
def test_large_reads_in_pieces_and_many_records_in_flight(direct_dir, chunk):
    # Records up to 2.5 MiB at unaligned offsets: chunks split into 1 MiB pieces, and a global shuffle's
    # records read one by one, many in flight, land where the buffered engine puts them.
    recs = _records(3, 24, (0, 2_500_000))
    for s in range(3):
        write_tfrecord(direct_dir / f"part-{s}.tfrecord", recs[s::3])
    for shuffle in ("none", "global"):
        batches = {}
        for engine in ("buffered", "io_uring"):
            ds = Dataset(direct_dir, io=engine, shuffle=shuffle, batch_size=7, seed=4, chunk_size=chunk,
                         remainder="uneven")
            batches[engine] = [batch_records(b) for b in ds.batches()]
            check_engine(ds, engine)
        assert batches["io_uring"] == batches["buffered"]


@needs_io_uring
@pytest.mark.parametrize("reader", ["in order", "plan"])
def test_a_file_cut_short_while_read_is_a_short_read_naming_file_and_offset(direct_dir, reader):
    recs = _records(5, 200, (1000, 30_000))
    path = write_tfrecord(direct_dir / "cut.tfrecord", recs)
    size = os.path.getsize(path)
    if reader == "in order":
        source = dlstore.open_records(path, io="io_uring", chunk_size=64 << 10, depth=1, io_threads=1)
    else:
        source = Dataset(path, io="io_uring", shuffle="none", batch_size=8, chunk_size=64 << 10, depth=1,
                         io_threads=1, max_retries=0)  # a retry reopens the file and finds it shorter
    batches = source.batches()
    first = batch_records(next(batches))  # the file is open now, its size known
    os.truncate(path, size // 2)
    got = list(first)
    with pytest.raises(dlstore.DlstoreIOError) as e:
        for b in batches:
            got += batch_records(b)
    assert e.value.path == path and e.value.offset is not None and e.value.offset <= size // 2 + 4096
    assert "short read" in str(e.value) and "was the file truncated" in str(e.value)
    assert got == recs[:len(got)] and len(got) < len(recs)


@needs_io_uring
def test_queue_depth_comes_from_the_device_or_the_setting(tmp_path, monkeypatch):
    path = write_tfrecord(tmp_path / "q.tfrecord", [b"x"])
    depth, why = io_uring_depth(path)
    assert 1 <= depth <= 64 and why
    monkeypatch.setenv("DLSTORE_QUEUE_DEPTH", "5")
    assert io_uring_depth(path) == (5, "the queue_depth setting")
    choice = resolve_engine("io_uring", [path], 10)
    assert choice.engine == "io_uring" and "up to 5 reads in flight per I/O thread" in choice.reason
    # A depth of 1 reads one piece at a time, and still every record.
    recs = _records(6, 40)
    other = write_tfrecord(tmp_path / "d.tfrecord", recs)
    assert [bytes(r) for r in dlstore.open_records(other, io="io_uring", chunk_size=1 << 20)] == recs
    monkeypatch.setenv("DLSTORE_QUEUE_DEPTH", "1")
    assert [bytes(r) for r in dlstore.open_records(other, io="io_uring", chunk_size=1 << 20)] == recs


@needs_io_uring
def test_auto_picks_io_uring_for_cold_data_and_says_why(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", [b"x" * 100])
    cold = resolve_engine("auto", [path], 30 << 30, available=20 << 30, random_reads=True)
    refused_direct = cold.engine == "buffered"  # a filesystem without O_DIRECT keeps auto on buffered
    assert cold.engine == "io_uring" or refused_direct, cold.reason
    if not refused_direct:
        assert "global shuffle reads record by record" in cold.reason and "reads in flight" in cold.reason
    # In order (or block-wise) from a cold device: io_uring too, its chunks' pieces all in flight.
    chunks = resolve_engine("auto", [path], 30 << 30, available=20 << 30)
    assert chunks.engine == ("buffered" if refused_direct else "io_uring"), chunks.reason
    if not refused_direct:
        assert "1 MiB piece" in chunks.reason and "reads in flight" in chunks.reason
    # From the page cache: no io_uring.
    assert resolve_engine("auto", [path], 10 << 30, available=20 << 30, random_reads=True).engine == "mmap"
    assert resolve_engine("auto", [path], 10 << 30, available=20 << 30).engine == "buffered"


def test_refused_io_uring_reads_direct_and_says_why(direct_dir, refused):
    recs = _records(8, 30, (0, 50_000))
    path = write_tfrecord(direct_dir / "r.tfrecord", recs)
    # Resolved in Python: direct, with the kernel's refusal in the reason.
    reader = dlstore.open_records(path, io="io_uring")
    assert reader.engine == "direct" and refused in reader.engine_reason
    assert [bytes(r) for r in reader] == recs
    ds = Dataset(path, io="io_uring", shuffle="global", batch_size=4, seed=1, remainder="uneven")
    assert ds.engine == "direct" and refused in ds.engine_reason
    assert sorted(r for b in ds.batches() for r in batch_records(b)) == sorted(recs)
    auto = resolve_engine("auto", [path], 30 << 30, available=1 << 30, random_reads=True)
    assert auto.engine == "direct" and f"not io_uring: {refused}" in auto.reason
    # Asked of the core directly, the engine falls back itself and notes why.
    core = _C.Reader([path], "tfrecord", ["none"], ReadOptions().core("io_uring"))
    got = []
    while (b := core.next_batch()) is not None:
        got += batch_records(b)
    assert got == recs and core.notes() == [f"io_uring -> direct: {refused}"]


def test_the_registry_is_the_list_of_engines():
    from dlstore.io import ENGINES

    assert list(ENGINES) == _C.engine_names() and "io_uring" in ENGINES
    options = ReadOptions().core("buffered")
    options.engine = "floppy"
    with pytest.raises(dlstore.DlstoreError, match="unknown I/O engine 'floppy' .*buffered, mmap, direct, io_uring"):
        _C.Reader([__file__], "tfrecord", ["none"], options)
    with pytest.raises(ValueError, match="expected one of auto, buffered, mmap, direct, io_uring, gds"):
        ReadOptions(io="floppy")


@needs_io_uring
def test_a_forked_child_reads_through_rings_of_its_own(direct_dir):
    # A DataLoader worker is a fork of a parent that has read: its I/O threads are new, and so are
    # their rings (the parent's belong to threads the child does not have). In a fresh interpreter, so
    # that no thread left by other tests holds a lock across the fork.
    recs = _records(9, 40, (0, 200_000))
    path = write_tfrecord(direct_dir / "f.tfrecord", recs)
    script = (
        "import os, sys, dlstore\n"
        "path = sys.argv[1]\n"
        "first = [bytes(r) for r in dlstore.open_records(path, io='io_uring')]\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    again = [bytes(r) for r in dlstore.open_records(path, io='io_uring')]\n"
        "    os._exit(0 if again == first else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(len(first), os.waitstatus_to_exitcode(status))\n")
    r = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, timeout=120,
                       cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == [str(len(recs)), "0"]
