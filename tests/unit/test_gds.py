"""The gds engine's code path through the host stand-in backend (numpy buffers, os.preadv, C++ CRC),
its pure read planning, and its CUDA frame kernel compiled for the host. The real kvikio/CuPy path
is the ``gds``-marked test at the end, skipped without a GPU."""
from __future__ import annotations

import os

import numpy as np
import pytest

import dlstore
from dlstore.sources.indexing import build_index
from dlstore.io import cuda, gds
from dlstore.io.gds.kernels import FRAMES_KERNEL_NAME, GATHER_KERNEL_NAME, frames_launch
from tests.helpers import oracle_read_tfrecord, oracle_tfrecord_bytes, write_tfrecord
from tests.stand_ins.host_kernels import HostCompilerMissing, host_kernel


def frames_of(records):
    sizes = np.array([len(r) + 16 for r in records], dtype=np.int64)
    return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64), sizes


def test_plan_reads_covers_every_record_once_with_aligned_starts():
    rng = np.random.default_rng(3)
    file, offset, size, file_sizes = [], [], [], []
    for f in range(3):
        s = rng.integers(16, 30_000, 200).astype(np.int64)
        s[50] = 300_000  # a record larger than a chunk
        o = np.concatenate([[0], np.cumsum(s)[:-1]])
        file.append(np.full(len(s), f))
        offset.append(o)
        size.append(s)
        file_sizes.append(int(s.sum()))
    file, offset, size = map(np.concatenate, (file, offset, size))
    plan = gds.plan_reads(file, offset, size, file_sizes, chunk_size=64 << 10)
    assert np.all(plan.start % gds.ALIGN == 0)
    assert np.array_equal(np.concatenate([np.arange(a, a + c) for a, c in zip(plan.first, plan.count)]),
                          np.arange(len(file)))
    for k in range(len(plan)):
        a, b = plan.first[k], plan.first[k] + plan.count[k]
        assert np.all(file[a:b] == plan.file[k])
        assert plan.start[k] <= offset[a] and offset[b - 1] + size[b - 1] <= plan.stop[k]
        assert plan.stop[k] <= file_sizes[plan.file[k]]
        assert plan.stop[k] % gds.ALIGN == 0 or plan.stop[k] == file_sizes[plan.file[k]]
        assert offset[b - 1] - plan.start[k] < 64 << 10  # each record starts within the chunk
    assert plan.max_bytes >= 300_000


def test_plan_reads_breaks_at_gaps_and_keeps_plan_order():
    # A shuffled plan (records not following each other) gives one read per record, in plan order.
    offset = np.array([8192, 0, 4096], dtype=np.int64)
    size = np.array([100, 100, 100], dtype=np.int64)
    plan = gds.plan_reads(np.zeros(3), offset, size, [9000], chunk_size=1 << 20)
    assert plan.first.tolist() == [0, 1, 2] and plan.start.tolist() == [8192, 0, 4096]
    assert plan.stop.tolist() == [9000, 4096, 8192]
    with pytest.raises(ValueError, match="alignment"):
        gds.plan_reads(np.zeros(3), offset, size, [9000], chunk_size=100)


def indexed(tmp_path, name, records):
    path = write_tfrecord(tmp_path / name, records)
    build_index(path, "tfrecord")
    return path


def read_all(core):
    out = []
    for batch in core:
        buf = batch.buffer.tobytes()
        out += [buf[o:o + n] for o, n in zip(batch.offsets.tolist(), batch.lengths.tolist())]
    return out


@pytest.mark.parametrize("chunk_size", [4096, 64 << 10, 8 << 20])
def test_host_stand_in_reads_what_the_oracle_reads(tmp_path, payloads, chunk_size):
    paths = [indexed(tmp_path, "a.tfrecord", payloads), indexed(tmp_path, "b.tfrecord", payloads[::-1])]
    core = gds.GdsCore(paths, *gds.file_plan(paths), gds.HostBackend(), chunk_size=chunk_size, depth=3)
    assert read_all(core) == payloads + payloads[::-1]
    stats = core.stats()
    assert stats["records"] == 2 * len(payloads) and stats["skipped"] == 0
    assert stats["bytes_read"] >= sum(os.path.getsize(p) for p in paths)
    assert stats["gds_mode"] == "host" and "host" in stats["crc"]


