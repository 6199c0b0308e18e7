# Over 500 lines: one concept, the epoch plan, with the remainder policies and record shuffles it is made of.
"""Which records each consumer reads in one epoch, in which order: exactly once across all ranks and
workers, the same on every rank without communication, and resumable at any sample.

How an epoch is built (see ``docs/placement.md``):

1. The shards are put in a seeded per-epoch order (or kept in index order). Their records, in
   that order, form the epoch's *global sequence* of ``N`` positions.
2. The remainder policy (:data:`REMAINDERS`) cuts the sequence into one contiguous span per
   consumer (``consumer = rank * num_workers + worker``). ``pad`` spans run past ``N`` and wrap
   around to the start of the sequence.
3. The record shuffle (:data:`SHUFFLES`) turns a span into :class:`Piece` record ranges (the
   *read sequence*) and an emission order: ``none`` and ``buffer`` read the span sequentially
   (whole runs of a shard); ``block`` cuts it into blocks of ``block_records`` records of a shard
   and reads them in a seeded order; ``global`` gives each consumer its part of a seeded
   permutation of all ``N`` records. ``block`` and ``buffer`` emit the records read in the order a
   shuffle buffer of ``buffer_size`` records would (:func:`buffer_order`); the others emit them as
   read.
4. :meth:`EpochPlan.read_plan` gives a consumer's read sequence and emission order from any
   resume point as arrays: what the C++ reader takes, once per epoch.

Everything is a pure function of (record counts, number of consumers, seed, epoch, options); the
random orders come from :mod:`dlstore.placement.shuffle`.
"""
from __future__ import annotations

import dataclasses
import functools
import heapq
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from dlstore.errors import PlacementError
from dlstore.placement.shuffle import _STREAM_BLOCKS, _permutation, buffer_order, permute, random_words, shard_order

__all__ = ["Piece", "Restart", "ReadOrder", "EpochPlan", "SamplerState", "REMAINDERS", "Shuffle", "SHUFFLES",
           "shuffle_named", "merge_runs", "interleave_order",
           "cut_blocks", "expand_runs", "shuffle_sizes"]

@dataclass(frozen=True)
class Piece:
    """Records ``start`` (included) to ``stop`` (excluded) of shard ``shard``, read in that order."""

    shard: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Restart:
    """Where reading resumes for a consumer that has emitted ``emitted`` samples of the epoch.

    Attributes
    ----------
    emitted : int
        Samples already emitted (``k``).
    local : int
        Index in the consumer's sequential read sequence (its pieces, concatenated) where reading
        resumes; equal to ``emitted`` unless the shuffle is ``buffer``.
    piece, offset : int
        The same place as a piece index and a record offset within that piece: resume reading
        at record ``pieces[piece].start + offset`` of shard ``pieces[piece].shard``. At the end of
        the epoch ``piece == len(pieces)`` and ``offset == 0``.
    skip : numpy.ndarray
        Sorted local indices at or after ``local`` that were already emitted: with a shuffle buffer
        they are read again but must not be emitted again. Empty for the other shuffles.
    """

    emitted: int
    local: int
    piece: int
    offset: int
    skip: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64), compare=False)


class ReadOrder(NamedTuple):
    """What a consumer reads from a point of its epoch on, as arrays: what crosses into C++ once.

    Attributes
    ----------
    shards, records : numpy.ndarray
        ``(shard, record)`` of each record to read, in reading order (int64).
    emit : numpy.ndarray or None
        The order records are emitted in, as indices into ``shards``/``records`` (each at most
        once: records read again only to reach others are not emitted twice); None when they are
        emitted as read.
    """

    shards: np.ndarray
    records: np.ndarray
    emit: Optional[np.ndarray]


