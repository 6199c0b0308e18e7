"""The gds reader (:class:`dlstore.io.gds.GdsPlanReader`) over the kvikio and CuPy stand-ins and the kernels
compiled for the host: the records the oracle reads, reads under and over kvikio's ``gds_threshold``, kvikio's
own errors (EOF at a file's end, any exception type, at open, issue or wait) becoming DlstoreIOError naming
file and offset, flagged frames named in the host engines' words, the DLPack hand-off and when a dropped
batch's memory is read into again. The real kvikio/CuPy path is the ``gds``-marked test, skipped without a GPU."""
from __future__ import annotations

import gzip
import os

import numpy as np
import pytest

import dlstore
from dlstore import _C
from dlstore.io import cuda
from dlstore.io.gds import GdsPlanReader
from dlstore.io.gds.kernels import FRAMES_KERNEL_NAME, frames_launch
from tests.helpers import flip_data_byte, oracle_tfrecord_bytes, write_tfrecord
from tests.stand_ins.host_kernels import host_kernel


def frames_of(records):
    size = np.array([len(r) + 16 for r in records], dtype=np.int64)
    return np.cumsum(size) - size, size


def records_of(batch):
    host = batch.buffer.get().tobytes()
    return [host[o:o + n] for o, n in zip(batch.offsets.tolist(), batch.lengths.tolist())]


def read_all(reader):
    out = []
    while (batch := reader.next_batch()) is not None:
        out += records_of(batch)
    return out


def plan_reader(paths, records, emit=None, order=None, **kw):
    """A GdsPlanReader over whole files (records: per path, its payloads), read in file order or ``order``."""
    file, offset, size = [], [], []
    for i, recs in enumerate(records):
        o, s = frames_of(recs)
        file.append(np.full(len(recs), i))
        offset.append(o)
        size.append(s)
    opts = dict(batch_size=7, chunk_size=64 << 10, depth=2)
    opts.update(kw)
    file, offset, size = np.concatenate(file), np.concatenate(offset), np.concatenate(size)
    if order is not None:
        file, offset, size = file[order], offset[order], size[order]
    return GdsPlanReader(paths, file, offset, size, emit, **opts)


@pytest.mark.parametrize("shuffled", [True, False])
def test_reads_under_and_over_kvikios_threshold_give_the_oracles_records(tmp_path, gpu_libraries, shuffled):
    """Shuffled, each record is a read of its own, under kvikio's gds_threshold (16 KiB in 26.10): run at once
    by pread itself; in order, reads of 64 KiB go to kvikio's thread pool. The same records either way."""
    rng = np.random.default_rng(1)
    recs = [rng.bytes(int(rng.integers(0, 6000))) for _ in range(60)]
    paths = [write_tfrecord(tmp_path / "a.tfrecord", recs), write_tfrecord(tmp_path / "b.tfrecord", recs[::-1])]
    order = rng.permutation(120) if shuffled else None  # a global shuffle reads record by record
    want = recs + recs[::-1]
    with gpu_libraries.kvikio.SummaryMonitor() as monitor:
        reader = plan_reader(paths, [recs, recs[::-1]], order=order)
        got = read_all(reader)
    assert got == ([want[i] for i in order] if shuffled else want)
    threshold = gpu_libraries.kvikio.defaults.get("gds_threshold")
    reads = monitor.get().by_backend["POSIX"]  # compat here: every read through POSIX
    mean = reads["bytes_transferred"] / reads["num_ops"]
    assert (mean < threshold) if shuffled else (mean > threshold)
    stats = reader.stats()
    assert stats["records"] == 120 and stats["chunks"] >= 1 and stats["file_bytes_read"] >= stats["payload_bytes"]


def test_open_records_indexes_on_the_fly_and_resumes(tmp_path, payloads, stand_in_gds):
    path = write_tfrecord(tmp_path / "r.tfrecord", payloads)  # no index: gds builds one, as the host engines do
    reader = dlstore.open_records(path, io="gds", device="cuda:1", chunk_size=64 << 10)
    assert reader.engine == "gds" and "GPUDirect Storage" in reader.engine_reason
    batches = list(reader.batches())
    assert [r for b in batches for r in records_of(b)] == payloads
    assert {b.buffer.device.id for b in batches} == {1}
    assert reader.stats()["records"] == len(payloads) and reader.state_dict() == {"epoch": 1, "sample_in_epoch": 0}
    reader.load_state_dict({"epoch": 1, "sample_in_epoch": 7})
    assert [n for b in reader.batches() for n in b.lengths.tolist()] == [len(p) for p in payloads[7:]]
    with pytest.raises(dlstore.DlstoreError, match="record by record"):
        list(reader)
    assert dlstore.open_records(path, io="gds").count()["records"] == len(payloads)


