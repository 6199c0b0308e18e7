"""The framework adapters: PyTorch (IterableDataset over ranks x workers, TorchLoader), TensorFlow
(tf.data with its element_spec), DALI (external_source fed by dlstore), and their lazy imports.

Data is made here, in tmp dirs: TFRecord files whose records say their own global number, small
synthetic ImageNet and BERT shards. Frameworks that are not installed skip their tests, saying so.
"""
from __future__ import annotations

import io
import json
import os
import warnings

import numpy as np
import pytest

import dlstore
from dlstore.adapters.base import LastBatch, check_last_batch
from dlstore.sources.dataset import dataset_for
from dlstore.formats.example import encode_example
from dlstore.placement.world import World
from dlstore.synthetic import generate_bert, generate_imagenet
from tests.helpers import batch_records, corrupt_unnoticed, run_python
from tests.resume import assert_resumes_exactly, loader_rows

pytestmark = pytest.mark.slow  # imports torch, TensorFlow and DALI

CUDA_REASON = "needs a CUDA GPU (torch.cuda.is_available() is False here)"


def _numbered_files(directory, counts, *, seed=0):
    """TFRecord files of Examples whose ``id`` is the record's global number, padded to varied sizes
    (so that files span several 64 KiB reads). Returns the paths and the total count."""
    rng = np.random.default_rng(seed)
    paths, n = [], 0
    for f, count in enumerate(counts):
        path = os.path.join(directory, f"part-{f:03d}.tfrecord")
        with dlstore.TFRecordWriter(path) as w:
            for _ in range(count):
                w.write(encode_example({"id": [n], "pad": rng.bytes(int(rng.integers(0, 3000)))}))
                n += 1
        paths.append(path)
    return paths, n


def _ids(records):
    return [int(dlstore.parse_example(r)["id"][0]) for r in records]


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory):
    d = tmp_path_factory.mktemp("imagenet")
    return generate_imagenet(d, shards=2, records_per_shard=9, image_size=(48, 80), progress=False)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert")
    return generate_bert(d, shards=3, records_per_shard=10, progress=False)


def _pipeline():
    import dlstore.pipeline

    return dlstore.pipeline


# ---- shared base ------------------------------------------------------------------------------------


def test_last_batch_policy_names_match_dali():
    assert LastBatch.ALL == ("FILL", "DROP", "PARTIAL")
    assert check_last_batch("partial") == "PARTIAL"
    dali_iter = pytest.importorskip("nvidia.dali.plugin.base_iterator", reason="DALI is not installed")
    for member in dali_iter.LastBatchPolicy:
        assert check_last_batch(member) == member.name
    with pytest.raises(ValueError, match="FILL, DROP, PARTIAL"):
        check_last_batch("pad")


@pytest.mark.parametrize("shuffle", ["none", "block", "global"])
@pytest.mark.parametrize("consumers", [1, 3, 4])
def test_rank_sources_cover_every_record_once(tmp_path, shuffle, consumers):
    """What every adapter reads through: one rank's share of one epoch plan (a Dataset), or a ready source."""
    paths, total = _numbered_files(tmp_path, [40, 0, 75, 33])
    seen = []
    for c in range(consumers):
        source = dataset_for(paths, {"chunk_size": 64 << 10}, world=World(rank=c, size=consumers), shuffle=shuffle,
                             seed=3, remainder="uneven")
        source.set_epoch(1)
        for batch in source.batches():
            seen += _ids(batch_records(batch))
    assert sorted(seen) == list(range(total))
    reader = dlstore.open_records(paths)
    assert dataset_for(reader) is reader
    with pytest.raises(ValueError, match="belong to the source"):
        dataset_for(reader, {"shuffle": "global"})
    with pytest.raises(TypeError, match="unexpected keyword arguments sideways"):
        dataset_for(paths, {"sideways": 1})
    # Every keyword argument of Dataset is taken, none listed twice: mount_policy and shuffle_window too.
    kw = {"shuffle_window": 1 << 20, "mounts_per_rank": 1, "mount_policy": "rank", "loader_own": 3}
    ds = dataset_for(paths, kw, rest=True, world=World(rank=0, size=1))
    assert kw == {"loader_own": 3} and ds.remainder == "uneven"


def test_lazy_imports():
    """Importing the adapters imports no framework; naming the torch dataset imports torch."""
    code = ("import sys, dlstore.adapters, dlstore.adapters.torch as t, dlstore.adapters.tensorflow, "
            "dlstore.adapters.dali\n"
            "assert not {'torch', 'tensorflow', 'nvidia.dali'} & set(sys.modules), sorted(sys.modules)\n"
            "t.DlstoreIterableDataset\n"
            "assert 'torch' in sys.modules and 'tensorflow' not in sys.modules\n")
    out = run_python(code)
    assert out.returncode == 0, out.stderr


# ---- PyTorch ----------------------------------------------------------------------------------------


def _collect(dataset, num_workers):
    torch = pytest.importorskip("torch")
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=num_workers, collate_fn=list)
    return [r for batch in loader for r in batch]


@pytest.mark.parametrize("counts", [[30, 50, 20, 41], [30, 50, 41]])
@pytest.mark.parametrize("shuffle", ["block", "global"])
def test_torch_dataset_ranks_x_workers_exactly_once(tmp_path, counts, shuffle):
    """Two ranks x DataLoader(num_workers=2): every record once per epoch, for two epochs, in an order
    that changes with the epoch."""
    from dlstore.adapters.torch import DlstoreIterableDataset

    paths, total = _numbered_files(tmp_path, counts)
    orders = []
    for epoch in range(2):
        per_rank = []
        for rank in range(2):
            with pytest.warns(RuntimeWarning, match="different batch counts"):
                ds = DlstoreIterableDataset(paths, world=World(rank=rank, size=2), shuffle=shuffle, seed=5,
                                            remainder="uneven", chunk_size=64 << 10)
            ds.set_epoch(epoch)
            per_rank.append(_ids(_collect(ds, num_workers=2)))
        assert sorted(per_rank[0] + per_rank[1]) == list(range(total))
        assert per_rank[0] and per_rank[1]
        orders.append(per_rank)
    assert orders[0] != orders[1]


def test_torch_dataset_without_a_pipeline_gives_every_rank_as_many_batches(tmp_path):
    """Without a pipeline the DataLoader batches the records: by default every rank gets an equal share
    (``pad``), so a collective per step never waits for a rank that has finished. It defaulted to
    ``uneven``, where 33 records over 2 ranks gave one rank 1 batch of 16 and the other 2."""
    torch = pytest.importorskip("torch")
    from dlstore.adapters.torch import DlstoreIterableDataset

    paths, total = _numbered_files(tmp_path, [33])
    counts, seen = [], []
    for rank in range(2):
        ds = DlstoreIterableDataset(paths, world=World(rank=rank, size=2), chunk_size=64 << 10)
        batches = list(torch.utils.data.DataLoader(ds, batch_size=16, collate_fn=list))
        counts.append(len(batches))
        seen += _ids([r for b in batches for r in b])
    assert counts[0] == counts[1] == 2
    assert set(seen) == set(range(total))
    one = DlstoreIterableDataset(paths, world=World(rank=0, size=1), chunk_size=64 << 10)
    assert one.dataset.remainder == "uneven"  # one rank: no collective to keep in step, every record once


