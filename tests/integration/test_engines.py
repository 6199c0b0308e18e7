"""Real files in a temp dir, read back through every engine and chunk size."""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import dlstore
from dlstore.io import resolve_engine
from dlstore.sources.reader import expand_paths
from tests.helpers import (ENGINES, REPO, batch_records, check_engine, oracle_tfrecord_bytes, run_python,
                           write_tfrecord)
from tests.resume import assert_resumes_exactly

CHUNKS = [64 << 10, 1 << 20, 8 << 20]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_every_engine_reads_every_record(engine_dir, payloads, engine, chunk):
    # Sizes are not multiples of 4096; records straddle chunks; one is larger than the headroom.
    paths = []
    for k in range(3):
        paths.append(write_tfrecord(engine_dir / f"s{k}.tfrecord", payloads[k::2]))
    expected = [r for k in range(3) for r in payloads[k::2]]
    reader = dlstore.open_records(paths, io=engine, chunk_size=chunk)
    assert [bytes(r) for r in reader] == expected
    check_engine(reader, engine)
    stats = reader.stats()
    assert stats["records"] == len(expected)
    assert stats["payload_bytes"] == sum(map(len, expected))
    assert stats["file_bytes_read"] == sum(os.path.getsize(p) for p in paths)


def test_batches_are_contiguous_views(engine_dir, payloads, engine):
    path = write_tfrecord(engine_dir / "b.tfrecord", payloads)
    got, file_offsets = [], []
    reader = dlstore.open_records(path, io=engine, chunk_size=64 << 10)
    for batch in reader.batches():
        assert batch.num_records == len(batch.offsets) == len(batch.lengths)
        assert batch.nbytes == int(np.sum(batch.lengths))
        got += batch_records(batch)
        file_offsets += batch.file_offsets.tolist()
    assert got == payloads
    assert file_offsets == np.cumsum([0] + [16 + len(r) for r in payloads])[:-1].tolist()
    check_engine(reader, engine)


def test_records_outlive_their_reader(tmp_path, payloads):
    path = write_tfrecord(tmp_path / "k.tfrecord", payloads)
    kept = list(dlstore.open_records(path, chunk_size=64 << 10))  # memoryviews keep their batches
    assert [bytes(r) for r in kept] == payloads


def test_empty_files_and_zero_length_records(engine_dir, engine):
    empty = engine_dir / "empty.tfrecord"
    empty.write_bytes(b"")
    zeros = write_tfrecord(engine_dir / "zeros.tfrecord", [b""] * 1000)
    reader = dlstore.open_records([str(empty), zeros, str(empty)], io=engine)
    assert [bytes(r) for r in reader] == [b""] * 1000
    check_engine(reader, engine)


@pytest.mark.parametrize("size", [1, 4095, 4096, 4097, 65535, 65536 * 3 + 17])
def test_direct_io_unaligned_file_sizes(direct_dir, size):
    # One record whose frame makes the file `size + 16` bytes: O_DIRECT reads whole blocks and
    # must stop at the real end of file.
    rec = np.random.default_rng(size).bytes(size)
    path = write_tfrecord(direct_dir / "u.tfrecord", [rec])
    assert os.path.getsize(path) % 4096 != 0 or size == 4080
    reader = dlstore.open_records(path, io="direct", chunk_size=64 << 10)
    assert [bytes(r) for r in reader] == [rec]
    check_engine(reader, "direct")


@pytest.mark.slow
def test_record_larger_than_chunk_and_headroom(engine_dir, engine):
    big = np.random.default_rng(0).bytes(5 << 20)
    path = write_tfrecord(engine_dir / "big.tfrecord", [b"a", big, b"b", big[:300_000]])
    reader = dlstore.open_records(path, io=engine, chunk_size=64 << 10)
    assert [bytes(r) for r in reader] == [b"a", big, b"b", big[:300_000]]
    check_engine(reader, engine)
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
    with pytest.raises(dlstore.DlstoreError, match="no record file matches"):
        dlstore.open_records(str(tmp_path / "nothing-*"))


