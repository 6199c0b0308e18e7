# Over 500 lines: one class, the Dataset (layout, indexes, its read plan through C++ or gds, failover, resume).
"""``Dataset``: shards on one or more mount points, read by this rank (and DataLoader worker) for an epoch.

It composes the pure placement functions with the C++ reader:

- :mod:`dlstore.placement.world` says who this process is (rank, world size, worker);
- :mod:`dlstore.placement.sharding` says which records it reads this epoch, in which order it reads
  them and in which it hands them out, so that every record is read once across all consumers
  (:class:`~dlstore.placement.sharding.EpochPlan`);
- :mod:`dlstore.placement.mounts` says through which mount each block of a shard is read (the same
  every epoch), and interleaves the mounts of a rank that has several so that all of them stream;
- ``dlstore._C.PlanReader`` takes that plan as arrays, once per epoch, reads it with large reads and
  several in flight, checks every frame, and hands out batches of exactly ``batch_size`` records in
  the planned order; :class:`dlstore.io.failover.MountHealth` picks a replica when a read fails, and
  the plan restarts there at the first record not yet handed out. With ``io="gds"``,
  :class:`dlstore.io.gds.GdsPlanReader` does the same into GPU memory.

Its state (``epoch``, ``sample_in_epoch``) resumes a run exactly, mid-epoch.
"""
from __future__ import annotations

import copy
import functools
import inspect
import operator
import os
import stat
import time
import warnings
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from dlstore import metrics, settings
from dlstore._args import whole
from dlstore.errors import CorruptRecordError, DlstoreError, DlstoreIOError, PlacementError
from dlstore.formats.registry import format_named
from dlstore.sources import replicas
from dlstore.sources.indexing import CHECK_SHARDS_PER_PLAN, index_dataset, open_shards
from dlstore.io import deadline
from dlstore.io.cuda import parse_device
from dlstore.io.failover import MountHealth
from dlstore.io.select import EngineChoice, resolve_engine
from dlstore.placement.mounts import assign_mounts, mount_for
from dlstore.placement.rank import RankPlan, plan_rank
from dlstore.placement.sharding import EpochPlan, SamplerState, shuffle_named, shuffle_sizes
from dlstore.placement.world import World, detect_world
from dlstore.sources.reader import (CorruptionWarnings, PathSpec, close_reader, path_list, refuse_unreadable,
                                    split_glob)
from dlstore.sources.layout import scan_layout
from dlstore.sources.reads import ReaderPlan as _ReaderPlan
from dlstore.sources.reads import reader_plan
from dlstore.sources.source import ReadOptions, ReadsWithOptions, Source, SourcePosition

__all__ = ["Dataset", "dataset_for"]

#: Batches in the first window of a pass planned in windows (``Shuffle.planned_in_windows``): the first
#: batch waits for this window's frame offsets and files only.
FIRST_WINDOW_BATCHES = 4
#: Records in a window at most (later windows grow fourfold up to it, in whole batches).
MAX_WINDOW_RECORDS = 16384