class _DatasetPerWorker:
    """A user's own torch IterableDataset that makes its dlstore.Dataset inside each DataLoader worker,
    leaving the world to detection (made a torch class in the test: torch is imported lazily)."""

    def __init__(self, pattern):
        self.pattern = pattern

    def __iter__(self):
        ds = dlstore.Dataset(self.pattern, remainder="uneven", batch_size=8, chunk_size=64 << 10)
        for batch in ds.batches():
            yield _ids(batch_records(batch))


def test_a_dataset_made_in_a_dataloader_worker_reads_that_workers_share(tmp_path):
    """A Dataset made inside a DataLoader worker without a world takes the worker's part of the rank's
    share, as dlstore.world() says: each worker read the whole share before, every record twice."""
    torch = pytest.importorskip("torch")
    _, total = _numbered_files(tmp_path, [30, 50, 41])
    mine = type("Mine", (_DatasetPerWorker, torch.utils.data.IterableDataset), {})(str(tmp_path / "part-*"))
    got = [i for ids in torch.utils.data.DataLoader(mine, batch_size=None, num_workers=2) for i in ids]
    assert sorted(got) == list(range(total))


def test_items_per_worker_follows_the_dataloaders_turns():
    from dlstore.adapters.torch import items_per_worker

    assert items_per_worker([3, 3], 0) == ([0, 0], 0)
    assert items_per_worker([3, 3], 3) == ([2, 1], 1)  # w0, w1, w0; then w1's turn
    assert items_per_worker([3, 3], 4) == ([2, 2], 0)
    assert items_per_worker([1, 3, 2], 3) == ([1, 1, 1], 0)
    assert items_per_worker([1, 3, 2], 4) == ([1, 2, 1], 2)  # w0 w1 w2 | w1 (w0 has none left); w2 next
    assert items_per_worker([1, 3, 2], 5) == ([1, 2, 2], 0)  # w0 is skipped when its turn comes
    assert items_per_worker([1, 3, 2], 6) == ([1, 3, 2], 2)
    assert items_per_worker([5], 4) == ([4], 0)
    with pytest.raises(ValueError, match="more than the epoch's 6 items"):
        items_per_worker([1, 3, 2], 7)


def _batches(dataset, num_workers, stop=None):
    """The DataLoader's batches of ``dataset`` (batch_size 4, records as ids), the first ``stop`` only."""
    torch = pytest.importorskip("torch")
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=num_workers, collate_fn=list)
    out = []
    for batch in loader:
        if stop is not None and len(out) == stop:
            break
        out.append(_ids(batch))
    return out


@pytest.mark.slow  # several DataLoaders, each forking workers
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", ["block", "global"])
def test_torch_dataset_resumes_mid_epoch_across_dataloader_workers(tmp_path, shuffle, num_workers):
    """A stop after k batches, the state through JSON, a fresh dataset and DataLoader: the rest of the
    epoch exactly as an uninterrupted run hands it out (workers' shares uneven), then a whole next epoch."""
    from dlstore.adapters.torch import DlstoreIterableDataset

    paths, _ = _numbered_files(tmp_path, [30, 50, 41])

    def make():
        return DlstoreIterableDataset(paths, world=World(rank=1, size=2), shuffle=shuffle, seed=5, chunk_size=64 << 10)

    reference = []
    for epoch in (0, 1):
        ds = make()
        ds.set_epoch(epoch)
        reference.append(_batches(ds, num_workers))
    assert len({len(b) for b in reference[0]}) > 1 or num_workers == 0  # workers' last batches are short
    for k in (0, 1, 5, len(reference[0]) - 1):
        first = make()
        first.set_epoch(0)
        before = _batches(first, num_workers, stop=k)
        state = json.loads(json.dumps(first.state_dict(k, num_workers=num_workers, records_per_batch=4)))
        again = make()
        again.load_state_dict(state)
        again.set_epoch(0)  # a training loop sets the epoch it resumes: the resume point stays
        assert before + _batches(again, num_workers) == reference[0], f"stop {k}"
        again.set_epoch(1)  # the next epoch: whole
        assert _batches(again, num_workers) == reference[1]


@pytest.mark.slow  # several DataLoaders, each forking workers
@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)])
def test_torch_dataset_resume_point_serves_one_pass(tmp_path, num_workers, persistent):
    """After load_state_dict the first pass resumes; the next pass of the same epoch (no set_epoch) resumed from
    the loaded point again, and so did every later one (with DataLoader workers too: each pass's workers copy the
    main process's dataset). Any later pass reads the epoch whole, from its start, as a Dataset does after
    set_epoch of that epoch: a pass broken off after its first batch, the next one, and one after set_epoch."""
    torch = pytest.importorskip("torch")
    from dlstore.adapters.torch import DlstoreIterableDataset

    paths, _ = _numbered_files(tmp_path, [30, 50, 41])

    def make():
        return DlstoreIterableDataset(paths, world=World(rank=1, size=2), shuffle="global", seed=5, chunk_size=64 << 10)

    def passes(ds, stops):
        loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=num_workers, collate_fn=list,
                                             persistent_workers=persistent)
        out = []
        for stop in stops:
            got = []
            for batch in loader:
                if len(got) == stop:
                    break
                got.append(_ids(batch))
            out.append(got)
        return out

    whole = _batches(make(), num_workers)
    k = 3
    state = make().state_dict(k, num_workers=num_workers, records_per_batch=4)
    for stops in ([None, None], [1, None]):
        again = make()
        again.load_state_dict(state)
        first, second = passes(again, stops)
        assert first == whole[k:k + (stops[0] or len(whole))]
        assert second == whole, stops
    again.set_epoch(0)  # the same epoch set again once a pass has started: its start, as a Dataset's set_epoch
    assert passes(again, [None])[0] == whole


