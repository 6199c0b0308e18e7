"""The loader over a placement-aware ``dlstore.Dataset``: ranks together see every sample once, agree on the
number of batches even when the epoch splits unevenly, and resume mid-epoch where they stopped."""
import collections

import warnings

import pytest

from dlstore.errors import PlacementError
from dlstore.sources.dataset import Dataset
from dlstore.pipeline import bert_loader
from dlstore.placement.world import World
from dlstore.synthetic import generate_bert

from tests.helpers import corrupt_unnoticed
from tests.resume import assert_resumes_exactly, loader_rows


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert")
    generate_bert(d, shards=3, records_per_shard=23, seq_len=128)  # 69 records: uneven for 4 ranks
    return d


def _rows(batch):
    ids = batch["input_ids"]
    return [ids[i].tobytes() for i in range(len(ids))]


@pytest.mark.parametrize("remainder", ["uneven", "pad", "drop"])
def test_ranks_see_every_sample_once_and_agree_on_batches(bert_dir, remainder):
    everything = collections.Counter()
    for batch in bert_loader(Dataset(bert_dir, world=World(), remainder="uneven"), batch_size=5, last_batch="PARTIAL"):
        everything.update(_rows(batch))
    assert sum(everything.values()) == 69
    seen, counts = collections.Counter(), []
    for rank in range(4):
        ds = Dataset(bert_dir, world=World(rank=rank, size=4), remainder=remainder, batch_size=5, seed=1)
        batches = list(bert_loader(ds, batch_size=5, last_batch="PARTIAL", copy=True))
        counts.append(len(batches))
        for b in batches:
            seen.update(_rows(b))
    assert len(set(counts)) == 1  # no rank would wait for another in a collective
    if remainder == "uneven":
        assert seen == everything
    elif remainder == "drop":
        assert max(seen.values()) == 1 and set(seen) <= set(everything)
    else:
        assert set(seen) == set(everything)


@pytest.mark.parametrize("last_batch", ["FILL", "DROP"])
@pytest.mark.parametrize("ranks,batch", [(4, 5), (4, 3), (3, 2), (5, 4)])
def test_uneven_ranks_agree_on_batches_under_fill_and_drop(bert_dir, last_batch, ranks, batch):
    # Under remainder="uneven" (the adapters' default) only PARTIAL agreed: FILL and DROP yielded as many
    # batches as each rank's own share made, and a rank with one more waits forever in a collective.
    # FILL now tops a short rank up with batches of its last sample repeated (padding, not samples);
    # DROP stops every rank at the full batches of the smallest share. Nothing is yielded twice.
    counts, seen = [], collections.Counter()
    for rank in range(ranks):
        ds = Dataset(bert_dir, world=World(rank=rank, size=ranks), remainder="uneven", seed=1)
        loader = bert_loader(ds, batch_size=batch, last_batch=last_batch, copy=True)
        n = 0
        for b in loader:
            n += 1
            assert len(b["input_ids"]) == batch
            seen.update(_rows(b)[:batch - loader.padding])
        counts.append(n)
        assert loader.batches_per_epoch() == n  # what the adapters give as a length and a cardinality
    assert len(set(counts)) == 1, counts
    assert max(seen.values()) == 1
    if last_batch == "FILL":
        assert sum(seen.values()) == 69  # every sample, once
    else:
        assert sum(seen.values()) == counts[0] * batch * ranks == 69 // ranks // batch * batch * ranks


@pytest.mark.parametrize("remainder", ["pad", "uneven"])
def test_drop_counts_full_batches_of_the_loaders_size_not_the_datasets(bert_dir, remainder):
    # The smallest share's full batches were counted in the Dataset's own batch size (16), and a Loader of
    # batch 4 under DROP stopped after 4 of its 17 batches (review of 90b9e38).
    ds = Dataset(bert_dir, world=World(), remainder=remainder, batch_size=16)
    loader = bert_loader(ds, batch_size=4, last_batch="DROP")
    n = sum(1 for _ in loader)
    assert n == loader.batches_per_epoch() == len(ds) // 4


