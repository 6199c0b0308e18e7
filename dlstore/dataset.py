"""``Dataset``: shards on one or more mount points, read by this rank (and DataLoader worker) for an epoch.

It composes the pure placement functions with the reader:

- :mod:`dlstore.placement.world` says who this process is (rank, world size, worker);
- :mod:`dlstore.placement.sharding` says which records it reads this epoch, in which order, so that
  every record is read once across all consumers (:class:`~dlstore.placement.sharding.EpochPlan`);
- :mod:`dlstore.placement.mounts` and :mod:`dlstore.placement.blocks` say through which mount each
  block of a shard is read (the same every epoch) and interleave blocks so several mounts stream at once;
- :class:`dlstore.io.failover.PieceReader` reads the records with the C++ reader, failing over to a
  replica mount when a read fails.

Its state (``epoch``, ``sample_in_epoch``) resumes a run exactly, mid-epoch.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from dlstore import settings
from dlstore.errors import DlstoreError, PlacementError
from dlstore.indexing import ensure_index
from dlstore.io.failover import PieceReader, Place, ReadPiece
from dlstore.io.select import EngineChoice, resolve_engine
from dlstore.placement.blocks import cut_blocks, interleave_by_mount
from dlstore.placement.mounts import assign_mounts, mount_for, mounts_for
from dlstore.placement.sharding import EpochPlan, SamplerState, merge_runs
from dlstore.placement.world import World, detect_world
from dlstore.reader import core_options, detect_files, expand_paths

__all__ = ["Dataset"]

PathSpec = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]


class Dataset:
    """TFRecord or RecordIO shards, possibly on several mount points, read by this consumer.

    Parameters
    ----------
    shards : str, path-like or sequence of them
        Without ``mounts``: files, globs or directories. With ``mounts``: shard paths relative to
        the mount points (globs allowed); each mount may hold all of them (replicated), one each
        (striped) or any mix; the layout is found by looking.
    mounts : sequence of str, optional
        Mount points (directories) the shards are read from.
    world : World, optional
        Who this process is; detected from the launcher's environment when omitted
        (:func:`dlstore.world`).
    seed : int
        Seeds every shuffle, with the epoch.
    shuffle_shards : bool
        A seeded shard order per epoch, the same on every rank.
    shuffle : {"none", "buffer", "global"}
        Record shuffle: none; the order a shuffle buffer of ``buffer_size`` records would give;
        or a seeded permutation of all records through the index.
    remainder : {"drop", "pad", "uneven"}
        When the records do not divide evenly among consumers (see ``docs/placement.md``).
    batch_size : int
        Records per batch of one consumer (remainder policies count in batches).
    mount_policy : {"rank", "local_rank", "weighted"}
        How ranks are given mounts; ``mounts_per_rank`` mounts each, read at once.
    throughput : sequence of float, optional
        Measured MB/s per mount, for ``mount_policy="weighted"``.
    io, verify, on_error, chunk_size, depth, io_threads, verify_threads
        As for :func:`dlstore.open_records`.
    read_timeout, max_retries, block_size : optional
        Failover and interleaving settings (:mod:`dlstore.settings`).
    """

    def __init__(self, shards: PathSpec, *, mounts: Optional[Sequence[str]] = None, world: Optional[World] = None,
                 format: str = "auto", seed: int = 0, shuffle_shards: bool = True, shuffle: str = "none",
                 buffer_size: int = 1024, remainder: str = "pad", batch_size: int = 1,
                 mount_policy: str = "rank", mounts_per_rank: int = 1, throughput: Optional[Sequence[float]] = None,
                 io: Optional[str] = None, verify: bool = True, on_error: str = "raise",
                 chunk_size: Optional[int] = None, depth: Optional[int] = None, io_threads: Optional[int] = None,
                 verify_threads: Optional[int] = None, read_timeout: Optional[float] = None,
                 max_retries: Optional[int] = None, block_size: Optional[int] = None, progress: bool = False):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        self.world = world if world is not None else detect_world()
        self._layout, self.shards = self._find_layout(shards, mounts)
        self.mounts = list(self._layout.mounts) if self._layout is not None else []
        self._plan_args = dict(seed=seed, shuffle_shards=shuffle_shards, shuffle=shuffle, buffer_size=buffer_size,
                               remainder=remainder, batch_size=batch_size)
        self.verify, self.on_error = verify, on_error
        self.read_timeout = settings.get("read_timeout", read_timeout)
        self.max_retries = settings.get("max_retries", max_retries)
        self.block_size = settings.get("block_size", block_size)
        # Indexes and the format come from each shard's first copy (replicas are the same bytes).
        first = (self.shards if self._layout is None else
                 [self._layout.path(i, self._layout.holders[i][0]) for i in range(len(self.shards))])
        self.format, comps = detect_files(first, format)
        compressed = [p for p, c in zip(first, comps) if c != "none"]
        if compressed:
            raise DlstoreError(f"{compressed[0]}: compressed shards cannot be split by record between ranks; "
                               f"read them with dlstore.open_records, or store them uncompressed")
        self._frames: List[np.ndarray] = []
        self.counts = self._index(first, progress)
        total = int(sum(int(f[-1]) for f in self._frames))
        self.choice: EngineChoice = resolve_engine(settings.get("io", io), first, total)
        self._core_args = core_options(self.choice.engine, chunk_size, depth, io_threads, verify_threads)
        self._rank_mounts = self._assign(mount_policy, mounts_per_rank, throughput)
        if len(self._rank_mounts) > 1:
            # Every mount of this rank streams at once only with reads in flight on each. Chunks are
            # consumed in order, so one mount running late holds the window: two threads and four
            # chunks per mount keep the others busy meanwhile (explicit arguments still win).
            k = len(self._rank_mounts)
            if settings.is_default("io_threads", io_threads):
                self._core_args["io_threads"] = max(self._core_args["io_threads"], 2 * k)
            if settings.is_default("depth", depth):
                self._core_args["depth"] = max(self._core_args["depth"], 4 * k)
        self.epoch = 0
        self.sample_in_epoch = 0
        self._last: Dict[str, Any] = {}

    # ---- layout -----------------------------------------------------------------------------------

    def _find_layout(self, shards: PathSpec, mounts: Optional[Sequence[str]]):
        if not mounts:
            files = [os.path.abspath(p) for p in expand_paths(shards)]
            return None, files
        from dlstore.io.layout import scan_layout

        if isinstance(shards, (str, os.PathLike)):
            shards = [shards]
        layout = scan_layout([os.fspath(m) for m in mounts], [os.fspath(s) for s in shards])
        return layout, list(layout.shards)

    def _assign(self, policy: str, mounts_per_rank: int, throughput) -> Tuple[int, ...]:
        if self._layout is None:
            return ()
        return tuple(assign_mounts(self._layout, self.world, policy=policy, mounts_per_rank=mounts_per_rank,
                                   throughput=throughput))

    @property
    def engine(self) -> str:
        """The engine that runs (``io="auto"`` resolved)."""
        return self.choice.engine

    @property
    def engine_reason(self) -> str:
        """Why that engine."""
        return self.choice.reason

    @property
    def layout(self):
        """The mounts' layout (``kind``: replicated, striped or mixed), or None without mounts."""
        return self._layout

    @property
    def rank_mounts(self) -> List[str]:
        """The mount points this rank reads through."""
        return [self.mounts[m] for m in self._rank_mounts]

    def _index(self, paths: List[str], progress: bool) -> np.ndarray:
        from dlstore._progress import Progress

        counts = np.zeros(len(paths), dtype=np.int64)
        bar = Progress(len(paths), "indexing shards", unit="shards") if progress else None
        for i, path in enumerate(paths):
            try:
                _, offsets = ensure_index(path, self.format)
            except DlstoreError:
                raise
            except (OSError, ValueError) as e:
                raise DlstoreError(f"{path}: cannot index the shard: {e}", path=path) from e
            # Frame starts and, last, the end of the file: record r is bytes [f[r], f[r + 1]).
            self._frames.append(np.append(np.asarray(offsets, dtype=np.int64), os.path.getsize(path)))
            counts[i] = len(offsets)
            if bar:
                bar.update(1)
        if bar:
            bar.close()
        return counts

    # ---- the epoch --------------------------------------------------------------------------------

    def plan(self, epoch: Optional[int] = None) -> EpochPlan:
        """The epoch's plan for every consumer (pure: the same on every rank)."""
        return EpochPlan(self.counts, self.world.num_consumers, epoch=self.epoch if epoch is None else epoch,
                         **self._plan_args)

    def __len__(self) -> int:
        """Samples this consumer emits per epoch."""
        return self.plan().num_samples(self.world.consumer)

    @property
    def num_batches(self) -> int:
        """Batches every consumer yields per epoch (agreed without communication)."""
        return self.plan().num_batches

    def _reading_order(self, epoch: int) -> List[ReadPiece]:
        """The consumer's records this epoch, as pieces in the order they are emitted."""
        plan = self.plan(epoch)
        c = self.world.consumer
        # Emitted as read, the plan's pieces are the runs; a shuffle buffer's emission order is
        # merged into runs again.
        arrays = plan.piece_arrays(c) if plan.order(c) is None else merge_runs(*plan.samples(c))
        runs = list(zip(*(a.tolist() for a in arrays)))
        if self._layout is None:
            return [ReadPiece(s, a, b, self._frames[s][a:b + 1], (Place("", self.shards[s]),)) for s, a, b in runs]
        frames = {s: self._frames[s] for s in {r[0] for r in runs}}
        blocks = cut_blocks(runs, frames, self.block_size)
        chosen = mounts_for(self._layout, [b.shard for b in blocks], self._rank_mounts,
                            [b.number for b in blocks]).tolist()
        # The failover order and the places depend on the shard and its chosen mount only.
        places: Dict[Tuple[int, int], Tuple[Place, ...]] = {}
        for b, m in zip(blocks, chosen):
            if (b.shard, m) not in places:
                first, fallbacks = mount_for(self._layout, b.shard, self._rank_mounts, block=b.number)
                places[(b.shard, m)] = tuple(Place(self.mounts[k], self._layout.path(b.shard, k))
                                             for k in (first, *fallbacks))
        return [ReadPiece(b.shard, b.start, b.stop, self._frames[b.shard][b.start:b.stop + 1],
                          places[(b.shard, chosen[i])])
                for i in interleave_by_mount(blocks, chosen) for b in [blocks[i]]]

    def set_epoch(self, epoch: int) -> None:
        """Starts ``epoch`` from its first sample."""
        if epoch < 0:
            raise ValueError(f"epoch must be non-negative, not {epoch}")
        self.epoch, self.sample_in_epoch = int(epoch), 0

    def _make_core(self, paths: List[str], ranges: List[Tuple[int, int]]):
        from dlstore import _C

        a = self._core_args
        return _C.Reader(paths, self.format, self.choice.engine, ["none"] * len(paths), self.verify, self.on_error,
                         a["chunk_size"], a["headroom"], a["depth"], a["io_threads"], 0, a["verify_threads"],
                         ranges=ranges, timeout_s=float(self.read_timeout))

    def batches(self) -> Iterator:
        """Yields RecordBatches of this consumer's records for the current epoch, from the current position.

        The position (:attr:`sample_in_epoch`) advances as batches are handed out; at the end of
        the epoch it moves to the start of the next one. A loader that prefetches sets the position
        it has really consumed with :meth:`load_state_dict` before it saves one.
        """
        pieces = self._reading_order(self.epoch)
        ends = np.cumsum([p.num_records for p in pieces]) if pieces else np.zeros(0, np.int64)
        k = self.sample_in_epoch
        first = int(np.searchsorted(ends, k, "right"))
        offset = k - (int(ends[first - 1]) if first else 0)
        reader = PieceReader(pieces, self._make_core, max_retries=self.max_retries)
        try:
            for batch in reader.batches(first, offset):
                self.sample_in_epoch += batch.num_records
                yield batch
            self.epoch, self.sample_in_epoch = self.epoch + 1, 0
        finally:
            self._last = {**reader.core_stats, **reader.stats.as_dict()}

    def state_dict(self) -> Dict[str, int]:
        """``epoch``, ``sample_in_epoch``, ``seed`` and ``num_consumers``: enough to resume exactly."""
        return SamplerState(self.epoch, self.sample_in_epoch, self._plan_args["seed"],
                            self.world.num_consumers).to_dict()

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Resumes at ``state``. A different number of consumers is accepted at an epoch boundary only.

        Raises
        ------
        PlacementError
            When the seed differs, or the world changed size mid-epoch (the records already read
            were split for the old world; finish that epoch with it, or resume from its end).
        """
        if int(state.get("seed", self._plan_args["seed"])) != self._plan_args["seed"]:
            raise PlacementError(f"the state was saved with seed {state['seed']}, this dataset has seed "
                                 f"{self._plan_args['seed']}")
        saved = SamplerState(int(state["epoch"]), int(state["sample_in_epoch"]), self._plan_args["seed"],
                             int(state.get("num_consumers", self.world.num_consumers)))
        epoch, k = saved.epoch, saved.for_consumers(self.world.num_consumers).sample_in_epoch
        n = self.plan(epoch).num_samples(self.world.consumer)
        if not 0 <= k <= n:
            raise PlacementError(f"sample_in_epoch {k} is outside 0..{n} for consumer {self.world.consumer}")
        self.epoch, self.sample_in_epoch = epoch, k

    def stats(self) -> Dict[str, Any]:
        """Counters of the last pass (records, bytes, failovers, retries), engine and why, this rank's mounts."""
        out = dict(self._last)
        out.update(engine=self.choice.engine, engine_reason=self.choice.reason, mounts=self.rank_mounts,
                   layout=self._layout.kind if self._layout is not None else "files", world=repr(self.world))
        return out

    def for_worker(self, worker: int, num_workers: int) -> "Dataset":
        """A copy of this dataset for DataLoader worker ``worker`` of ``num_workers`` (same rank)."""
        import copy

        clone = copy.copy(self)
        clone.world = self.world.with_worker(worker, num_workers)
        clone._last = {}
        return clone

    def __repr__(self) -> str:
        where = f"{len(self.mounts)} mounts ({self._layout.kind})" if self._layout is not None else "local files"
        return (f"Dataset({len(self.shards)} {self.format} shards, {int(self.counts.sum())} records on {where}, "
                f"{self.world}, io={self.choice.engine!r}: {self.choice.reason})")