class Dataset(SourcePosition, ReadsWithOptions):
    """TFRecord or RecordIO shards, possibly on several mount points, read by this consumer: a
    :class:`~dlstore.sources.source.Source`.

    Parameters
    ----------
    shards : str, path-like or sequence of them
        Without ``mounts``: files, globs or directories. With ``mounts``: shard paths relative to
        the mount points (globs allowed; None: every record file under them); each mount may hold
        all of them (replicated), one each (striped) or any mix; the layout is found by looking.
    mounts : sequence of str, optional
        Mount points (directories) the shards are read from.
    world : World, optional
        Who this process is; detected from the launcher's environment when omitted, with the
        PyTorch DataLoader worker it is made in (:func:`dlstore.world`).
    seed : int
        Seeds every shuffle, with the epoch.
    shuffle_shards : bool
        A seeded shard order per epoch, the same on every rank.
    shuffle : {"block", "none", "buffer", "global"}
        Record shuffle (``docs/placement.md``):

        - ``block`` (default): the consumer's share (its shards in the epoch's seeded order) cut
          into blocks of about ``block_size`` bytes, read whole in a seeded order within each window
          of ``shuffle_window`` bytes, the records emitted through a shuffle buffer of
          ``buffer_size`` records. Reads stay large and near each other, so a cold epoch streams at
          about the engine's speed, and consecutive records rarely come from one place of one file.
        - ``none``: records in order, shards in the epoch's order (with several mounts per rank, a
          shard's blocks come in the order the mounts take turns, each block's records in order).
        - ``buffer``: the share read in order, emitted through the shuffle buffer.
        - ``global``: a seeded permutation of all the epoch's records, each read where the index
          says: fast from the page cache; from cold storage, as fast as its random reads.
    buffer_size : int, optional
        Records the shuffle buffer of ``block`` and ``buffer`` holds; by default as many as fit in
        the ``shuffle_buffer`` setting (bytes) at this dataset's mean record size. The records held
        stay in the chunks they were read into, up to twice that many bytes, then are copied out.
    remainder : {"pad", "drop", "uneven"}
        When the records do not divide evenly among consumers (see ``docs/placement.md``).
    interleave : int
        ``none`` and ``buffer``: the shards are read this many at a time, one record from each in turn,
        the order of ``tf.data.TFRecordDataset(num_parallel_reads=interleave)``
        (:func:`~dlstore.placement.sharding.interleave_order`); 1 (default): each shard whole.
    batch_size : int, optional
        Records per batch of one consumer: :meth:`batches` yields batches of exactly this many
        (only an epoch's last may be shorter), and the remainder policies count in them. Left
        unset, the loader that reads this dataset sets it to its own; read directly, a batch is
        then about one read (``chunk_size`` bytes) of records.
    mount_policy : {"rank", "local_rank", "weighted"}
        How ranks are given mounts; ``mounts_per_rank`` mounts each, read at once.
    throughput : sequence of float, optional
        Measured MB/s per mount, for ``mount_policy="weighted"``.
    block_size : int, optional
        Bytes of a shard per block (the ``block_size`` setting): a block is read in one go, always
        through the same mount, and is the unit the ``block`` shuffle reorders.
    shuffle_window : int, optional
        Bytes of the consumer's sequence within which the ``block`` shuffle reorders blocks (the
        ``shuffle_window`` setting, 128 MiB; 0: the whole share).
    progress : bool
        A progress bar while the shards are indexed.
    device : str, optional
        Where the records are going: ``cuda:N`` (or ``cuda:local``: GPU number ``world.local_rank``)
        lets ``io="auto"`` pick ``gds`` (true GPUDirect Storage only), and is the device ``io="gds"``
        reads into (default ``cuda:0``). With
        ``io="gds"`` batches are :class:`~dlstore.io.gds.DeviceBatch` objects (TFRecord only).
        ``None`` or ``"cpu"``: host memory (with ``io="gds"``, ``"cpu"`` is a ValueError).
    options : ReadOptions, optional
        How to read: engine, CRC checks, ``on_error``, read sizes, threads, ``read_timeout`` and
        ``max_retries``. Or pass those as keyword arguments (``io="direct"``, ...); see
        :class:`~dlstore.ReadOptions`.
    """

    def __init__(self, shards: PathSpec, *, mounts: Optional[Sequence[str]] = None, world: Optional[World] = None,
                 format: str = "auto", seed: int = 0, shuffle_shards: bool = True, shuffle: str = "block",
                 buffer_size: Optional[int] = None, remainder: str = "pad", interleave: int = 1,
                 batch_size: Optional[int] = None,
                 mount_policy: str = "rank", mounts_per_rank: int = 1, throughput: Optional[Sequence[float]] = None,
                 block_size: Optional[int] = None, shuffle_window: Optional[int] = None, progress: bool = False,
                 device: Optional[str] = None, options: Optional[ReadOptions] = None, **read_options: Any):
        self.options = ReadOptions.take(options, read_options)
        if read_options:
            raise TypeError(f"Dataset() got unexpected keyword arguments {', '.join(sorted(read_options))}")
        #: What the shuffle means: how it orders, reads and is described (:class:`~dlstore.placement.Shuffle`).
        self.shuffle_kind = shuffle_named(shuffle)
        batch_size = whole("batch_size", batch_size, 1, none_means="the loader's")
        lacks = [a for a in ("consumer", "num_consumers", "local_rank", "with_worker") if not hasattr(world, a)]
        if world is not None and lacks:  # a World, or anything with its members
            raise TypeError(f"world must be a dlstore.placement.World (dlstore.world(rank=..., size=...)), not "
                            f"{world!r:.80} (it has no {', '.join(lacks)})")
        self.world = world if world is not None else detect_world().with_torch_worker()
        gpu = parse_device(device, self.world.local_rank)  # a bad device string fails here, before any indexing
        # The mounts' listings, manifests and stats, each call bounded by read_timeout (a stalled mount raises
        # naming it rather than hanging the constructor).
        self._layout, self.shards, self.index = self._watched(self._find_shards, shards, mounts, format, progress)
        self.mounts = list(self._layout.mounts) if self._layout is not None else []
        self.seed, self.shuffle_shards, self.shuffle, self.remainder = seed, shuffle_shards, shuffle, remainder
        self.interleave = interleave
        self.batch_size = batch_size
        self.block_size = settings.get("block_size", block_size)
        whole("buffer_size", buffer_size, 1, none_means="the default")
        self._sizes_asked = (buffer_size, shuffle_window)
        self._take_index()
        # A rank checks its own shards against the manifest (a stat each), not every shard. Alone, it brings
        # the manifest up to date; one of several stops, since the others would plan with other counts.
        if self._watched(self.index.check, self.plan(0).piece_arrays(self.world.consumer)[0],
                         rebuild=self.world.num_consumers == 1):
            self._take_index()
        first = [self._path_of(0, self._layout.holders[0][0] if self._layout is not None else 0)] if self.shards else []
        total_bytes = int(self.index.sizes.sum())
        self.choice: EngineChoice = self._watched(resolve_engine, self.options.get("io"), first, total_bytes,
                                                  random_reads=self.shuffle_kind.random_reads,
                                                  # gds reads TFRecord only: no GPU target for auto otherwise
                                                  device=device if gpu is None  # "cpu" contradicts gds
                                                  else f"cuda:{gpu}" if self._device_reads else None)
        if self.engine == "gds":  # GdsUnavailableError was raised above where it cannot run
            from dlstore.io.gds import check_source

            check_source(self.format, first)
        #: The CUDA device ``io="gds"`` reads into, else None.
        self.device_index: Optional[int] = gpu if gpu is not None else (0 if self.engine == "gds" else None)
        self._mount_policy = (mount_policy, mounts_per_rank, throughput)
        self._rank_mounts = self._assign(self.world)
        # Per set of rank mounts, which shards' copies through them were checked (Dataset._check_copies).
        self._copies_checked: Dict[Tuple[int, ...], np.ndarray] = {}
        self._watched(self._check_copies, self.plan(0).piece_arrays(self.world.consumer)[0])
        self._core_options = self.options.core(self.engine, in_order=False, mounts=len(self._rank_mounts),
                                               reorders=self.shuffle_kind.buffered)
        if self.options.chunk_size is None and self.shuffle_kind.chunk_bytes:  # how this shuffle reads
            self._core_options.chunk_size = self.shuffle_kind.chunk_bytes
        # Shards held by several mounts: a corrupt record raises in the reader and is read from another
        # copy; this dataset's on_error applies when no copy holds it good (_read_around).
        self._reads_around = self._layout is not None and any(len(h) > 1 for h in self._layout.holders)
        if self._reads_around:
            self._core_options.on_error = "raise"
        self._copy_reports = replicas.CopyReports()
        self.plan(0)  # checks the placement options now rather than at the first read
        self.epoch = 0
        self.sample_in_epoch = 0
        self._last: Dict[str, Any] = {}
        self._life = _new_life()
        #: Corrupt records the pass under way (else the last) skipped so far, each once: one padded into the
        #: epoch again (``remainder="pad"``) moves the position again but is no second record. A Loader counts
        #: the source's skipped records by it.
        self.skipped_this_pass = 0
        self._corruptions: List[Tuple[str, int, str]] = []
        metrics.track(self)  # exported while it lives, unless a Loader reads it; DLSTORE_METRICS_PORT: serves

    # ---- layout -----------------------------------------------------------------------------------

    def _find_shards(self, shards: PathSpec, mounts: Optional[Sequence[str]], fmt: str, progress: bool):
        """``(layout or None, shard paths, index)``: the indexes and the format come from each shard's first
        copy (replicas are the same bytes), one manifest per directory, built (once, under a lock) where
        there is none."""
        if not mounts:
            index = open_shards(shards, fmt, progress)
            _refuse_twice_named(index.paths)
            return None, index.paths, index
        # Absolute: the reads of a pass name the mounts' files, and the working directory may change by then.
        mounts = [os.path.abspath(m) for m in path_list(mounts)]
        patterns = None if shards is None else [os.path.normpath(p) for p in path_list(shards)]
        # One glob in one directory: the first mount answers it from its manifest (one stat of the directory
        # while unchanged), as a Dataset without mounts does; its index is the first copies' when the first
        # mount holds every shard, the other mounts being compared by their listings.
        known = None
        if patterns is not None and len(patterns) == 1 and mounts:
            one = split_glob(os.path.join(mounts[0], patterns[0]))
            if one is not None and one[1] is not None and not os.path.isabs(patterns[0]):
                try:
                    known = open_shards(os.path.join(mounts[0], patterns[0]), fmt, progress)
                except (DlstoreError, ValueError, OSError):  # nothing there, bit rot...: the scan decides
                    known = None
        head = os.path.dirname(patterns[0]) if known is not None else ""
        names = None if known is None else [os.path.join(head, p.rpartition(os.sep)[2]) if head
                                            else p.rpartition(os.sep)[2] for p in known.paths]
        layout = scan_layout(mounts, patterns, first=names)
        roots = [m.rstrip(os.sep) + os.sep for m in layout.mounts]
        first = [roots[held[0]] + rel for rel, held in zip(layout.shards, layout.holders)]
        if known is not None:
            root = os.path.abspath(layout.mounts[0]).rstrip(os.sep) + os.sep
            if all(held[0] == 0 for held in layout.holders) and known.paths == [root + rel for rel in layout.shards]:
                return layout, list(layout.shards), known
        return layout, list(layout.shards), _index_good_copies(layout, first, fmt, progress)

    def _check_copies(self, shards: np.ndarray, rank_mounts: Optional[Sequence[int]] = None) -> None:
        """The copies a rank reads through its own mounts (``rank_mounts``; default this rank's) of
        ``shards`` not checked yet (the first :data:`~dlstore.sources.indexing.CHECK_SHARDS_PER_PLAN`
        of them, each plan) have the size of the copy indexed: a stat each, as the index checks that
        copy (the layout scan lists the mounts and stats no file). A copy of another size is another
        file, not a replica: refused, naming both."""
        rank_mounts = self._rank_mounts if rank_mounts is None else rank_mounts
        if self._layout is None or len(rank_mounts) == 0:
            return
        mine = set(rank_mounts)
        done = self._copies_checked.setdefault(tuple(sorted(mine)), np.zeros(len(self.shards), dtype=bool))
        indexed = self.index.paths
        shards = np.asarray(shards, dtype=np.int64)
        shards = shards[~done[shards]]  # after an epoch or two, none
        _, first = np.unique(shards, return_index=True)
        todo = shards[np.sort(first)][:CHECK_SHARDS_PER_PLAN]
        for shard in todo.tolist():
            want = int(self.index.sizes[shard])
            for m in self._layout.holders[shard]:
                full = os.path.join(self.mounts[m], self._layout.shards[shard])
                if m not in mine or full == indexed[shard]:
                    continue
                try:
                    st = deadline.stat(full)
                except FileNotFoundError:
                    if os.path.islink(full):  # a dangling link listed among the copies: said, as a glob does
                        refuse_unreadable([full])
                    continue  # gone since the listing: read from another copy when this one fails
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):  # a directory or a FIFO of a shard's name is no copy
                    refuse_unreadable([full])
                size = st.st_size
                if size != want:
                    raise PlacementError(f"shard {self._layout.shards[shard]} differs between mounts: "
                                         f"{indexed[shard]} has {want} bytes, {full} has {size}", path=full)
        done[todo] = True  # checked and sound (one that was refused is checked again by the next plan)

    def _take_index(self) -> None:
        """The format, record counts, and blocks and the shuffle buffer sized in records, from the index."""
        self.format = self.index.format
        self._device_reads = format_named(self.format).device_reads  # the GPU path parses its frames
        self.counts = self.index.counts
        total = int(self.counts.sum())
        #: Mean bytes of a record's frame: blocks and the shuffle buffer are sized in records from it.
        self.mean_record_bytes = int(self.index.sizes.sum()) / total if total else 0.0
        buffer_size, shuffle_window = self._sizes_asked
        self.block_records, self.block_window, default_buffer = shuffle_sizes(
            self.mean_record_bytes, self.block_size, settings.get("shuffle_window", shuffle_window),
            settings.get("shuffle_buffer"))
        self.buffer_size = default_buffer if buffer_size is None else int(buffer_size)

    def _assign(self, world: World) -> Tuple[int, ...]:
        if self._layout is None:
            return ()
        policy, per_rank, throughput = self._mount_policy
        return tuple(assign_mounts(self._layout, world, policy=policy, mounts_per_rank=per_rank,
                                   throughput=throughput))

    @property
    def layout(self):
        """The mounts' layout (``kind``: replicated, striped or mixed), or None without mounts."""
        return self._layout

    @property
    def rank_mounts(self) -> List[str]:
        """The mount points this rank reads through."""
        return [self.mounts[m] for m in self._rank_mounts]

    # ---- the epoch --------------------------------------------------------------------------------

    def plan(self, epoch: Optional[int] = None) -> EpochPlan:
        """The epoch's plan for every consumer (pure: the same on every rank). The last one is kept: the
        shard order and a consumer's pieces are computed once per epoch."""
        options = dict(epoch=self.epoch if epoch is None else epoch, seed=self.seed, shuffle_shards=self.shuffle_shards,
                       shuffle=self.shuffle, buffer_size=self.buffer_size, block_records=self.block_records,
                       block_window=self.block_window, remainder=self.remainder, batch_size=self.batch_size or 1,
                       interleave=self.interleave)
        key = (self.world.num_consumers, tuple(options.values()))
        kept = getattr(self, "_kept_plan", None)
        if kept is None or kept[0] is not self.counts or kept[1] != key:
            kept = (self.counts, key, EpochPlan(self.counts, self.world.num_consumers, **options))
            self._kept_plan = kept
        return kept[2]

    def __len__(self) -> int:
        """Samples this consumer emits per epoch."""
        return self.plan().num_samples(self.world.consumer)

    @property
    def repeated_records(self) -> int:
        """Records of this consumer's epoch that repeat records read elsewhere in the epoch
        (``remainder="pad"``, which keeps every consumer at the same number of full batches): the last
        ones of its sequence. A loader counts them as padding, not as samples."""
        return self.plan().repeats(self.world.consumer)

    @property
    def num_batches(self) -> int:
        """Batches per epoch of the largest consumer's share (agreed without communication). Every consumer
        yields this many under ``pad`` and ``drop``; under ``uneven`` a consumer whose share is a record
        short may yield one fewer, and a :class:`~dlstore.pipeline.Loader` tops it up with an agreed empty
        batch."""
        return self.plan().num_batches

    @property
    def smallest_share(self) -> int:
        """Records of the smallest consumer's share this epoch (under ``uneven`` shares differ by a record):
        a loader dropping short batches stops every rank at the full batches of this many, so that all yield
        as many (agreed without communication)."""
        return self.plan().smallest_share()

    def use_batch_size(self, batch_size: int) -> None:
        """Adopts the consumer's batch size when this dataset's was left unset (a loader calls it).

        Raises
        ------
        PlacementError
            Where a state loaded before the consumer came (mid-epoch, its batch size taken) was saved with
            another batch size, and the shares depend on it (as :meth:`load_state_dict` refuses it).
        """
        state_batch = self.__dict__.get("_state_batch")
        if state_batch is not None and int(batch_size) != state_batch[0]:
            raise self._other_batch(*state_batch, int(batch_size))
        self._state_batch = None
        if self.batch_size is None:
            self.batch_size = int(batch_size)

    def _other_batch(self, batch: int, k: int, epoch: int, have: int) -> PlacementError:
        return PlacementError(f"the state was saved at sample {k} of epoch {epoch} with batch size {batch}; this "
                              f"dataset has batch size {have}, and remainder={self.remainder!r} cuts each epoch "
                              f"among the consumers in whole batches: resuming mid-epoch would read some records "
                              f"twice and others never. Resume with batch_size={batch}, or from an epoch's start "
                              f"(sample_in_epoch 0); remainder='uneven' shares do not depend on the batch size")

    def _read_batch_size(self) -> int:
        if self.batch_size is not None:
            return self.batch_size
        chunk = self._core_options.chunk_size
        return max(1, int(chunk // self.mean_record_bytes)) if self.mean_record_bytes else 1

    def read_plan(self, epoch: Optional[int] = None, emitted: int = 0, world: Optional[World] = None,
                  health: Optional[MountHealth] = None, limit: Optional[int] = None) -> _ReaderPlan:
        """What this consumer (or ``world``'s, a rank of the same world) reads of ``epoch`` after handing out
        ``emitted`` samples: every record's file, frame and mount in reading order, and the order they are
        handed out in, as the reader is given them (:func:`dlstore.placement.rank.plan_rank`).

        ``health``: the mounts that failed in this pass, whose blocks are read from their next place.
        ``limit``: only the next ``limit`` records, where records are handed out as read (a window of a
        pass; see :attr:`~dlstore.placement.Shuffle.planned_in_windows`): only their frames are fetched.
        """
        rank = self._rank_plan(epoch, emitted, world, health)
        if limit is not None and rank.emit is None and limit < len(rank.shards):
            rank = RankPlan(*(a[:limit] for a in rank[:4]), None)
        return self._watched(self._checked_plan, rank, world is None)

    def _checked_plan(self, rank: RankPlan, mine: bool) -> _ReaderPlan:
        """:meth:`read_plan` of ``rank``'s records, after the checks of this rank's own (``mine``)."""
        if mine:
            self.index.check(rank.shards)  # the shards this rank opens first, not checked yet
            self._check_copies(rank.shards)  # and their copies through its mounts
        return reader_plan(rank, self.index.frames, self._paths_of, mounts=self._layout is not None,
                           num_shards=len(self.shards))

    def _watched(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, each of its calls to the mounts (listings, stats, manifest reads: those
        :mod:`dlstore.io.deadline` marks) bounded by ``read_timeout``."""
        return deadline.within(self.options.get("read_timeout"), "opening the Dataset's shards", fn, *args,
                               **kwargs)

    def _rank_plan(self, epoch: Optional[int], emitted: int, world: Optional[World],
                   health: Optional[MountHealth]) -> RankPlan:
        """:func:`plan_rank` for ``read_plan``. This consumer's plan of a pass planned in windows is kept while
        the pass has no failures: records are handed out as read, so the plan after ``emitted`` is the kept
        one less its first records, and the windows of a pass slice one plan rather than plan the rest of
        the epoch each (:meth:`batches` lets it go at the pass's end)."""
        epoch_plan = self.plan(epoch)
        mine = (world is None and self.shuffle_kind.planned_in_windows
                and (health is None or not health.avoid))
        kept = self.__dict__.get("_kept_rank")
        if mine and kept is not None and kept[0] is epoch_plan and kept[1] <= emitted:  # kept: emitted as read
            skip = emitted - kept[1]
            return RankPlan(*(a[skip:] for a in kept[2][:4]), None)
        rank = self._plan_rank(epoch_plan, emitted, world, health)
        if mine and rank.emit is None:
            self._kept_rank = (epoch_plan, emitted, rank)
        return rank

    def _plan_rank(self, epoch_plan: EpochPlan, emitted: int, world: Optional[World],
                   health: Optional[MountHealth]) -> RankPlan:
        w = self.world if world is None else world
        rank_mounts = self._rank_mounts if world is None else self._assign(w)
        failed = health.avoid if health is not None else []  # mounts failed, or holding a bad copy

        def remap(shards: np.ndarray, blocks: np.ndarray) -> np.ndarray:
            assert health is not None
            keys, back = np.unique(np.stack([shards, blocks], axis=1), axis=0, return_inverse=True)
            chosen = []
            for shard, block in keys.tolist():
                place = health.choose(shard, self._places(shard, block, rank_mounts))
                if place is None:
                    raise _NoPlace(shard, block)
                chosen.append(place)
            return np.asarray(chosen, dtype=np.int64)[back.reshape(-1)]

        return plan_rank(epoch_plan, w.consumer, rank_mounts, layout=self._layout, emitted=emitted, failed=failed,
                         remap=remap)

    def _path_of(self, shard: int, mount: int) -> str:
        return self.shards[shard] if self._layout is None else self._layout.path(shard, mount)

    def _paths_of(self, shards: np.ndarray, mounts: np.ndarray) -> List[str]:
        if self._layout is None:
            if len(shards) == len(self.shards):  # every shard, in order
                return self.shards
            return [self.shards[s] for s in shards.tolist()]
        return [self._layout.path(s, m) for s, m in zip(shards.tolist(), mounts.tolist())]

    def _places(self, shard: int, block: int, rank_mounts: Optional[Sequence[int]] = None) -> Tuple[int, ...]:
        """The mounts block ``block`` of ``shard`` can be read through, best first (``mount_for``: the
        rank's choice, then its failover order); ``(0,)``, the one place, without mounts."""
        if self._layout is None:
            return (0,)
        first, fallbacks = mount_for(self._layout, shard, self._rank_mounts if rank_mounts is None else rank_mounts,
                                     block=block)
        return (first, *fallbacks)

    def _reader_plan(self, epoch: int, emitted: int, health: MountHealth, limit: Optional[int] = None) -> _ReaderPlan:
        return self.read_plan(epoch, emitted, health=health, limit=limit)

    def window_starts(self, records: int, emitted: int = 0) -> np.ndarray:
        """Where a pass from sample ``emitted`` that reads ``records`` records gives its reader the next
        window (indices into the pass's read plan, the first window's start left out); empty when the
        shuffle is not planned in windows (:meth:`read_plan`'s ``limit``)."""
        starts, at, windows = [], 0, 0
        while (size := self._window(emitted + at, windows)) is not None and at + size < records:
            at += size
            windows += 1
            starts.append(at)
        return np.asarray(starts, dtype=np.int64)

    def _window(self, start: int, windows: int) -> Optional[int]:
        """Records the next reader of a pass is given, from sample ``start`` on, after ``windows`` windows of
        the pass: None (the rest of the epoch) unless the shuffle is planned in windows. Windows hold whole
        batches of the epoch, the first :data:`FIRST_WINDOW_BATCHES`, each next one four times the last, up
        to :data:`MAX_WINDOW_RECORDS` records. Only a pass spread over more files than the
        ``plan_window_files`` setting is planned in windows: over few files, its offsets come cheaply from
        the manifest, and a reader per window would only open and map the same files again."""
        if not self.shuffle_kind.planned_in_windows:
            return None
        if min(len(self), len(self.shards)) <= settings.get("plan_window_files"):
            return None
        batch = self._read_batch_size()
        batches = min(FIRST_WINDOW_BATCHES * 4 ** min(windows, 16), max(1, MAX_WINDOW_RECORDS // batch))
        return (batch - start % batch) + (batches - 1) * batch

    def _core(self, plan: _ReaderPlan, start: int = 0):
        # Under a shuffle buffer the records held stay in the chunks read, up to twice the buffer's
        # bytes (then the oldest chunks' remaining records are copied out and the chunks let go).
        hold = 0
        if plan.emit is not None:
            hold = max(int(2 * self.buffer_size * self.mean_record_bytes), 2 * self._core_options.chunk_size)
        # Restarted mid-batch (a resume, a failover), the first batch completes the one under way, so
        # that batches keep the epoch's boundaries.
        batch = self._read_batch_size()
        if self.engine == "gds":
            return self._gds_core(plan, batch, batch - start % batch, hold)
        from dlstore import _C

        return _C.PlanReader(plan.paths, plan.file, plan.offset, plan.size, plan.emit, self.format, batch,
                             self._core_options, hold_bytes=hold, sequential=not self.shuffle_kind.random_reads,
                             first_batch=batch - start % batch, device=plan.device)

    def _gds_core(self, plan: _ReaderPlan, batch: int, first_batch: int, hold: int):
        # The same plan and schedule as _C.PlanReader; bytes land in GPU memory.
        from dlstore.io.gds import GdsPlanReader

        o = self._core_options
        return GdsPlanReader(plan.paths, plan.file, plan.offset, plan.size, plan.emit, device=self.device_index,
                             mounts=plan.device, batch_size=batch, first_batch=first_batch, chunk_size=o.chunk_size,
                             depth=o.depth, hold_bytes=hold, verify=self.verify, on_error=o.on_error,
                             mode=self.choice.gds_mode)

    def batches(self) -> Iterator:
        """Yields RecordBatches of this consumer's records for the current epoch, from the current position
        (with ``io="gds"``, :class:`~dlstore.io.gds.DeviceBatch` objects in GPU memory).

        Every batch holds ``batch_size`` records (an epoch's last may hold fewer, and so may the last batch
        before an error that ends the pass: the good records read before it, when no copy is left to
        read the rest from; a :class:`~dlstore.pipeline.Loader` fills its own batches). The position
        (:attr:`sample_in_epoch`) advances as batches are handed out; at the end of the epoch it
        moves to the start of the next one. A loader that prefetches sets the position it has
        really consumed with :meth:`load_state_dict` before it saves one.

        A batch is a view into the chunk its records were read into when they lie in one, else a
        buffer they were copied into; either stays valid while the batch (or a view of it) is held.
        """
        metrics.track(self)  # a copy (a DataLoader worker's) is exported once it reads; tracked already: nothing
        self._pass_starts()
        epoch = self.epoch
        names = self.mounts if self._layout is not None else [""]
        health = MountHealth(names, self.options.get("max_retries"))
        totals: Dict[str, int] = {}
        # Life counts (stats()["life"], what dlstore.metrics exports), per batch handed out, never per record.
        # Under skip/warn, when the position moved past more records than were handed out, the readers'
        # counts of records skipped as corrupt are taken: the positions overcount them, as a record padded
        # into the epoch again is skipped again (under raise none is skipped: a pass that ends in an error may
        # stand past the record it raised for); the pass's end sets them exactly, with its failovers and retries.
        life, begun, skipped_before = self._life, self.sample_in_epoch, self._life["skipped"]
        life["passes"] += 1
        handed = passed = self.skipped_this_pass = 0
        skips = self.options.on_error != "raise"
        live = None  # the reader under way, until its counts are in totals

        def hand_out(batch: Any) -> Any:
            nonlocal handed, passed
            handed += batch.num_records
            life["records"] += batch.num_records
            life["bytes"] += int(batch.nbytes)
            if skips and self.sample_in_epoch - begun - handed > passed:
                passed = self.sample_in_epoch - begun - handed
                self.skipped_this_pass = totals.get("skipped", 0) + (self._new_skips(live) if live is not None else 0)
                life["skipped"] = max(life["skipped"], skipped_before + self.skipped_this_pass)
            return batch

        warner = CorruptionWarnings(self.options.on_error == "warn", stacklevel=2)
        self._corruptions = []
        core = None
        notes: List[str] = []
        batch_size = self._read_batch_size()
        samples = self.plan(epoch).num_samples(self.world.consumer)
        windows = 0  # windows of this pass read (a shuffle planned in windows)
        ahead = None  # the next window's (start, plan, reader), made and started before its turn
        tried = False  # whether the next window was planned ahead (or could not be: its turn plans it)
        try:
            while True:
                start = self.sample_in_epoch
                limit = self._window(start, windows)
                if ahead is not None and ahead[0] == start:
                    _, plan, core = ahead
                else:
                    try:
                        plan = self._reader_plan(epoch, start, health, limit)
                    except _NoPlace as gone:
                        raise self._gave_up(gone.shard, gone.block, health, None) from None
                    core = self._core(plan, start)
                ahead, tried, live = None, False, core
                warner.next_reader()
                total = len(plan.file) if plan.emit is None else len(plan.emit)
                more = limit is not None and start + total < samples  # a window: the pass goes on after it
                # The next window is planned, and its reads started, once this one's last reads are in
                # flight (and its first batch has gone out), so that the device never waits between
                # windows.
                lead = (self._core_options.depth + 1) * batch_size if more else -1
                # A batch cut short by an error that follows it is held back: when the plan restarts
                # (another mount, a retry) it is read again whole, so the batches are a clean read's;
                # it goes out only before an error that ends the pass.
                held, held_at, error = None, start, None
                try:
                    while True:
                        before = core.position
                        if not tried and before > 0 and total - before <= lead:
                            ahead, tried = self._read_ahead(epoch, start + total, windows + 1, health), True
                        batch = core.next_batch()
                        warner.check(core)
                        if batch is None:
                            break
                        if batch.num_records < min(batch_size - (start + before) % batch_size, total - before):
                            held, held_at = batch, start + core.position
                            batch = core.next_batch()  # raises the error that cut it short, if any
                            warner.check(core)
                            self.sample_in_epoch = held_at
                            yield hand_out(held)
                            held = None
                            if batch is None:
                                break
                        self.sample_in_epoch = start + core.position
                        yield hand_out(batch)
                except (DlstoreIOError, CorruptRecordError) as e:
                    error = e
                finally:
                    _add_counts(totals, core.stats())
                    live = None
                    self._add_corruptions(core.corruptions(), totals)
                    notes += [n for n in core.notes() if n not in notes]
                if error is None:
                    if more:
                        windows += 1
                        continue
                    break
                ahead = None  # planned before the failure: the pass restarts with what it now knows
                try:
                    restart = self._recover(error, plan, start, core, health, totals)
                except DlstoreError as final:
                    if held is not None:  # the good records before the error go out first
                        self.sample_in_epoch = held_at
                        yield hand_out(held)
                    raise final
                if restart is not None:  # a record no copy holds good was left out, just before this
                    self.sample_in_epoch = restart
                    if held is not None:
                        yield hand_out(held)
                elif held is not None:  # read again by the restarted plan: handed out once, counted once
                    totals["records"] -= held.num_records
                    totals["payload_bytes"] -= int(held.nbytes)
                held = None
            self.epoch, self.sample_in_epoch = epoch + 1, 0
        finally:
            for reader in (core, ahead[2] if ahead is not None else None):
                close_reader(reader)
            core = ahead = None  # their files, mappings and buffers go now
            self.__dict__.pop("_kept_rank", None)
            self._last = {**totals, **health.stats.as_dict(), "notes": notes}
            self.skipped_this_pass = totals.get("skipped", 0)
            life["skipped"] = max(life["skipped"], skipped_before + self.skipped_this_pass)
            life["failovers"] += health.stats.failovers
            life["retries"] += health.stats.retries

    def _add_corruptions(self, found: List[Tuple[str, int, str]], totals: Dict[str, int]) -> None:
        """Adds a reader's skipped records to the pass's, each record once: one padded into another window (or
        met again after a restart) was counted by that reader too, and comes off ``totals["skipped"]``."""
        listed = self._skipped_records()
        for path, offset, what in found:
            if (path, offset) in listed:
                totals["skipped"] -= 1
            else:
                listed.add((path, offset))
                self._corruptions.append((path, offset, what))

    def _new_skips(self, core: Any) -> int:
        """Records the reader under way skipped that no earlier reader of the pass did (rare: asked when
        records were skipped; a life count, exported as a counter, must not count one twice)."""
        listed = self._skipped_records()
        return core.stats()["skipped"] - sum((path, offset) in listed for path, offset, _ in core.corruptions())

    def _skipped_records(self) -> set:
        """``(path, offset)`` of each record this pass skipped as corrupt so far."""
        return {(path, offset) for path, offset, _ in self._corruptions}

    def _read_ahead(self, epoch: int, start: int, windows: int, health: MountHealth):
        """``(start, plan, reader)`` of the window from sample ``start`` with its first reads started; None
        when it cannot be planned now (its turn plans it again, and raises what planning raises)."""
        try:
            plan = self._reader_plan(epoch, start, health, self._window(start, windows))
        except (_NoPlace, DlstoreError):
            return None
        core = self._core(plan, start)
        if hasattr(core, "start"):  # the GPU reader starts its reads when first asked for a batch
            core.start()
        return start, plan, core

    def _recover(self, error: DlstoreError, plan: _ReaderPlan, start: int, core, health: MountHealth,
                 totals: Dict[str, int]) -> Optional[int]:
        """What follows a read error of a pass: the plan restarts on another place (None), or just after a
        corrupt record no copy holds good (its position in the epoch); raises when the pass must end."""
        if isinstance(error, DlstoreIOError):
            self._fail_over(error, plan, self.sample_in_epoch - start, health)
            return None
        if not self._reads_around:
            named = _naming_the_index(error, self.index)
            if named is error:
                raise error
            raise named from error
        return self._read_around(error, plan, start, health, totals)

    def _read_around(self, error: CorruptRecordError, plan: _ReaderPlan, start: int, health: MountHealth,
                     totals: Dict[str, int]) -> Optional[int]:
        """A record failed its frame or CRC check: marks that copy bad and picks another holder (None:
        restart where the pass stands); when none holds it good, applies ``on_error`` (raise, or the
        epoch position just after the record, left out)."""
        r = replicas.locate(plan.paths, plan.file, plan.offset, plan.size, error.path, error.offset)
        if r is None:
            raise error
        shard, mount = plan.places[int(plan.file[r])]
        record, offset = int(plan.records[r]), int(error.offset)
        what = error.reason
        candidates = self._places(shard, record // self.block_records)
        mount_name = self.mounts[mount]
        line = replicas.bad_copy_line(mount_name, error.path, offset, what)
        instead = None
        if health.corrupt(shard, record, mount, line):  # else back at a bad copy: nowhere better to go
            instead = health.next_copy(shard, record, candidates)
            self._copy_reports.report(line, error.path, offset, None if instead is None else self.mounts[instead],
                                      stacklevel=5)
        if instead is not None:
            health.stats.events.append(f"{mount_name} -> {self.mounts[instead]} at record {record} of shard "
                                       f"{shard}: bad copy ({what})")
            return None
        bad = health.bad_for(shard, record)
        message = replicas.no_good_copy_message(
            error.path, offset, what, record, shard, [(self.mounts[m], self._layout.path(shard, m)) for m in bad],
            [self.mounts[m] for m in candidates if m not in bad])
        if self.options.on_error == "raise":
            raise CorruptRecordError(message, path=error.path, offset=offset, reason=what) from error
        totals["skipped"] = totals.get("skipped", 0) + 1
        self._add_corruptions([(error.path, offset, what)], totals)
        if self.options.on_error == "warn":
            warnings.warn(f"{message} (skipped)", RuntimeWarning, stacklevel=4)
        return start + replicas.emission_index(plan.emit, r) + 1

    def _fail_over(self, error: DlstoreIOError, plan: _ReaderPlan, handed: int, health: MountHealth) -> None:
        """Records a failed read of ``plan``, of which the pass handed out ``handed`` records, and waits
        before the plan restarts; raises when no place is left."""
        # Read positions not handed out yet (the pass's count, not the reader's position: the reader has
        # moved past a batch whose build failed, picks of a batch under way, and a batch cut short that the
        # pass holds back); the failing file is the one the error names, else the file of the first of them;
        # the failing record, the first of them in that file holding the byte the error names (a direct
        # read starts at the aligned block before it), else the first.
        left = (np.arange(handed, len(plan.file)) if plan.emit is None else np.sort(plan.emit[handed:]))
        if len(left) == 0:  # the failure came with the last records: name the plan's last one
            left = np.array([len(plan.file) - 1])
        index = plan.paths.index(error.path) if error.path in plan.paths else int(plan.file[left[0]])
        shard, mount = plan.places[index]
        mine = left[plan.file[left] == index]
        if len(mine) == 0:
            mine = left[:1]
        k = int(mine[0])
        if error.offset is not None:
            holds = mine[plan.offset[mine] + plan.size[mine] > error.offset]
            if len(holds):
                k = int(holds[np.argmin(plan.offset[holds])])
        record = int(plan.records[k])
        health.fail(shard, mount)
        block = record // self.block_records
        chosen = health.choose(shard, self._places(shard, block))
        if chosen is None:
            raise self._gave_up(shard, block, health, error, record=record, offset=int(plan.offset[k])) from error
        time.sleep(health.record(shard, mount, chosen, f"record {record} of shard {shard}", error))

    def _gave_up(self, shard: int, block: int, health: MountHealth, cause: Optional[BaseException], *,
                 record: Optional[int] = None, offset: Optional[int] = None) -> DlstoreIOError:
        if record is None:
            record = block * self.block_records
        if offset is None:
            offset = int(self.index.frames([shard], [record])[0][0])
        if self._layout is None:
            places = [("", self.shards[shard])]
        else:
            places = [(self.mounts[m], self._layout.path(shard, m)) for m in self._places(shard, block)]
        last = places[-1][1]
        where = ", ".join(f"{m} ({p})" if m else p for m, p in places)
        why = f": {cause}" if cause is not None else ""
        return DlstoreIOError(
            f"{last}: at byte {offset}: cannot read record {record} of shard {shard} from any of its "
            f"{len(places)} mount(s) [{where}] after {health.max_retries} retries each{why}",
            path=last, offset=offset, errno=getattr(cause, "errno", None))

    def state_dict(self) -> Dict[str, Any]:
        """``epoch``, ``sample_in_epoch``, ``seed`` and ``num_consumers``: enough to resume exactly; and
        what the epoch's order was made of (``shards``, ``records``, ``order``, a digest of the shuffle and
        its sizes, and ``batch_size``), so that a resume mid-epoch over other records or in another order is
        refused. A state at the end of the consumer's share (saved after the epoch's last batch, before the
        loop moved on) is the next epoch's start, which another world size may resume too."""
        epoch, k = self.epoch, self.sample_in_epoch
        if k and k >= len(self):  # the consumer's whole share of this epoch read
            epoch, k = epoch + 1, 0
        return dict(SamplerState(epoch, k, self.seed, self.world.num_consumers).to_dict(),
                    shards=len(self.shards), records=int(np.sum(self.counts)), order=self._order_digest(),
                    batch_size=self.batch_size or 1)

    def _order_digest(self) -> str:
        """What besides the seed, the records and the batch size (kept apart in the state, checked under ``pad``
        and ``drop``) decides which record comes at which sample of an epoch."""
        import hashlib

        what = (self.shuffle, self.shuffle_shards, self.buffer_size, self.block_records, self.block_window,
                self.remainder, self.interleave)
        kept = self.__dict__.get("_kept_digest")
        if kept is None or kept[0] is not self.counts or kept[1] != what:  # a state may be saved every step
            digest = hashlib.sha1(repr(what).encode())
            digest.update(np.ascontiguousarray(self.counts, dtype=np.int64).tobytes())
            kept = self._kept_digest = (self.counts, what, f"{self.shuffle}:{digest.hexdigest()[:12]}")
        return kept[2]

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resumes at ``state``: the next :meth:`batches` starts there, also after :meth:`set_epoch` of that
        epoch (a loop that sets each epoch resumes); another epoch forgets it. A :class:`~dlstore.pipeline.Loader`
        over this dataset (or the DALI feed, or a DlstoreIterableDataset) starts its next iteration there
        (:attr:`resume_point`). A different number of consumers is accepted at an epoch boundary only.

        Raises
        ------
        PlacementError
            When the seed differs, or the world changed size mid-epoch (the records already read
            were split for the old world; finish that epoch with it, or resume from its end), or the
            records or their order (shuffle, its sizes) changed mid-epoch.
        """
        if not isinstance(state, Mapping):
            raise PlacementError(f"not a dataset state: {state!r:.80} (state_dict() gives one)")
        missing = [k for k in ("epoch", "sample_in_epoch") if k not in state]
        if missing:
            raise PlacementError(f"not a dataset state (it lacks {', '.join(missing)}; state_dict() gives one)")
        if isinstance(state.get("source"), Mapping) and "order" not in state:
            raise PlacementError("a consumer's state (a Loader's or the DALI feed's: the dataset's is its 'source'), "
                                 "not a dataset's: load it with that consumer's load_state_dict, or this dataset's "
                                 "part, state['source'], here")
        try:
            for key in ("epoch", "sample_in_epoch", "seed", "num_consumers", "batch_size"):
                if state.get(key) is not None:
                    operator.index(state[key])
        except TypeError:
            raise PlacementError(f"not a dataset state: its {key} is {state[key]!r}, not an integer") from None
        if int(state.get("seed", self.seed)) != self.seed:
            raise PlacementError(f"the state was saved with seed {state['seed']}, this dataset has seed {self.seed}")
        saved = SamplerState(int(state["epoch"]), int(state["sample_in_epoch"]), self.seed,
                             int(state.get("num_consumers", self.world.num_consumers)))
        epoch, k = saved.epoch, saved.for_consumers(self.world.num_consumers).sample_in_epoch
        batch = int(state.get("batch_size") or 0)
        self._state_batch = None
        if k and batch and self.remainder != "uneven":
            if self.batch_size is None:  # left to a consumer not made yet: the state's, which use_batch_size checks
                self.batch_size, self._state_batch = batch, (batch, k, epoch)
            elif batch != self.batch_size:
                raise self._other_batch(batch, k, epoch, self.batch_size)
        if k and "order" in state and state["order"] != self._order_digest():  # states saved before: unchecked
            now = f"{len(self.shards):,} shards, {int(np.sum(self.counts)):,} records, shuffle {self.shuffle}"
            then = (f"{int(state.get('shards', 0)):,} shards, {int(state.get('records', 0)):,} records, shuffle "
                    f"{str(state['order']).split(':')[0]}")
            differs = "the same counts but other shuffle sizes or settings" if then == now else then
            raise PlacementError(f"the state was saved at sample {k} of epoch {epoch} over {differs}; this dataset has "
                                 f"{now}: resuming mid-epoch would read some records twice and others never. Resume "
                                 f"with the dataset as it was, or from an epoch's start (sample_in_epoch 0)")
        n = self.plan(epoch).num_samples(self.world.consumer)
        if not 0 <= k <= n:
            raise PlacementError(f"sample_in_epoch {k} is outside 0..{n} for consumer {self.world.consumer}")
        self._resume_at(epoch, k)

    def stats(self) -> Dict[str, Any]:
        """Counters of the last pass (records, bytes, bytes read from files and, of those, what an O_DIRECT
        engine read from the page cache: ``cache_bytes_read``; chunks, batches gathered by copy, records the
        shuffle buffer copied out, failovers, retries, ``corrupt_copies`` and ``bad_copies``: copies
        found bad and read around), the engine and why, the shuffle and this rank's mounts; with
        ``io="gds"`` also ``gds_mode`` (``gds`` or ``compat``), ``gds_backend`` and ``crc`` (where the
        CRC ran).

        Under ``life``, counts over this dataset's life, the pass under way included (what
        :mod:`dlstore.metrics` exports): ``passes``, ``records`` and ``bytes`` (payload) handed out,
        counted per batch; ``skipped`` (corrupt records left out, each once even where ``remainder="pad"``
        reads it again: as the position moves past them, and exactly at each pass's end), ``failovers``
        and ``retries`` (at each pass's end)."""
        out = dict(self._last)
        out["life"] = dict(self._life)
        if self.engine == "gds":  # before a pass: what the verdict says (the pass's backend says more)
            out.setdefault("gds_mode", self.choice.gds_mode)
        out.update(engine=self.choice.engine, engine_reason=self.choice.reason, shuffle=self.describe_shuffle(),
                   manifests=list(self.index.manifests), index_notes=list(self.index.notes),
                   mounts=self.rank_mounts, layout=self._layout.kind if self._layout is not None else "files",
                   world=repr(self.world))
        return out

    def record_keys(self, batch: Any) -> Tuple[np.ndarray, np.ndarray]:
        """``(shard, record)`` of each record of ``batch`` (one of :meth:`batches`), as int64 arrays: the
        shard's index in :attr:`shards` and the record's in the shard, found from the batch's file
        indices and offsets by one ``searchsorted`` over the index's frame offsets."""
        files = np.asarray(batch.file_indices, dtype=np.int64)
        # The reader's files are those its plan reads (the shards it needs, or (shard, mount) places: a
        # shard's copy), not all the shards in order: each is told by its path, once per batch.
        lookup = self.__dict__.get("_shard_of_path")
        if lookup is None:
            if self._layout is None:
                lookup = {path: s for s, path in enumerate(self.shards)}
            else:
                lookup = {self._layout.path(s, m): s for s in range(len(self.shards)) for m in self._layout.holders[s]}
            self._shard_of_path = lookup
        used, first, inverse = np.unique(files, return_index=True, return_inverse=True)
        shard = np.array([lookup[batch.path(int(k))] for k in first], dtype=np.int64)[inverse.reshape(-1)]
        keys = self.__dict__.get("_frame_keys")
        if keys is None:  # every frame as (shard << 40) | offset, in order: shards hold less than 1 TiB
            starts = np.concatenate([[0], np.cumsum(self.counts)])
            offsets = np.concatenate([self.index.shard_offsets(s) for s in range(len(self.shards))] or [[]])
            keys = self._frame_keys = (np.repeat(np.arange(len(self.shards), dtype=np.int64), self.counts) << 40
                                       | offsets.astype(np.int64), starts)
        frames, starts = keys
        at = np.searchsorted(frames, shard << 40 | np.asarray(batch.file_offsets, dtype=np.int64))
        return shard, at - starts[shard]

    def corruptions(self) -> List[Tuple[str, int, str]]:
        """``(path, offset, what)`` for each corrupt record skipped in the last pass (``on_error`` skip/warn)."""
        return list(self._corruptions)

    def describe(self) -> str:
        """What this consumer reads, in a line: e.g. ``consumer 1 of 4: 2,300 of 9,200 records, shuffle block ...``."""
        w = self.world
        start, stop = self.plan().span(w.consumer)
        where = f"positions {start:,}..{stop - 1:,} of each epoch's sequence" if stop > start else "no positions"
        return (f"consumer {w.consumer} of {w.num_consumers}: {len(self):,} of {int(self.counts.sum()):,} records "
                f"({where}) in {len(self.shards)} shards, remainder {self.remainder}, "
                f"shuffle {self.describe_shuffle()}")

    def describe_shuffle(self) -> str:
        """The shuffle in words, with its block and buffer sizes in records and bytes (:meth:`Shuffle.describe`)."""
        words = self.shuffle_kind.describe(len(self), block_records=self.block_records, block_window=self.block_window,
                                           buffer_size=self.buffer_size, mean_record_bytes=self.mean_record_bytes,
                                           shuffle_shards=self.shuffle_shards)
        if self.interleave > 1:
            words += f"; the shards read {self.interleave} at a time, one record from each in turn (interleave)"
        return words

    def for_worker(self, worker: int, num_workers: int) -> "Dataset":
        """A copy of this dataset for DataLoader worker ``worker`` of ``num_workers`` (same rank)."""
        clone = copy.copy(self)
        clone.world = self.world.with_worker(worker, num_workers)
        clone._last = {}
        clone._life = _new_life()  # the worker's own counts, not the rank's
        clone._corruptions = []
        clone.__dict__.pop("_kept_rank", None)  # the rank's plan, not the worker's
        clone._resume_point = None  # a point in the rank's share, none in the worker's
        return clone

    def __repr__(self) -> str:
        where = f"{len(self.mounts)} mounts ({self._layout.kind})" if self._layout is not None else "local files"
        return (f"Dataset({len(self.shards)} {self.format} shards, {int(self.counts.sum())} records on {where}, "
                f"{self.world}, shuffle={self.shuffle!r}, io={self.choice.engine!r}: {self.choice.reason})")


@functools.lru_cache(maxsize=None)
def _dataset_arguments() -> Tuple[str, ...]:
    """The keyword arguments Dataset takes: its signature's and the reader options' names."""
    own = [n for n, p in inspect.signature(Dataset.__init__).parameters.items()
           if p.kind == p.KEYWORD_ONLY and n != "options"]
    return tuple(own) + tuple(ReadOptions.names())


def _naming_the_index(error: DlstoreError, index: Any) -> DlstoreError:
    """A frame that disagrees with its index (not a CRC, which is the file's own): the error, naming the
    manifest the frame offsets came from and how to rebuild it, since the file itself may be sound (a
    manifest damaged on disk gave a healthy shard's name to its fault). Other errors as they are."""
    if not isinstance(error, CorruptRecordError) or "the index" not in (error.reason or ""):
        return error
    found = index.manifest_for(error.path) if error.path else None
    if found is None:
        return error
    manifest, directory = found
    return CorruptRecordError(f"{error} (its frame offsets come from {manifest}: if `dlstore verify {error.path}` "
                              f"finds the file sound, `dlstore index {directory}` rebuilds them)",
                              path=error.path, offset=error.offset, reason=error.reason)


def dataset_for(source: Any, kwargs: Optional[Dict[str, Any]] = None, *, shared: Sequence[str] = (),
                rest: bool = False, **defaults: Any) -> Source:
    """This consumer's records: ``source`` when it is a :class:`~dlstore.sources.source.Source` already,
    else a :class:`Dataset` over those paths. The one way paths become a Dataset (the adapters' and the
    loader helpers').

    Parameters
    ----------
    source : paths or Source
    kwargs : dict, optional
        Arguments given by the user: those :class:`Dataset` takes (its keyword arguments and the reader
        options) are taken out of it, and win over ``defaults``.
    shared : sequence of str
        Arguments that also stay in ``kwargs`` (``seed``, ``on_error``: the loader's too).
    rest : bool
        Whether ``kwargs`` may keep arguments that are not the Dataset's (a loader helper's own);
        otherwise they are refused.
    **defaults
        The caller's defaults (``shuffle``, ``seed``, ``batch_size``...). ``world``: detected from the
        launcher when None or absent; ``remainder`` (when None or absent): ``uneven`` for a single consumer
        (every record once), ``pad`` for several (equal full batches on every rank, so none waits for
        another in a collective).

    Raises
    ------
    ValueError
        When Dataset arguments come with a ready source (they belong on it).
    TypeError
        When ``kwargs`` holds other arguments and ``rest`` is False.
    """
    kwargs = {} if kwargs is None else kwargs
    mine = [k for k in _dataset_arguments() if k in kwargs]
    if isinstance(source, Source):
        given = [k for k in mine if k not in shared]
        if given or (kwargs and not rest):
            raise ValueError(f"{', '.join(sorted(given or kwargs))} belong to the source: set them on "
                             f"{type(source).__name__} when making it, not here")
        return source
    args = {k: (kwargs[k] if k in shared else kwargs.pop(k)) for k in mine}
    if kwargs and not rest:
        raise TypeError(f"Dataset() got unexpected keyword arguments {', '.join(sorted(kwargs))}")
    for key, value in defaults.items():
        if value is not None or key not in ("world", "remainder"):  # None: this function's choice
            args.setdefault(key, value)
    world = args["world"] = args.get("world") or detect_world().with_torch_worker()
    args.setdefault("remainder", "uneven" if world.num_consumers == 1 else "pad")
    return Dataset(source, **args)


def _index_good_copies(layout, first: List[str], fmt: str, progress: bool):
    """The index of the shards from their first copies (``first``); a shard whose copy fails its check
    or cannot be read while being indexed (no current manifest, bit rot, a device error) is indexed from
    its next holder instead, so that a job restarted after a disk died starts from its replicas. A
    manifest an attempt built before the failure is kept; its note is not (``index.notes`` has the last
    attempt's, and one line per copy passed over)."""
    moved: List[str] = []
    while True:
        try:
            index = index_dataset(first, fmt, progress, check_all=False)
            index.notes += moved
            return index
        except (CorruptRecordError, DlstoreIOError) as e:
            if e.path not in first:
                raise
            s = first.index(e.path)
            holders = list(layout.holders[s])
            at = holders.index(next(m for m in holders if layout.path(s, m) == e.path))
            if at + 1 == len(holders):
                raise
            first[s] = layout.path(s, holders[at + 1])
            moved.append(f"{e}: shard {layout.shards[s]} indexed from {first[s]} instead")


class _NoPlace(Exception):
    """No mount is left to read a block of a shard from."""

    def __init__(self, shard: int, block: int):
        super().__init__(shard, block)
        self.shard, self.block = shard, block


def _new_life() -> Dict[str, int]:
    """A Dataset's counts over its life, at zero (:meth:`Dataset.stats`, ``life``)."""
    return {"passes": 0, "records": 0, "bytes": 0, "skipped": 0, "failovers": 0, "retries": 0}


def _add_counts(totals: Dict[str, int], stats: Mapping[str, int]) -> None:
    for key, value in stats.items():
        if isinstance(value, str):  # what ran (the gds reader's mode, backend, CRC), not a count
            totals[key] = value
        elif key == "peak_held_bytes":
            totals[key] = max(totals.get(key, 0), int(value))
        else:
            totals[key] = totals.get(key, 0) + int(value)


def _refuse_twice_named(paths: Sequence[str]) -> None:
    """A shard named twice (a glob and the file, a list holding it twice, or two directories that are one
    through a symbolic link) would be read twice per epoch, its records given twice: a mistake, not a way
    to weight data, so it is refused. Directories are resolved once each, not the shards."""
    keys: Sequence[Any] = paths
    if len(set(paths)) == len(paths):
        directories = {p.rpartition(os.sep)[0] for p in paths}
        if len(directories) == 1:
            return
        real = {d: os.path.realpath(d) for d in directories}
        keys = [(real[p.rpartition(os.sep)[0]], p.rpartition(os.sep)[2]) for p in paths]
        if len(set(keys)) == len(keys):
            return
    seen: set = set()
    twice = next(p for p, k in zip(paths, keys) if k in seen or seen.add(k))
    raise DlstoreError(f"{twice}: named more than once in shards (twice in the list, by a glob or directory and "
                       "again, or through a symbolic link): each shard is read once per epoch; name each file once")
