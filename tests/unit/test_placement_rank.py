"""Plans that cost one rank's share: the global shuffle's bijection, and one rank planned alone."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlstore.errors import PlacementError
from dlstore.placement import Layout, World
from dlstore.placement.mounts import assign_mounts, mounts_for, read_in_turns
from dlstore.placement.rank import plan_rank
from dlstore.placement.sharding import EpochPlan
from dlstore.placement.shuffle import global_permutation, permute


@settings(max_examples=200, deadline=None)
@given(total=st.integers(0, 5000), seed=st.integers(0, 2**40), epoch=st.integers(0, 5))
def test_permute_is_a_bijection_computed_at_any_position(total, seed, epoch):
    whole = global_permutation(total, seed, epoch)
    assert sorted(whole.tolist()) == list(range(total))
    if total:
        picked = np.random.default_rng(seed % 1000).integers(0, total, 50)
        assert np.array_equal(permute(picked, total, seed, epoch), whole[picked])


def test_permute_is_seeded_and_refuses_positions_outside():
    assert not np.array_equal(global_permutation(1000, 1, 0), global_permutation(1000, 1, 1))
    assert not np.array_equal(global_permutation(1000, 1, 0), global_permutation(1000, 2, 0))
    assert np.array_equal(global_permutation(1000, 1, 0), global_permutation(1000, 1, 0))
    with pytest.raises(PlacementError, match="0..9"):
        permute(np.array([10]), 10, 0, 0)


def test_permute_sends_a_position_anywhere_evenly():
    # Over 4,000 seeds, where position 0 of 8 lands: each place about 500 times (a biased network
    # with too few rounds or a weak round function piles up on some places).
    landed = np.array([permute(np.array([0]), 8, seed, 0)[0] for seed in range(4000)])
    counts = np.bincount(landed, minlength=8)
    chi2 = float(((counts - 500.0) ** 2 / 500.0).sum())
    assert chi2 < 30, counts  # 7 degrees of freedom: above 30 has probability below 1e-4
    # And neighbouring positions do not stay neighbours.
    whole = global_permutation(100_000, 3, 0)
    assert np.mean(np.abs(np.diff(whole)) == 1) < 0.001


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=30), world=st.integers(1, 7),
       workers=st.integers(1, 3), shuffle=st.sampled_from(["none", "block", "buffer", "global"]),
       seed=st.integers(0, 100), block=st.integers(1, 9), mounts=st.integers(1, 3))
def test_ranks_planned_alone_read_every_record_once(counts, world, workers, shuffle, seed, block, mounts):
    plan = EpochPlan(counts, world * workers, shuffle=shuffle, seed=seed, block_records=block, buffer_size=5,
                     remainder="uneven")
    seen = []
    for consumer in range(world * workers):
        r = plan_rank(plan, consumer, list(range(mounts)))
        emitted = np.arange(len(r.shards)) if r.emit is None else r.emit
        seen += list(zip(r.shards[emitted].tolist(), r.records[emitted].tolist()))
        assert np.array_equal(r.blocks, r.records // block) and set(r.mounts.tolist()) <= set(range(mounts))
    assert sorted(seen) == [(s, i) for s, c in enumerate(counts) for i in range(c)]


@pytest.mark.parametrize("shuffle", ["block", "global"])
@pytest.mark.parametrize("per_rank", [1, 3])
def test_a_rank_reads_its_blocks_through_its_mounts_in_turns(shuffle, per_rank):
    # The planner's choices spelt out with the layout's own functions.
    counts, world, rank, mounts = [37, 0, 120, 64, 5, 80], 4, 2, 5
    plan = EpochPlan(counts, world, shuffle=shuffle, seed=3, epoch=1, block_records=16, buffer_size=20,
                     remainder="pad", batch_size=4)
    layout = Layout.replicated([f"/m{i}" for i in range(mounts)], [f"s{i}" for i in range(len(counts))])
    rank_mounts = assign_mounts(layout, World(rank=rank, size=world), mounts_per_rank=per_rank)
    shards, records = plan.read_sequence(rank)
    chosen = mounts_for(layout, shards, rank_mounts, records // 16)
    turns = read_in_turns(shards, records, records // 16, chosen) if per_rank > 1 else None
    expected = plan.read_plan(rank, 0, reorder=turns)
    for got in (plan_rank(plan, rank, rank_mounts), plan_rank(plan, rank, rank_mounts, layout=layout)):
        assert np.array_equal(got.shards, expected.shards) and np.array_equal(got.records, expected.records)
        assert (got.emit is None and expected.emit is None) or np.array_equal(got.emit, expected.emit)
        assert np.array_equal(got.mounts, chosen if turns is None else chosen[turns])
    # From a resume point on: the same reads' tail.
    later = plan_rank(plan, rank, rank_mounts, emitted=9)
    full = plan_rank(plan, rank, rank_mounts)
    assert np.array_equal(later.mounts, full.mounts[len(full.mounts) - len(later.mounts):])


def test_a_failed_mount_is_remapped():
    plan = EpochPlan([50, 50], 1, block_records=10)
    moved = plan_rank(plan, 0, [0, 1], failed=[1], remap=lambda shards, blocks: np.full(len(shards), 0))
    assert set(moved.mounts.tolist()) == {0}
    assert set(plan_rank(plan, 0, [0, 1]).mounts.tolist()) == {0, 1}