def test_directories_leave_out_files_that_are_not_records(tmp_path):
    for k in range(3):
        write_tfrecord(tmp_path / f"part-{k}", [bytes([k])])
    for name in ["train.lst", "part-0.idx.tmp1234", "part-1.tmp", "meta.json", "notes.txt", "README.md",
                 "part-2.index", ".hidden"]:
        (tmp_path / name).write_bytes(b"not records")
    assert expand_paths(tmp_path) == [str(tmp_path / f"part-{k}") for k in range(3)]
    assert [bytes(r) for r in dlstore.open_records(tmp_path)] == [b"\0", b"\1", b"\2"]
    # A file named explicitly is read whatever its name.
    named = write_tfrecord(tmp_path / "odd.txt", [b"t"])
    assert [bytes(r) for r in dlstore.open_records(named)] == [b"t"]


@pytest.mark.parametrize("odd", ["broken_link", "fifo"])
def test_a_shard_name_that_is_no_file_is_an_error_not_left_out(tmp_path, odd):
    # A shard linked in from a filesystem now gone (or a FIFO among the shards) was left out of a
    # directory's or a glob's listing without a word: an epoch a shard short.
    for k in range(2):
        write_tfrecord(tmp_path / f"part-{k}.tfrecord", [bytes([k])])
    bad = tmp_path / "part-2.tfrecord"
    if odd == "broken_link":
        target = tmp_path / "gone" / "part-2.tfrecord"
        os.symlink(target, bad)
        words = f"{bad}: named as a shard but a symbolic link to {target}, which cannot be reached (No such file"
    else:
        os.mkfifo(bad)
        words = f"{bad}: named as a shard but not a regular file"
    (tmp_path / "sub.tfrecord").mkdir()  # a subfolder is not searched, whatever its name
    for spec in (tmp_path, tmp_path / "part-*", tmp_path / "**" / "part-*.tfrecord"):
        with pytest.raises(dlstore.DlstoreIOError) as e:
            expand_paths(os.fspath(spec))
        assert str(e.value).startswith(words) and e.value.path == os.fspath(bad)
        with pytest.raises(dlstore.DlstoreIOError, match="named as a shard"):
            dlstore.Dataset(os.fspath(spec))
    # Not named: a glob or list that does not take it reads the others (the directory's listing, taken
    # for its manifest, does not refuse it).
    named = [os.fspath(tmp_path / f"part-{k}.tfrecord") for k in range(2)]
    assert len(dlstore.Dataset(os.fspath(tmp_path / "part-[01].tfrecord"))) == len(dlstore.Dataset(named)) == 2
    # The manifest those wrote is not taken as the directory's listing while the link is there: a glob that
    # names it is still refused (it was read a shard short once a manifest was current).
    with pytest.raises(dlstore.DlstoreIOError, match="named as a shard"):
        dlstore.Dataset(os.fspath(tmp_path / "part-*"))
    bad.unlink()
    assert len(expand_paths(tmp_path)) == 2


@pytest.mark.parametrize("odd", ["fifo", "device", "broken_link"])
def test_a_shard_named_explicitly_that_is_no_file_is_said_as_through_its_directory(tmp_path, odd, capsys):
    # A FIFO or device named itself was "no such file or directory"; through its directory, what it is.
    from dlstore.cli import main

    if odd == "fifo":
        bad = os.fspath(tmp_path / "fifo.tfrecord")
        os.mkfifo(bad)
        words = f"{bad}: named as a shard but not a regular file (a FIFO, a socket or a device)"
    elif odd == "device":
        bad, words = "/dev/zero", "/dev/zero: named as a shard but not a regular file (a FIFO, a socket or a device)"
    else:
        bad = os.fspath(tmp_path / "link.tfrecord")
        os.symlink(tmp_path / "gone.tfrecord", bad)
        words = f"{bad}: named as a shard but a symbolic link to {tmp_path / 'gone.tfrecord'}, which cannot be reached"
    for make in (expand_paths, dlstore.open_records, dlstore.Dataset):
        with pytest.raises(dlstore.DlstoreIOError) as e:
            make(bad)
        assert str(e.value).startswith(words) and e.value.path == bad
    odd_paths: list = []
    assert expand_paths([bad], odd_paths) == [] and odd_paths == [bad]  # as a directory's listing hands it over
    assert main(["verify", bad]) == 1  # the same lines as `dlstore verify DIR`: the file is unreadable
    out = capsys.readouterr().out
    assert out.startswith(f"{words}") and "UNREADABLE: 1 file" in out
    with pytest.raises(dlstore.DlstoreError, match="no such file or directory"):  # truly absent: as before
        expand_paths(os.fspath(tmp_path / "nothing.tfrecord"))


