"""Real files in a temp dir, read back through every engine and chunk size."""
import os
import subprocess
import sys

import numpy as np
import pytest

import dlstore
from dlstore.io import resolve_engine
from tests.conftest import ENGINES, oracle_tfrecord_bytes, write_tfrecord

CHUNKS = [64 << 10, 1 << 20, 8 << 20]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("chunk", CHUNKS)
def test_every_engine_reads_every_record(tmp_path, payloads, engine, chunk):
    # Sizes are not multiples of 4096; records straddle chunks; one is larger than the headroom.
    paths = []
    for k in range(3):
        paths.append(write_tfrecord(tmp_path / f"s{k}.tfrecord", payloads[k::2]))
    expected = [r for k in range(3) for r in payloads[k::2]]
    reader = dlstore.open_records(paths, io=engine, chunk_size=chunk)
    assert [bytes(r) for r in reader] == expected
    stats = reader.stats()
    assert stats["records"] == len(expected)
    assert stats["payload_bytes"] == sum(map(len, expected))
    assert stats["file_bytes_read"] == sum(os.path.getsize(p) for p in paths)


@pytest.mark.parametrize("engine", ENGINES)
def test_batches_are_contiguous_views(tmp_path, payloads, engine):
    path = write_tfrecord(tmp_path / "b.tfrecord", payloads)
    got, file_offsets = [], []
    for batch in dlstore.open_records(path, io=engine, chunk_size=64 << 10).batches():
        mv = memoryview(batch)
        assert batch.num_records == len(batch.offsets) == len(batch.lengths)
        assert batch.nbytes == int(np.sum(batch.lengths))
        got += [bytes(mv[o:o + n]) for o, n in zip(batch.offsets.tolist(), batch.lengths.tolist())]
        file_offsets += batch.file_offsets.tolist()
    assert got == payloads
    assert file_offsets == np.cumsum([0] + [16 + len(r) for r in payloads])[:-1].tolist()


def test_records_outlive_their_reader(tmp_path, payloads):
    path = write_tfrecord(tmp_path / "k.tfrecord", payloads)
    kept = list(dlstore.open_records(path, chunk_size=64 << 10))  # memoryviews keep their batches
    assert [bytes(r) for r in kept] == payloads


def test_empty_files_and_zero_length_records(tmp_path):
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    zeros = write_tfrecord(tmp_path / "zeros.tfrecord", [b""] * 1000)
    for engine in ENGINES:
        assert [bytes(r) for r in dlstore.open_records([str(empty), zeros, str(empty)], io=engine)] == [b""] * 1000


@pytest.mark.parametrize("size", [1, 4095, 4096, 4097, 65535, 65536 * 3 + 17])
def test_direct_io_unaligned_file_sizes(tmp_path, size):
    # One record whose frame makes the file `size + 16` bytes: O_DIRECT reads whole blocks and
    # must stop at the real end of file.
    rec = np.random.default_rng(size).bytes(size)
    path = write_tfrecord(tmp_path / "u.tfrecord", [rec])
    assert os.path.getsize(path) % 4096 != 0 or size == 4080
    reader = dlstore.open_records(path, io="direct", chunk_size=64 << 10)
    assert [bytes(r) for r in reader] == [rec]
    assert reader.engine == "direct"


def test_record_larger_than_chunk_and_headroom(tmp_path):
    big = np.random.default_rng(0).bytes(5 << 20)
    path = write_tfrecord(tmp_path / "big.tfrecord", [b"a", big, b"b", big[:300_000]])
    for engine in ENGINES:
        reader = dlstore.open_records(path, io=engine, chunk_size=64 << 10)
        assert [bytes(r) for r in reader] == [b"a", big, b"b", big[:300_000]]
        if engine != "mmap":
            assert reader.stats()["spilled_records"] >= 1


def test_read_is_repeatable_epochs(tmp_path, payloads):
    path = write_tfrecord(tmp_path / "e.tfrecord", payloads)
    reader = dlstore.open_records(path)
    assert [bytes(r) for r in reader] == [bytes(r) for r in reader] == payloads


def test_paths_globs_and_directories(tmp_path):
    for k in range(3):
        write_tfrecord(tmp_path / f"part-{k}.tfrecord", [bytes([k])])
    (tmp_path / "part-0.tfrecord.idx").write_text("0 17\n")
    by_glob = [bytes(r) for r in dlstore.open_records(str(tmp_path / "part-*.tfrecord"))]
    by_dir = [bytes(r) for r in dlstore.open_records(tmp_path)]
    assert by_glob == by_dir == [b"\0", b"\1", b"\2"]
    with pytest.raises(dlstore.DlstoreError, match="no such file"):
        dlstore.open_records(tmp_path / "missing")
    with pytest.raises(dlstore.DlstoreError, match="no file matches"):
        dlstore.open_records(str(tmp_path / "nothing-*"))


def test_unknown_format_is_named(tmp_path):
    path = tmp_path / "junk.bin"
    path.write_bytes(b"not a record file at all")
    with pytest.raises(ValueError, match="cannot tell the record format"):
        dlstore.open_records(path)


def test_auto_picks_and_says_why(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", [b"x" * 100])
    small = resolve_engine("auto", [path], 10 << 30, available=20 << 30)
    assert small.engine == "buffered" and "fits" in small.reason
    large = resolve_engine("auto", [path], 30 << 30, available=20 << 30)
    assert large.engine in ("direct", "buffered") and "exceeds" in large.reason
    if large.engine == "direct":
        assert "O_DIRECT" in large.reason
    reader = dlstore.open_records(path)
    assert reader.engine == "buffered" and reader.engine_reason


def test_direct_falls_back_on_tmpfs_with_a_reason():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this machine")
    path = os.path.join("/dev/shm", f"dlstore-test-{os.getpid()}.tfrecord")
    try:
        with open(path, "wb") as f:
            f.write(oracle_tfrecord_bytes([b"abc"]))
        reader = dlstore.open_records(path, io="direct")
        if reader.engine == "direct":
            pytest.skip("this /dev/shm accepts O_DIRECT (not tmpfs here)")
        assert reader.engine == "buffered" and "refuses O_DIRECT" in reader.engine_reason
        assert [bytes(r) for r in reader] == [b"abc"]
    finally:
        os.unlink(path)


def test_read_error_names_file(tmp_path):
    path = write_tfrecord(tmp_path / "gone.tfrecord", [b"x"])
    reader = dlstore.open_records(path)
    os.unlink(path)
    with pytest.raises(dlstore.DlstoreError) as e:
        list(reader)
    assert e.value.path == path and "No such file" in str(e.value)


def test_import_needs_only_numpy():
    code = ("import sys, dlstore; bad = [m for m in ('tensorflow', 'torch', 'nvidia.dali', 'PIL') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)) + "/..")
