"""Exactly-once sharding of an epoch over ranks x workers, its order, and where reading restarts."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlstore.errors import PlacementError
from dlstore.placement.sharding import REMAINDERS, SHUFFLES, EpochPlan, Piece
from dlstore.placement.shuffle import buffer_order, global_permutation, shard_order
from dlstore.placement.world import World

counts_st = st.lists(st.integers(0, 25), min_size=0, max_size=12)
options_st = st.fixed_dictionaries({
    "seed": st.integers(0, 2**32),
    "epoch": st.integers(0, 6),
    "shuffle_shards": st.booleans(),
    "shuffle": st.sampled_from(sorted(SHUFFLES)),
    "buffer_size": st.integers(1, 9),
    "block_records": st.integers(1, 6),
    "block_window": st.integers(0, 4),
    "batch_size": st.integers(1, 5),
})


def all_samples(counts):
    return Counter((s, r) for s, n in enumerate(counts) for r in range(n))


def consumers_of(size, workers):
    """Every consumer index of a world, found through World the way a reader finds its own."""
    return [World(rank=r, size=size, local_rank=0, local_size=1).with_worker(w, workers).consumer
            for r in range(size) for w in range(workers)]


def emitted(plan, consumer):
    shards, records = plan.samples(consumer)
    return list(zip(shards.tolist(), records.tolist()))


@settings(max_examples=300, deadline=None)
@given(counts=counts_st, size=st.integers(1, 9), workers=st.integers(1, 3),
       remainder=st.sampled_from(sorted(REMAINDERS)), options=options_st)
def test_every_sample_once_across_ranks_and_workers(counts, size, workers, remainder, options):
    plan = EpochPlan(counts, size * workers, remainder=remainder, **options)
    consumers = consumers_of(size, workers)
    assert sorted(consumers) == list(range(size * workers))
    seen = Counter()
    sizes = []
    for c in consumers:
        got = emitted(plan, c)
        assert len(got) == plan.num_samples(c)
        seen.update(got)
        sizes.append(len(got))
        batches = plan.batch_sizes(c)  # the same batch count everywhere: no rank waits for another
        assert len(batches) == plan.num_batches and batches.sum() == len(got)
        assert np.all(batches[:-1] == plan.batch_size) and (len(batches) == 0 or 0 <= batches[-1] <= plan.batch_size)
    expected = all_samples(counts)
    total, n_consumers, batch = sum(counts), size * workers, options["batch_size"]
    assert set(seen) <= set(expected)
    if remainder == "uneven":
        assert seen == expected  # exactly once
        assert max(sizes) - min(sizes) <= 1
    elif remainder == "drop":
        assert all(v == 1 for v in seen.values())  # at most once
        assert len(set(sizes)) == 1 and sizes[0] % batch == 0
        assert total - sum(sizes) < n_consumers * (batch + 1)
    else:  # pad
        assert set(seen) == set(expected)  # at least once
        assert len(set(sizes)) == 1 and sizes[0] % batch == 0
        if total:
            assert max(seen.values()) - min(seen.values()) <= 1  # the wrap-around is even
            if sum(sizes) <= 2 * total:
                assert max(seen.values()) <= 2
            assert sum(sizes) - total < n_consumers * batch
        else:
            assert sum(sizes) == 0


@settings(max_examples=150, deadline=None)
@given(counts=counts_st, consumers=st.integers(1, 9), remainder=st.sampled_from(sorted(REMAINDERS)),
       options=options_st)
def test_pieces_describe_the_read_sequence(counts, consumers, remainder, options):
    plan = EpochPlan(counts, consumers, remainder=remainder, **options)
    for c in range(consumers):
        pieces = plan.pieces(c)
        assert all(isinstance(p, Piece) and 0 <= p.start < p.stop <= counts[p.shard] for p in pieces)
        from_pieces = [(p.shard, r) for p in pieces for r in range(p.start, p.stop)]
        shards, records = plan.read_sequence(c)
        assert from_pieces == list(zip(shards.tolist(), records.tolist()))
        if options["shuffle"] in ("none", "buffer"):  # sequential reading: no two neighbouring pieces could be one
            for a, b in zip(pieces, pieces[1:]):
                assert not (a.shard == b.shard and a.stop == b.start)


@settings(max_examples=150, deadline=None)
@given(counts=counts_st, consumers=st.integers(1, 9), options=options_st)
def test_consumers_read_contiguous_slices_of_one_global_sequence(counts, consumers, options):
    options = dict(options, shuffle="none")
    plan = EpochPlan(counts, consumers, remainder="uneven", **options)
    sequence = [(int(s), r) for s in plan.shard_order for r in range(counts[s])]
    joined = [x for c in range(consumers) for x in emitted(plan, c)]
    assert joined == sequence
    # Each rank builds its own plan, without communication, and gets the same order.
    again = [EpochPlan(list(counts), consumers, remainder="uneven", **options) for _ in range(2)]
    assert all(np.array_equal(p.shard_order, plan.shard_order) for p in again)
    assert [x for c in range(consumers) for x in emitted(again[c % 2], c)] == sequence


def test_pad_wraps_to_the_start_of_the_epoch():
    plan = EpochPlan([3, 4], 3, shuffle_shards=False, remainder="pad", batch_size=2)
    assert plan.num_batches == 2
    everything = [x for c in range(3) for x in emitted(plan, c)]
    sequence = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert everything == (sequence * 2)[:12]
    assert plan.pieces(1) == [Piece(1, 1, 4), Piece(0, 0, 1)]  # runs off the end, on from the start
    assert plan.pieces(2) == [Piece(0, 1, 3), Piece(1, 0, 2)]


def test_uneven_short_consumer_ends_with_a_smaller_or_empty_batch():
    plan = EpochPlan([9], 2, remainder="uneven", batch_size=2)  # 4 and 5 records
    assert plan.num_batches == 3
    assert plan.batch_sizes(0).tolist() == [2, 2, 0] and plan.batch_sizes(1).tolist() == [2, 2, 1]
    plan = EpochPlan([2], 4, remainder="uneven", batch_size=3)  # fewer records than consumers
    assert [plan.batch_sizes(c).tolist() for c in range(4)] == [[0], [1], [0], [1]]
    assert EpochPlan([], 3, remainder="uneven").num_batches == 0


def test_drop_and_pad_sizes():
    plan = EpochPlan([10, 7], 4, remainder="drop", batch_size=2)
    assert [plan.num_samples(c) for c in range(4)] == [4] * 4 and plan.num_batches == 2
    plan = EpochPlan([10, 7], 4, remainder="pad", batch_size=2)
    assert [plan.num_samples(c) for c in range(4)] == [6] * 4 and plan.num_batches == 3
    plan = EpochPlan([1], 3, remainder="pad", batch_size=2)  # one record, wrapped six times
    assert sum(plan.num_samples(c) for c in range(3)) == 6


def test_same_seed_same_plan_and_epochs_differ():
    counts = [50] * 40
    a = EpochPlan(counts, 4, seed=7, epoch=3, shuffle="global")
    b = EpochPlan(counts, 4, seed=7, epoch=3, shuffle="global")
    assert all(emitted(a, c) == emitted(b, c) for c in range(4))
    assert np.array_equal(a.shard_order, b.shard_order)
    orders = {tuple(shard_order(40, 7, e)) for e in range(5)}
    assert len(orders) == 5  # a new shard order every epoch
    assert tuple(shard_order(40, 8, 3)) != tuple(a.shard_order)
    assert tuple(global_permutation(100, 7, 0)) != tuple(global_permutation(100, 7, 1))
    assert shard_order(5, 1, 0, shuffle=False).tolist() == [0, 1, 2, 3, 4]


def test_order_does_not_depend_on_numpys_global_state():
    np.random.seed(1)
    first = shard_order(50, 3, 2)
    np.random.seed(2)
    np.random.random(100)
    assert np.array_equal(first, shard_order(50, 3, 2))


def test_shard_order_is_pinned():
    # The order every rank and every version of dlstore must agree on: a change here breaks
    # resuming runs started with an older dlstore.
    assert shard_order(10, 0, 0).tolist() == PINNED_ORDER


PINNED_ORDER = [4, 7, 8, 6, 1, 2, 9, 0, 5, 3]  # recorded with numpy 2 when the order was defined


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 300), buffer_size=st.integers(1, 40), seed=st.integers(0, 2**32),
       epoch=st.integers(0, 3), consumer=st.integers(0, 8))
def test_buffer_order_is_a_permutation_a_buffer_can_produce(n, buffer_size, seed, epoch, consumer):
    order = buffer_order(n, buffer_size, seed, epoch, consumer)
    assert sorted(order.tolist()) == list(range(n))
    # Output k is among the first k + buffer_size records read: the reader holds at most
    # buffer_size records.
    assert np.all(order < np.arange(n) + buffer_size)
    held, read, most = set(), 0, 0
    for k in range(n):
        while order[k] not in held:
            held.add(read)
            read += 1
        most = max(most, len(held))
        held.remove(order[k])
    assert most <= buffer_size


def test_buffer_order_edges_and_seeding():
    assert buffer_order(10, 1, 0, 0, 0).tolist() == list(range(10))  # a buffer of one changes nothing
    full = buffer_order(50, 100, 0, 0, 0)
    assert full.tolist() != list(range(50))
    assert buffer_order(50, 8, 0, 0, 0).tolist() != buffer_order(50, 8, 0, 0, 1).tolist()  # per consumer
    assert buffer_order(50, 8, 0, 0, 0).tolist() != buffer_order(50, 8, 0, 1, 0).tolist()  # per epoch
    with pytest.raises(PlacementError):
        buffer_order(5, 0, 0, 0, 0)


def _resume_by_restart(plan, consumer, k):
    """A reader restarting after ``k`` emitted samples: reads from the restart point, skips what was
    emitted, emits in the plan's order, holding as few records as it can."""
    r = plan.restart(consumer, k)
    pieces = plan.pieces(consumer)
    assert sum(len(p) for p in pieces[:r.piece]) + r.offset == r.local
    shards, records = plan.read_sequence(consumer)
    n = len(shards)
    order = plan.order(consumer)
    order = np.arange(n) if order is None else order
    skip = set(r.skip.tolist())
    held, out, nxt, most = set(), [], k, 0
    for local in range(r.local, n):
        if local in skip:
            continue
        held.add(local)
        most = max(most, len(held))
        while nxt < n and int(order[nxt]) in held:
            held.remove(int(order[nxt]))
            out.append((int(shards[order[nxt]]), int(records[order[nxt]])))
            nxt += 1
    assert not held and nxt == n
    return out, most


