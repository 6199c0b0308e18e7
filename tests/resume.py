"""One save/resume check for everything that resumes: the sources (``Dataset``, ``open_records``), the
``Loader``, and the adapters over them.

A *resumable* has ``state_dict()`` / ``load_state_dict()`` and is read one epoch at a time by a
``run(obj)`` function given to the check (``obj.batches()`` for a source, ``iter(obj)`` for a loader or
an adapter). The check reads ``epochs`` epochs straight through; then, for each stop, it reads that
many items in a fresh object, saves its state (through JSON, as a checkpoint would), loads it into
another fresh object (by its ``load_state_dict``, or as ``load`` says) and reads on to the same epoch.
Both runs must give the same samples in the same order, with nothing lost or repeated across the stop, in
whatever batches they come.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Iterable, List, Optional, Sequence


def loader_rows(batch) -> List[bytes]:
    """Each row of a loader's (or adapter's) batch, all its arrays together, as bytes."""
    import numpy as np

    arrays = [np.asarray(batch[name]) for name in sorted(batch)]
    return [b"|".join(a[i].tobytes() for a in arrays) for i in range(len(arrays[0]))]


def _epoch_of(obj) -> int:
    return int(obj.state_dict()["epoch"])


def assert_resumes_exactly(make: Callable[[], Any], stops: Sequence[int], *, run: Callable[[Any], Iterable],
                           values: Callable[[Any], List[Any]], epochs: int = 2,
                           load: Optional[Callable[[Any, Any], None]] = None) -> None:
    """Fails unless every stop resumes to exactly the samples of an uninterrupted run.

    Parameters
    ----------
    make : callable
        A fresh resumable, each time at the same starting state (its epoch: the first read).
    stops : sequence of int
        Items (batches) read before saving; a stop may lie in a later epoch than the first.
    run : callable
        ``run(obj)``: an iterator over the rest of ``obj``'s current epoch; finishing it moves ``obj``
        to the next epoch.
    values : callable
        ``values(item)``: the samples of one item as comparable values (copies: buffers are reused).
    epochs : int
    load : callable, optional
        ``load(obj, state)``: how the saved state reaches the fresh object (default:
        ``obj.load_state_dict(state)``), e.g. into the source a loader reads.
    """
    reference: List[Any] = []
    straight = make()
    end = _epoch_of(straight) + epochs
    for _ in range(epochs):
        for item in run(straight):
            reference += values(item)
    assert reference, "the check needs samples to compare"
    for stop in stops:
        first = make()
        got: List[Any] = []
        taken = 0
        while taken < stop and _epoch_of(first) < end:
            it = iter(run(first))
            for item in it:
                got += values(item)
                taken += 1
                if taken == stop:
                    break
            close = getattr(it, "close", None)
            if close is not None:
                close()
        state = json.loads(json.dumps(first.state_dict()))
        resumed = make()
        if load is None:
            resumed.load_state_dict(state)
        else:
            load(resumed, state)
        for _ in range(epochs + 1):  # bounded: a resumable that never moves on fails below, not hangs
            if _epoch_of(resumed) >= end:
                break
            for item in run(resumed):
                got += values(item)
        assert len(got) == len(reference), f"stop {stop}: {len(got)} samples, expected {len(reference)}"
        for i, (a, b) in enumerate(zip(got, reference)):
            assert a == b, f"stop {stop}: sample {i} differs"