def corrupt(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, (os.path.getmtime(path) - 10,) * 2)  # keep the index newer than the data
    os.utime(path + ".idx", None)


def test_corrupt_data_is_named_or_skipped(tmp_path, payloads):
    path = indexed(tmp_path, "c.tfrecord", payloads)
    offsets, sizes = frames_of(payloads)
    corrupt(path, int(offsets[5]) + 12 + 100)  # in record 5's payload (4097 bytes)
    core = gds.GdsCore([path], *gds.file_plan([path]), gds.HostBackend(), chunk_size=64 << 10)
    with pytest.raises(dlstore.CorruptRecordError, match=f"^{path}: at byte {offsets[5]}: .*data CRC") as e:
        read_all(core)
    assert e.value.path == path and e.value.offset == offsets[5]
    core = gds.GdsCore([path], *gds.file_plan([path]), gds.HostBackend(), chunk_size=64 << 10, on_error="skip")
    assert read_all(core) == payloads[:5] + payloads[6:]
    assert core.stats()["skipped"] == 1 and core.corruptions() == [(path, int(offsets[5]),
                                                                    "bad data CRC in a record of 4097 bytes")]
    # verify=False: the CRC is not checked, so the damaged payload comes through.
    core = gds.GdsCore([path], *gds.file_plan([path]), gds.HostBackend(), chunk_size=64 << 10, verify=False)
    got = read_all(core)
    assert len(got) == len(payloads) and got[5] != payloads[5]


def test_length_differing_from_the_index_is_caught(tmp_path):
    path = indexed(tmp_path, "l.tfrecord", [b"a" * 10, b"b" * 20])
    corrupt(path, 0)  # record 0's length field
    core = gds.GdsCore([path], *gds.file_plan([path]), gds.HostBackend(), chunk_size=4096, verify=False)
    with pytest.raises(dlstore.CorruptRecordError, match="at byte 0: record length differs from the index"):
        read_all(core)


def test_short_read_names_file_offset_and_bytes(tmp_path):
    path = indexed(tmp_path, "s.tfrecord", [b"x" * 5000, b"y" * 5000])

    class Short(gds.HostBackend):
        def read(self, handle, buf, size, file_offset):
            return super().read(handle, buf, size - 7, file_offset)

    core = gds.GdsCore([path], *gds.file_plan([path]), Short(), chunk_size=4096)
    with pytest.raises(dlstore.DlstoreIOError, match=f"^{path}: short read at byte 0: 8185 of 8192 bytes"):
        read_all(core)


class _Refused:
    """kvikio's way of failing: C++ errors reach Python as RuntimeError, when issued or when waited on."""

    def get(self):
        raise RuntimeError("cuFile read: Input/output error")


@pytest.mark.parametrize("where", ["open", "issue", "wait"])
def test_kvikio_style_errors_become_dlstore_io_errors_naming_file_and_offset(tmp_path, where):
    path = indexed(tmp_path, "k.tfrecord", [b"x" * 5000, b"y" * 5000])

    class Kvikio(gds.HostBackend):
        def open(self, p):
            if where == "open":
                raise RuntimeError("cuFileHandleRegister failed")
            return super().open(p)

        def read(self, handle, buf, size, file_offset):
            if where == "issue":
                raise RuntimeError("cuFile read: Input/output error")
            return _Refused() if where == "wait" else super().read(handle, buf, size, file_offset)

    core = gds.GdsCore([path], *gds.file_plan([path]), Kvikio(), chunk_size=4096)
    what = "cannot open" if where == "open" else "read failed at byte 0"
    with pytest.raises(dlstore.DlstoreIOError, match=f"^{path}: {what}: ") as e:  # failover's error, not a traceback
        read_all(core)
    assert e.value.path == path


def test_missing_index_says_how_to_build_one(tmp_path):
    path = write_tfrecord(tmp_path / "n.tfrecord", [b"x"])
    with pytest.raises(dlstore.DlstoreError, match="locates records from the index.*dlstore index"):
        gds.file_plan([path])


