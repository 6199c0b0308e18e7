"""``interleave``: a sequence that reads shards several at a time, one record from each in turn, as
``tf.data.TFRecordDataset(num_parallel_reads=N)`` does: against a visit-by-visit model of tf.data's
interleave, against TensorFlow itself, and through a Dataset."""
import os

import pytest

import dlstore
from dlstore.errors import PlacementError
from dlstore.placement.sharding import EpochPlan, interleave_order
from dlstore.placement.world import World
from dlstore.sources.dataset import Dataset


def visit_by_visit(counts, cycle):
    """tf.data's interleave (block length 1), one cycle visit at a time: a slot with a file hands out its
    next record; a slot whose file ended is emptied (nothing that visit); an empty slot takes the next file
    and hands out its first record in the same visit."""
    slots = [None] * cycle  # (file, next record)
    files, out, visit = iter(range(len(counts))), [], 0
    left = True
    while left or any(s is not None for s in slots):
        i = visit % cycle
        if slots[i] is None and left:
            f = next(files, None)
            if f is None:
                left = False
            else:
                slots[i] = (f, 0)
        if slots[i] is not None:
            f, k = slots[i]
            if k < counts[f]:
                out.append((f, k))
                slots[i] = (f, k + 1)
            else:
                slots[i] = None
        visit += 1
    return out


@pytest.mark.parametrize("counts", [[3] * 5, [12] * 8, [2, 0, 3, 1], [5, 1, 1, 7, 0, 2, 9], [4], []])
@pytest.mark.parametrize("cycle", [1, 2, 3, 8])
def test_the_order_is_tf_datas_interleave(counts, cycle):
    file, record = interleave_order(counts, cycle)
    assert list(zip(file.tolist(), record.tolist())) == visit_by_visit(counts, cycle)


def test_files_of_one_length_are_read_in_groups_record_by_record():
    file, record = interleave_order([3] * 5, 2)
    assert list(zip(file.tolist(), record.tolist()))[:8] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2),
                                                             (2, 0), (3, 0)]


def test_only_the_shuffles_that_read_in_sequence_interleave():
    assert EpochPlan([4] * 3, 1, shuffle="buffer", interleave=2).interleave == 2
    for shuffle in ("block", "global"):
        with pytest.raises(PlacementError, match="interleave=2"):
            EpochPlan([4] * 3, 1, shuffle=shuffle, interleave=2)


def _write(root, counts):
    paths = []
    for s, n in enumerate(counts):
        path = os.path.join(root, f"part-{s:02d}")
        with dlstore.TFRecordWriter(path) as w:
            for k in range(n):
                w.write(f"{s}:{k}".encode())
        paths.append(path)
    return paths


def test_a_dataset_reads_in_the_interleaved_order_across_ranks(tmp_path):
    counts = [5, 3, 0, 6, 4]
    _write(tmp_path, counts)
    expected = [f"{f}:{k}".encode() for f, k in visit_by_visit(counts, 3)]
    got = []
    for rank in range(2):
        ds = Dataset(os.fspath(tmp_path / "part-*"), shuffle="none", shuffle_shards=False, interleave=3,
                     world=World(rank=rank, size=2), remainder="uneven", batch_size=4)
        got += [bytes(r) for b in ds.batches() for r in _records(b)]
    assert got == expected
    assert "3 at a time, one record from each in turn" in ds.describe_shuffle()


def _records(batch):
    mv = memoryview(batch).cast("B")
    return [mv[o:o + n] for o, n in zip(batch.offsets.tolist(), batch.lengths.tolist())]


@pytest.mark.slow  # importing TensorFlow takes seconds
def test_tensorflow_reads_the_same_order(tmp_path):
    tf = pytest.importorskip("tensorflow")
    counts = [5, 1, 0, 7, 2, 9]
    paths = _write(tmp_path, counts)
    for cycle in (2, 3, 4):
        seen = [bytes(r.numpy()) for r in tf.data.TFRecordDataset(paths, num_parallel_reads=cycle)]
        assert seen == [f"{f}:{k}".encode() for f, k in visit_by_visit(counts, cycle)], cycle
