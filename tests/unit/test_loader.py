"""The loader: exact batches across chunk boundaries, last-batch policies, buffer reuse, errors from the
background thread, stopping, resumption; the parser's out=/row= path; per-sample seeds.

Records are BERT-like Examples with known values (row ``i`` of each feature is a function of
``i``), so every output row says which record it came from.
"""
import gc
import os
import threading
import time

import numpy as np
import pytest

import dlstore
from dlstore import _C
from dlstore.errors import CorruptRecordError, DlstoreError
from dlstore.formats.example import encode_example
from dlstore.pipeline.bert import Bert
from dlstore.pipeline.loader import Loader
from dlstore.pipeline.stages import sample_seeds
from tests.resume import assert_resumes_exactly, loader_rows

SEQ, PRED = 16, 4  # small shapes keep the records short; Bert accepts any length with max_predictions


def features(i: int) -> dict:
    """Record ``i``: every value derived from ``i``, so a row tells which record filled it."""
    ids = np.arange(SEQ, dtype=np.int64) + 1000 * i
    return {
        "input_ids": ids,
        "input_mask": (np.arange(SEQ) < (i % SEQ) + 1).astype(np.int64),
        "segment_ids": (np.arange(SEQ) >= SEQ // 2).astype(np.int64),
        "masked_lm_positions": np.arange(PRED, dtype=np.int64) + i,
        "masked_lm_ids": np.full(PRED, i, dtype=np.int64),
        "masked_lm_weights": np.full(PRED, 0.5 + i, dtype=np.float32),
        "next_sentence_labels": np.array([i % 2], dtype=np.int64),
    }


def record(i: int) -> bytes:
    return encode_example(features(i))


def expected_rows(indices) -> dict:
    rows = [features(i) for i in indices]
    return {name: np.stack([r[name] for r in rows]) for name in rows[0]}


class Chunk:
    """A RecordBatch stand-in: records laid end to end in ``buffer``, with a gap before each."""

    path_name = "/data/shard-0"

    def __init__(self, payloads, file_index=0, first_offset=0):
        gap = 3  # records do not start at 0 or follow each other directly, as in a TFRecord chunk
        blob, offsets, lengths, file_offsets = bytearray(), [], [], []
        for p in payloads:
            blob += b"\xee" * gap
            offsets.append(len(blob))
            file_offsets.append(first_offset + len(blob) - gap)
            blob += p
            lengths.append(len(p))
        self.buffer = bytes(blob)
        self.offsets = np.array(offsets, dtype=np.uint64)
        self.lengths = np.array(lengths, dtype=np.uint64)
        self.file_offsets = np.array(file_offsets, dtype=np.uint64)
        self.file_index = file_index
        self.num_records = len(payloads)
        self.nbytes = int(self.lengths.sum())

    def path(self, i):
        return self.path_name


class ListSource:
    """A Source of records ``0..n-1`` cut into chunks of the given sizes (cycled), resumable at any
    record; records the epochs it is set to and its generators closing."""

    format = "tfrecord"
    engine, engine_reason, num_batches = "memory", "records made in the test", None

    def __init__(self, n, chunk_sizes=(5,), payload=record, fail_after=None):
        self.n, self.chunk_sizes, self.payload, self.fail_after = n, chunk_sizes, payload, fail_after
        self.opened = self.closed = 0
        self.epochs_set = []
        self.epoch = self.sample_in_epoch = 0

    def set_epoch(self, epoch):
        self.epochs_set.append(epoch)
        self.epoch, self.sample_in_epoch = epoch, 0

    def use_batch_size(self, batch_size):
        pass

    def state_dict(self):
        return {"epoch": self.epoch, "sample_in_epoch": self.sample_in_epoch}

    def load_state_dict(self, state):
        self.epoch, self.sample_in_epoch = state["epoch"], state["sample_in_epoch"]

    def stats(self):
        return {}

    def batches(self):
        self.opened += 1
        try:
            i, k = self.sample_in_epoch, 0
            while i < self.n:
                size = self.chunk_sizes[k % len(self.chunk_sizes)]
                k += 1
                ids = range(i, min(i + size, self.n))
                if self.fail_after is not None and i >= self.fail_after:
                    raise DlstoreError("the source failed", "/data/shard-0", 1234)
                chunk = Chunk([self.payload(j) for j in ids], first_offset=100 * i)
                i += len(ids)
                self.sample_in_epoch = i
                yield chunk
            self.epoch, self.sample_in_epoch = self.epoch + 1, 0
        finally:
            self.closed += 1


class SizedSource(ListSource):
    """A ListSource that says its length, as a Dataset does (its consumer's share)."""

    def __len__(self):
        return self.n


def collect(loader, copy=True):
    return [{k: v.copy() for k, v in b.items()} if copy else b for b in loader]


def concat(batches):
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def assert_rows(batch, indices):
    want = expected_rows(indices)
    for name, values in want.items():
        np.testing.assert_array_equal(batch[name], values, err_msg=name)


# ---- the parser's out= / row= extension ----------------------------------------------------------


def spec():
    return [(name, np.dtype(dtype).name, int(np.prod(shape)), None)
            for name, (shape, dtype) in Bert(SEQ, PRED).fields().items()]


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_parse_into_rows_at_an_offset(threads):
    chunk = Chunk([record(i) for i in range(100)])
    out = {name: np.full((140, length), -7, dtype=dtype) for name, dtype, length, _ in spec()}
    out["next_sentence_labels"] = np.full(140, -7, dtype=np.int64)  # (rows,) is accepted for length 1
    assert _C.parse_example_batch(chunk.buffer, chunk.offsets[10:90], chunk.lengths[10:90], spec(), out, 30,
                                  threads) is None
    want = expected_rows(range(10, 90))
    for name, a in out.items():
        np.testing.assert_array_equal(a[30:110].reshape(want[name].shape), want[name], err_msg=name)
        assert (a[:30] == -7).all() and (a[110:] == -7).all(), f"{name}: rows outside the range were written"


@pytest.mark.parametrize("threads", [1, 3])
def test_parallel_parse_reports_the_lowest_bad_record(threads):
    payloads = [record(i) for i in range(96)]
    payloads[70] = payloads[70][:-5]  # truncated: framing error
    payloads[40] = encode_example({**features(40), "input_ids": np.arange(SEQ + 1)})  # wrong count
    chunk = Chunk(payloads)
    with pytest.raises(DlstoreError, match=r"^record 40: feature 'input_ids': has 17 values, expected 16"):
        _C.parse_example_batch(chunk.buffer, chunk.offsets, chunk.lengths, spec(), None, 0, threads)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_parallel_parse_works_in_a_forked_child():
    """The parse pool's threads do not survive fork (a DataLoader worker): the child must make its own."""
    chunk = Chunk([record(i) for i in range(200)])
    want = _C.parse_example_batch(chunk.buffer, chunk.offsets, chunk.lengths, spec(), None, 0, 4)  # pool made
    pid = os.fork()
    if pid == 0:  # the child: exit status says whether the parse matched
        ok = False
        try:
            got = _C.parse_example_batch(chunk.buffer, chunk.offsets, chunk.lengths, spec(), None, 0, 4)
            ok = all(np.array_equal(got[k], want[k]) for k in want)
        finally:
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the parse hung in a forked child")


def test_parse_into_checks_the_arrays():
    chunk = Chunk([record(i) for i in range(4)])
    good = {name: np.zeros((4, length), dtype=dtype) for name, dtype, length, _ in spec()}
    cases = [
        (dict(good, input_ids=np.zeros((4, SEQ), np.int32)), TypeError, "dtype int32, expected int64"),
        (dict(good, input_ids=np.zeros((4, SEQ + 1), np.int64)), ValueError, "rows hold 17 values, expected 16"),
        (dict(good, input_ids=np.zeros((SEQ, 4), np.int64).T), ValueError, "C-contiguous"),
        (dict(good, input_ids=np.zeros((3, SEQ), np.int64)), ValueError, "has 3 rows; rows 0..4 do not fit"),
        ({k: v for k, v in good.items() if k != "segment_ids"}, KeyError, "segment_ids"),
    ]
    readonly = np.zeros((4, SEQ), np.int64)
    readonly.flags.writeable = False
    cases.append((dict(good, input_ids=readonly), ValueError, "writable"))
    for out, exc, text in cases:
        with pytest.raises(exc, match=text):
            _C.parse_example_batch(chunk.buffer, chunk.offsets, chunk.lengths, spec(), out, 0, 1)
    with pytest.raises(ValueError, match="do not fit"):
        _C.parse_example_batch(chunk.buffer, chunk.offsets, chunk.lengths, spec(), good, 1, 1)
    with pytest.raises(ValueError, match="without `out` it must be 0"):
        _C.parse_example_batch(chunk.buffer, chunk.offsets, chunk.lengths, spec(), None, 2, 1)


# ---- batches -------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_sizes", [(1,), (7,), (64,), (3, 50, 1, 13), (1000,)])
@pytest.mark.parametrize("batch_size", [1, 8, 13])
def test_exact_batches_across_chunk_boundaries(chunk_sizes, batch_size):
    n = 101
    loader = Loader(ListSource(n, chunk_sizes), Bert(SEQ, PRED), batch_size, last_batch="PARTIAL")
    batches = collect(loader)
    sizes = [len(b["input_ids"]) for b in batches]
    assert sizes == [batch_size] * (n // batch_size) + ([n % batch_size] if n % batch_size else [])
    assert_rows(concat(batches), range(n))
    stats = loader.stats()
    assert stats["samples"] == n and stats["records"] == n and stats["padding"] == 0


def test_last_batch_policies():
    n, b = 23, 10
    drop = collect(Loader(ListSource(n, (4,)), Bert(SEQ, PRED), b, last_batch="DROP"))
    assert [len(x["input_ids"]) for x in drop] == [10, 10]
    assert_rows(concat(drop), range(20))

    partial = collect(Loader(ListSource(n, (4,)), Bert(SEQ, PRED), b, last_batch="partial"))
    assert [len(x["input_ids"]) for x in partial] == [10, 10, 3]

    loader = Loader(ListSource(n, (4,)), Bert(SEQ, PRED), b, last_batch="FILL")
    paddings = []
    batches = []
    for batch in loader:
        batches.append({k: v.copy() for k, v in batch.items()})
        paddings.append(loader.padding)
    assert [len(x["input_ids"]) for x in batches] == [10, 10, 10] and paddings == [0, 0, 7]
    assert_rows(concat(batches), list(range(23)) + [22] * 7)
    assert loader.stats()["padding"] == 7 and loader.stats()["samples"] == 23
    assert loader.element_spec["input_ids"] == ((10, SEQ), np.dtype(np.int64))
    assert Loader(ListSource(1), Bert(SEQ, PRED), 4, last_batch="PARTIAL").element_spec["masked_lm_weights"] == (
        (None, PRED), np.dtype(np.float32))


def test_epochs_do_not_mix_and_set_epoch_is_called():
    source = ListSource(10, (3,))
    loader = Loader(source, Bert(SEQ, PRED), 4, last_batch="PARTIAL", epochs=2)
    batches = collect(loader)
    assert [len(x["input_ids"]) for x in batches] == [4, 4, 2, 4, 4, 2]
    assert source.epochs_set == [0, 1] and source.opened == source.closed == 2
    assert loader.epoch == 2 and loader.state_dict()["sample_in_epoch"] == 0
    collect(loader)  # the next iteration carries on with epochs 2 and 3
    assert source.epochs_set == [0, 1, 2, 3]


def test_buffers_are_reused_and_stay_valid_until_the_next_draw():
    loader = Loader(ListSource(400, (7,)), Bert(SEQ, PRED), 8, prefetch=2)
    seen = set()
    it = iter(loader)
    for i in range(30):
        batch = next(it)
        kept = batch["input_ids"].copy()
        time.sleep(0.002)  # let the producer run ahead as far as the ring allows
        np.testing.assert_array_equal(batch["input_ids"], kept)  # not overwritten while held
        assert_rows(batch, range(8 * i, 8 * i + 8))
        seen.add(batch["input_ids"].__array_interface__["data"][0])
    it.close()
    assert len(seen) == 4  # prefetch + 2 slots, round and round
    assert loader.stats()["buffers_allocated"] == 4 * 7


def test_copy_gives_owned_arrays():
    loader = Loader(ListSource(40, (7,)), Bert(SEQ, PRED), 8, copy=True)
    batches = list(loader)
    assert_rows(concat(batches), range(40))
    assert len({b["input_ids"].__array_interface__["data"][0] for b in batches}) == 5


# ---- stopping and errors -------------------------------------------------------------------------


def loader_threads():
    return [t for t in threading.enumerate() if t.name == "dlstore-loader"]


def test_break_stops_the_thread_and_closes_the_source():
    source = ListSource(100_000, (50,))
    loader = Loader(source, Bert(SEQ, PRED), 16, epochs=None)
    for i, _ in enumerate(loader):
        if i == 5:
            break
    gc.collect()
    assert not loader_threads() and source.closed == source.opened == 1
    # A context manager or close() does the same for an iterator kept aside.
    with Loader(source, Bert(SEQ, PRED), 16) as loader2:
        it = iter(loader2)
        next(it)
    assert not loader_threads() and source.closed == source.opened == 2
    it = iter(loader2)  # and the loader can be iterated again
    assert_rows(next(it), range(16, 32))
    it.close()
    assert not loader_threads()


def test_close_from_another_thread_ends_the_loop():
    class Slow(ListSource):
        def batches(self):
            for chunk in super().batches():
                time.sleep(0.01)
                yield chunk

    source = Slow(100_000, (4,))
    loader = Loader(source, Bert(SEQ, PRED), 8, epochs=None)
    timer = threading.Timer(0.3, loader.close)
    timer.start()
    t0 = time.monotonic()
    n = sum(1 for _ in loader)
    assert 0 < n and time.monotonic() - t0 < 5
    timer.join()
    assert not loader_threads() and source.closed == source.opened == 1


def test_iterating_twice_at_once_is_refused():
    loader = Loader(ListSource(100), Bert(SEQ, PRED), 4)
    it = iter(loader)
    next(it)
    with pytest.raises(RuntimeError, match="already being iterated"):
        iter(loader)
    it.close()


def test_a_source_error_reaches_the_consumer_after_the_good_batches():
    loader = Loader(ListSource(100, (10,), fail_after=30), Bert(SEQ, PRED), 10)
    got = []
    with pytest.raises(DlstoreError, match="the source failed") as info:
        for batch in loader:
            got.append(batch["input_ids"][:, 0].copy())
    assert len(got) == 3 and info.value.path == "/data/shard-0" and info.value.offset == 1234
    assert not loader_threads()


def bad_payload(bad):
    def payload(i):
        if i in bad:
            return encode_example({**features(i), "masked_lm_ids": np.arange(PRED + 2)})
        return record(i)
    return payload


def test_a_bad_record_is_named_by_file_offset_and_position():
    loader = Loader(ListSource(50, (10,), payload=bad_payload({27})), Bert(SEQ, PRED), 4)
    with pytest.raises(DlstoreError) as info:
        collect(loader)
    e = info.value
    # Record 27 lies in the chunk starting at record 20 (file offset 2000), after 7 records and gaps.
    chunk = Chunk([bad_payload({27})(j) for j in range(20, 30)], first_offset=2000)
    assert e.path == "/data/shard-0" and e.offset == int(chunk.file_offsets[7])
    assert str(e).startswith(f"/data/shard-0: record at byte {e.offset} (sample 27 of epoch 0), bert pipeline: "
                             "feature 'masked_lm_ids': has 6 values, expected 4")


def test_a_corrupt_record_keeps_its_class():
    loader = Loader(ListSource(20, (10,), payload=lambda i: record(i)[:-3] if i == 5 else record(i)),
                    Bert(SEQ, PRED), 4)
    with pytest.raises(CorruptRecordError, match=r"record at byte \d+ \(sample 5 of epoch 0\)"):
        collect(loader)


@pytest.mark.parametrize("policy", ["skip", "warn"])
def test_bad_records_can_be_skipped(policy):
    bad = {3, 4, 17, 39}
    loader = Loader(ListSource(40, (6,), payload=bad_payload(bad)), Bert(SEQ, PRED), 8, on_error=policy,
                    last_batch="PARTIAL")
    if policy == "warn":
        with pytest.warns(RuntimeWarning) as caught:
            batches = collect(loader)
        assert [str(w.message).split("(sample ")[1].split(")")[0] for w in caught] == [
            f"{i} of epoch 0" for i in sorted(bad)]
        assert all(str(w.message).endswith("has 6 values, expected 4 (skipped)") for w in caught)
    else:
        batches = collect(loader)
    good = [i for i in range(40) if i not in bad]
    assert [len(b["input_ids"]) for b in batches] == [8, 8, 8, 8, 4]
    assert_rows(concat(batches), good)
    assert loader.stats()["skipped"] == 4


def test_no_batch_under_drop_counts_the_records_the_pipeline_left_out():
    """10 records, one the pipeline cannot process and skips, batch 10, DROP: the message said "it has 10
    samples, fewer than batch_size 10 ... use a batch_size of at most 10", the size that failed."""
    loader = Loader(ListSource(10, (10,), payload=bad_payload({3})), Bert(SEQ, PRED), 10, on_error="skip",
                    last_batch="DROP")
    with pytest.raises(DlstoreError, match=r"1 of which the pipeline could not process .* so 9, fewer than "
                                           r"batch_size 10.* a batch_size of at most 9,"):
        collect(loader)


def test_a_bug_in_the_pipeline_reaches_the_consumer_with_where():
    class Broken(Bert):
        def bind(self, **kw):
            def run(*args):
                raise ZeroDivisionError("boom")
            return run

    loader = Loader(ListSource(20, (10,)), Broken(SEQ, PRED), 4)
    with pytest.raises(ZeroDivisionError, match="boom") as info:
        collect(loader)
    notes = " ".join(getattr(info.value, "__notes__", [])) or str(info.value)
    assert "loader thread" in notes and "records 0..3 of epoch 0" in notes and "/data/shard-0 at byte" in notes


def test_arguments_are_checked():
    source = ListSource(4)
    with pytest.raises(ValueError, match="last_batch"):
        Loader(source, Bert(SEQ, PRED), 4, last_batch="KEEP")
    with pytest.raises(ValueError, match="batch_size"):
        Loader(source, Bert(SEQ, PRED), 0)
    with pytest.raises(ValueError, match="prefetch"):
        Loader(source, Bert(SEQ, PRED), 4, prefetch=0)
    with pytest.raises(TypeError, match="Source"):
        Loader([1, 2], Bert(SEQ, PRED), 4)
    source.format = "recordio"
    with pytest.raises(ValueError, match="the bert pipeline reads tfrecord records, not recordio"):
        Loader(source, Bert(SEQ, PRED), 4)
    with pytest.raises(ValueError, match="no max_predictions preset for seq_len 100"):
        Bert(100)
    assert (Bert(128).max_predictions, Bert(384).max_predictions) == (20, 60)


# ---- resumption ----------------------------------------------------------------------------------


def test_resume_mid_epoch_over_two_epochs(tmp_path):
    path = tmp_path / "part-0"
    with dlstore.TFRecordWriter(str(path)) as w:
        for i in range(1000):  # ~150 KB: three 64 KiB chunks
            w.write(record(i))

    def make():
        reader = dlstore.open_records(str(path), chunk_size=1 << 16)
        return Loader(reader, Bert(SEQ, PRED), 64, last_batch="FILL")

    # 16 batches an epoch (the last one padded): stops before, at and after the epoch's end.
    assert_resumes_exactly(make, stops=[1, 7, 15, 16, 17, 25], run=iter, values=loader_rows)


def test_the_source_state_travels_with_the_loaders():
    class Tagged(ListSource):
        def state_dict(self):
            return dict(super().state_dict(), shuffle_seed=5)

    source = Tagged(20, (3,))
    loader = Loader(source, Bert(SEQ, PRED), 4)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    it.close()
    # The source had read ahead; the state says where the consumer is.
    assert state == {"epoch": 0, "sample_in_epoch": 8, "delivered": 8, "seed": 0,
                     "source": {"epoch": 0, "sample_in_epoch": 8, "shuffle_seed": 5}}
    resumed = Loader(Tagged(20, (3,)), Bert(SEQ, PRED), 4)
    resumed.load_state_dict(state)
    assert resumed.source.sample_in_epoch == 8
    assert_rows(concat(collect(resumed)), range(8, 20))
    with pytest.raises(ValueError, match="seed 0; this loader has seed 3"):
        Loader(Tagged(20), Bert(SEQ, PRED), 4, seed=3).load_state_dict(state)


@pytest.mark.parametrize("last_batch,n,sized", [
    ("PARTIAL", 10, False),  # the short batch is the last
    ("FILL", 10, False),
    ("PARTIAL", 8, True),  # a full batch that reaches the source's length
    ("FILL", 8, True),
    ("DROP", 8, True),
    ("DROP", 10, True),  # fewer records left than a batch: dropped
])
def test_the_state_after_an_epochs_last_batch_is_the_next_epochs_start(last_batch, n, sized):
    """A checkpoint taken in the loop after the epoch's last batch named that epoch and its last sample, which a
    world of another size refuses as mid-epoch, until the consumer asked for the next batch: it is the next
    epoch's start as soon as that batch is handed out, as a Dataset's state is."""
    source = SizedSource(n, (3,)) if sized else ListSource(n, (3,))
    loader = Loader(source, Bert(SEQ, PRED), 4, last_batch=last_batch, epochs=2)
    states = [(loader.state_dict(), loader.epoch) for _ in loader]
    boundary = {"epoch": 1, "sample_in_epoch": 0, "delivered": 0, "seed": 0,
                "source": {"epoch": 1, "sample_in_epoch": 0}}
    per_epoch = len(states) // 2
    assert per_epoch == (2 if last_batch == "DROP" else -(-n // 4))
    # After the others, the epoch and the samples yielded in it, as before.
    assert states[:per_epoch - 1] == [(dict(boundary, epoch=0, sample_in_epoch=k, delivered=k,
                                            source={"epoch": 0, "sample_in_epoch": k}), 0)
                                      for k in range(4, 4 * per_epoch, 4)]
    assert states[per_epoch - 1] == (boundary, 1)
    assert states[-1] == (dict(boundary, epoch=2, source={"epoch": 2, "sample_in_epoch": 0}), 2)
    assert [loader.state_after(k) for k in (per_epoch, 2 * per_epoch)] == [states[per_epoch - 1][0], states[-1][0]]
    # A loop broken off right after the epoch's last batch goes on with the next epoch.
    again = Loader(SizedSource(n, (3,)) if sized else ListSource(n, (3,)), Bert(SEQ, PRED), 4, last_batch=last_batch)
    it = iter(again)
    for _ in range(per_epoch):
        next(it)
    it.close()
    assert again.state_dict() == boundary
    assert len(collect(again)) == per_epoch and again.state_dict()["epoch"] == 2


@pytest.mark.parametrize("last_batch", ["PARTIAL", "DROP"])
def test_a_source_without_a_length_ends_its_epoch_when_the_consumer_asks_past_it(last_batch):
    """A source that does not say its length may have more records after a full batch: the loader cannot tell
    which batch is the last, and its state says the epoch's end until the consumer asks for the next one."""
    loader = Loader(ListSource(8, (3,)), Bert(SEQ, PRED), 4, last_batch=last_batch)
    it = iter(loader)
    next(it), next(it)
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["sample_in_epoch"] == 8
    assert next(it, None) is None
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["sample_in_epoch"] == 0


# ---- seeds ---------------------------------------------------------------------------------------


def test_sample_seeds_are_a_pure_function_of_seed_epoch_position():
    a = sample_seeds(7, 2, 100, 50)
    assert a.dtype == np.uint64 and len(a) == 50
    np.testing.assert_array_equal(a[10:20], sample_seeds(7, 2, 110, 10))
    assert len(set(a.tolist())) == 50
    for other in (sample_seeds(8, 2, 100, 50), sample_seeds(7, 3, 100, 50)):
        assert not np.intersect1d(a, other).size
    # Bits look uniform: each of the 64 bits set about half the time over many seeds.
    bits = np.unpackbits(sample_seeds(0, 0, 0, 4096).view(np.uint8)).reshape(4096, 64).mean(axis=0)
    assert (abs(bits - 0.5) < 0.05).all()


# ---- pipelines' small pieces ---------------------------------------------------------------------


def test_bert_int32_outputs():
    batches = collect(Loader(ListSource(20, (6,)), Bert(SEQ, PRED, dtype="int32"), 10))
    assert batches[0]["input_ids"].dtype == np.int32 and batches[0]["masked_lm_weights"].dtype == np.float32
    assert_rows(concat(batches), range(20))


def test_recordio_labels_and_image_spans():
    from dlstore.formats import recordio
    from dlstore.pipeline.resnet50 import recordio_labels

    payloads = [recordio.pack(0, 7.0, 1, 0, b"JPEG-a"), recordio.pack(0, [3.0, 9.0], 2, 0, b"JPEG-bb"),
                recordio.pack(0, 999.0, 3, 0, b"")]
    chunk = Chunk(payloads)
    labels, offsets, lengths = recordio_labels(chunk.buffer, chunk.offsets, chunk.lengths)
    assert labels.tolist() == [7, 3, 999] and labels.dtype == np.int64
    assert [chunk.buffer[o:o + n] for o, n in zip(offsets.tolist(), lengths.tolist())] == [b"JPEG-a", b"JPEG-bb", b""]
    short = Chunk([payloads[0], payloads[1][:30]])  # says 2 extra labels, holds 1.5
    with pytest.raises(CorruptRecordError, match="record 1: IRHeader says 2 extra labels"):
        recordio_labels(short.buffer, short.offsets, short.lengths)
    tiny = Chunk([payloads[0], b"x" * 10])
    with pytest.raises(CorruptRecordError, match="record 1: RecordIO image record of 10 bytes is shorter"):
        recordio_labels(tiny.buffer, tiny.offsets, tiny.lengths)
    # A label that is no class number (NaN became -2**63, silently, with numpy's cast warning).
    for label, extra in ((float("nan"), False), (float("inf"), True), (1e19, False)):
        odd = Chunk([payloads[0], recordio.pack(0, [label, 1.0] if extra else label, 4, 0, b"JPEG")])
        with pytest.raises(CorruptRecordError, match=r"record 1: RecordIO label .* is not a class number"):
            recordio_labels(odd.buffer, odd.offsets, odd.lengths)


def test_output_buffers_larger_than_half_the_memory_are_refused(monkeypatch):
    # batch_size or prefetch a digit too large grew the ring of output buffers (allocated at the first
    # iteration) until the machine ran out of memory (21 GB in a minute for prefetch=10**6).
    from dlstore.pipeline import loader as loader_module

    fields = dict(Bert(SEQ, PRED).fields()).values()
    per_sample = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in fields)
    monkeypatch.setattr(loader_module, "available_page_cache_bytes", lambda: 2 * per_sample * 64 * 4)
    monkeypatch.setattr(loader_module, "cgroup_memory_room", lambda: None)
    Loader(ListSource(1000), Bert(SEQ, PRED), 64, prefetch=2)  # exactly half: taken
    with pytest.raises(DlstoreError, match=r"^Loader: its output buffers, 5 batches \(prefetch 3 \+ 2\) of 64 "
                                           r"samples of .* more than half the .* lower batch_size or prefetch$"):
        Loader(ListSource(1000), Bert(SEQ, PRED), 64, prefetch=3)
    with pytest.raises(DlstoreError, match="lower batch_size or prefetch"):
        Loader(ListSource(1000), Bert(SEQ, PRED), 65, prefetch=2)
    # A ring larger than an epoch's batches + 2 is never needed: a tiny set with a huge prefetch takes that.
    small = Loader(SizedSource(100), Bert(SEQ, PRED), 10, prefetch=10**6)
    sum(1 for _ in small)
    assert small.stats()["buffers_allocated"] == len(dict(Bert(SEQ, PRED).fields())) * (10 + 2)


def test_counts_that_are_not_integers_are_refused_not_truncated():
    # batch_size=2.5 made batches of 2 and True batches of 1; None failed inside int().
    for kwargs, words in (({"batch_size": 2.5}, "batch_size must be an integer, not 2.5"),
                          ({"batch_size": True}, "batch_size must be an integer, not True"),
                          ({"batch_size": None}, "batch_size must be an integer, not None"),
                          ({"batch_size": 4, "prefetch": 1.5}, "prefetch must be an integer, not 1.5"),
                          ({"batch_size": 4, "epochs": 2.0},
                           r"epochs must be an integer \(or None: endless\), not 2.0")):
        with pytest.raises(TypeError, match=f"^{words}$"):
            Loader(ListSource(100), Bert(SEQ, PRED), **kwargs)
    with pytest.raises(ValueError, match="^batch_size must be at least 1, got 0$"):
        Loader(ListSource(100), Bert(SEQ, PRED), 0)
    assert Loader(ListSource(100), Bert(SEQ, PRED), np.int64(4)).batch_size == 4


@pytest.mark.parametrize("version", [1, 2])
def test_a_cgroup_limit_is_the_memory_available(tmp_path, version):
    # In a container MemAvailable is the host's: the cgroup's room (limit less usage) is what is left.
    from dlstore.io.system import cgroup_memory_room

    proc = tmp_path / "cgroup"
    if version == 2:
        proc.write_text("0::/job\n")
        (tmp_path / "fs" / "job").mkdir(parents=True)
        (tmp_path / "fs" / "job" / "memory.max").write_text("1000000\n")
        (tmp_path / "fs" / "job" / "memory.current").write_text("400000\n")
    else:
        proc.write_text("5:devices:/\n4:memory:/job\n0::/\n")
        (tmp_path / "fs" / "memory" / "job").mkdir(parents=True)
        (tmp_path / "fs" / "memory" / "job" / "memory.limit_in_bytes").write_text("1000000\n")
        (tmp_path / "fs" / "memory" / "job" / "memory.usage_in_bytes").write_text("400000\n")
    assert cgroup_memory_room(str(proc), str(tmp_path / "fs")) == 600000
    # The page cache the group's reads filled counts in its usage; the inactive part is reclaimed on demand.
    stat = tmp_path / "fs" / ("job" if version == 2 else "memory/job") / "memory.stat"
    stat.write_text(f"cache 350000\n{'inactive_file' if version == 2 else 'total_inactive_file'} 300000\n")
    assert cgroup_memory_room(str(proc), str(tmp_path / "fs")) == 900000
    unlimited = "max" if version == 2 else str(2**63 - 4096)
    limit_file = "memory.max" if version == 2 else "memory.limit_in_bytes"
    (tmp_path / "fs" / ("job" if version == 2 else "memory/job") / limit_file).write_text(unlimited + "\n")
    assert cgroup_memory_room(str(proc), str(tmp_path / "fs")) is None


def test_state_after_a_count_of_batches_resumes_there(tmp_path):
    """state_after(n) is the state_dict() the loader had once it had handed out n batches: a consumer that
    draws ahead of its step resumes from the batches it really used, also across an epoch's end."""
    path = tmp_path / "part-0"
    with dlstore.TFRecordWriter(str(path)) as w:
        for i in range(200):
            w.write(record(i))

    def make(epochs=2):
        return Loader(dlstore.open_records(str(path), chunk_size=1 << 16), Bert(SEQ, PRED), 48, epochs=epochs,
                      last_batch="PARTIAL", copy=True)

    loader = make()
    states, rows = [loader.state_dict()], []
    for batch in loader:  # 5 batches an epoch, the last one of 8 rows
        states.append(loader.state_dict())
        rows.append(batch["input_ids"][:, 0] // 1000)
    assert loader.batches_handed == len(rows) == 10
    for n in range(len(rows) + 1):
        state = loader.state_after(n)
        assert state == states[n]
        rest = []
        if state["epoch"] < 2:
            again = make(epochs=2 - state["epoch"])  # an iteration's epochs count from the one it starts in
            again.load_state_dict(state)
            rest = [b["input_ids"][:, 0] // 1000 for b in again]
        assert np.concatenate(rows[:n] + rest).tolist() == np.concatenate(rows).tolist()
    with pytest.raises(ValueError, match="keeps the states after 0 to 10 batches"):
        loader.state_after(11)
    loader.load_state_dict(states[7])
    assert loader.state_after(10) == states[7]
    with pytest.raises(ValueError, match="after 10 to 10"):
        loader.state_after(9)  # a state before the one loaded belongs to another run