def test_open_records_gds_runs_the_engine_and_says_which_mode(tmp_path, payloads, stand_in_gds):
    path = indexed(tmp_path, "r.tfrecord", payloads)
    reader = dlstore.open_records(path, io="gds", device="cuda:1", chunk_size=64 << 10)
    assert reader.engine == "gds" and "GPUDirect Storage" in reader.engine_reason
    got = [bytes(r) for b in reader.batches() for r in
           (b.buffer[o:o + n] for o, n in zip(b.offsets.tolist(), b.lengths.tolist()))]
    assert got == payloads
    assert stand_in_gds[0][0] == "gds" and stand_in_gds[0][2] == 1
    stats = reader.stats()
    assert stats["gds_mode"] == "gds" and stats["records"] == len(payloads) and stats["engine"] == "gds"
    assert reader.state_dict() == {"epoch": 1, "sample_in_epoch": 0}
    # Resumes mid-epoch as the host engines do.
    reader.load_state_dict({"epoch": 1, "sample_in_epoch": 7})
    rest = [n for b in reader.batches() for n in b.lengths.tolist()]
    assert rest == [len(p) for p in payloads[7:]]


def test_gds_refuses_compressed_and_recordio(tmp_path, stand_in_gds):
    import gzip

    path = tmp_path / "z.tfrecord.gz"
    path.write_bytes(gzip.compress(oracle_tfrecord_bytes([b"x"])))
    with pytest.raises(dlstore.DlstoreError, match="uncompressed TFRecord.*gzip"):
        dlstore.open_records(path, io="gds")
    rec = str(tmp_path / "r.rec")
    with dlstore.RecordIOWriter(rec, idx_path=str(tmp_path / "r.idx")) as w:
        w.write(b"x")
    with pytest.raises(dlstore.DlstoreError, match=f"^io='gds' reads uncompressed TFRecord files; {rec} is recordio"):
        dlstore.open_records(rec, io="gds")


def host_kernel_or_skip(name):
    try:
        return host_kernel(name)
    except HostCompilerMissing as e:
        pytest.skip(str(e))


def test_the_cuda_frame_kernel_agrees_with_the_host_stand_in(tmp_path):
    """The CUDA kernel, compiled for the host, on good, damaged and mis-sized frames."""
    frames = host_kernel_or_skip(FRAMES_KERNEL_NAME)
    records = [b"", b"a", b"hello world" * 300, bytes(range(256)) * 20, b"z" * 4096]
    blob = bytearray(b"\0" * 3 + oracle_tfrecord_bytes(records))  # 3 bytes in: frames misaligned
    offsets, sizes = frames_of(records)
    rel = offsets + 3
    blob[rel[2] + 12 + 7] ^= 1           # data CRC of record 2
    blob[rel[3] + 9] ^= 1                # length CRC of record 3
    sizes = sizes.copy()
    sizes[4] += 1                        # the index disagrees with record 4's length
    buf = np.frombuffer(bytes(blob), dtype=np.uint8)
    for verify in (True, False):
        want = gds.HostBackend().frame_status(buf, rel, sizes, verify)
        got = np.zeros(len(records), dtype=np.uint8)
        grid, block, shared = frames_launch(len(records))
        frames(grid, block, (buf, rel, sizes, np.int32(len(records)), np.int32(int(verify)), got), shared_mem=shared)
        assert got.tolist() == want.tolist()
    assert want.tolist() == [0, 0, 0, 0, gds.FRAME_LENGTH]
    assert gds.HostBackend().frame_status(buf, rel, sizes, True).tolist() == [0, 0, gds.FRAME_DATA_CRC,
                                                                             gds.FRAME_LENGTH_CRC, gds.FRAME_LENGTH]
    assert oracle_read_tfrecord(bytes(blob[3:]))[0] == b""


@pytest.mark.gds
@pytest.mark.gpu
def test_kvikio_reads_into_gpu_memory(tmp_path, payloads):
    verdict = cuda.gds_verdict(cuda.cuda_facts())
    if not verdict.runs:
        pytest.skip(verdict.missing)
    import cupy

    path = indexed(tmp_path, "g.tfrecord", payloads)
    reader = dlstore.open_records(path, io="gds", chunk_size=64 << 10)
    got = []
    for batch in reader.batches():
        assert batch.on_gpu and cupy.asarray(batch.buffer).device.id == 0
        host = cupy.asnumpy(batch.buffer).tobytes()
        got += [host[o:o + n] for o, n in zip(batch.offsets.tolist(), batch.lengths.tolist())]
    assert got == payloads
    assert reader.stats()["gds_mode"] == verdict.mode and "GPU" in reader.stats()["crc"]