def test_open_records_reads_cuda_local_into_the_local_ranks_gpu(tmp_path, payloads, stand_in_gds, monkeypatch):
    # cuda:local read into (and was checked against) cuda:0 whatever the local rank; a Dataset's did not.
    for name, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    path = write_tfrecord(tmp_path / "l.tfrecord", payloads)
    reader = dlstore.open_records(path, io="gds", device="cuda:local", chunk_size=64 << 10)
    assert reader.device_index == 1 and {b.buffer.device.id for b in reader.batches()} == {1}


def test_bench_storage_reads_gds_into_the_device_asked_for(tmp_path, payloads, stand_in_gds):
    # open_readers left the device out, so --io gds --device cuda:1 read into cuda:0.
    from dlstore.bench.storage import open_readers

    paths = [write_tfrecord(tmp_path / f"s{k}.tfrecord", payloads) for k in range(2)]
    readers = open_readers(paths, io="gds", readers=2, device=1)
    assert [r.device_index for r in readers] == [1, 1]
    assert {b.buffer.device.id for r in readers for b in r.batches()} == {1}
    assert open_readers(paths, io="buffered", device=1)[0].device_index is None  # the bench copies host batches


def test_corrupt_data_is_named_as_the_host_names_it_or_skipped(tmp_path, gpu_libraries, payloads):
    path = write_tfrecord(tmp_path / "c.tfrecord", payloads)
    offsets, _ = frames_of(payloads)
    flip_data_byte(path, 5, offsets)
    with pytest.raises(dlstore.CorruptRecordError) as gds_err:
        read_all(plan_reader([path], [payloads]))
    with pytest.raises(dlstore.CorruptRecordError) as host_err:
        list(dlstore.open_records(path, io="buffered"))
    assert str(gds_err.value) == str(host_err.value) and gds_err.value.offset == offsets[5]
    reader = plan_reader([path], [payloads], on_error="skip")
    assert read_all(reader) == payloads[:5] + payloads[6:]
    assert reader.stats()["skipped"] == 1 and reader.corruptions()[0][:2] == (path, int(offsets[5]))
    got = read_all(plan_reader([path], [payloads], verify=False))  # CRCs off: the damaged payload comes through
    assert len(got) == len(payloads) and got[5] != payloads[5]


def test_a_file_shorter_than_its_index_fails_at_kvikios_eof_naming_file_and_offset(tmp_path, gpu_libraries):
    recs = [b"x" * 5000, b"y" * 5000]
    path = write_tfrecord(tmp_path / "s.tfrecord", recs)
    os.truncate(path, os.path.getsize(path) - 100)  # cut after it was indexed
    with pytest.raises(dlstore.DlstoreIOError, match=f"^{path}: read failed at byte 0: .*POSIX error on pread: EOF"):
        read_all(plan_reader([path], [recs]))


@pytest.mark.parametrize("error", [RuntimeError, ValueError, OSError])
@pytest.mark.parametrize("where", ["open", "issue", "wait"])
def test_every_kvikio_error_becomes_a_dlstore_io_error_naming_file_and_offset(tmp_path, gpu_libraries, monkeypatch,
                                                                               where, error):
    recs = [b"x" * 5000, b"y" * 5000]
    path = write_tfrecord(tmp_path / "k.tfrecord", recs)
    kvikio = gpu_libraries.kvikio
    if where == "open":
        monkeypatch.setattr(kvikio, "CuFile", lambda *a, **k: (_ for _ in ()).throw(error("cuFileHandleRegister")))
    elif where == "issue":
        monkeypatch.setattr(kvikio.CuFile, "pread", lambda *a, **k: (_ for _ in ()).throw(error("bad buffer")))
    else:
        monkeypatch.setattr(kvikio.IOFuture, "get", lambda self: (_ for _ in ()).throw(error("Input/output error")))
    what = "cannot open" if where == "open" else "read failed at byte 0"
    with pytest.raises(dlstore.DlstoreIOError, match=f"^{path}: {what}: ") as e:  # failover's error, not a traceback
        read_all(plan_reader([path], [recs]))
    assert e.value.path == path