@settings(max_examples=80, deadline=None)
@given(counts=st.lists(st.integers(0, 12), min_size=1, max_size=6), consumers=st.integers(1, 4),
       remainder=st.sampled_from(sorted(REMAINDERS)), options=options_st)
def test_restart_at_every_position_gives_the_rest_exactly(counts, consumers, remainder, options):
    plan = EpochPlan(counts, consumers, remainder=remainder, **options)
    for c in range(consumers):
        full = emitted(plan, c)
        for k in range(len(full) + 1):
            rest, most = _resume_by_restart(plan, c, k)
            assert rest == full[k:]
            if options["shuffle"] == "buffer":
                assert most <= plan.buffer_size
        with pytest.raises(PlacementError):
            plan.restart(c, len(full) + 1)


def test_restart_points_into_pieces():
    plan = EpochPlan([5, 5], 1, shuffle_shards=False)
    r = plan.restart(0, 7)
    assert (r.local, r.piece, r.offset) == (7, 1, 2)
    assert plan.pieces(0)[r.piece].start + r.offset == 2
    end = plan.restart(0, 10)
    assert (end.piece, end.offset) == (2, 0)


def test_global_shuffle_merges_runs_and_mixes_shards():
    plan = EpochPlan([1000] * 4, 2, shuffle="global", seed=3)
    shards, records = plan.samples(0)
    assert len(set(shards.tolist())) == 4
    assert len(plan.pieces(0)) > 900  # a random permutation rarely has consecutive records
    plan = EpochPlan([4], 1, shuffle="global", seed=3)
    assert sum(len(p) for p in plan.pieces(0)) == 4