def test_resume_mid_epoch_through_the_loader(bert_dir):
    def make():
        ds = Dataset(bert_dir, world=World(rank=1, size=2), shuffle="global", remainder="pad", batch_size=4, seed=3)
        return bert_loader(ds, batch_size=4, copy=True)

    assert_resumes_exactly(make, stops=[1, 5, 9], run=iter, values=loader_rows)


def test_a_loader_over_a_dataset_loaded_directly_resumes_there(bert_dir):
    """``dataset.load_state_dict(state)`` rather than the loader's: the loader started its first epoch from the
    start (its own position, sample 0 of epoch 0, put the Dataset back there), reading the records before the
    point again. It starts at the point the Dataset was loaded with, in that epoch: every record once across the
    stop (stop 9 lies in epoch 1), and the batches a loader given the equivalent state yields."""
    def dataset():
        return Dataset(bert_dir, world=World(rank=1, size=2), shuffle="global", remainder="pad", batch_size=4, seed=3)

    def make():
        return bert_loader(dataset(), batch_size=4, copy=True)

    def into_the_dataset(loader, state):
        loader.source.load_state_dict(state["source"])

    assert_resumes_exactly(make, stops=[1, 5, 9], run=iter, values=loader_rows, load=into_the_dataset)

    read = dataset()  # a state the Dataset saved itself, after 3 of its batches
    for _, _ in zip(range(3), read.batches()):
        pass
    saved = read.state_dict()
    loaded = dataset()
    loaded.load_state_dict(saved)  # before the loader is made
    loader = bert_loader(loaded, batch_size=4, copy=True)
    assert (loader.epoch, loader.state_dict()["sample_in_epoch"]) == (0, 12)
    given = make()
    given.load_state_dict({"epoch": 0, "sample_in_epoch": 12, "seed": 0, "source": saved})
    assert [loader_rows(b) for b in loader] == [loader_rows(b) for b in given]


def test_a_dataset_without_a_batch_size_loaded_before_its_loader_resumes(bert_dir):
    """The documented flow, dataset.load_state_dict(state) before the Loader is made, was refused under the
    default remainder="pad": the Dataset, its batch size left to the Loader, compared the state's 4 with 1. It
    takes the state's batch size, and a Loader of another one is refused when made, as the load would be."""
    first = bert_loader(Dataset(bert_dir, shuffle="global", seed=3), batch_size=4, copy=True)
    it = iter(first)
    for _ in range(3):
        next(it)
    saved = first.state_dict()
    rest = [loader_rows(b) for b in it]
    ds = Dataset(bert_dir, shuffle="global", seed=3)  # no batch_size: the Loader's
    ds.load_state_dict(saved["source"])
    loader = bert_loader(ds, batch_size=4, copy=True)
    assert [loader_rows(b) for b in loader] == rest
    other = Dataset(bert_dir, shuffle="global", seed=3)
    other.load_state_dict(saved["source"])
    with pytest.raises(PlacementError, match="saved at sample 12 of epoch 0 with batch size 4; this dataset has "
                                             "batch size 8"):
        bert_loader(other, batch_size=8)


def test_a_loaders_state_and_a_datasets_are_not_taken_for_each_other(bert_dir):
    # Dataset.load_state_dict(loader.state_dict()) loaded with equal seeds (its order check looks at the top
    # level, where a Loader nests the Dataset's state under "source"), and the mirror case too (user trial).
    loader = bert_loader(Dataset(bert_dir, shuffle="block", seed=3), batch_size=4, copy=True)
    it = iter(loader)
    next(it)
    loader_state, dataset_state = loader.state_dict(), loader.source.state_dict()
    del it
    loader.close()
    with pytest.raises(PlacementError, match=r"a consumer's state .* state\['source'\]"):
        Dataset(bert_dir, shuffle="global", seed=3).load_state_dict(loader_state)
    with pytest.raises(ValueError, match="a Dataset's state .* not a loader's"):
        bert_loader(Dataset(bert_dir, shuffle="block", seed=3), batch_size=4).load_state_dict(dataset_state)
    again = Dataset(bert_dir, shuffle="block", seed=3)
    again.load_state_dict(loader_state["source"])  # its part, as the message says
    assert again.resume_point == (0, loader_state["sample_in_epoch"])


