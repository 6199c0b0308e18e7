"""The seeded random orders of placement: shards in an epoch, a permutation of all records computed
at any position, and the order a shuffle buffer emits records in.

Random numbers come from raw Philox output keyed by a :class:`numpy.random.SeedSequence` of
(seed, epoch, purpose, consumer), and permutations are ``argsort`` of those raw words, so the order
depends on no numpy version's sampling algorithm and no global random state.
"""
from __future__ import annotations

import numpy as np

from dlstore.errors import PlacementError

__all__ = ["random_words", "shard_order", "permute", "global_permutation", "buffer_order"]

# Purposes of the random streams: each has its own key, so that e.g. turning the shard shuffle on
# does not change the buffer order.
_STREAM_SHARDS = 1
_STREAM_GLOBAL = 2
_STREAM_BUFFER = 3
_STREAM_BLOCKS = 4


def random_words(n: int, seed: int, epoch: int, stream: int, *more: int) -> np.ndarray:
    """``n`` raw 64-bit Philox words keyed by (seed, epoch, stream, *more); the same everywhere."""
    key = np.random.SeedSequence([int(seed), int(epoch), int(stream), *(int(m) for m in more)])
    return np.random.Philox(key).random_raw(int(n))


def _permutation(n: int, seed: int, epoch: int, stream: int, *more: int) -> np.ndarray:
    # Sorting random words gives a uniform permutation defined by Philox alone. The low bits of
    # each word are replaced by its index, so that no two keys are equal and every sort algorithm
    # (numpy's default is not stable) gives the same order everywhere.
    words = random_words(n, seed, epoch, stream, *more)
    if n > 1:
        bits = np.uint64(int(n - 1).bit_length())
        words = (words >> bits << bits) | np.arange(n, dtype=np.uint64)
    return np.argsort(words).astype(np.int64)


def shard_order(num_shards: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The epoch's order of shard indices: a seeded permutation, or ``0..num_shards-1``."""
    if not shuffle:
        return np.arange(num_shards, dtype=np.int64)
    return _permutation(num_shards, seed, epoch, _STREAM_SHARDS)


# A Feistel network over the smallest even number of bits that covers the domain, walked until it
# lands inside it: a seeded bijection of 0..total-1 computed at any position without the others.
_FEISTEL_ROUNDS = 6
_MIX_1 = np.uint64(0x9E3779B97F4A7C15)
_MIX_2 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_3 = np.uint64(0x94D049BB133111EB)


def _feistel_round(half: np.ndarray, key: np.uint64, mask: np.uint64) -> np.ndarray:
    x = (half ^ key) * _MIX_1  # splitmix64's finaliser: every input bit reaches every output bit
    x = (x ^ (x >> np.uint64(30))) * _MIX_2
    x = (x ^ (x >> np.uint64(27))) * _MIX_3
    return (x ^ (x >> np.uint64(31))) & mask


def permute(positions: np.ndarray, total: int, seed: int, epoch: int, stream: int = _STREAM_GLOBAL,
            *more: int) -> np.ndarray:
    """Where a seeded permutation of ``0..total-1`` sends each of ``positions``, each computed on its
    own: a cost in the positions asked for, not in ``total``.

    The permutation is a six-round Feistel network keyed by (seed, epoch, stream, *more) over the
    smallest even number of bits covering ``total`` (at most four times as many values), applied
    again to a value that lands outside ``0..total-1`` until it lands inside (cycle walking), which
    keeps it a bijection of ``0..total-1``.
    """
    x = np.asarray(positions, dtype=np.int64)
    if total < 0 or (len(x) and (x.min() < 0 or x.max() >= total)):
        raise PlacementError(f"positions must lie in 0..{total - 1}")
    if total <= 1:
        return x.copy()
    bits = max(2, int(total - 1).bit_length())
    half = np.uint64((bits + 1) // 2)
    mask = np.uint64((1 << int(half)) - 1)
    keys = random_words(_FEISTEL_ROUNDS, seed, epoch, stream, *more)
    bound = np.uint64(total)

    def encrypt(v: np.ndarray) -> np.ndarray:
        left, right = v >> half, v & mask
        for key in keys:
            left, right = right, left ^ _feistel_round(right, key, mask)
        return (left << half) | right

    out = encrypt(x.astype(np.uint64))
    outside = np.flatnonzero(out >= bound)
    while len(outside):
        out[outside] = encrypt(out[outside])
        outside = outside[out[outside] >= bound]
    return out.astype(np.int64)


def global_permutation(total: int, seed: int, epoch: int) -> np.ndarray:
    """A seeded permutation of all ``total`` records of the epoch (positions in shard index order):
    position ``i`` of the epoch holds record ``global_permutation(...)[i]``. A consumer computes only
    its own positions with :func:`permute`; this materialises all of them."""
    return permute(np.arange(total, dtype=np.int64), total, seed, epoch)


def buffer_order(n: int, buffer_size: int, seed: int, epoch: int, consumer: int) -> np.ndarray:
    """The order in which a shuffle buffer of ``buffer_size`` emits a sequence of ``n`` records.

    The buffer is filled with the first records; then each record read replaces a randomly chosen
    one, which is emitted; at the end what the buffer holds is emitted in random order. Computed on
    indices only, so a reader can emit ``order[k]`` once it has read it, holding at most
    ``buffer_size`` records: ``order[k] < k + buffer_size`` for every ``k``.

    Vectorised: at step ``k`` the buffer emits the occupant of slot ``j_k`` (a random word modulo the
    size), which entered that slot at the slot's previous step (as record ``step + size``) or, at its
    first, is the slot's initial record. Grouping the steps by slot gives every step's output at once.

    Returns
    -------
    numpy.ndarray
        A permutation of ``0..n-1`` (int64).
    """
    if buffer_size < 1:
        raise PlacementError(f"buffer_size must be at least 1, not {buffer_size}")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    size = min(int(buffer_size), int(n))
    words = random_words(n, seed, epoch, _STREAM_BUFFER, consumer)
    steps = int(n) - size  # steady state: one in, one out
    out = np.empty(n, dtype=np.int64)
    occupant = np.arange(size, dtype=np.int64)
    if steps:
        slot = (words[:steps] % np.uint64(size)).astype(np.int64)
        by_slot = np.argsort(slot, kind="stable")  # each slot's steps, in step order
        slots = slot[by_slot]
        first = np.ones(steps, dtype=bool)
        first[1:] = slots[1:] != slots[:-1]
        previous = np.empty(steps, dtype=np.int64)
        previous[1:] = by_slot[:-1]
        out[by_slot] = np.where(first, slots, previous + size)
        last = np.append(np.flatnonzero(first)[1:], steps) - 1
        occupant[slots[last]] = by_slot[last] + size  # what each slot holds at the end
    # Drain: the last occupants in a random order (raw words, ties broken by index as in _permutation).
    drain = words[steps:]
    if size > 1:
        bits = np.uint64(int(size - 1).bit_length())
        drain = (drain >> bits << bits) | np.arange(size, dtype=np.uint64)
    out[steps:] = occupant[np.argsort(drain)]
    return out