def test_torch_dataset_over_a_dataset_loaded_directly_resumes_there(tmp_path):
    """``dataset.load_state_dict(state)`` on the Dataset a DlstoreIterableDataset reads, rather than the adapter's:
    a pass counted its own position (the epoch's start) and put the Dataset back there, reading the records
    before the point again, and a point in a later epoch was ignored. A pass starts at the point, loaded before
    or after the adapter was made, as a Loader over that Dataset does: with the records read before the stop,
    every record of the epoch once. The point serves one pass and follows set_epoch's rule (kept by its epoch,
    forgotten at another), as the adapter's own does."""
    from dlstore.adapters.torch import DlstoreIterableDataset

    paths, _ = _numbered_files(tmp_path, [30, 50, 41])

    def dataset():
        return dlstore.Dataset(paths, world=World(rank=1, size=2), shuffle="global", seed=5, chunk_size=64 << 10,
                               batch_size=4)

    def records(ds):
        return [i for batch in _batches(ds, 0) for i in batch]

    whole = []
    for epoch in (0, 1):
        ds = DlstoreIterableDataset(dataset())
        ds.set_epoch(epoch)
        whole.append(records(ds))
    read = dataset()  # the interrupted run: 12 records of epoch 0; then the epoch's rest and 4 records of epoch 1
    batches = read.batches()
    before = [i for _, batch in zip(range(3), batches) for i in _ids(batch_records(batch))]
    mid = read.state_dict()
    assert (mid["epoch"], mid["sample_in_epoch"]) == (0, 12)
    for _ in batches:
        pass
    next(read.batches())
    later = read.state_dict()
    assert (later["epoch"], later["sample_in_epoch"]) == (1, 4)

    loaded = dataset()
    loaded.load_state_dict(mid)  # before the adapter is made
    ds = DlstoreIterableDataset(loaded)
    assert before + records(ds) == whole[0]
    assert records(ds) == whole[0]  # the point served one pass
    ds.set_epoch(1)
    assert records(ds) == whole[1]

    ds = DlstoreIterableDataset(dataset())
    ds.dataset.load_state_dict(later)  # after, in a later epoch: that epoch, from the point
    assert records(ds) == whole[1][4:] and ds.epoch == 1
    ds.dataset.load_state_dict(later)
    ds.set_epoch(1)  # its epoch keeps it
    assert records(ds) == whole[1][4:]
    ds.dataset.load_state_dict(later)
    ds.set_epoch(0)  # another forgets it
    assert records(ds) == whole[0]
    own = ds.state_dict(0, records_per_batch=4)  # epoch 0's start
    ds.dataset.load_state_dict(later)
    ds.load_state_dict(own)  # the adapter's own state, loaded after: that one
    assert records(ds) == whole[0]


def test_torch_dataset_state_in_a_pass_begun_at_the_datasets_point_counts_from_the_epochs_start(tmp_path):
    """A pass that began at sample 12, loaded into the Dataset: a state saved after 2 of its items named record 8
    (2 items counted from the epoch's start), so the resume read records 8-19 again. batches_seen counts from the
    epoch's start (3 items before the pass, so 5 here); a count short of the pass's start is refused, and so is
    any mid-epoch count where the point is no whole number of items."""
    from dlstore.adapters.torch import DlstoreIterableDataset

    paths, _ = _numbered_files(tmp_path, [30, 50, 41])

    def adapter(at=None):
        ds = dlstore.Dataset(paths, shuffle="global", seed=5, chunk_size=64 << 10, batch_size=2)
        if at is not None:
            ds.load_state_dict(dict(ds.state_dict(), sample_in_epoch=at))
        return DlstoreIterableDataset(ds)

    def records(ds, stop=None):
        return [i for batch in _batches(ds, 0, stop) for i in batch]

    whole = records(adapter())
    ds = adapter(12)
    assert records(ds, stop=2) == whole[12:20]
    with pytest.raises(ValueError, match="at least 3 here"):
        ds.state_dict(2, records_per_batch=4)
    resumed = adapter()
    resumed.load_state_dict(ds.state_dict(5, records_per_batch=4))
    assert records(resumed) == whole[20:]
    both = adapter()  # a checkpoint restoring the adapter, then its Dataset: the later load wins, and says so
    both.load_state_dict(ds.state_dict(5, records_per_batch=4))
    both.dataset.load_state_dict(dict(both.dataset.state_dict(), sample_in_epoch=24))
    with pytest.warns(RuntimeWarning, match="after this DlstoreIterableDataset's own load_state_dict"):
        assert records(both) == whole[24:]
    odd = adapter(10)
    records(odd, stop=1)
    with pytest.raises(ValueError, match="not a whole number of items of 4"):
        odd.state_dict(3, records_per_batch=4)
    assert odd.state_dict(0, records_per_batch=4)["batches_seen"] == 0


def test_torch_dataset_with_a_pipeline_over_a_dataset_loaded_directly_resumes_there(bert):
    """The same through a pipeline: each pass's Loader was put at the adapter's position (the epoch's start) over
    the point loaded into the Dataset. It yields the rest of the epoch from the point, the batches of a Loader
    over that Dataset."""
    pipeline = _pipeline()
    from dlstore.adapters.torch import DlstoreIterableDataset

    def dataset():
        return dlstore.Dataset(bert, world=World(rank=0, size=2), shuffle="global", seed=2, batch_size=4,
                               remainder="uneven")

    def rows(ds):
        return [row for batch in ds for row in loader_rows(batch)]

    def adapter(source):
        return DlstoreIterableDataset(source, pipeline.Bert(seq_len=128, max_predictions=20), batch_size=4)

    whole = rows(adapter(dataset()))
    loaded = dataset()
    loaded.load_state_dict(dataset().state_dict() | {"sample_in_epoch": 8})
    ds = adapter(loaded)
    assert rows(ds) == whole[8:]
    assert rows(ds) == whole


@pytest.mark.slow  # DataLoaders forking workers
def test_torch_dataset_over_a_dataset_loaded_directly_with_workers(tmp_path):
    """DataLoader workers split the rank's share: a point loaded into the Dataset mid-epoch (a sample of the rank's
    order) was ignored by them, each reading its share whole; it is refused, saying what resumes. A point at an
    epoch's start is that epoch, read whole."""
    from dlstore.adapters.torch import DlstoreIterableDataset

    paths, _ = _numbered_files(tmp_path, [30, 50, 41])

    def dataset():
        return dlstore.Dataset(paths, world=World(rank=1, size=2), shuffle="global", seed=5, chunk_size=64 << 10)

    reference = DlstoreIterableDataset(dataset())
    reference.set_epoch(1)
    epoch_1 = _batches(reference, 2)
    start = dataset().state_dict() | {"epoch": 1}
    for before in (True, False):  # loaded before the adapter is made, or after (its workers find it)
        source = dataset()
        if before:
            source.load_state_dict(start)
        ds = DlstoreIterableDataset(source)
        if not before:
            source.load_state_dict(start)
        assert _batches(ds, 2) == epoch_1
        ds.dataset.load_state_dict(start | {"sample_in_epoch": 8})
        with pytest.raises(ValueError, match="sample 8 of epoch 1 .* 2 DataLoader workers split"):
            _batches(ds, 2)


def _pipeline_items(dataset, stop=None):
    """The input_ids of a DataLoader's items (batch_size=None, 2 workers) over a DlstoreIterableDataset with a
    pipeline, the first ``stop`` only."""
    torch = pytest.importorskip("torch")
    out = []
    for batch in torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2):
        if stop is not None and len(out) == stop:
            break
        out.append(batch["input_ids"].tolist())
    return out


@pytest.mark.slow  # DataLoaders forking workers
def test_torch_dataset_resumes_mid_epoch_with_a_pipeline(bert):
    pytest.importorskip("torch")
    pipeline = _pipeline()
    from dlstore.adapters.torch import DlstoreIterableDataset

    def make():
        return DlstoreIterableDataset(bert, pipeline.Bert(seq_len=128, max_predictions=20), batch_size=4,
                                      world=World(rank=0, size=2), shuffle="global", seed=2)

    reference = _pipeline_items(make())
    assert [] in reference or len(reference) >= 4
    for k in (1, 3, len(reference) - 1):
        first = make()
        before = _pipeline_items(first, stop=k)
        again = make()
        again.load_state_dict(first.state_dict(k, num_workers=2))
        assert before + _pipeline_items(again) == reference, f"stop {k}"
    wrong = make()
    wrong.load_state_dict(make().state_dict(1, num_workers=0))
    with pytest.raises(ValueError, match="reading with 0 DataLoader workers; this pass has 2"):
        _pipeline_items(wrong)
    with pytest.raises(ValueError, match="records_per_batch"):
        DlstoreIterableDataset(bert).state_dict(3, num_workers=2)