def test_a_dataset_state_restored_after_the_loaders_is_taken_with_a_warning(bert_dir):
    """A checkpoint that saves and restores both a Loader and its Dataset: the Dataset's state, saved while the
    loader ran, is ahead of the loader's by what was read ahead, and restored after the loader's it wins (the
    later load) but says so, since the records in between are skipped. Restored alone, no warning."""
    def make():
        return bert_loader(Dataset(bert_dir, shuffle="global", batch_size=4, seed=3), batch_size=4, prefetch=2,
                           copy=True)

    first = make()
    it = iter(first)
    for _ in range(3):
        next(it)
    loader_state, dataset_state = first.state_dict(), first.source.state_dict()
    assert dataset_state["sample_in_epoch"] > loader_state["sample_in_epoch"]  # read ahead
    del it
    first.close()

    alone = make()
    alone.load_state_dict(loader_state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert alone.state_dict()["sample_in_epoch"] == loader_state["sample_in_epoch"]
    both = make()
    both.load_state_dict(loader_state)
    both.source.load_state_dict(dataset_state)
    with pytest.warns(RuntimeWarning, match="after this Loader's own load_state_dict"):
        assert both.state_dict()["sample_in_epoch"] == dataset_state["sample_in_epoch"]


@pytest.mark.parametrize("last_batch", ["DROP", "PARTIAL", "FILL"])
@pytest.mark.filterwarnings("ignore:dlstore loader.*empty batch:RuntimeWarning")  # rank 0 owes one under PARTIAL
def test_a_loader_state_saved_on_an_epochs_last_step_resumes_with_another_world(bert_dir, last_batch):
    """A Loader's state saved in the loop after the epoch's last batch named that epoch and its last sample,
    which a world of another size refused as mid-epoch: it is the next epoch's start, once the batches the
    ranks agreed on are handed out too. Uneven shares of 34 and 35 records in batches of 17: rank 0 ends on a
    full batch (then, under PARTIAL, an agreed empty one), rank 1 on a short one (DROP: every rank stops at 2)."""
    def make(world, epochs=1):
        ds = Dataset(bert_dir, world=world, remainder="uneven", shuffle="global", seed=1)
        return bert_loader(ds, batch_size=17, last_batch=last_batch, epochs=epochs, copy=True)

    ends = []
    for rank in range(2):
        loader = make(World(rank=rank, size=2))
        states = [loader.state_dict() for _ in loader]
        want = [(0, 17), (1, 0)] if last_batch == "DROP" else [(0, 17), (0, 34), (1, 0)]
        assert [(s["epoch"], s["sample_in_epoch"]) for s in states] == want
        assert states[-1]["delivered"] == 0 and states[-1]["source"]["sample_in_epoch"] == 0
        assert loader.state_after(len(states)) == states[-1]
        ends.append(states[-1])
    assert ends[0] == ends[1]
    for rank in range(3):  # epoch 1 over 3 ranks: as a run of two epochs there gives it
        straight = make(World(rank=rank, size=3), epochs=2)
        rows = [loader_rows(b) for b in straight]
        resumed = make(World(rank=rank, size=3))
        resumed.load_state_dict(ends[rank % 2])
        assert [loader_rows(b) for b in resumed] == rows[len(rows) // 2:]
    # The short rank's states, the last step's included, resume in its own world. (Not FILL's: resumed after its
    # last sample, its agreed batch holds zeros, not that sample repeated; padding either way.)
    if last_batch != "FILL":
        assert_resumes_exactly(lambda: make(World(rank=0, size=2)), stops=range(1, 2 * len(want) + 1), run=iter,
                               values=loader_rows)


@pytest.mark.parametrize("shuffle", ["none", "block", "global"])
@pytest.mark.filterwarnings("ignore:dlstore loader.*empty batch:RuntimeWarning")  # the rank tops up what it skipped
def test_resume_after_records_the_source_skipped(tmp_path, shuffle):
    """The source leaves corrupt records out (``on_error="skip"``): the loader's position still counts
    them, so a resume starts where the source stopped, not that many records earlier."""
    generate_bert(tmp_path, shards=2, records_per_shard=23, seq_len=128)
    path = sorted(p for p in tmp_path.iterdir() if not p.name.startswith("."))[1]
    Dataset(tmp_path)  # the manifest, made before the damage
    corrupt_unnoticed(path, (2, 17))

    def make():
        ds = Dataset(tmp_path, world=World(rank=1, size=2), shuffle=shuffle, remainder="pad", batch_size=4, seed=3,
                     on_error="skip", block_size=64 << 10, buffer_size=6)
        return bert_loader(ds, batch_size=4, copy=True)

    assert_resumes_exactly(make, stops=[1, 2, 3, 4, 5, 6, 7], run=iter, values=loader_rows)


@pytest.mark.filterwarnings("ignore:dlstore loader.*empty batch:RuntimeWarning")  # the empty batches are the point
@pytest.mark.parametrize("shuffle", ["none", "global"])
def test_a_resume_after_skipped_records_keeps_the_agreed_empty_batches(tmp_path, shuffle):
    """``remainder="uneven"``: a rank whose share ran short yields empty batches up to the count the
    ranks agree on. Resumed mid-epoch after records its source skipped, it must still yield that count:
    the loader's state carries the samples delivered, not only the source's position (which counts the
    skipped records too)."""
    generate_bert(tmp_path, shards=2, records_per_shard=23, seq_len=128)
    path = sorted(p for p in tmp_path.iterdir() if not p.name.startswith("."))[1]
    Dataset(tmp_path)  # the manifest, made before the damage
    corrupt_unnoticed(path, (1, 2, 3, 17))

    def make():
        ds = Dataset(tmp_path, world=World(rank=1, size=2), shuffle=shuffle, shuffle_shards=False,
                     remainder="uneven", batch_size=4, seed=3, on_error="skip", block_size=64 << 10)
        return bert_loader(ds, batch_size=4, last_batch="PARTIAL", copy=True)

    straight = make()
    agreed = straight.source.num_batches
    rows = [_rows(b) for b in straight]
    assert len(rows) == agreed and [] in rows  # this rank ran short: empty batches fill the count
    for stop in range(1, agreed):
        first = make()
        it = iter(first)
        taken = [_rows(next(it)) for _ in range(stop)]
        it.close()
        resumed = make()
        resumed.load_state_dict(first.state_dict())
        rest = [_rows(b) for b in resumed]
        assert taken + rest == rows, f"stop {stop}: {len(taken) + len(rest)} batches, expected {len(rows)}"


@pytest.mark.parametrize("helper", ["bert_loader", "resnet50_loader"])
def test_a_loader_helper_over_paths_gives_device_to_the_loader(bert_dir, helper):
    """``device=`` on a loader helper is the loader's (decode or parse on the host, then copy to the GPU):
    it was handed to the Dataset, where it only steers gds, and the batches stayed in host memory."""
    import dlstore.pipeline as pipelines
    from dlstore.io import memory
    from dlstore.errors import DlstoreError

    missing = None
    try:
        memory.check_device("cuda:0")
    except DlstoreError as e:
        missing = str(e)
    if missing is None:
        pytest.skip("a CUDA GPU is here: the device path is checked by the GPU tests")
    with pytest.raises(DlstoreError) as e:
        getattr(pipelines, helper)(bert_dir, batch_size=4, device="cuda:0")
    assert str(e.value) == missing