def test_reader_of_gds_iterates_records_through_the_stand_in(tmp_path, payloads, stand_in_gds):
    path = indexed(tmp_path, "it.tfrecord", payloads)
    assert [bytes(r) for r in dlstore.open_records(path, io="gds", chunk_size=64 << 10)] == payloads
    assert dlstore.open_records(path, io="gds").count()["records"] == len(payloads)


def test_plan_reader_hands_out_exact_batches_gathered_across_reads_and_files(tmp_path, payloads):
    """GdsPlanReader: a plan over two files in an interleaved order, batches of exactly 7 (the first of
    3), records gathered from several reads (and files) into one buffer, each naming its file."""
    paths = [indexed(tmp_path, "a.tfrecord", payloads), indexed(tmp_path, "b.tfrecord", payloads[::-1])]
    file, offset, size = gds.file_plan(paths)
    n = len(payloads)
    order = np.arange(2 * n).reshape(2, n).T.reshape(-1)  # a0 b0 a1 b1 ...: no two neighbours in a file
    want = [r for pair in zip(payloads, payloads[::-1]) for r in pair]
    reader = gds.GdsPlanReader(paths, file[order], offset[order], size[order], gds.HostBackend(), batch_size=7,
                               first_batch=3, chunk_size=4096)
    got, sizes, files = [], [], []
    while (batch := reader.next_batch()) is not None:
        got += read_all([batch])
        sizes.append(batch.num_records)
        files += [batch.path(i) for i in range(batch.num_records)]
    assert got == want and files == [paths[i % 2] for i in range(2 * n)]
    assert sizes[0] == 3 and all(s == 7 for s in sizes[1:-1]) and reader.position == 2 * n
    stats = reader.stats()
    assert stats["records"] == 2 * n and stats["gathered_batches"] == len(sizes) and stats["chunks"] == 2 * n


def test_the_gather_kernel_and_the_host_gather_match_an_oracle_off_4096(tmp_path):
    """Records from three buffers, at offsets not aligned to 4096 (empty ones too), gathered into one
    buffer by the CUDA kernel compiled for the host and by HostBackend.gather."""
    gather = host_kernel_or_skip(GATHER_KERNEL_NAME)
    rng = np.random.default_rng(8)
    sources = [np.frombuffer(rng.bytes(n), dtype=np.uint8) for n in (20_000, 4096 * 3 + 5, 7)]
    src_buf = rng.integers(0, 3, 60).astype(np.int64)
    src_buf[:3] = [2, 1, 0]
    length = np.array([rng.integers(0, min(5000, len(sources[b])) + 1) for b in src_buf], dtype=np.int64)
    length[5] = 0
    src_at = np.array([rng.integers(0, len(sources[b]) - n + 1) for b, n in zip(src_buf, length)], dtype=np.int64)
    src_at[1], length[1] = 4095, 4098  # across a 4096 boundary
    dst_at = gds.packed_offsets(length)
    want = b"".join(sources[b][a:a + n].tobytes() for b, a, n in zip(src_buf.tolist(), src_at.tolist(),
                                                                     length.tolist()))
    assert dst_at.tolist() == [sum(length[:i].tolist()) for i in range(len(length))]
    host = np.zeros(len(want), dtype=np.uint8)
    gds.HostBackend().gather(host, sources, src_buf, src_at, length, dst_at)
    assert host.tobytes() == want
    pointers = np.array([b.ctypes.data for b in sources], dtype=np.uint64)
    for step in (1, 3, 256):
        got = np.zeros(len(want) + 1, dtype=np.uint8)
        gather((2,), (step,), (pointers, src_buf, src_at, length, dst_at, np.int64(len(length)), got))
        assert got[:-1].tobytes() == want and got[-1] == 0  # nothing written past the records


def held_back(n, every):
    """An emission order that holds every ``every``-th read position back to the end (as a shuffle
    buffer holds stragglers), the rest in read order."""
    late = np.arange(0, n, every)
    return np.concatenate([np.setdiff1d(np.arange(n), late), late])