@pytest.mark.slow  # DataLoaders forking workers
def test_torch_dataset_over_a_dataset_without_a_batch_size_resumes_its_padded_shares(bert):
    # Each worker's Loader gives its Dataset the pipeline's batch size, which pads its share (15 records to 16):
    # the state counted the second worker's share unpadded, so resumed one item before the epoch's end, the
    # worker that had finished restarted early and handed out records again (found by a user trial).
    pytest.importorskip("torch")
    pipeline = _pipeline()
    from dlstore.adapters.torch import DlstoreIterableDataset

    def make():
        ds = dlstore.Dataset(bert, shuffle="none", remainder="pad", seed=4)  # no batch_size
        return DlstoreIterableDataset(ds, pipeline.Bert(seq_len=128, max_predictions=20), 4, seed=4)

    reference = _pipeline_items(make())
    assert len(reference) == 8  # 2 workers x 16 records (15 and a repeat) in batches of 4
    first = make()
    before = _pipeline_items(first, stop=7)
    again = make()
    again.load_state_dict(first.state_dict(7, num_workers=2))
    assert before + _pipeline_items(again) == reference


def test_torch_dataset_refuses_a_state_of_another_kind(tmp_path):
    """A Loader's state given to DlstoreIterableDataset.load_state_dict (found by a user trial: a bare
    KeyError 'batches_seen') is refused with a ValueError naming what it lacks."""
    from dlstore.adapters.torch import DlstoreIterableDataset

    paths, _ = _numbered_files(tmp_path, [30, 50, 40])
    ds = DlstoreIterableDataset(paths, world=World(rank=0, size=1), seed=1)
    with pytest.raises(ValueError, match="not a DlstoreIterableDataset state: it lacks batches_seen, num_workers, "
                                         "records_per_batch, num_consumers"):
        ds.load_state_dict({"epoch": 0, "sample_in_epoch": 32, "seed": 1})  # a Loader's
    state = ds.state_dict(3, num_workers=2, records_per_batch=4)
    with pytest.raises(ValueError, match="its batches_seen is '3', not an integer"):
        ds.load_state_dict(dict(state, batches_seen="3"))
    with pytest.raises(ValueError, match="not a DlstoreIterableDataset state"):
        ds.load_state_dict([0, 3])


@pytest.mark.slow  # DataLoaders forking workers
def test_torch_dataset_resumes_at_an_epoch_boundary_with_other_workers_or_world(tmp_path):
    """A state saved with 2 DataLoader workers before an epoch's first item or after its last (found by a
    user trial: both were refused with 0 workers, the message asking for what the state was) resumes with
    0 or 1 worker, and over 2 ranks: every record exactly once across the restart. After the last item the
    state is the next epoch's start, as the Dataset's and the Loader's are."""
    from dlstore.adapters.torch import DlstoreIterableDataset

    paths, total = _numbered_files(tmp_path, [30, 50, 40])

    def make(size=1, rank=0):
        return DlstoreIterableDataset(paths, world=World(rank=rank, size=size), shuffle="global", seed=5,
                                      chunk_size=64 << 10)

    first = make()
    first.set_epoch(1)
    items = _batches(first, 2)
    assert sorted(i for batch in items for i in batch) == list(range(total))
    start, end = (json.loads(json.dumps(first.state_dict(k, num_workers=2, records_per_batch=4)))
                  for k in (0, len(items)))
    assert (start["epoch"], start["batches_seen"], end["epoch"], end["batches_seen"]) == (1, 0, 2, 0)
    for state in (start, end):
        for workers in (0, 1):
            again = make()
            again.load_state_dict(state)
            again.set_epoch(state["epoch"])
            got = [i for batch in _batches(again, workers) for i in batch]
            assert sorted(got) == list(range(total)), (state, workers)
        got = []
        for rank in (0, 1):
            again = make(2, rank)
            again.load_state_dict(state)
            again.set_epoch(state["epoch"])
            got += [i for batch in _batches(again, 0) for i in batch]
        assert sorted(got) == list(range(total)), (state, "2 ranks")
    # A state saved at the end before it was the next epoch's start: nothing is left of its epoch, with any workers.
    done = dict(end, epoch=1, batches_seen=len(items))
    again = make()
    again.load_state_dict(done)
    again.set_epoch(1)
    assert _batches(again, 1) == []
    again.set_epoch(2)
    assert sorted(i for batch in _batches(again, 0) for i in batch) == list(range(total))


def test_torch_dataset_state_refused_in_the_main_process(tmp_path):
    """What the main process can tell is refused there, in one line, not inside a DataLoader worker
    (found by a user trial): a state past the end of its epoch (when saved, and when loaded) and a
    mid-epoch state in a world of another size."""
    from dlstore.adapters.torch import DlstoreIterableDataset

    paths, _ = _numbered_files(tmp_path, [30, 50, 40])

    def make(size=1):
        return DlstoreIterableDataset(paths, world=World(rank=0, size=size), seed=5)

    ds = make()
    with pytest.raises(ValueError, match="batches_seen 31 is more than epoch 0's 30 items with 2 DataLoader"):
        ds.state_dict(31, num_workers=2, records_per_batch=4)
    state = ds.state_dict(3, num_workers=2, records_per_batch=4)
    with pytest.raises(ValueError, match="batches_seen 31 is more than epoch 0's 30 items"):
        make().load_state_dict(dict(state, batches_seen=31))
    with pytest.raises(ValueError, match=r"saved at item 3 of epoch 0 by 2 consumers \(2 DataLoader workers per "
                                         r"rank\); with 2 workers this world has 4"):
        make(2).load_state_dict(state)


def test_torch_dataset_reads_the_rank_from_the_environment(tmp_path, monkeypatch):
    from dlstore.adapters.torch import DlstoreIterableDataset

    paths, total = _numbered_files(tmp_path, [10, 11, 12])
    seen = []
    for rank in range(3):
        for name, value in {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": 3,
                            "OMPI_COMM_WORLD_LOCAL_RANK": rank, "OMPI_COMM_WORLD_LOCAL_SIZE": 3}.items():
            monkeypatch.setenv(name, str(value))
        mine = _ids(_collect(DlstoreIterableDataset(paths), num_workers=0))
        assert len(mine) == total // 3  # an equal share each (33 records), from the launcher's rank
        seen += mine
    assert sorted(seen) == list(range(total))


