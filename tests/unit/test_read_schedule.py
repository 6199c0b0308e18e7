"""The one read schedule (``_C.ReadSchedule``) through its step protocol, carried out by a small Python
executor over host bytes: it must hand out what the host reader (``_C.PlanReader``, the same schedule
with the C++ executor) hands out, keep at most ``depth`` reads in flight, spill and let go within the
hold budget, and raise or skip what the host reader does."""
import numpy as np
import pytest

from dlstore import _C, ReadOptions
from dlstore.errors import CorruptRecordError, DlstoreIOError
from tests.helpers import flip_data_byte, write_tfrecord


def frames_of(records):
    size = np.array([len(r) + 16 for r in records], dtype=np.int64)
    return np.cumsum(size) - size, size


class PythonExecutor:
    """Carries out the schedule's steps with Python file reads: what the GPU reader does with kvikio."""

    def __init__(self, paths, file, offset, size, emit, fail_file=None, **opts):
        self.fail_file = fail_file  # reads of this file fail, as a dead mount's would
        self.paths, self.file, self.offset, self.size = paths, file, offset, size
        self.sched = _C.ReadSchedule(paths, file, offset, size, emit, **opts)
        self.data = {}     # read position -> payload, while its chunk (or spill) is held
        self.held = {}     # chunk -> its read positions
        self.pending = {}  # chunk -> (positions, payloads, failure)
        self.in_flight_max = 0
        self.steps = []

    def read(self, chunk, file, start, end, first, last):
        positions, payloads, failure = [], [], None
        for f, s, e, a, b in zip(file, start, end, first, last):
            try:
                if f == self.fail_file:
                    raise OSError("EIO (a test fault)")
                with open(self.paths[f], "rb") as fh:
                    fh.seek(s)
                    blob = fh.read(e - s)
            except OSError as err:
                failure = (int(a), f"{self.paths[f]}: cannot read: {err}", self.paths[f], int(s))
                break
            at = 0
            for pos in range(a, b):
                positions.append(pos)
                payloads.append(blob[at:at + int(self.size[pos])])
                at += int(self.size[pos])
        self.pending[chunk] = (positions, payloads, failure)
        self.in_flight_max = max(self.in_flight_max, len(self.pending))

    def arrive(self, chunk):
        positions, frames, failure = self.pending.pop(chunk)
        bad, bad_at, what = [], [], []
        for pos, frame in zip(positions, frames):
            problem = _C.frame_problem(frame, "tfrecord", True)
            if problem is not None:
                bad.append(pos)
                bad_at.append(int(self.offset[pos]) + problem[1])
                what.append(problem[0])
            else:
                self.data[pos] = frame[12:-4]
        self.held[chunk] = positions
        extra = dict(failed_from=failure[0], failure=failure[1], failure_path=failure[2],
                     failure_offset=failure[3]) if failure else {}
        self.sched.arrived(chunk, sum(map(len, frames)), sum(map(len, frames)), np.array(bad, dtype=np.int64),
                           np.array(bad_at, dtype=np.uint64), what, **extra)

    def next_batch(self):
        while True:
            step = self.sched.next()
            self.steps.append(None if step is None else step[0])
            if step is None:
                return None
            if step[0] == "read":
                self.read(step[1], *(a.tolist() for a in step[2:]))
            elif step[0] == "wait":
                self.arrive(step[1])
            elif step[0] == "spill":
                assert set(step[2].tolist()) <= set(self.held[step[1]])
            elif step[0] == "release":
                self.held.pop(step[1])
            else:
                return [self.data[p] for p in step[1].tolist()]


def plan_of(tmp_path, counts=(40, 0, 25, 31), seed=2):
    rng = np.random.default_rng(seed)
    paths, file, offset, size, records = [], [], [], [], []
    for s, n in enumerate(counts):
        recs = [b"%d.%d|" % (s, i) + rng.bytes(int(rng.integers(0, 9000))) for i in range(n)]
        paths.append(write_tfrecord(tmp_path / f"p{s}.tfrecord", recs))
        o, z = frames_of(recs)
        file.append(np.full(n, s, dtype=np.int64))
        offset.append(o)
        size.append(z)
        records += recs
    return paths, np.concatenate(file), np.concatenate(offset), np.concatenate(size), records


def host_batches(paths, file, offset, size, emit, batch, **kw):
    options = ReadOptions(chunk_size=kw.get("chunk_size", 64 << 10), depth=kw.get("depth", 2),
                          on_error=kw.get("on_error", "raise")).core("buffered", in_order=False)
    reader = _C.PlanReader(paths, file, offset, size, emit, "tfrecord", batch, options,
                           hold_bytes=kw.get("hold_bytes", 0), first_batch=kw.get("first_batch", 0))
    out = []
    while (b := reader.next_batch()) is not None:
        view = memoryview(b)
        out.append([bytes(view[o:o + n]) for o, n in zip(b.offsets.tolist(), b.lengths.tolist())])
    return out, reader