@pytest.mark.parametrize("kwargs,message", [
    ({"counts": [1, -1], "num_consumers": 1}, "negative"),
    ({"counts": [1], "num_consumers": 0}, "num_consumers"),
    ({"counts": [1], "num_consumers": 1, "shuffle": "perfect"}, "unknown shuffle"),
    ({"counts": [1], "num_consumers": 1, "remainder": "wrap"}, "unknown remainder"),
    ({"counts": [1], "num_consumers": 1, "batch_size": 0}, "batch_size"),
    ({"counts": [1], "num_consumers": 1, "seed": -1}, "seed"),
    ({"counts": [[1, 2]], "num_consumers": 1}, "counts"),
])
def test_bad_arguments(kwargs, message):
    counts = kwargs.pop("counts")
    consumers = kwargs.pop("num_consumers")
    with pytest.raises(PlacementError, match=message):
        EpochPlan(counts, consumers, **kwargs)


def test_consumer_out_of_range():
    plan = EpochPlan([3], 2)
    with pytest.raises(PlacementError, match="consumer 2"):
        plan.pieces(2)


def test_block_shuffle_reads_whole_blocks_in_seeded_order_within_windows():
    counts = [100, 37, 64]
    plan = EpochPlan(counts, 1, shuffle="block", block_records=10, block_window=3, seed=2, shuffle_shards=False)
    pieces = plan.pieces(0)
    # Every piece is one whole block: records 10j..10j+9 of its shard (the shard's last may be short).
    assert all(p.start % 10 == 0 and (len(p) == 10 or p.stop == counts[p.shard]) for p in pieces)
    in_order = sorted((p.shard, p.start) for p in pieces)
    assert len(in_order) == len(set(in_order)) == 10 + 4 + 7  # each block once
    # Blocks move only within their window of 3 neighbouring blocks of the sequence, in a seeded order.
    window_of = {b: i // 3 for i, b in enumerate(in_order)}
    assert [window_of[(p.shard, p.start)] for p in pieces] == sorted(window_of.values())
    assert [(p.shard, p.start) for p in pieces] != in_order
    again = EpochPlan(counts, 1, shuffle="block", block_records=10, block_window=3, seed=2, shuffle_shards=False)
    assert again.pieces(0) == pieces
    other_epoch = EpochPlan(counts, 1, shuffle="block", block_records=10, block_window=3, seed=2, epoch=1,
                            shuffle_shards=False)
    assert other_epoch.pieces(0) != pieces
    # A window of 0 reorders the blocks over the whole share.
    whole = EpochPlan(counts, 1, shuffle="block", block_records=10, block_window=0, seed=2, shuffle_shards=False)
    assert sorted((p.shard, p.start) for p in whole.pieces(0)) == in_order


def test_a_shuffle_is_one_object_and_one_registry_entry(monkeypatch):
    from dlstore.placement import sharding

    assert all(isinstance(s, sharding.Shuffle) and s.name == n for n, s in SHUFFLES.items())
    assert [n for n, s in SHUFFLES.items() if s.random_reads] == ["global"]
    assert not SHUFFLES["global"].sequential and SHUFFLES["block"].sequential
    assert "shuffle buffer of 10 records" in SHUFFLES["buffer"].describe(50, block_records=4, block_window=0,
                                                                           buffer_size=10, mean_record_bytes=100)

    def backwards(plan, start, stop, consumer):  # the span's records, last first, one piece each
        shards, starts, stops = sharding._sequential_pieces(plan, start, stop, consumer)
        records = np.repeat(shards, stops - starts), sharding.expand_runs(starts, stops - starts)
        return records[0][::-1], records[1][::-1], records[1][::-1] + 1

    monkeypatch.setitem(SHUFFLES, "backwards", sharding.Shuffle("backwards", backwards, False, True, "last first"))
    plan = EpochPlan([3, 2], 1, shuffle="backwards", shuffle_shards=False)
    assert plan.samples(0)[1].tolist() == [1, 0, 2, 1, 0]
    with pytest.raises(PlacementError, match="unknown shuffle 'sideways'"):
        EpochPlan([3], 1, shuffle="sideways")


def test_a_batch_size_that_dwarfs_the_data_is_refused_under_pad():
    """batch_size=10**12 over 300 records: pad planned 10**12 reads of repeats, and exhausted memory."""
    with pytest.raises(PlacementError, match=r"batch_size 1,000,000,000,000 over the epoch's 300 records: "
                                              r"remainder='pad' would read 4,000,000,000,000 records"):
        EpochPlan([300], 4, remainder="pad", batch_size=10**12)
    assert EpochPlan([300], 4, remainder="uneven", batch_size=10**12).num_batches == 1  # one short batch each
    assert EpochPlan([1], 3, remainder="pad", batch_size=2).num_batches == 1  # small repeats stay allowed