def test_unreadable_file_is_a_dlstore_error_naming_it(tmp_path, make_unreadable):
    path = write_tfrecord(tmp_path / "locked.tfrecord", [b"x"])
    make_unreadable(path)
    with pytest.raises(dlstore.DlstoreError, match="Permission denied") as e:
        dlstore.open_records(path)
    assert e.value.path == path and str(e.value).startswith(path)


_THREADS_CANNOT_START = """
import resource, sys
import dlstore
path = {path!r}
vm = next(int(line.split()[1]) << 10 for line in open("/proc/self/status") if line.startswith("VmSize"))
# Address space for about 30 thread stacks (8 MiB each) more: thread creation fails, as at a process's thread limit
# (which root is not held to).
resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))
for options in (dict(io_threads=1024), dict(verify_threads=1024)):
    try:
        sum(1 for _ in dlstore.open_records(path, **options))  # the reader starts its threads on the first read
    except dlstore.DlstoreError as e:
        print(type(e).__name__, e.errno, e)
print(sum(1 for _ in dlstore.open_records(path)))  # the threads started were stopped: a reader reads again
"""


@pytest.mark.slow  # a subprocess
def test_threads_that_cannot_start_are_an_error_naming_the_setting(tmp_path):
    # They were a bare RuntimeError ("Resource temporarily unavailable"), the threads already started left
    # waiting forever.
    path = write_tfrecord(tmp_path / "a.tfrecord", [b"x"] * 3)
    out = run_python(_THREADS_CANNOT_START.format(path=path))
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == 3, out.stderr[-2000:]
    for line, threads in zip(lines, ("I/O threads (io_threads)", "CRC threads (verify_threads)")):
        assert line.startswith(f"DlstoreError 11 could not start {threads}: thread ") and " of 1024 failed (" in line
        assert "ask for fewer" in line
    assert lines[2] == "3"


@pytest.mark.slow  # a subprocess: before the check, the threads it could start were left in the process
@pytest.mark.parametrize("env", ["DLSTORE_IO_THREADS", "DLSTORE_VERIFY_THREADS"])
def test_thread_counts_beyond_the_limit_are_refused_before_reading(tmp_path, env):
    path = write_tfrecord(tmp_path / "a.tfrecord", [b"x"] * 3)
    code = (f"import dlstore\nfor make in (dlstore.open_records, dlstore.Dataset):\n"
            f"    try:\n        make({path!r})\n    except ValueError as e:\n        print(e)\n")
    out = run_python(code, **{env: "100000"})
    name = env[len("DLSTORE_"):].lower()
    expected = (f"{name}='100000' (from environment variable {env}) is not valid: expected a "
                f"{'positive' if name == 'io_threads' else 'non-negative'} integer, at most 1024")
    assert out.returncode == 0 and out.stdout.splitlines() == [expected] * 2, out.stderr[-2000:]


def test_gds_is_refused_naming_what_is_missing(tmp_path, monkeypatch):
    from dlstore.io import cuda

    path = write_tfrecord(tmp_path / "g.tfrecord", [b"x"])
    no_driver = cuda.CudaFacts(driver_error="no CUDA driver (libcuda.so.1 cannot be loaded)",
                               kvikio_error="kvikio is not installed", cupy_error="cupy is not installed")
    monkeypatch.setattr(cuda, "cuda_facts", lambda: no_driver)
    with pytest.raises(dlstore.GdsUnavailableError, match="no CUDA driver.*kvikio is not installed.*libcufile "
                                                          "not found"):
        dlstore.open_records(path, io="gds")
    no_kvikio = cuda.CudaFacts(driver="13.0", devices=["GPU"], cupy="14.0", kvikio_error="kvikio is not installed")
    monkeypatch.setattr(cuda, "cuda_facts", lambda: no_kvikio)
    with pytest.raises(dlstore.GdsUnavailableError, match="^io='gds' cannot run: kvikio is not installed"):
        dlstore.open_records(path, io="gds")
    monkeypatch.setenv("DLSTORE_IO", "gds")
    with pytest.raises(dlstore.GdsUnavailableError):
        dlstore.open_records(path)
    with pytest.raises(dlstore.GdsUnavailableError):
        dlstore.Dataset(path)


def test_gds_here_says_what_this_machine_lacks(tmp_path):
    from dlstore.io.cuda import cuda_facts, gds_verdict

    verdict = gds_verdict(cuda_facts())
    if verdict.runs:
        pytest.skip(f"gds can run on this machine ({verdict.reason}); the gds-marked tests cover it")
    path = write_tfrecord(tmp_path / "g.tfrecord", [b"x"])
    with pytest.raises(dlstore.GdsUnavailableError) as e:
        dlstore.open_records(path, io="gds")
    assert str(e.value) == verdict.missing and "\n" not in str(e.value)