@pytest.mark.parametrize("hold", [0, 30_000])
@pytest.mark.parametrize("shuffled", [False, True])
def test_a_python_executor_hands_out_what_the_host_reader_does(tmp_path, shuffled, hold):
    paths, file, offset, size, records = plan_of(tmp_path)
    emit = np.random.default_rng(5).permutation(len(file)).astype(np.int64) if shuffled else None
    want, host = host_batches(paths, file, offset, size, emit, 7, hold_bytes=hold, first_batch=3)
    ex = PythonExecutor(paths, file, offset, size, emit, chunk_size=64 << 10, depth=2, batch_size=7, first_batch=3,
                        hold_bytes=hold)
    got = []
    while (b := ex.next_batch()) is not None:
        got.append(b)
    assert got == want
    assert [len(b) for b in got[:2]] == [3, 7]
    order = [records[i] for i in (emit if shuffled else range(len(file)))]
    assert [r for b in got for r in b] == order
    assert ex.in_flight_max <= 2 and not ex.pending
    stats = ex.sched.stats()
    assert stats["records"] == len(file) and stats["chunks"] == host.stats()["chunks"]
    assert stats["spilled_records"] == host.stats()["spilled_records"]
    if shuffled and hold:
        # the same chunks held at the peak (the host reader pads each piece to 8 bytes in its buffer)
        assert stats["spilled_records"] > 0 and abs(stats["peak_held_bytes"] - host.stats()["peak_held_bytes"]) < 1024
        assert "spill" in ex.steps
    assert "release" in ex.steps and not ex.held  # every chunk let go by the end


def test_a_failed_read_goes_out_after_the_records_before_it(tmp_path):
    paths, file, offset, size, records = plan_of(tmp_path, counts=(30, 30))
    ex = PythonExecutor(paths, file, offset, size, None, fail_file=1, chunk_size=16 << 10, depth=3, batch_size=4)
    got = []
    with pytest.raises(DlstoreIOError) as caught:
        while (b := ex.next_batch()) is not None:
            got += b
    assert got == records[:30] and caught.value.path == paths[1] and ex.sched.position == 30


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_corrupt_records_raise_after_the_good_ones_or_are_skipped(tmp_path, policy):
    paths, file, offset, size, records = plan_of(tmp_path, counts=(20,))
    at = flip_data_byte(paths[0], 6, offset)
    ex = PythonExecutor(paths, file, offset, size, None, chunk_size=64 << 10, depth=1, batch_size=4,
                        on_error=policy)
    got = []
    if policy == "raise":
        with pytest.raises(CorruptRecordError, match="bad data CRC") as caught:
            while (b := ex.next_batch()) is not None:
                got += b
        assert got == records[:6] and caught.value.offset == at
    else:
        while (b := ex.next_batch()) is not None:
            got += b
        assert got == records[:6] + records[7:]
        assert ex.sched.stats()["skipped"] == 1 and ex.sched.corruptions()[0][:2] == (paths[0], at)


def test_a_corrupt_record_read_at_several_positions_is_skipped_and_reported_once(tmp_path):
    # remainder="pad" reads a record again at another position of the plan: one record, one skip.
    paths, file, offset, size, records = plan_of(tmp_path, counts=(10,))
    at = flip_data_byte(paths[0], 2, offset)
    again = np.r_[np.arange(10), [0, 1, 2, 3]]  # the first four records padded in again
    ex = PythonExecutor(paths, file[again], offset[again], size[again], None, chunk_size=64 << 10, depth=1,
                        batch_size=4, on_error="skip")
    got = []
    while (b := ex.next_batch()) is not None:
        got += b
    assert len(got) == 12 and ex.sched.position == 14
    assert ex.sched.stats()["skipped"] == 1 and [c[:2] for c in ex.sched.corruptions()] == [(paths[0], at)]


def test_arrivals_out_of_turn_are_refused(tmp_path):
    paths, file, offset, size, _ = plan_of(tmp_path, counts=(10,))
    sched = _C.ReadSchedule(paths, file, offset, size, None, chunk_size=64 << 10, depth=1, batch_size=4)
    assert sched.next()[0] == "read"
    with pytest.raises(Exception, match="internal"):
        sched.arrived(0, 0, 0, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64), [])


@pytest.mark.parametrize("reorders", [False, True])
def test_a_chunk_reads_at_most_max_chunk_files_files(tmp_path, reorders):
    # A global shuffle of small records lists them in emission order, each from another file: an 8 MiB chunk
    # would hold thousands of files open at once. max_chunk_files cuts a chunk before one file too many (a
    # chunk that must hold whole batches still takes one batch), and the batches stay the same.
    paths, file, offset, size, records = plan_of(tmp_path, counts=(5,) * 24)
    order = np.random.default_rng(9).permutation(len(file))
    file, offset, size = file[order], offset[order], size[order]
    emit = np.random.default_rng(4).permutation(len(file)).astype(np.int64) if reorders else None

    def run(cap):
        ex = PythonExecutor(paths, file, offset, size, emit, chunk_size=8 << 20, depth=2, batch_size=4,
                            max_chunk_files=cap)
        files_per_chunk = []
        read = ex.read

        def counting(chunk, f, *rest):
            files_per_chunk.append(len(set(f)))
            read(chunk, f, *rest)
        ex.read = counting
        got = []
        while (b := ex.next_batch()) is not None:
            got.append(b)
        return got, files_per_chunk

    whole, one = run(0)
    capped, many = run(6)
    assert capped == whole and one == [24]  # uncapped: one chunk reads every file
    assert max(many) <= 6 and len(many) > 4
