"""Resuming mid-epoch gives exactly the rest of the sequence; a new world size only at an epoch boundary.

:func:`check_resume` is the generic save-at-every-position harness (STYLE habit 6): it takes a
factory of any iterator with ``state_dict``/``load_state_dict`` whose ``iter()`` yields the rest of
the current epoch, and can serve every loader in the project.
"""
from __future__ import annotations

import json
from collections import Counter
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlstore.errors import PlacementError
from dlstore.placement.sharding import REMAINDERS, SHUFFLES, SamplerState

from tests.index_model import IndexSampler
from tests.resume import assert_resumes_exactly


def _take(it, count: int) -> list:
    """The next ``count`` items across epochs (one ``iter()`` per epoch; stopping early keeps the place)."""
    out: list = []
    while len(out) < count:
        before, epoch = len(out), it.state_dict()["epoch"]
        for x in it:
            out.append(x)
            if len(out) == count:
                break
        if len(out) == before and it.state_dict()["epoch"] == epoch:
            raise AssertionError(f"the iterator is stuck in epoch {epoch}")
    return out


def _rest(it, end_epoch: int) -> list:
    """Everything up to the end of epoch ``end_epoch - 1``."""
    out: list = []
    while it.state_dict()["epoch"] < end_epoch:
        epoch = it.state_dict()["epoch"]
        out.extend(it)
        if it.state_dict()["epoch"] == epoch:
            raise AssertionError(f"a whole iteration left the iterator in epoch {epoch}")
    return out


def check_resume(make: Callable[[], IndexSampler], epochs: int = 2) -> int:
    """:func:`tests.resume.assert_resumes_exactly` stopping after every sample of ``epochs`` epochs, plus
    a check that saving leaves the saved iterator's own rest unchanged. Returns the samples' count."""
    reference = make()
    full = _rest(reference, reference.state_dict()["epoch"] + epochs)
    if full:
        assert_resumes_exactly(make, range(len(full) + 1), run=iter, values=lambda item: [item], epochs=epochs)
    for p in (0, len(full) // 2, len(full)):
        first = make()
        end = first.state_dict()["epoch"] + epochs
        assert _take(first, p) == full[:p]
        first.state_dict()
        assert _rest(first, end) == full[p:], f"continuing after {p} items differs"  # saving is harmless
    return len(full)


options_st = st.fixed_dictionaries({
    "seed": st.integers(0, 2**32),
    "shuffle_shards": st.booleans(),
    "shuffle": st.sampled_from(sorted(SHUFFLES)),
    "buffer_size": st.integers(1, 6),
    "remainder": st.sampled_from(sorted(REMAINDERS)),
    "batch_size": st.integers(1, 4),
})


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 8), min_size=0, max_size=5), consumers=st.integers(1, 4),
       epoch=st.integers(0, 3), options=options_st, data=st.data())
def test_resume_anywhere_over_two_epochs(counts, consumers, epoch, options, data):
    consumer = data.draw(st.integers(0, consumers - 1))
    seed = options.pop("seed")
    check_resume(lambda: IndexSampler(counts, consumers, consumer, seed=seed, epoch=epoch, **options), epochs=2)


def test_epochs_differ_and_state_moves_to_the_next_epoch():
    s = IndexSampler([6, 6, 6], 2, 0, seed=4, shuffle="buffer", buffer_size=4)
    first = list(s)
    assert s.state_dict() == {"epoch": 1, "sample_in_epoch": 0, "seed": 4, "num_consumers": 2}
    second = list(s)
    assert len(first) == len(second) == 9 and first != second


def test_harness_catches_a_broken_resume():
    class Forgetful(IndexSampler):  # resumes from the start of the epoch: the harness must notice
        def load_state_dict(self, state):
            super().load_state_dict(dict(state, sample_in_epoch=0))

    with pytest.raises(AssertionError, match="stop 1: 11 samples, expected 10"):
        check_resume(lambda: Forgetful([5, 5], 1, 0), epochs=1)


def test_new_world_size_accepted_at_an_epoch_boundary():
    counts = [7, 0, 5, 9]
    old = IndexSampler(counts, 4, 1, seed=2)
    list(old)  # one whole epoch
    state = old.state_dict()
    assert state["sample_in_epoch"] == 0 and state["epoch"] == 1
    seen = Counter()
    for c in range(3):  # every consumer of the new world resumes from it ...
        s = IndexSampler(counts, 3, c, seed=0, remainder="uneven")
        s.load_state_dict(state)
        assert s.state_dict()["num_consumers"] == 3 and s.state_dict()["seed"] == 2
        seen.update(list(s))
    # ... and together they read epoch 1 exactly once
    assert seen == Counter((s, r) for s, n in enumerate(counts) for r in range(n))


def test_new_world_size_refused_mid_epoch():
    old = IndexSampler([10, 10], 4, 0)
    _take(old, 3)
    new = IndexSampler([10, 10], 2, 0)
    with pytest.raises(PlacementError, match="epoch boundary"):
        new.load_state_dict(old.state_dict())
    assert new.state_dict()["sample_in_epoch"] == 0  # unchanged by the refused load


def test_sampler_state_round_trip_and_checks():
    state = SamplerState(epoch=2, sample_in_epoch=5, seed=9, num_consumers=8)
    assert SamplerState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    assert state.for_consumers(8) is state
    with pytest.raises(PlacementError, match="epoch boundary"):
        state.for_consumers(4)
    assert SamplerState(epoch=3, seed=9, num_consumers=8).for_consumers(4).num_consumers == 4
    with pytest.raises(PlacementError, match="missing"):
        SamplerState.from_dict({"epoch": 1})
    with pytest.raises(PlacementError, match="unknown"):
        SamplerState.from_dict(dict(state.to_dict(), rank=1))
    with pytest.raises(PlacementError):
        SamplerState(epoch=-1)


def test_state_past_the_end_of_the_epoch_is_refused():
    s = IndexSampler([3], 1, 0)
    with pytest.raises(PlacementError, match="only 3 samples"):
        s.load_state_dict({"epoch": 0, "sample_in_epoch": 4, "seed": 0, "num_consumers": 1})