def test_auto_with_a_gpu_target_picks_gds_only_for_true_gds(tmp_path):
    from dlstore.io import cuda

    path = write_tfrecord(tmp_path / "g.tfrecord", [b"x"])
    true_gds = cuda.CudaFacts(driver="13.0", devices=["GPU"], kvikio="26.10", cupy="14.0", libcufile="libcufile.so.0",
                              nvidia_fs=True)
    choice = resolve_engine("auto", [path], 10, available=1 << 30, device="cuda:0", probe=lambda: true_gds)
    assert choice.engine == "gds" and choice.gds_mode == "gds" and "GPUDirect Storage" in choice.reason
    compat = cuda.CudaFacts(**dict(true_gds.as_dict(), nvidia_fs=False))
    choice = resolve_engine("auto", [path], 10, available=1 << 30, device="cuda:0", probe=lambda: compat)
    assert choice.engine == "buffered" and "but not gds" in choice.reason and "nvidia-fs not loaded" in choice.reason
    none = cuda.CudaFacts(driver_error="no CUDA driver")
    choice = resolve_engine("auto", [path], 10, available=1 << 30, device="cuda:1", probe=lambda: none)
    assert choice.engine == "buffered" and "cuda:1, but not gds (no CUDA driver" in choice.reason
    # No GPU target: the host choice, and CUDA is not even probed.
    choice = resolve_engine("auto", [path], 10, available=1 << 30, probe=lambda: 1 / 0)
    assert choice.engine == "buffered" and "GPU" not in choice.reason


def test_unknown_format_is_named(tmp_path):
    path = tmp_path / "junk.bin"
    path.write_bytes(b"not a record file at all")
    with pytest.raises(ValueError, match="does not look like TFRecord or RecordIO"):
        dlstore.open_records(path)