def test_torch_dataset_with_bert_pipeline_exactly_once(bert):
    """Batches of the Bert pipeline through two workers x two ranks: each record's features once."""
    torch = pytest.importorskip("torch")
    pipeline = _pipeline()
    from dlstore.adapters.torch import DlstoreIterableDataset

    expected = sorted(tuple(dlstore.parse_example(r)["input_ids"].tolist()) for r in dlstore.open_records(bert))
    got = []
    for rank in range(2):
        ds = DlstoreIterableDataset(bert, pipeline.Bert(seq_len=128, max_predictions=20), batch_size=4,
                                    world=World(rank=rank, size=2))
        for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2):
            assert isinstance(batch["input_ids"], torch.Tensor) and batch["input_ids"].dtype == torch.int64
            assert batch["input_ids"].shape[1:] == (128,) and batch["input_ids"].shape[0] <= 4
            assert batch["next_sentence_labels"].shape[1:] == (1,)
            got += [tuple(row) for row in batch["input_ids"].tolist()]
    assert sorted(got) == expected


def test_torch_dataset_recordio_images(tmp_path):
    """ResNet-50 batches from RecordIO shards over three ranks: every label once."""
    torch = pytest.importorskip("torch")
    pipeline = _pipeline()
    from dlstore.adapters.torch import DlstoreIterableDataset

    paths = generate_imagenet(tmp_path, shards=2, records_per_shard=7, image_size=(40, 56), format="recordio",
                              progress=False)
    expected = sorted(int(dlstore.recordio.unpack(r)[0].label) for r in dlstore.open_records(paths))
    got = []
    for rank in range(3):
        ds = DlstoreIterableDataset(paths, pipeline.ResNet50(train=False, size=24), batch_size=2,
                                    world=World(rank=rank, size=3))
        with warnings.catch_warnings():  # 14 records over 3 ranks in batches of 2: a short share's empty batch
            warnings.filterwarnings("ignore", "dlstore loader: .* yields an empty batch", RuntimeWarning)
            for batch in torch.utils.data.DataLoader(ds, batch_size=None):
                assert batch["image"].dtype == torch.uint8 and batch["image"].shape[1:] == (24, 24, 3)
                got += batch["label"].tolist()
    assert sorted(got) == expected


def test_torch_dataset_argument_checks(tmp_path):
    from dlstore.adapters.torch import DlstoreIterableDataset

    paths, _ = _numbered_files(tmp_path, [3])
    with pytest.raises(ValueError, match="batch_size"):
        DlstoreIterableDataset(paths, batch_size=8)
    with pytest.raises(ValueError, match="last_batch"):
        DlstoreIterableDataset(paths, last_batch="pad")
    with pytest.raises(dlstore.PlacementError, match="unknown shuffle 'perfect'"):
        DlstoreIterableDataset(paths, shuffle="perfect")
    with pytest.raises(TypeError, match="shard"):
        DlstoreIterableDataset(paths, shard="files")  # the Dataset's plan splits records, not files


def test_torch_loader_shares_the_loaders_arrays(bert):
    """On the CPU the tensors are the loader's arrays (no copy) and equal the numpy loader's values."""
    torch = pytest.importorskip("torch")
    pipeline = _pipeline()
    from dlstore.adapters.torch import TorchLoader

    reference = list(pipeline.bert_loader(bert, batch_size=8, copy=True))
    native = pipeline.bert_loader(bert, batch_size=8)
    adapter = TorchLoader(native, device="cpu")
    assert adapter.element_spec["input_ids"] == ((8, 128), torch.int64)
    n = 0
    for mine, ref in zip(adapter, reference):
        for name, array in ref.items():
            tensor = mine[name]
            assert isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu"
            np.testing.assert_array_equal(tensor.numpy(), array)
        n += 1
    assert n == len(reference) > 1


def test_torch_loader_zero_copy(bert):
    torch = pytest.importorskip("torch")
    pipeline = _pipeline()
    from dlstore.adapters.torch import TorchLoader

    adapter = TorchLoader(pipeline.bert_loader(bert, batch_size=8), device="cpu")
    it = iter(adapter.loader)
    batch = next(it)
    tensor = adapter.convert("input_ids", batch["input_ids"])
    assert tensor.data_ptr() == batch["input_ids"].__array_interface__["data"][0]
    assert isinstance(tensor, torch.Tensor)


def test_pinned_allocator_without_cuda_falls_back_to_pageable_memory(bert, monkeypatch):
    torch = pytest.importorskip("torch", reason="the torch adapter needs torch")
    pipeline = _pipeline()
    from dlstore.adapters import torch as adapter

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # what a CPU-only machine says
    monkeypatch.setattr(adapter, "_noted_no_cuda", False)
    with pytest.warns(RuntimeWarning, match="CUDA is not available here.*pageable"):
        allocate = adapter.pinned_allocator()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the note is said once per process
        again = adapter.pinned_allocator()
    buf = allocate((4, 3), np.int64)
    assert buf.shape == (4, 3) and buf.dtype == np.int64 and buf.flags.writeable
    reference = list(pipeline.bert_loader(bert, batch_size=8, copy=True))
    got = list(adapter.TorchLoader(pipeline.bert_loader(bert, batch_size=8, allocator=again, copy=True),
                                   device="cpu"))
    assert len(got) == len(reference)
    np.testing.assert_array_equal(got[0]["input_ids"].numpy(), reference[0]["input_ids"])


@pytest.mark.gpu
def test_torch_loader_to_cuda_through_pinned_memory(bert):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip(CUDA_REASON)
    pipeline = _pipeline()
    from dlstore.adapters.torch import TorchLoader, pinned_allocator

    reference = list(pipeline.bert_loader(bert, batch_size=8, copy=True))
    adapter = TorchLoader(pipeline.bert_loader(bert, batch_size=8))
    assert adapter.device.type == "cuda" and adapter.pin_memory
    got = [{k: v.cpu().numpy() for k, v in b.items()} for b in adapter]
    assert adapter._staging and all(buf.is_pinned() for buf in adapter._staging.values())
    assert len(got) == len(reference)
    for mine, ref in zip(got, reference):
        for name in ref:
            np.testing.assert_array_equal(mine[name], ref[name])
    # The loader's own buffers pinned: copied from there, no staging.
    pinned = TorchLoader(pipeline.bert_loader(bert, batch_size=8, allocator=pinned_allocator()))
    got = [{k: v.cpu().numpy() for k, v in b.items()} for b in pinned]
    assert not pinned._staging and len(got) == len(reference)
    for mine, ref in zip(got, reference):
        np.testing.assert_array_equal(mine["input_ids"], ref["input_ids"])


# ---- TensorFlow -------------------------------------------------------------------------------------