def expand_runs(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Runs of consecutive integers end to end: ``starts[i]``, ``starts[i] + 1``, ... (``lengths[i]``
    of them) for each run ``i`` in turn, as one int64 array."""
    lengths = np.asarray(lengths, dtype=np.int64)
    skip = np.repeat(np.asarray(starts, dtype=np.int64) - (np.cumsum(lengths) - lengths), lengths)
    return skip + np.arange(int(lengths.sum()), dtype=np.int64)


def cut_blocks(shards: np.ndarray, starts: np.ndarray, stops: np.ndarray,
               block_records: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Record runs ``(shard, start, stop)`` cut where they cross a block boundary of their shard.

    Block ``j`` of a shard holds its records ``j * block_records`` to ``(j + 1) * block_records - 1``,
    whoever reads them and in whichever epoch, so a block can always be read through the same mount.
    """
    if len(shards) == 0:
        return _no_pieces()
    k = int(block_records)
    first, last = starts // k, (stops - 1) // k
    parts = last - first + 1
    block = expand_runs(first, parts)
    shards, starts, stops = (np.repeat(a, parts) for a in (shards, starts, stops))
    return shards, np.maximum(starts, block * k), np.minimum(stops, (block + 1) * k)


def shuffle_sizes(mean_record_bytes: float, block_bytes: int, window_bytes: int,
                  buffer_bytes: int) -> Tuple[int, int, int]:
    """``(block_records, block_window, buffer_size)``: the byte sizes of a block, of the block
    shuffle's window (0: the whole share) and of the shuffle buffer, in records of the mean size."""
    window = max(2, int(round(window_bytes / block_bytes))) if window_bytes else 0
    if mean_record_bytes <= 0:
        return 1, window, 1
    return (max(1, int(round(block_bytes / mean_record_bytes))), window,
            max(1, int(buffer_bytes // mean_record_bytes)))


# ---- remainder policies: who gets which span of the global sequence ---------------------------------

#: Records an epoch under ``pad`` may read at most when that is more than twice its records: past it, the
#: batch size dwarfs the data (a mistake), and the repeats would fill memory.
_MOST_PADDED = 1 << 20

class Split(NamedTuple):
    """Each consumer's span ``[starts[c], stops[c])`` of global positions (taken modulo the total)
    and the number of batches every consumer yields."""

    starts: np.ndarray
    stops: np.ndarray
    num_batches: int


def _drop(total: int, consumers: int, batch_size: int) -> Split:
    """Equal spans of whole batches; the rest of the epoch (fewer than ``consumers * batch_size +
    consumers`` records) is not read."""
    n = (total // consumers) // batch_size * batch_size
    starts = np.arange(consumers, dtype=np.int64) * n
    return Split(starts, starts + n, n // batch_size)


def _pad(total: int, consumers: int, batch_size: int) -> Split:
    """Equal spans of whole batches covering the epoch; the last spans wrap around to its start."""
    if total == 0:
        return _drop(0, consumers, batch_size)
    per = -(-total // consumers)
    n = -(-per // batch_size) * batch_size
    starts = np.arange(consumers, dtype=np.int64) * n
    return Split(starts, starts + n, n // batch_size)


def _uneven(total: int, consumers: int, batch_size: int) -> Split:
    """Exact shares differing by at most one record; every consumer yields the same number of
    batches, all full but the last, which is smaller on short consumers and may be empty."""
    bounds = np.arange(consumers + 1, dtype=np.int64) * total // consumers
    longest = int(np.max(np.diff(bounds))) if consumers else 0
    return Split(bounds[:-1], bounds[1:], -(-longest // batch_size))


#: Remainder policies by name: ``(total, num_consumers, batch_size) -> Split``.
REMAINDERS: Dict[str, Callable[[int, int, int], Split]] = {
    "drop": _drop,
    "pad": _pad,
    "uneven": _uneven,
}


# ---- record shuffles: a span -> pieces and an emission order ------------------------------------------

def _sequential_pieces(plan: "EpochPlan", start: int, stop: int,
                       consumer: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pieces of the global sequence ``[start, stop)``, wrapping around past its end."""
    if plan.interleave > 1:  # the sequence is the shards' records interleaved (interleave_order)
        if stop <= start:
            return _no_pieces()
        where = np.arange(start, stop, dtype=np.int64) % plan.total
        shards, records = plan.interleaved
        return merge_runs(shards[where], records[where])
    parts = []
    total = plan.total
    while start < stop:
        base = start // total * total
        end = min(stop, base + total)
        parts.append(_sequence_range(plan, start - base, end - base))
        start = end
    if not parts:
        return _no_pieces()
    return tuple(np.concatenate(p) for p in zip(*parts))  # type: ignore[return-value]


def _sequence_range(plan: "EpochPlan", x: int, y: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pieces of positions ``x..y`` (``0 <= x < y <= total``) of the global sequence."""
    begins, ends = plan._seq_begins, plan._seq_ends
    j = np.arange(np.searchsorted(ends, x, "right"), np.searchsorted(begins, y, "left"))
    a = np.maximum(x, begins[j]) - begins[j]
    b = np.minimum(y, ends[j]) - begins[j]
    keep = b > a  # shards without records
    return plan.shard_order[j][keep], a[keep], b[keep]


def _block_pieces(plan: "EpochPlan", start: int, stop: int,
                  consumer: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The span's blocks (:func:`cut_blocks`), each read front to back, in a seeded order of the
    consumer's within each window of ``block_window`` neighbouring blocks of the span (whose shards are
    in the epoch's shard order): reads jump about, but within a few shards at a time."""
    shards, starts, stops = cut_blocks(*_sequential_pieces(plan, start, stop, consumer), plan.block_records)
    n = len(shards)
    if plan.block_window == 0 or plan.block_window >= n:
        order = _permutation(n, plan.seed, plan.epoch, _STREAM_BLOCKS, consumer)
    else:
        words = random_words(n, plan.seed, plan.epoch, _STREAM_BLOCKS, consumer) >> np.uint64(1)
        order = np.lexsort((np.arange(n), words, np.arange(n) // plan.block_window))
    return shards[order], starts[order], stops[order]


def _global_pieces(plan: "EpochPlan", start: int, stop: int,
                   consumer: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The consumer's part of the epoch's global permutation, consecutive records merged."""
    if stop <= start:
        return _no_pieces()
    where = np.arange(start, stop, dtype=np.int64) % plan.total  # pad: wraps around
    picked = permute(where, plan.total, plan.seed, plan.epoch)
    ends = np.cumsum(plan.counts)  # shards in index order
    shards = np.searchsorted(ends, picked, "right")
    return merge_runs(shards, picked - (ends - plan.counts)[shards])


def interleave_order(counts: Sequence[int], cycle: int) -> Tuple[np.ndarray, np.ndarray]:
    """``(file, record)`` of each record when files of ``counts`` records are read ``cycle`` at a time, one
    record from each in turn: tf.data's ``interleave(cycle_length=cycle, block_length=1)``, which
    ``TFRecordDataset(num_parallel_reads=cycle)`` is (deterministic).

    The cycle visits its slots in turn. A slot with a file hands out that file's next record; a slot
    whose file has ended is emptied (no record at that visit); an empty slot takes the next file and
    hands out its first record at once. So file ``f``, taken at visit ``v``, hands out its ``k``-th
    record at visit ``v + k * cycle``, and its slot takes another file at visit ``v + (count + 1) *
    cycle``: files of one length are read in groups of ``cycle``, record by record. A loop over files
    (not records) finds when each is taken; one sort orders the records.
    """
    counts = np.asarray(counts, dtype=np.int64)
    n, total = len(counts), int(counts.sum())
    file = np.repeat(np.arange(n, dtype=np.int64), counts)
    first = np.cumsum(counts) - counts
    record = np.arange(total, dtype=np.int64) - np.repeat(first, counts)
    if cycle <= 1 or n <= 1:
        return file, record
    taken = np.empty(n, dtype=np.int64)
    requests = [(slot, slot) for slot in range(min(cycle, n))]  # (visit, slot): slot s asks first at visit s
    for f in range(n):
        visit, slot = heapq.heappop(requests)
        taken[f] = visit
        heapq.heappush(requests, (visit + (int(counts[f]) + 1) * cycle, slot))
    order = np.argsort(taken[file] + record * cycle, kind="stable")  # each visit hands out one record at most
    return file[order], record[order]


def merge_runs(shards: np.ndarray, records: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(shard, record)`` pairs in reading order as pieces ``(shard, start, stop)``: consecutive
    records of one shard merged."""
    if len(shards) == 0:
        return _no_pieces()
    new_run = np.ones(len(shards), dtype=bool)
    new_run[1:] = (shards[1:] != shards[:-1]) | (records[1:] != records[:-1] + 1)
    first = np.flatnonzero(new_run)
    last = np.append(first[1:], len(shards)) - 1
    return shards[first], records[first], records[last] + 1


def _no_pieces() -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)


def _mib(n: float) -> str:
    return f"{n / (1 << 20):,.0f} MiB" if n >= 1 << 20 else f"{n / 1024:,.0f} KiB"


@dataclass(frozen=True)
class Shuffle:
    """Everything a record shuffle means, in one place: how it orders a consumer's records, how they are
    read, and how it is described. A new shuffle is a ``pieces`` function and one :data:`SHUFFLES` entry.

    Attributes
    ----------
    name : str
    pieces : callable
        ``(plan, start, stop, consumer) -> (shards, starts, stops)``: the consumer's span of the epoch's
        sequence as record ranges, in reading order.
    buffered : bool
        The records read go through a shuffle buffer of ``buffer_size`` records (:func:`buffer_order`).
    random_reads : bool
        Reads land anywhere in the files, record by record: ``io="auto"`` then prefers an engine that
        serves them from the page cache (mmap), and mapped files are not advised ``sequential``.
    summary : str
        One line, for ``--help`` and the docs.
    chunk_bytes : int or None
        The reader's chunk (records read together) unless one is asked for; None: the engine's default.
        A chunk of random reads is a list of records, not a stretch of a file: a small one keeps the
        first batch near and the files opened (or mapped) at once few.
    planned_in_windows : bool
        The consumer's reads are given to the reader a window of batches at a time, each window's frame
        offsets fetched from the manifest when it is planned: a pass starts after its first window, not
        after every record's offset (a ``global`` rank's records lie in nearly every shard).
    """

    name: str
    pieces: Callable[["EpochPlan", int, int, int], Tuple[np.ndarray, np.ndarray, np.ndarray]]
    buffered: bool
    random_reads: bool
    summary: str
    chunk_bytes: Optional[int] = None
    planned_in_windows: bool = False

    @property
    def sequential(self) -> bool:
        """Whether files are read mostly front to back (the mmap advice ``sequential``)."""
        return not self.random_reads

    def describe(self, share: int, *, block_records: int, block_window: int, buffer_size: int,
                 mean_record_bytes: float, shuffle_shards: bool = True) -> str:
        """The shuffle in words for a consumer of ``share`` records: its block and buffer sizes in
        records and bytes, as they are in effect (a buffer larger than the share holds all of it)."""
        mean = mean_record_bytes
        if self.buffered:
            buffer, block = min(buffer_size, share), min(block_records, share)
            held = f"a shuffle buffer of {buffer:,} records (~{_mib(buffer * mean)})"
            if self.name != "block":
                return f"{self.name}: read in order, {held}"
            blocks = -(-share // max(1, block_records))
            within = (f"within windows of {block_window} blocks (~{_mib(block_window * block_records * mean)})"
                      if block_window and block_window < blocks else "over the whole share")
            return (f"block: blocks of {block:,} records (~{_mib(block * mean)}) in a seeded order {within}, "
                    f"{held}")
        if self.random_reads:
            return f"{self.name}: a seeded permutation of all records, read through the index"
        return (f"{self.name}: records in order, shards in the epoch's order" if shuffle_shards
                else f"{self.name}: records and shards in order")


#: Record shuffles by name.
SHUFFLES: Dict[str, Shuffle] = {s.name: s for s in (
    Shuffle("none", _sequential_pieces, False, False, "records in shard order, shards in the epoch's order"),
    Shuffle("block", _block_pieces, True, False,
            "blocks of block_records records read whole in a seeded order within windows of block_window "
            "blocks, emitted through a shuffle buffer of buffer_size records: a shuffle that keeps reads large "
            "and near each other"),
    Shuffle("buffer", _sequential_pieces, True, False,
            "read sequentially, emitted through a shuffle buffer of buffer_size records"),
    Shuffle("global", _global_pieces, False, True,
            "a seeded permutation of all records of the epoch, read through the index", chunk_bytes=64 << 10,
            planned_in_windows=True),
)}


def shuffle_named(name: str) -> Shuffle:
    """The shuffle called ``name``.

    Raises
    ------
    PlacementError
        Naming the shuffles there are.
    """
    try:
        return SHUFFLES[name]
    except (KeyError, TypeError):
        raise PlacementError(f"unknown shuffle {name!r}; choose one of {sorted(SHUFFLES)}") from None


# ---- the plan of one epoch -------------------------------------------------------------------------

def _check_int(name: str, value, low: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise PlacementError(f"{name} must be an int, not {value!r}")
    if value < low:
        raise PlacementError(f"{name} must be at least {low}, not {value}")
    return int(value)


class EpochPlan:
    """Who reads which records of one epoch, and in which order.

    Parameters
    ----------
    counts : sequence of int
        Records in each shard (shard ``i`` is the ``i``-th entry; zero is allowed).
    num_consumers : int
        Readers sharing the epoch: ``world.num_consumers`` (ranks x DataLoader workers).
    seed, epoch : int
        Every random choice is a function of these (and of the consumer where it is local).
    shuffle_shards : bool
        Put the shards in a seeded per-epoch order (else index order). Ignored by ``global``.
    shuffle : {"none", "block", "buffer", "global"}
        Record shuffle; see :data:`SHUFFLES`.
    buffer_size : int
        Records the shuffle buffer of ``block`` and ``buffer`` holds.
    block_records : int
        Records of a shard per block (``block``): block ``j`` of a shard is its records
        ``j * block_records`` onwards.
    block_window : int
        ``block``: the blocks are reordered within each run of this many neighbouring blocks of the
        consumer's span; 0: over the whole span.
    remainder : {"drop", "pad", "uneven"}
        What happens when the records do not divide evenly; see :data:`REMAINDERS`.
    batch_size : int
        Records per batch of one consumer.
    interleave : int
        ``none`` and ``buffer``: the global sequence reads this many shards at a time, one record from
        each in turn (:func:`interleave_order`, the order of ``tf.data.TFRecordDataset`` with
        ``num_parallel_reads=interleave``); 1: each shard whole, one after the other.

    Notes
    -----
    Every consumer yields :attr:`num_batches` batches. ``drop`` and ``pad`` give every consumer
    the same number of records in full batches (``drop`` leaves fewer than ``num_consumers *
    (batch_size + 1)`` records unread; ``pad`` wraps around, so some records are read twice, or
    more often when there are fewer records than consumers x batch size). ``uneven`` reads each
    record exactly once: shares differ by at most one record, and a short consumer's last batch
    is smaller, possibly empty.
    """

    def __init__(self, counts: Sequence[int], num_consumers: int, *, seed: int = 0, epoch: int = 0,
                 shuffle_shards: bool = True, shuffle: str = "none", buffer_size: int = 1024,
                 block_records: int = 1024, block_window: int = 0, remainder: str = "pad", batch_size: int = 1,
                 interleave: int = 1):
        counts = np.asarray(counts)
        if counts.ndim != 1 or (counts.size and not np.issubdtype(counts.dtype, np.integer)):
            raise PlacementError(f"counts must be a list of record counts per shard, not {counts!r}")
        if counts.size and counts.min() < 0:
            raise PlacementError(f"shard {int(np.argmin(counts))} has a negative record count {int(counts.min())}")
        shuffle_named(shuffle)
        if remainder not in REMAINDERS:
            raise PlacementError(f"unknown remainder policy {remainder!r}; choose one of {sorted(REMAINDERS)}")
        self.counts = counts.astype(np.int64)
        self.num_consumers = _check_int("num_consumers", num_consumers, 1)
        self.seed = _check_int("seed", seed, 0)
        self.epoch = _check_int("epoch", epoch, 0)
        self.buffer_size = _check_int("buffer_size", buffer_size, 1)
        self.block_records = _check_int("block_records", block_records, 1)
        self.block_window = _check_int("block_window", block_window, 0)
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.interleave = _check_int("interleave", interleave, 1)
        if self.interleave > 1 and shuffle_named(shuffle).pieces is not _sequential_pieces:
            raise PlacementError(f"interleave={interleave} orders the shards' records for the shuffles that read "
                                 f"in sequence (none, buffer), not for {shuffle!r}")
        self.shuffle_shards = bool(shuffle_shards)
        self.shuffle = shuffle
        self.remainder = remainder
        self.total = int(self.counts.sum())
        self.shard_order = shard_order(len(self.counts), self.seed, self.epoch, self.shuffle_shards)
        in_order = self.counts[self.shard_order]
        self._seq_ends = np.cumsum(in_order)
        self._seq_begins = self._seq_ends - in_order
        split = REMAINDERS[remainder](self.total, self.num_consumers, self.batch_size)
        padded = int(split.stops[-1]) if len(split.stops) else 0
        if remainder == "pad" and padded > max(2 * self.total, _MOST_PADDED):
            # batch_size=10**12 over 300 records planned 10**12 reads of repeats per consumer, and
            # exhausted memory: a mistake, not a batch.
            raise PlacementError(f"batch_size {self.batch_size:,} over the epoch's {self.total:,} records: "
                                 f"remainder='pad' would read {padded:,} records to give {self.num_consumers} "
                                 f"consumer(s) whole batches, each record about {padded // max(self.total, 1):,} "
                                 f"times; give a smaller batch_size, or remainder='uneven' (a short last batch)")
        self._starts, self._stops = split.starts, split.stops
        self.num_batches = int(split.num_batches)
        self._cache: Dict[Tuple[str, int], object] = {}

    def options(self) -> Dict[str, object]:
        """The arguments that, with counts and num_consumers, rebuild this plan."""
        return {"seed": self.seed, "epoch": self.epoch, "shuffle_shards": self.shuffle_shards,
                "shuffle": self.shuffle, "buffer_size": self.buffer_size, "block_records": self.block_records,
                "block_window": self.block_window, "remainder": self.remainder, "batch_size": self.batch_size,
                "interleave": self.interleave}

    @functools.cached_property
    def interleaved(self) -> Tuple[np.ndarray, np.ndarray]:
        """``(shard, record)`` at each position of the global sequence when ``interleave`` > 1: the shards
        in the epoch's order read ``interleave`` at a time (:func:`interleave_order`); the epoch's
        records, held once per plan."""
        file, record = interleave_order(self.counts[self.shard_order], self.interleave)
        return self.shard_order[file], record

    def _check(self, consumer: int) -> int:
        if isinstance(consumer, bool) or not isinstance(consumer, (int, np.integer)) \
                or not 0 <= consumer < self.num_consumers:
            raise PlacementError(f"consumer {consumer!r} is outside 0..{self.num_consumers - 1}")
        return int(consumer)

    def span(self, consumer: int) -> Tuple[int, int]:
        """The consumer's positions ``[start, stop)`` in the global sequence (``pad``: may pass ``total``)."""
        c = self._check(consumer)
        return int(self._starts[c]), int(self._stops[c])

    def num_samples(self, consumer: int) -> int:
        """Records the consumer emits this epoch."""
        start, stop = self.span(consumer)
        return stop - start

    def smallest_share(self) -> int:
        """Records the consumer with the fewest emits this epoch (``uneven``: shares differ by one)."""
        return int((self._stops - self._starts).min()) if len(self._starts) else 0

    def repeats(self, consumer: int) -> int:
        """Records of the consumer's epoch that another position of the epoch already gives (``pad`` wraps
        around to the epoch's start): the last ones of its span."""
        start, stop = self.span(consumer)
        return max(0, stop - max(start, self.total))

    def batch_sizes(self, consumer: int) -> np.ndarray:
        """Size of each of the consumer's :attr:`num_batches` batches (all ``batch_size`` but,
        under ``uneven``, the last, which may be smaller or 0)."""
        n = self.num_samples(consumer)
        sizes = np.full(self.num_batches, self.batch_size, dtype=np.int64)
        if self.num_batches:
            sizes[-1] = n - (self.num_batches - 1) * self.batch_size
        return sizes

    def piece_arrays(self, consumer: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The consumer's pieces as three int64 arrays ``(shard, start, stop)``, in reading order.

        Under ``global`` a consumer has about one piece per record: prefer these arrays to
        :meth:`pieces` there.
        """
        c = self._check(consumer)
        key = ("pieces", c)
        if key not in self._cache:
            self._cache[key] = SHUFFLES[self.shuffle].pieces(self, int(self._starts[c]), int(self._stops[c]), c)
        return self._cache[key]  # type: ignore[return-value]

    def pieces(self, consumer: int) -> List[Piece]:
        """The consumer's record ranges, in reading order; concatenated they are its read sequence."""
        shards, starts, stops = self.piece_arrays(consumer)
        return [Piece(s, a, b) for s, a, b in zip(shards.tolist(), starts.tolist(), stops.tolist())]

    def order(self, consumer: int) -> Optional[np.ndarray]:
        """The emission order over the consumer's read sequence (a permutation of
        ``0..num_samples-1``), or ``None`` when records are emitted as read."""
        c = self._check(consumer)
        if not SHUFFLES[self.shuffle].buffered:
            return None
        key = ("order", c)
        if key not in self._cache:
            self._cache[key] = buffer_order(self.num_samples(c), self.buffer_size, self.seed, self.epoch, c)
        return self._cache[key]  # type: ignore[return-value]

    def read_sequence(self, consumer: int) -> Tuple[np.ndarray, np.ndarray]:
        """``(shard, record)`` of every record the consumer reads, in reading order."""
        shards, starts, stops = self.piece_arrays(consumer)
        return np.repeat(shards, stops - starts), expand_runs(starts, stops - starts)

    def samples(self, consumer: int) -> Tuple[np.ndarray, np.ndarray]:
        """``(shard, record)`` of every sample the consumer emits, in emission order."""
        shards, records = self.read_sequence(consumer)
        order = self.order(consumer)
        if order is None:
            return shards, records
        return shards[order], records[order]

    def locate(self, consumer: int, local: int) -> Tuple[int, int]:
        """``(piece index, offset in piece)`` of position ``local`` of the consumer's read sequence."""
        shards, starts, stops = self.piece_arrays(consumer)
        ends = np.cumsum(stops - starts)
        n = int(ends[-1]) if len(ends) else 0
        if isinstance(local, bool) or not 0 <= local <= n:
            raise PlacementError(f"position {local!r} is outside the {n} records of consumer {consumer}")
        if local == n:
            return len(ends), 0
        p = int(np.searchsorted(ends, local, "right"))  # pieces are never empty
        return p, local - (int(ends[p - 1]) if p else 0)

    def restart(self, consumer: int, emitted: int) -> Restart:
        """Where reading resumes after the consumer has emitted ``emitted`` samples of this epoch.

        Raises
        ------
        PlacementError
            When ``emitted`` is outside ``0..num_samples(consumer)``.
        """
        n = self.num_samples(consumer)
        if isinstance(emitted, bool) or not 0 <= emitted <= n:
            raise PlacementError(f"sample {emitted!r} is outside 0..{n} for consumer {consumer} "
                                 f"of epoch {self.epoch}")
        order = self.order(consumer)
        if order is None or emitted == n:
            local, skip = emitted, np.zeros(0, np.int64)
        else:
            key = ("suffix_min", int(consumer))
            if key not in self._cache:
                self._cache[key] = np.minimum.accumulate(order[::-1])[::-1]
            local = int(self._cache[key][emitted])  # type: ignore[index]
            done = order[:emitted]
            skip = np.sort(done[done >= local])
        piece, offset = self.locate(consumer, local)
        return Restart(emitted, local, piece, offset, skip)

    def read_plan(self, consumer: int, emitted: int = 0, reorder: Optional[np.ndarray] = None) -> ReadOrder:
        """What the consumer reads after emitting ``emitted`` samples, and in which order it emits it.

        The read sequence from :meth:`restart`'s point on and, under a shuffle buffer, the rest of
        the emission order over it (records already emitted are left out of it: read again, not
        emitted). Arrays only, for the C++ reader.

        ``reorder``, indices into :meth:`read_sequence`, reads the sequence in that order instead (the
        mounts of a rank taking turns, :func:`~dlstore.placement.mounts.read_in_turns`). An emission
        order is over read positions, so it holds as it is: the records emitted are those at its
        positions of the reordered sequence.
        """
        r = self.restart(consumer, emitted)
        shards, records = self.read_sequence(consumer)
        if reorder is not None:
            shards, records = shards[reorder], records[reorder]
        order = self.order(consumer)
        emit = None if order is None else order[emitted:] - r.local
        return ReadOrder(shards[r.local:], records[r.local:], emit)


# ---- resumable state -------------------------------------------------------------------------------

@dataclass(frozen=True)
class SamplerState:
    """Where a consumer stands: enough to resume mid-epoch exactly.

    ``sample_in_epoch`` counts the samples this consumer has emitted in ``epoch``.
    """

    epoch: int = 0
    sample_in_epoch: int = 0
    seed: int = 0
    num_consumers: int = 1

    def __post_init__(self):
        for name, low in (("epoch", 0), ("sample_in_epoch", 0), ("seed", 0), ("num_consumers", 1)):
            _check_int(f"SamplerState.{name}", getattr(self, name), low)

    def to_dict(self) -> Dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, state: Mapping[str, int]) -> "SamplerState":
        """Reads :meth:`to_dict`'s output; a missing or unknown key is a PlacementError."""
        names = {f.name for f in dataclasses.fields(cls)}
        missing, unknown = names - set(state), set(state) - names
        if missing or unknown:
            raise PlacementError(f"not a sampler state: missing {sorted(missing)}, unknown {sorted(unknown)}")
        return cls(**{k: state[k] for k in names})

    def for_consumers(self, num_consumers: int) -> "SamplerState":
        """This state in a world of ``num_consumers`` readers.

        Raises
        ------
        PlacementError
            When the number changes mid-epoch: the records left to each consumer are defined by
            the old split, so a new world can only start at an epoch boundary.
        """
        if num_consumers == self.num_consumers:
            return self
        if self.sample_in_epoch != 0:
            raise PlacementError(f"the state was saved by {self.num_consumers} consumers at sample "
                                 f"{self.sample_in_epoch} of epoch {self.epoch}; a different number of consumers "
                                 f"({num_consumers}) can only resume at an epoch boundary (sample_in_epoch 0), "
                                 f"since the samples left to each depend on the old split")
        return dataclasses.replace(self, num_consumers=num_consumers)