def test_auto_picks_and_says_why(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", [b"x" * 100])
    small = resolve_engine("auto", [path], 10 << 30, available=20 << 30)
    assert small.engine == "buffered" and "fits" in small.reason
    large = resolve_engine("auto", [path], 30 << 30, available=20 << 30)
    assert large.engine in ("io_uring", "direct", "buffered") and "exceeds" in large.reason
    if large.engine != "buffered":  # O_DIRECT, through io_uring where the kernel allows it
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


def _held(path) -> bool:
    """Whether this process has ``path`` open or mapped."""
    real = os.path.realpath(path)
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(os.path.join("/proc/self/fd", fd)) == real:
                return True
        except OSError:  # closed meanwhile (the listing's own fd)
            pass
    with open("/proc/self/maps") as f:
        return any(line.rstrip("\n").endswith(" " + real) for line in f)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd and /proc/self/maps")
@pytest.mark.parametrize("how", ["break", "close"])
def test_stopping_early_releases_the_files(engine_dir, engine, how):
    path = write_tfrecord(engine_dir / "long.tfrecord", [bytes(1000)] * 4000)  # 64 chunks of 64 KiB
    reader = dlstore.open_records(path, io=engine, chunk_size=64 << 10)
    if how == "break":
        for _record in reader:
            assert _held(path)
            break
        del _record  # a record keeps its chunk (for mmap: the mapping) alive
    else:
        batches = reader.batches()
        next(batches)
        assert _held(path)
        batches.close()
    assert not _held(path)
    assert reader.stats()["records"] >= 1  # the stopped pass's counters are kept
    check_engine(reader, engine)


def _bad_crc_file(path, n: int) -> str:
    """``n`` one-byte records whose data CRCs are all wrong (the framing is intact)."""
    blob = bytearray(oracle_tfrecord_bytes([b"z"] * n))
    for i in range(n):
        blob[i * 17 + 13] ^= 0xFF  # 8 length + 4 length CRC + 1 data, then the data CRC
    path.write_bytes(bytes(blob))
    return str(path)


@pytest.mark.parametrize("via", ["records", "batches"])
def test_warnings_point_at_the_caller(tmp_path, via):
    path = _bad_crc_file(tmp_path / "w.tfrecord", 5)
    reader = dlstore.open_records(path, on_error="warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if via == "records":
            assert list(reader) == []
        else:
            assert sum(b.num_records for b in reader.batches()) == 0
    assert [str(w.message).split(": bad data CRC")[0] for w in caught] == [f"{path}: at byte {17 * i}"
                                                                          for i in range(5)]
    assert {w.filename for w in caught} == {__file__}


def test_warn_notes_corruptions_beyond_the_reports(tmp_path):
    n = 10_050  # the core keeps the first 10000 reports
    path = _bad_crc_file(tmp_path / "many.tfrecord", n)
    reader = dlstore.open_records(path, on_error="warn", chunk_size=64 << 10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(reader) == []
    reported = len(reader.corruptions())
    assert reader.stats()["skipped"] == n and reported < n
    assert len(caught) == reported + 1
    assert "more corrupt records were skipped than reported" in str(caught[-1].message)
    assert {w.filename for w in caught} == {__file__}


def test_compression_none_means_uncompressed_as_in_tf_data(tmp_path):
    plain = write_tfrecord(tmp_path / "plain.tfrecord", [b"x" * 10, b"y"])
    with dlstore.TFRecordWriter(os.fspath(tmp_path / "z.tfrecord"), compression="gzip") as w:
        w.write(b"zipped")
    assert dlstore.open_records(plain, compression=None).compression == ["none"]
    assert [bytes(r) for r in dlstore.open_records(plain, compression=None)] == [b"x" * 10, b"y"]
    # Auto-detection is the default, and says "auto" by name.
    assert dlstore.open_records(tmp_path / "z.tfrecord").compression == ["gzip"]
    assert dlstore.open_records(tmp_path / "z.tfrecord", compression="auto").compression == ["gzip"]
    assert dlstore.open_records(tmp_path / "z.tfrecord", compression="GZIP").compression == ["gzip"]
    assert dlstore.open_records(tmp_path / "z.tfrecord", compression=None).compression == ["none"]


@pytest.mark.parametrize("engine", ENGINES)
def test_open_records_resumes_exactly_through_the_shared_harness(engine, engine_dir, payloads):
    paths = [write_tfrecord(engine_dir / f"part-{i}", payloads[i::3]) for i in range(3)]

    def make():
        return dlstore.open_records(paths, io=engine, chunk_size=1 << 16)

    assert_resumes_exactly(make, stops=[0, 1, 3, 7], run=lambda source: source.batches(), values=batch_records)


def test_open_records_resumes_in_a_loop_that_sets_each_epoch(tmp_path, payloads):
    """set_epoch of the epoch a state was loaded for keeps its resume point, as a Dataset's does: it was
    thrown away, and the epoch read again from its first record."""
    paths = [write_tfrecord(tmp_path / f"part-{i}", payloads[i::3]) for i in range(3)]

    def run(reader):  # one epoch of a loop that sets each epoch
        reader.set_epoch(reader.epoch)
        return reader.batches()

    assert_resumes_exactly(lambda: dlstore.open_records(paths, chunk_size=1 << 16), stops=[1, 3, 7], run=run,
                           values=batch_records)


def test_iterating_records_moves_the_position_and_starts_at_a_loaded_one(tmp_path):
    """``for record in reader`` neither moved ``sample_in_epoch`` nor started at a loaded one: a resume read
    every record again. It now counts as batches() does, exactly where a stop falls inside a chunk."""
    records = [b"%05d|" % i * (20 + i % 100) for i in range(1200)]  # about 170 KB a file
    paths = [write_tfrecord(tmp_path / f"part-{i}", records[i * 400:(i + 1) * 400]) for i in range(3)]

    def make():
        return dlstore.open_records(paths, chunk_size=1 << 16)  # several chunks a file

    reader = make()
    it = iter(reader)
    assert [bytes(next(it)) for _ in range(100)] == records[:100]
    assert reader.state_dict() == {"epoch": 0, "sample_in_epoch": 100}
    it.close()
    assert reader.state_dict() == {"epoch": 0, "sample_in_epoch": 100}
    assert [bytes(r) for b in reader.batches() for r in batch_records(b)] == records[100:]  # and batches() go on
    assert reader.state_dict() == {"epoch": 1, "sample_in_epoch": 0}
    for _record in reader:
        break
    assert reader.state_dict() == {"epoch": 1, "sample_in_epoch": 1}

    again = make()
    again.load_state_dict({"epoch": 0, "sample_in_epoch": 37})
    assert [bytes(r) for r in again] == records[37:]
    assert again.state_dict() == {"epoch": 1, "sample_in_epoch": 0}
    assert_resumes_exactly(make, stops=[0, 1, 37, 100, 1199, 1200, 1500], run=iter, values=lambda r: [bytes(r)])


_FORK_AFTER_READ = """
import gc, multiprocessing, sys
import dlstore
path, io = sys.argv[1], sys.argv[2]
gc.disable()  # what the parent leaves behind stays until the child collects it
batches = iter(dlstore.open_records(path, io=io).batches())
next(batches)  # a reader left mid-pass, its I/O threads waiting for work, then left as garbage in a cycle
cycle = [batches]
cycle.append(cycle)
del batches, cycle


def read(p):
    gc.collect()  # the child collects what it inherited (the parent's reader) before it reads
    return sum(len(r) for r in dlstore.open_records(p, io=io))


with multiprocessing.get_context("fork").Pool(1) as pool:
    print(pool.apply(read, (path,)))
"""


@pytest.mark.slow  # a subprocess
def test_a_forked_child_collects_its_parents_readers_without_hanging(tmp_path, engine_dir, engine):
    """A DataLoader worker forked from a parent with a reader mid-pass: the inherited thread pools have no
    threads in the child, and collecting them must neither hang (joining, destroying a condition variable
    their threads waited on) nor abort (a joinable std::thread destroyed)."""
    import subprocess
    import sys

    recs = [bytes([i]) * 50_000 for i in range(30)]
    path = write_tfrecord(engine_dir / "f.tfrecord", recs)
    r = subprocess.run([sys.executable, "-c", _FORK_AFTER_READ, str(path), engine], capture_output=True, text=True,
                       timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout.split()[-1]) == sum(map(len, recs))


@pytest.mark.parametrize("reader", ["open_records", "Dataset"])
def test_stats_from_another_thread_while_reading(tmp_path, reader):
    """A metrics scrape (or a training loop) calls stats() and corruptions() while the loader's thread is inside
    next_batch with the GIL released: the core grew its vector of corruptions under the reading thread, a
    use-after-free. Its asserts on the counts seen hold either way: the race shows as a crash, reliably only
    under AddressSanitizer, in the sanitizer pass (.ci/sanitize runs this file)."""
    import threading

    path = write_tfrecord(tmp_path / "bad.tfrecord", [b"x" * 20] * 6000)
    with open(path, "r+b") as f:
        blob = bytearray(f.read())
        blob[12::36] = bytes(b ^ 0xFF for b in blob[12::36])  # every record's data: a bad data CRC each
        f.seek(0)
        f.write(blob)
    if reader == "open_records":
        source = dlstore.open_records(path, io="buffered", on_error="skip", chunk_size=64 << 10, verify_threads=0)
        batches = source.batches
    else:
        source = dlstore.Dataset(path, shuffle="none", on_error="skip", batch_size=16, chunk_size=64 << 10)
        batches = source.batches
    stop = threading.Event()
    seen = []

    def scrape():
        while not stop.is_set():
            seen.append((source.stats().get("skipped", 0), len(source.corruptions())))

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        assert sum(b.num_records for b in batches()) == 0
    finally:
        stop.set()
        scraper.join()
    assert source.stats()["skipped"] == 6000 and len(source.corruptions()) == 6000
    assert seen and all(0 <= skipped <= 6000 and 0 <= listed <= 6000 for skipped, listed in seen)


@pytest.mark.parametrize("io", ["direct", "io_uring"])
def test_a_chunk_size_off_the_block_grain_still_reads_direct(direct_dir, io):
    """The settings take any chunk_size from 64 KiB; a Dataset's reads are sized per piece, yet chunk_size=1000000
    (not a multiple of the filesystem's 512 or 4096) sent every file to buffered reads, "alignment ... is larger
    than supported"."""
    if io == "io_uring" and dlstore._C.io_uring_refusal():
        pytest.skip(f"io_uring cannot run here: {dlstore._C.io_uring_refusal()}")
    path = write_tfrecord(direct_dir / "a.tfrecord", [bytes([i]) * 3000 for i in range(200)])
    want = [bytes(r) for r in dlstore.open_records(path, io="buffered")]
    ds = dlstore.Dataset(path, shuffle="none", io=io, chunk_size=1_000_000, batch_size=10)
    assert [r for b in ds.batches() for r in batch_records(b)] == want
    assert not [n for n in ds.stats()["notes"] if "buffered" in n], ds.stats()["notes"]
