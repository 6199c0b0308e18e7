"""The pure index model a reader follows: ``(shard, record)`` for one consumer, epoch after epoch,
resumable. Not used by dlstore itself (its sources resume through the same :class:`EpochPlan` and
:class:`SamplerState`); the property tests check placement and resume against it without any I/O.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Mapping, Optional, Sequence

import numpy as np

from dlstore.errors import PlacementError
from dlstore.placement.sharding import EpochPlan, SamplerState


class IndexSampler:
    """``(shard, record)`` for one consumer, epoch after epoch, with ``state_dict`` and
    ``load_state_dict``: the pure index model that a reader follows.

    Each ``iter()`` yields the rest of the current epoch; once its last sample is yielded the
    state moves to the start of the next epoch. Leaving a loop early keeps the position.

    Parameters
    ----------
    counts : sequence of int
        Records per shard.
    num_consumers, consumer : int
        The world's consumer count and this consumer's index.
    seed, epoch : int
        Starting seed and epoch.
    **options
        ``shuffle_shards``, ``shuffle``, ``buffer_size``, ``remainder``, ``batch_size`` as for
        :class:`EpochPlan`.
    """

    def __init__(self, counts: Sequence[int], num_consumers: int, consumer: int, *, seed: int = 0, epoch: int = 0,
                 **options):
        self._counts = np.asarray(counts, dtype=np.int64)
        self._options = options
        self._consumer = consumer
        self._state = SamplerState(epoch=epoch, seed=seed, num_consumers=num_consumers)
        self._plan: Optional[EpochPlan] = None
        self.plan()._check(consumer)  # validates everything now rather than at the first iteration

    def plan(self) -> EpochPlan:
        """The plan of the current epoch."""
        s = self._state
        if self._plan is None or self._plan.epoch != s.epoch or self._plan.seed != s.seed \
                or self._plan.num_consumers != s.num_consumers:
            self._plan = EpochPlan(self._counts, s.num_consumers, seed=s.seed, epoch=s.epoch, **self._options)
        return self._plan

    def __iter__(self):
        plan = self.plan()
        shards, records = plan.samples(self._consumer)
        n, start, epoch = len(shards), self._state.sample_in_epoch, self._state.epoch
        if start >= n:
            self._state = dataclasses.replace(self._state, epoch=epoch + 1, sample_in_epoch=0)
            return
        for k in range(start, n):
            if k + 1 == n:
                self._state = dataclasses.replace(self._state, epoch=epoch + 1, sample_in_epoch=0)
            else:
                self._state = dataclasses.replace(self._state, sample_in_epoch=k + 1)
            yield int(shards[k]), int(records[k])

    def state_dict(self) -> Dict[str, int]:
        return self._state.to_dict()

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resumes from :meth:`state_dict`, possibly saved by a world of another size.

        Raises
        ------
        PlacementError
            When the state is malformed, changes the number of consumers mid-epoch, or points past
            the end of this consumer's epoch.
        """
        loaded = SamplerState.from_dict(state).for_consumers(self._state.num_consumers)
        previous, self._state = self._state, loaded
        n = self.plan().num_samples(self._consumer)
        if loaded.sample_in_epoch > n:
            self._state = previous
            raise PlacementError(f"the state is at sample {loaded.sample_in_epoch} of epoch {loaded.epoch}, but "
                                 f"consumer {self._consumer} has only {n} samples in that epoch")