@pytest.mark.parametrize("hold", [0, 12 << 10])
def test_plan_reader_reads_in_read_order_and_hands_out_in_emission_order(tmp_path, hold):
    """The plan in read order plus an emission order: large reads (as many as plan_reads makes for the
    read order, far fewer than records), batches of exactly 5 in emission order; with a hold limit the
    reads held stay within it, the held-back records copied out of the reads let go (spilled)."""
    rng = np.random.default_rng(5)
    recs = [b"%d|" % i + rng.bytes(int(rng.integers(0, 1500))) for i in range(300)]
    path = indexed(tmp_path, "e.tfrecord", recs)
    file, offset, size = gds.file_plan([path])
    emit = held_back(len(recs), 10)
    reads = gds.plan_reads(file, offset, size, [os.path.getsize(path)], 4096)
    reader = gds.GdsPlanReader([path], file, offset, size, gds.HostBackend(), emit=emit, batch_size=5,
                               chunk_size=4096, hold_bytes=hold)
    batches = []
    while (batch := reader.next_batch()) is not None:
        batches.append(read_all([batch]))
        assert batch.file_offsets.tolist() == offset[emit[reader.position - batch.num_records:reader.position]].tolist()
    assert [r for b in batches for r in b] == [recs[i] for i in emit]
    assert all(len(b) == 5 for b in batches) and reader.position == len(recs)
    stats = reader.stats()
    assert stats["chunks"] == len(reads) < len(recs) // 4
    read_bytes = int((reads.stop - reads.start).sum())  # neighbouring reads share the page between them
    assert stats["file_bytes_read"] == read_bytes and stats["records"] == len(recs)
    # No limit: each read holding a record emitted at the end stays held until the end.
    holding = np.unique(np.repeat(np.arange(len(reads)), reads.count)[::10])
    unbounded = int((reads.stop - reads.start)[holding].sum())
    if hold:
        assert stats["peak_held_bytes"] <= hold + reads.max_bytes < unbounded
        assert stats["spilled_records"] >= len(emit) // 10 // 2  # held-back records copied out of reads let go
    else:
        assert unbounded <= stats["peak_held_bytes"] <= unbounded + 2 * reads.max_bytes  # + a batch's reads
        assert stats["spilled_records"] == 0


def test_plan_reader_resumed_plan_reads_only_the_records_emitted(tmp_path, payloads):
    """Read positions missing from ``emit`` (already handed out before a restart) are not read."""
    path = indexed(tmp_path, "r.tfrecord", payloads)
    file, offset, size = gds.file_plan([path])
    emit = np.arange(12, len(payloads))[::-1]
    reader = gds.GdsPlanReader([path], file, offset, size, gds.HostBackend(), emit=emit, batch_size=4,
                               first_batch=3, chunk_size=4096)
    got, sizes = [], []
    while (batch := reader.next_batch()) is not None:
        got += read_all([batch])
        sizes.append(batch.num_records)
    assert got == [payloads[i] for i in emit] and sizes[0] == 3 and set(sizes[1:-1]) == {4}
    stats = reader.stats()  # from record 12's page on, each read at most a page more
    assert stats["file_bytes_read"] <= os.path.getsize(path) - (offset[12] & ~4095) + 4096 * stats["chunks"]


def test_plan_reader_skips_or_raises_corrupt_records_in_emission_order(tmp_path, payloads):
    path = indexed(tmp_path, "c.tfrecord", payloads)
    offsets, _ = frames_of(payloads)
    corrupt(path, int(offsets[4]) + 12 + 1)
    file, offset, size = gds.file_plan([path])
    emit = held_back(len(payloads), 4)  # record 4 is held back to the end
    late = len(payloads) - len(np.arange(0, len(payloads), 4))

    def run(on_error):
        reader = gds.GdsPlanReader([path], file, offset, size, gds.HostBackend(), emit=emit, batch_size=3,
                                   chunk_size=4096, on_error=on_error)
        got = []
        try:
            while (batch := reader.next_batch()) is not None:
                got += read_all([batch])
        except dlstore.CorruptRecordError as e:
            return reader, got, e
        return reader, got, None

    reader, got, err = run("raise")
    assert got == [payloads[i] for i in emit[:late + 1]] and reader.position == late + 1
    assert (err.path, err.offset) == (path, offsets[4]) and "data CRC" in str(err)
    reader, got, err = run("skip")
    assert err is None and got == [payloads[i] for i in emit if i != 4] and reader.position == len(payloads)
    assert reader.corruptions() == [(path, int(offsets[4]), f"bad data CRC in a record of {len(payloads[4])} bytes")]
    assert reader.stats()["skipped"] == 1