def test_many_files_stay_within_the_open_file_budget(tmp_path, gpu_libraries, monkeypatch):
    """A global shuffle over many small files: files no read in flight holds are closed, least recently used
    first, once more than ``max_open_files`` are open, and a chunk reads at most max(16, budget // (2 * depth))
    files (the host reader's cap), so the reader never holds every file of the pass open."""
    kvikio, state = gpu_libraries.kvikio, {"open": 0, "most": 0}
    opened_as = kvikio.CuFile

    class Counted(opened_as):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            state["open"] += 1
            state["most"] = max(state["most"], state["open"])

        def close(self):
            if not self.closed:
                state["open"] -= 1
            super().close()

    monkeypatch.setattr(kvikio, "CuFile", Counted)
    recs = [[b"%02d-%d" % (k, i) * 40 for i in range(3)] for k in range(60)]
    paths = [write_tfrecord(tmp_path / f"s{k:02d}.tfrecord", r) for k, r in enumerate(recs)]
    order = np.random.default_rng(5).permutation(180)
    want = [r for rs in recs for r in rs]
    reader = plan_reader(paths, recs, order=order, max_open_files=4, chunk_size=1 << 20, batch_size=8)
    assert read_all(reader) == [want[i] for i in order]
    assert 16 < state["most"] <= 4 + 2 * 16  # the budget, and the files of the two chunks in flight
    assert state["open"] == 0  # the end of the pass closed the rest


def test_the_default_budget_counts_kvikios_two_descriptors_per_file_in_gds_mode(tmp_path, gpu_libraries, monkeypatch):
    """kvikio's FileHandle opens a file with and without O_DIRECT unless in compat mode (kvikio 26.10
    cpp/src/compat_mode_manager.cpp): in gds mode the descriptor budget keeps half as many files open."""
    from dlstore.io.gds import reader as gds_reader

    monkeypatch.setattr(gds_reader, "open_files_budget", lambda: 100)
    path = write_tfrecord(tmp_path / "b.tfrecord", [b"x" * 10])
    assert plan_reader([path], [[b"x" * 10]], mode="gds")._max_open == 50
    assert plan_reader([path], [[b"x" * 10]], mode="compat")._max_open == 100


def test_pieces_after_a_failed_one_are_waited_before_their_buffer_goes(tmp_path, gpu_libraries, monkeypatch):
    """A chunk whose first piece fails: the pieces issued after it still write into the chunk's buffer, so
    each is waited (once) before the error is raised and the buffer and files are let go."""
    kvikio, futures = gpu_libraries.kvikio, []
    issue = kvikio.CuFile.pread

    def tracked(self, *a, **k):
        futures.append(issue(self, *a, **k))
        return futures[-1]

    real_get = kvikio.IOFuture.get

    def get(self):
        if self is futures[0]:
            real_get(self)
            raise RuntimeError("Input/output error")
        return real_get(self)

    monkeypatch.setattr(kvikio.CuFile, "pread", tracked)
    monkeypatch.setattr(kvikio.IOFuture, "get", get)
    recs = [[b"%d" % k * 3000] for k in range(6)]
    paths = [write_tfrecord(tmp_path / f"p{k}.tfrecord", r) for k, r in enumerate(recs)]
    with pytest.raises(dlstore.DlstoreIOError, match=f"^{paths[0]}: read failed at byte 0: "):
        read_all(plan_reader(paths, recs, chunk_size=1 << 20, batch_size=6))
    assert len(futures) == 6 and all(f._future is None for f in futures)  # each waited, none twice


def test_batches_gathered_across_reads_and_files_in_emission_order(tmp_path, gpu_libraries, payloads):
    paths = [write_tfrecord(tmp_path / "a.tfrecord", payloads), write_tfrecord(tmp_path / "b.tfrecord",
                                                                              payloads[::-1])]
    n = len(payloads)
    emit = np.arange(2 * n).reshape(2, n).T.reshape(-1)  # a0 b0 a1 b1 ...: no two neighbours in a read
    reader = plan_reader(paths, [payloads, payloads[::-1]], emit=emit, first_batch=3, chunk_size=4096)
    got, sizes, files = [], [], []
    while (batch := reader.next_batch()) is not None:
        got += records_of(batch)
        sizes.append(batch.num_records)
        files += [batch.path(i) for i in range(batch.num_records)]
    assert got == [r for pair in zip(payloads, payloads[::-1]) for r in pair]
    assert files == [paths[i % 2] for i in range(2 * n)]
    assert sizes[0] == 3 and all(s == 7 for s in sizes[1:-1]) and reader.position == 2 * n
    assert reader.stats()["gathered_batches"] >= len(sizes) - 2