@pytest.mark.parametrize("last_batch", ["DROP", "PARTIAL"])
def test_tf_dataset_element_spec_and_values(bert, last_batch):
    tf = pytest.importorskip("tensorflow")
    pipeline = _pipeline()
    from dlstore.adapters.tensorflow import as_tf_dataset

    reference = list(pipeline.bert_loader(bert, batch_size=7, last_batch=last_batch, copy=True))
    ds = as_tf_dataset(pipeline.bert_loader(bert, batch_size=7, last_batch=last_batch))
    batch_dim = 7 if last_batch == "DROP" else None
    spec = ds.element_spec
    assert spec["input_ids"] == tf.TensorSpec((batch_dim, 128), tf.int64, name="input_ids")
    assert spec["masked_lm_weights"] == tf.TensorSpec((batch_dim, 20), tf.float32, name="masked_lm_weights")
    assert spec["next_sentence_labels"] == tf.TensorSpec((batch_dim, 1), tf.int64, name="next_sentence_labels")
    # Every element held at once: an element aliasing the loader's reused buffers would change under us.
    got = list(ds.as_numpy_iterator())
    assert len(got) == len(reference) == (30 // 7 if last_batch == "DROP" else -(-30 // 7))
    for mine, ref in zip(got, reference):
        assert set(mine) == set(ref)
        for name in ref:
            np.testing.assert_array_equal(mine[name], ref[name])
    assert len(list(ds.as_numpy_iterator())) == len(got)  # a second pass is a new epoch of the loader


def test_tf_dataset_images(imagenet):
    tf = pytest.importorskip("tensorflow")
    pipeline = _pipeline()
    from dlstore.adapters.tensorflow import as_tf_dataset

    def make():
        return pipeline.resnet50_loader(imagenet, batch_size=4, train=False, layout="NHWC", dtype="uint8",
                                        size=32)

    ds = as_tf_dataset(make())
    assert ds.element_spec["image"] == tf.TensorSpec((4, 32, 32, 3), tf.uint8, name="image")
    assert ds.element_spec["label"].dtype == tf.int64
    reference = [{k: v.copy() for k, v in b.items()} for b in make()]
    got = list(ds.as_numpy_iterator())
    assert len(got) == len(reference) == 18 // 4
    for mine, ref in zip(got, reference):
        np.testing.assert_array_equal(mine["image"], ref["image"])
        np.testing.assert_array_equal(mine["label"], ref["label"])


# ---- DALI -------------------------------------------------------------------------------------------


def _dali_epoch(pipe):
    images, labels = [], []
    try:
        while True:
            out_images, out_labels = pipe.run()
            images.append(np.array(out_images.as_tensor()))
            labels += out_labels.as_array().tolist()
    except StopIteration:
        pipe.reset()
    return images, labels


@pytest.mark.parametrize("train,layout,dtype", [(True, "NCHW", "float32"), (False, "NHWC", "uint8")])
def test_dali_pipeline_cpu_shapes_and_labels(imagenet, train, layout, dtype):
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    from dlstore.adapters.dali import dali_pipeline

    truth = [int(dlstore.parse_example(r)["image/class/label"][0]) for r in dlstore.open_records(imagenet)]
    pipe = dali_pipeline(imagenet, 4, device="cpu", train=train, size=40, layout=layout, dtype=dtype,
                         num_threads=1, label_offset=-1, shuffle="none", shuffle_shards=False)
    for _ in range(2):  # two epochs: the feed restarts after StopIteration
        images, labels = _dali_epoch(pipe)
        assert labels == [t - 1 for t in truth]
        assert [len(b) for b in images] == [4, 4, 4, 4, 2]  # PARTIAL
        shape = (3, 40, 40) if layout == "NCHW" else (40, 40, 3)
        assert all(b.shape[1:] == shape and b.dtype == np.dtype(dtype) for b in images)
    if dtype == "float32":  # normalised: roughly zero-centred
        assert -2.5 < float(np.concatenate(images).mean()) < 2.5


def test_dali_eval_refuses_a_resize_smaller_than_the_crop(imagenet):
    # The dlstore pipelines refuse it when made; the DALI one was built regardless (a 32-pixel crop of 24 pixels).
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    from dlstore.adapters.dali import dali_pipeline

    with pytest.raises(ValueError, match=r"eval_resize \(24\) must be at least the output size \(32\)"):
        dali_pipeline(imagenet[:1], 4, device="cpu", train=False, size=32, eval_resize=24)


def test_dali_eval_matches_a_reference_decode(imagenet):
    """Eval images are the JPEG, resized and centre-cropped: close to PIL doing the same."""
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    from PIL import Image

    from dlstore.adapters.dali import dali_pipeline

    pipe = dali_pipeline(imagenet[:1], 9, device="cpu", train=False, size=32, layout="NHWC", dtype="uint8",
                         num_threads=1)
    images, _ = _dali_epoch(pipe)
    first = next(iter(dlstore.open_records(imagenet[:1])))
    img = Image.open(io.BytesIO(dlstore.parse_example(first)["image/encoded"][0])).convert("RGB")
    w, h = img.size
    short = round(32 * 256 / 224)
    scale = short / min(w, h)
    img = img.resize((round(w * scale), round(h * scale)), Image.BILINEAR)
    left, top = (int((side - 32) / 2 + 0.5) for side in img.size)  # DALI rounds the centre crop's corner up
    ref = np.asarray(img.crop((left, top, left + 32, top + 32)), dtype=np.float32)
    assert np.abs(images[0][0].astype(np.float32) - ref).mean() < 3


@pytest.mark.parametrize("policy,sizes", [("DROP", [4, 4, 4, 4]), ("FILL", [4, 4, 4, 4, 4])])
def test_dali_last_batch(imagenet, policy, sizes):
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    from dlstore.adapters.dali import dali_pipeline

    truth = [int(dlstore.parse_example(r)["image/class/label"][0]) for r in dlstore.open_records(imagenet)]
    pipe = dali_pipeline(imagenet, 4, device="cpu", size=24, num_threads=1, last_batch=policy, shuffle="none",
                         shuffle_shards=False)
    images, labels = _dali_epoch(pipe)
    assert [len(b) for b in images] == sizes
    expected = truth[:16] if policy == "DROP" else truth + truth[-1:] * 2
    assert labels == expected


def test_dali_ranks_share_the_records(imagenet):
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    from dlstore.adapters.dali import dali_pipeline

    truth = sorted(int(dlstore.parse_example(r)["image/class/label"][0]) for r in dlstore.open_records(imagenet))
    labels = []
    for rank in range(3):
        pipe = dali_pipeline(imagenet, 4, device="cpu", size=24, num_threads=1, world=World(rank=rank, size=3))
        labels += _dali_epoch(pipe)[1]
    assert sorted(labels) == truth


def test_dali_names_a_record_without_the_image(tmp_path):
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    from dlstore.adapters.dali import EncodedSamples

    path = str(tmp_path / "bad.tfrecord")
    with dlstore.TFRecordWriter(path) as w:
        w.write(encode_example({"image/encoded": b"\xff\xd8", "image/class/label": [1]}))
        w.write(encode_example({"image/class/label": [2]}))
    feed = EncodedSamples(dlstore.open_records(path), 4)
    with pytest.raises(dlstore.DlstoreError, match="bad.tfrecord: record at byte [1-9].*'image/encoded'") as e:
        list(feed)
    assert e.value.path == path and e.value.offset > 0


@pytest.mark.gpu
def test_dali_pipeline_gpu_decode(imagenet):
    dali = pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    if dali.backend.GetCUDADeviceCount() == 0:
        pytest.skip("needs a CUDA GPU visible to DALI (mixed nvJPEG decode)")
    from dlstore.adapters.dali import dali_pipeline

    pipe = dali_pipeline(imagenet, 4, device="auto", size=32)
    images, labels = pipe.run()
    assert images.as_cpu().as_array().shape == (4, 3, 32, 32)
    assert len(labels.as_array()) == 4


# ---- every adapter resumes exactly (the shared harness) -----------------------------------------


def test_torch_loader_resumes_exactly(bert):
    pytest.importorskip("torch")
    pipeline = _pipeline()
    from dlstore.adapters.torch import TorchLoader

    def make():
        return TorchLoader(pipeline.bert_loader(bert, batch_size=4, seed=2, buffer_size=5), device="cpu")

    assert_resumes_exactly(make, stops=[1, 3, 7, 8, 11], run=iter, values=loader_rows)


def test_tf_adapter_resumes_exactly(bert):
    pytest.importorskip("tensorflow")
    pipeline = _pipeline()
    from dlstore.adapters.tensorflow import TensorFlowAdapter

    def make():
        return TensorFlowAdapter(pipeline.bert_loader(bert, batch_size=4, seed=2, shuffle="global"))

    assert_resumes_exactly(make, stops=[1, 6, 9], run=iter, values=loader_rows)


def test_tf_dataset_resumes_exactly_under_a_slow_training_step(bert):
    # Through the tf.data.Dataset itself, with a step that takes time: tf.data's injected prefetch had
    # drawn the next batch from the loader meanwhile, so the state saved was a batch ahead of the loop
    # and the resumed run never saw that batch.
    pytest.importorskip("tensorflow")
    import time

    pipeline = _pipeline()
    from dlstore.adapters.tensorflow import TensorFlowAdapter

    def make():
        return TensorFlowAdapter(pipeline.bert_loader(bert, batch_size=4, seed=2, shuffle="global"))

    def slow_rows(batch):
        time.sleep(0.05)  # the training step
        return loader_rows(batch)

    assert_resumes_exactly(make, stops=[2, 5], run=lambda adapter: adapter.dataset(), values=slow_rows, epochs=1)


def test_tf_dataset_after_a_peek_says_to_make_it_again(bert):
    """A pass after one that stopped early (a take(), a peek) starts mid-epoch, under a cardinality counted
    from the epoch's start: tf.data failed it at its end, after its batches were used, in a message about its
    own assertion. Now the pass fails at once saying what to do, and the dataset made again reads the rest."""
    tf = pytest.importorskip("tensorflow")
    pipeline = _pipeline()
    from dlstore.adapters.tensorflow import as_tf_dataset

    loader = pipeline.bert_loader(bert, batch_size=4, seed=2, shuffle="global", record_key="index")
    ds = as_tf_dataset(loader)
    whole = int(ds.cardinality())
    peeked = [b["record"].numpy().tolist() for b in ds.take(2)]
    with pytest.raises(tf.errors.OpError, match="make the dataset again"):
        next(iter(ds))
    rest = as_tf_dataset(loader)
    assert int(rest.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)
    after = [b["record"].numpy().tolist() for b in rest]
    assert len(peeked) + len(after) == whole


@pytest.mark.parametrize("epochs,stop_epoch,stop_step,per_execution", [(1, 0, 5, 1), (2, 1, 4, 2)])
def test_keras_fit_resumes_exactly_from_trained_state(bert, epochs, stop_epoch, stop_step, per_execution):
    """Keras fit's iterator draws batches ahead of its step, so the loader's own state, saved in a fit
    callback, skipped the batches drawn but not trained (32 of 192 samples in a user's run); trained_state
    gives the state of the steps fit ran."""
    tf = pytest.importorskip("tensorflow")
    pipeline = _pipeline()
    from dlstore.adapters.tensorflow import as_tf_dataset, trained_state

    def make():
        return pipeline.bert_loader(bert, batch_size=4, seed=2, shuffle="global", record_key="index")

    def keys(batch):
        return list(zip(np.asarray(batch["shard"]).tolist(), np.asarray(batch["record"]).tolist()))

    reference = make()
    order = []  # per epoch, the batches' keys
    for _ in range(epochs):
        order.append([keys(b) for b in reference])
    loader = make()
    progress = trained_state(loader)
    saved = {}

    class Stop(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch == stop_epoch and batch + 1 == stop_step:
                saved["trained"], saved["loader"] = progress.state_dict(), loader.state_dict()
                self.model.stop_training = True

    width = as_tf_dataset(make()).element_spec["input_ids"].shape[-1]
    model = tf.keras.Sequential([tf.keras.Input((width,)), tf.keras.layers.Dense(2)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=per_execution)
    data = as_tf_dataset(loader).map(lambda b: (tf.cast(b["input_ids"], tf.float32), b["next_sentence_labels"]))
    model.fit(data, epochs=epochs, verbose=0, shuffle=False, callbacks=[progress, Stop()])
    trained = [k for e in range(stop_epoch) for b in order[e] for k in b] + \
        [k for b in order[stop_epoch][:stop_step] for k in b]
    assert progress.steps == sum(len(order[e]) for e in range(stop_epoch)) + stop_step
    ahead, used = saved["loader"], saved["trained"]
    assert (ahead["epoch"], ahead["sample_in_epoch"]) >= (used["epoch"], used["sample_in_epoch"])
    again = make()
    again.load_state_dict(saved["trained"])
    rest = []
    for _ in range(epochs - stop_epoch):
        rest += [k for b in again for k in keys(b)]
    assert trained + rest == [k for e in range(epochs) for b in order[e] for k in b]


def test_keras_trained_state_leaves_out_a_validation_pass_over_the_same_loader(bert):
    """validation_data made from the training loader takes a whole loader epoch between training epochs: the
    state counted those batches as trained, so Keras epoch 2 (loader epoch 2) resumed inside loader epoch 1."""
    tf = pytest.importorskip("tensorflow")
    pipeline = _pipeline()
    from dlstore.adapters.tensorflow import as_tf_dataset, trained_state

    loader = pipeline.bert_loader(bert, batch_size=4, seed=2, shuffle="global", record_key="index")
    progress = trained_state(loader)
    states = []

    class Record(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            state = progress.state_dict()
            states.append((state["epoch"], state["sample_in_epoch"]))

    def features(b):
        return tf.cast(b["input_ids"], tf.float32), b["next_sentence_labels"]

    width = as_tf_dataset(loader).element_spec["input_ids"].shape[-1]
    model = tf.keras.Sequential([tf.keras.Input((width,)), tf.keras.layers.Dense(2)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(as_tf_dataset(loader).map(features), validation_data=as_tf_dataset(loader).map(features), epochs=2,
              verbose=0, shuffle=False, callbacks=[progress, Record()])
    per_epoch = len(states) // 2

    def spelt(epoch, k):  # after an epoch's last batch, the next epoch's start as well
        return {(epoch, 4 * (k + 1))} | ({(epoch + 1, 0)} if k == per_epoch - 1 else set())

    assert all(states[k] in spelt(0, k) for k in range(per_epoch)), states
    assert all(states[per_epoch + k] in spelt(2, k) for k in range(per_epoch)), states  # 1 was validation's


def _dali_values(batch):
    images, labels = batch
    return [bytes(i) + b"|%d" % label for i, label in zip(images, labels.tolist())]


def test_dali_feed_reads_recordio_images(tmp_path):
    """EncodedSamples over RecordIO shards hands DALI each record's image (the bytes after its IRHeader) and
    the header's label: it parsed every record as a tf.train.Example and called the valid files corrupt."""
    from dlstore.adapters.dali import EncodedSamples

    paths = generate_imagenet(tmp_path, shards=2, records_per_shard=5, image_size=(40, 56), format="recordio",
                              progress=False)
    want = sorted((int(h.label) + 1, bytes(image)) for h, image in map(dlstore.recordio.unpack,
                                                                        dlstore.open_records(paths)))
    got = []
    for images, labels in EncodedSamples(dlstore.Dataset(paths, shuffle="global", batch_size=3, remainder="uneven"), 3,
                                     label_offset=1):
        got += [(int(label), bytes(image)) for image, label in zip(images, labels.tolist())]
    assert sorted(got) == want


def test_dali_feed_resumes_exactly(imagenet):
    from dlstore.adapters.dali import EncodedSamples

    def make():
        source = dlstore.Dataset(imagenet, shuffle="block", buffer_size=4, batch_size=4, seed=3)
        return EncodedSamples(source, 4, last_batch="FILL")

    assert_resumes_exactly(make, stops=[1, 2, 5, 6], run=iter, values=_dali_values)


def _into_the_source(feed, state):
    feed.source.load_state_dict(state["source"])


def test_dali_feed_over_a_source_loaded_directly_resumes_there(imagenet):
    """``feed.source.load_state_dict(state)`` rather than the feed's: the feed counted its own position (sample 0
    of epoch 0) and put the source back at the epoch's start, handing DALI the samples before the point again
    (and a point in epoch 1 was ignored). It starts at the point the source was loaded with, before or after the
    feed was made, as a Loader does: every sample once across the stop (stop 6 lies in epoch 1)."""
    from dlstore.adapters.dali import EncodedSamples

    def make():
        source = dlstore.Dataset(imagenet, shuffle="block", buffer_size=4, batch_size=4, seed=3)
        return EncodedSamples(source, 4, last_batch="FILL")

    assert_resumes_exactly(make, stops=[1, 2, 5, 6], run=iter, values=_dali_values, load=_into_the_source)

    read = make()  # the source loaded before the feed is made, and the feed says where it stands
    for _ in read:
        pass
    next(iter(read))
    source = dlstore.Dataset(imagenet, shuffle="block", buffer_size=4, batch_size=4, seed=3)
    source.load_state_dict(read.state_dict()["source"])
    feed = EncodedSamples(source, 4, last_batch="FILL")
    assert (feed.epoch, feed.sample_in_epoch) == (1, 4)
    given = make()
    given.load_state_dict(read.state_dict())
    assert [_dali_values(b) for b in feed] == [_dali_values(b) for b in given]


def test_dali_pipeline_resumes_exactly_from_the_state_after_its_runs(imagenet):
    """DALI asks the feed ahead of pipe.run() (its prefetch queue), so the feed's state_dict between runs is
    ahead of the training step, and a resume from it lost the batches in between (a user trial: one batch per
    resume at prefetch_queue_depth 2). state_after(runs) is the state after the batches the runs returned."""
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    from dlstore.adapters.dali import dali_pipeline

    def make():
        return dali_pipeline(imagenet, 4, device="cpu", train=False, size=24, layout="NHWC", dtype="uint8",
                             num_threads=1, shuffle="block", buffer_size=4, seed=3, prefetch_queue_depth=3)

    def rows(out):
        images, labels = out
        return [(int(np.asarray(i).sum()), label) for i, label in zip(images, labels.as_array().tolist())]

    def epochs(pipe, n=2):
        got = []
        for _ in range(n):
            try:
                while True:
                    got += rows(pipe.run())
            except StopIteration:
                pipe.reset()
        return got

    whole = epochs(make())
    assert len(whole) == 36
    for runs in (2, 5):  # mid-epoch; the epoch's last batch (18 records in batches of 4)
        pipe = make()
        before = []
        for _ in range(runs):
            before += rows(pipe.run())
        feed = pipe.dlstore_samples
        state = feed.state_after(runs)
        if runs < 5:  # DALI asked ahead, within the epoch
            assert feed.batches_handed > runs and feed.state_dict() != state
        else:
            assert (state["epoch"], state["sample_in_epoch"]) == (1, 0)
        again = make()
        again.dlstore_samples.load_state_dict(state)
        assert before + epochs(again, 2 if runs < 5 else 1) == whole, runs
    with pytest.raises(ValueError, match="no state after 99 batches"):
        make().dlstore_samples.state_after(99)


def test_dali_feed_refuses_a_state_of_another_kind_and_stays_where_it_was(imagenet):
    # A bare KeyError or TypeError; and a state the source refused had moved the feed already (user trial).
    from dlstore.adapters.dali import EncodedSamples

    def make():
        return EncodedSamples(dlstore.Dataset(imagenet, shuffle="block", buffer_size=4, batch_size=4, seed=3), 4)

    whole = [labels.tolist() for _, labels in make()]
    feed = make()
    for bad in (None, {"sample_in_epoch": 4}, {"epoch": 0, "batches_seen": 1}, {"epoch": "x", "sample_in_epoch": 4},
                {"epoch": 0, "sample_in_epoch": -4}):
        with pytest.raises(ValueError, match="^not a DALI feed state"):
            feed.load_state_dict(bad)
    other = dlstore.Dataset(imagenet, shuffle="global", batch_size=4, seed=3)
    with pytest.raises(dlstore.DlstoreError, match="shuffle global"):
        feed.load_state_dict({"epoch": 0, "sample_in_epoch": 8, "source": dict(other.state_dict(), sample_in_epoch=8)})
    assert (feed.epoch, feed.sample_in_epoch) == (0, 0) and [labels.tolist() for _, labels in feed] == whole


def test_dali_feed_warns_when_its_source_is_restored_after_it(imagenet):
    # A checkpoint restoring the feed, then its source with another point: the later load wins, and says so.
    from dlstore.adapters.dali import EncodedSamples

    feed = EncodedSamples(dlstore.Dataset(imagenet, shuffle="block", buffer_size=4, batch_size=4, seed=3), 4)
    feed.load_state_dict({"epoch": 0, "sample_in_epoch": 4})
    feed.source.load_state_dict(dict(feed.source.state_dict(), sample_in_epoch=8))
    with pytest.warns(RuntimeWarning, match="after this DALI feed's own load_state_dict"):
        assert (feed.epoch, feed.sample_in_epoch) == (0, 8)


def test_dali_feed_resumes_after_records_the_source_skipped(tmp_path):
    from dlstore.adapters.dali import EncodedSamples

    generate_imagenet(tmp_path, shards=2, records_per_shard=9, image_size=(48, 80), progress=False)
    dlstore.Dataset(tmp_path)  # the manifest, made before the damage
    corrupt_unnoticed(sorted(p for p in tmp_path.iterdir() if not p.name.startswith("."))[0], (1, 6))

    def make():
        source = dlstore.Dataset(tmp_path, shuffle="block", buffer_size=4, batch_size=4, seed=3, on_error="skip")
        return EncodedSamples(source, 4, last_batch="FILL")

    for load in (None, _into_the_source):  # the feed's state, or the source's loaded into the source
        assert_resumes_exactly(make, stops=[1, 2, 3, 4], run=iter, values=_dali_values, load=load)