def test_the_dlpack_hand_off_orders_the_consumers_stream_and_keeps_the_batch(tmp_path, gpu_libraries):
    import torch

    recs = [b"%d" % i * 100 for i in range(20)]
    path = write_tfrecord(tmp_path / "d.tfrecord", recs)
    batch = plan_reader([path], [recs], batch_size=20).next_batch()
    cp = gpu_libraries.cupy
    consumer = cp.cuda.Stream(non_blocking=True)
    tensor = torch.from_dlpack(batch.__dlpack__(stream=consumer.ptr))  # the stand-in exports host memory
    assert ("dlpack", consumer.ptr) in cp.log
    assert any(e[0] == "wait_event" and e[1] == consumer.ptr for e in cp.log)  # the consumer waits for the reader
    data = tensor.numpy().tobytes()
    assert [data[o:o + n] for o, n in zip(batch.offsets.tolist(), batch.lengths.tolist())] == recs


def test_a_dropped_batch_is_not_read_into_before_its_consumers_stream_passes(tmp_path, gpu_libraries, monkeypatch):
    """A batch a consumer read on its own stream, then dropped: its memory stays out of CuPy's pool until an
    event recorded on that stream at the drop completes, so the next pread cannot land in it."""
    recs = [b"r" * 3000 for _ in range(40)]
    path = write_tfrecord(tmp_path / "q.tfrecord", recs)
    cp = gpu_libraries.cupy
    reader = plan_reader([path], [recs], batch_size=10, chunk_size=4096, depth=1)
    consumer = cp.cuda.Stream(non_blocking=True)
    batch = reader.next_batch()
    batch.__dlpack__(stream=consumer.ptr)
    address = batch.buffer.data.ptr
    monkeypatch.setattr(cp.Event, "done", property(lambda self: False))  # the consumer's kernels still run
    del batch
    later = [reader.next_batch() for _ in range(3)]
    assert all(b.buffer.data.ptr != address for b in later if b is not None)
    assert len(reader._quarantine) == 1
    monkeypatch.setattr(cp.Event, "done", property(lambda self: True))  # now they have finished
    reader._quarantine.purge()
    assert len(reader._quarantine) == 0


def test_gds_refuses_compressed_and_recordio(tmp_path, stand_in_gds):
    path = tmp_path / "z.tfrecord.gz"
    path.write_bytes(gzip.compress(oracle_tfrecord_bytes([b"x"])))
    with pytest.raises(dlstore.DlstoreError, match="uncompressed TFRecord.*gzip"):
        dlstore.open_records(path, io="gds")
    rec = str(tmp_path / "r.rec")
    with dlstore.RecordIOWriter(rec, idx_path=str(tmp_path / "r.idx")) as w:
        w.write(b"x")
    with pytest.raises(dlstore.DlstoreError, match=f"^io='gds' reads uncompressed TFRecord files; {rec} is recordio"):
        dlstore.open_records(rec, io="gds")


def test_the_frame_kernel_flags_what_the_cpp_frame_check_refuses():
    """The CUDA frame kernel (compiled for the host) and the C++ check the host engines run, on good, damaged
    and mis-sized frames placed 3 bytes off alignment: a frame flagged is one the C++ check names."""
    records = [b"", b"a", b"hello world" * 300, bytes(range(256)) * 20, b"z" * 4096]
    blob = bytearray(b"\0" * 3 + oracle_tfrecord_bytes(records))
    offsets, sizes = frames_of(records)
    rel = offsets + 3
    blob[rel[2] + 12 + 7] ^= 1  # data CRC of record 2
    blob[rel[3] + 9] ^= 1       # length CRC of record 3
    sizes = sizes.copy()
    sizes[4] += 1               # the index disagrees with record 4's length
    buf = np.frombuffer(bytes(blob + b"\0"), dtype=np.uint8)
    frames = host_kernel(FRAMES_KERNEL_NAME)
    for verify in (True, False):
        status = np.zeros(len(records), dtype=np.uint8)
        grid, block, shared = frames_launch(len(records))
        frames(grid, block, (buf, rel, sizes, np.int32(len(records)), np.int32(int(verify)), status), shared_mem=shared)
        named = [_C.frame_problem(bytes(buf[r:r + s]), "tfrecord", verify) is not None for r, s in zip(rel, sizes)]
        assert (status != 0).tolist() == named
    assert named == [False, False, False, False, True] and status.tolist() == [0, 0, 0, 0, 1]


@pytest.mark.gds
@pytest.mark.gpu
def test_kvikio_reads_into_gpu_memory(tmp_path, payloads):
    verdict = cuda.gds_verdict(cuda.cuda_facts())
    if not verdict.runs:
        pytest.skip(verdict.missing)
    import cupy

    path = write_tfrecord(tmp_path / "g.tfrecord", payloads)
    reader = dlstore.open_records(path, io="gds", chunk_size=64 << 10)
    got = []
    for batch in reader.batches():
        assert batch.on_gpu and cupy.asarray(batch.buffer).device.id == 0
        got += records_of(batch)
    assert got == payloads
    assert "GPU" in reader.stats()["crc"]
