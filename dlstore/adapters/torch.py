"""PyTorch adapter: an IterableDataset sharded over ranks and DataLoader workers, and a tensor loader.

``import dlstore.adapters.torch`` does not import torch; :class:`TorchLoader` imports it when made,
and :class:`DlstoreIterableDataset` (a ``torch.utils.data.IterableDataset``) when first named.

Examples
--------
Ranks and DataLoader workers, each sample once per epoch, shuffled::

    from dlstore.adapters.torch import DlstoreIterableDataset
    from dlstore.pipeline import ResNet50

    ds = DlstoreIterableDataset("/data/train-*", ResNet50(layout="NCHW", dtype="float32"), batch_size=256)
    for epoch in range(90):
        ds.set_epoch(epoch)
        for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=4):
            ...

The native loader's threads, as torch tensors (no DataLoader, no per-sample Python)::

    from dlstore.adapters.torch import TorchLoader
    from dlstore.pipeline import resnet50_loader

    for batch in TorchLoader(resnet50_loader("/data/train-*", batch_size=256)):
        batch["image"], batch["label"]       # on the GPU when there is one, copied from pinned memory
"""
from __future__ import annotations

import operator
import os
import struct
import tempfile
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from dlstore import metrics
from dlstore._args import whole
from dlstore.adapters.base import BatchAdapter, LastBatch, check_last_batch, import_framework
from dlstore.sources.dataset import dataset_for
from dlstore.io.cuda import parse_device
from dlstore.placement.world import detect_world
from dlstore.sources.source import loaded_point, start_at

__all__ = ["DlstoreIterableDataset", "TorchLoader", "pinned_allocator"]  # noqa: F822 (DlstoreIterableDataset: module __getattr__)

_INSTALL = "pip install torch"
_DLPACK_CPU = 1  # DLDeviceType kDLCPU
_noted_no_cuda = False  # pinned_allocator's note on a machine without CUDA: once per process


def _torch():
    return import_framework("torch", _INSTALL)


def _as_tensor(torch, array: Any):
    """A torch tensor sharing ``array``'s memory (numpy on the CPU, or any DLPack producer, e.g. the CuPy
    arrays of a ``Loader(device="cuda:N")``: a CUDA tensor, no copy; ``from_dlpack`` passes torch's current
    stream, which the producer makes wait for its pending work)."""
    if isinstance(array, np.ndarray):
        # from_numpy warns on read-only arrays (torch has no read-only tensors); DLPack shares them quietly.
        return torch.from_numpy(array) if array.flags.writeable else torch.from_dlpack(array)
    return torch.from_dlpack(array)


class _IterableRecords:
    """The body of :class:`DlstoreIterableDataset`; see there. Kept apart so that this module imports
    without torch: the dataset class is made (with ``torch.utils.data.IterableDataset`` as its second
    base) the first time it is named."""

    def __init__(self, source, pipeline=None, batch_size: Optional[int] = None, *, world: Any = None,
                 shuffle: str = "block", seed: int = 0, remainder: Optional[str] = None,
                 last_batch: str = LastBatch.PARTIAL, prefetch: int = 2, threads: Optional[int] = None,
                 record_key: Optional[str] = None, report_stalls: Any = False, **dataset_kwargs: Any):
        if pipeline is not None:
            if batch_size is None:
                raise ValueError("a pipeline needs a batch_size (the DataLoader's is None with a pipeline)")
            batch_size = whole("batch_size", batch_size, 1)
        if pipeline is None and batch_size is not None:
            raise ValueError("batch_size goes with a pipeline; without one the dataset yields records "
                             "and the DataLoader batches them")
        # This rank's Dataset: its placement (mounts, shuffle, remainder, failover) is shared by the
        # DataLoader workers, each reading its part of the rank's share.
        if hasattr(source, "for_worker"):
            if dataset_kwargs or world is not None:
                raise ValueError("a dlstore.Dataset brings its world and options: set them on it")
            self.dataset = source
        else:
            # With a pipeline the Loader tops a short share up with agreed empty batches, so `uneven` keeps
            # every record once and the ranks' batch counts equal. Without one the DataLoader batches the
            # records, and only equal shares give equal batch counts: the Dataset's default (`pad` over
            # several ranks).
            self.dataset = dataset_for(source, dataset_kwargs, world=world, shuffle=shuffle, seed=seed,
                                       remainder=remainder or ("uneven" if pipeline is not None else None),
                                       batch_size=batch_size)
        if pipeline is None and self.dataset.remainder == "uneven" and self.dataset.world.size > 1:
            warnings.warn(f"DlstoreIterableDataset without a pipeline over {self.dataset.world.size} ranks with "
                          f"remainder='uneven': the DataLoader batches the records, and shares that differ by a "
                          f"record can give the ranks different batch counts, so a collective per step would "
                          f"wait for a rank that has finished; remainder='pad' (every record at least once) or "
                          f"'drop' gives every rank as many", RuntimeWarning, stacklevel=2)
        self.pipeline = pipeline
        self.batch_size = batch_size
        self.seed = whole("seed", seed, 0)
        self.last_batch = check_last_batch(last_batch)
        self.prefetch = whole("prefetch", prefetch, 1)
        self.threads = whole("threads", threads, 1, none_means="the pipeline's choice")
        self.record_key, self.report_stalls = record_key, report_stalls
        self.epoch = 0
        self._board = _EpochBoard()  # where workers that outlive an epoch (persistent_workers) learn the next
        self._current: Any = None  # the loader of the pass under way in this process (not pickled)
        self._passes: Dict[str, Any] = {"passes": 0, "stats": {}, "stalls": None, "waits": None}  # finished, summed
        self._resume: Optional[Dict[str, int]] = None  # where the next pass of `epoch` starts (load_state_dict)
        self._began: Optional[Tuple[int, int]] = None  # (epoch, sample) where a pass began at its Dataset's point
        self._take_dataset_point()

    @property
    def paths(self):
        return list(self.dataset.shards)

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_current"] = None  # a loader holds a thread; a DataLoader worker makes its own
        return state

    def _fold(self, loader: Any) -> None:
        """Adds a finished pass's loader counts to :attr:`_passes`."""
        from dlstore.pipeline.stalls import StallMeter

        summed = self._passes
        summed["passes"] += 1
        _sum_stats(summed["stats"], loader.stats())
        if summed["stalls"] is None:
            summed["stalls"] = StallMeter()
        summed["stalls"].add(loader._stalls.totals)
        counts = loader.wait_histogram()[1]
        summed["waits"] = counts if summed["waits"] is None else tuple(a + b for a, b in zip(summed["waits"], counts))

    def wait_histogram(self) -> Tuple[Tuple[float, ...], Tuple[int, ...]]:
        """The :meth:`dlstore.pipeline.Loader.wait_histogram` of the passes run in this process, together."""
        from dlstore.pipeline.stalls import WAIT_BUCKETS_S

        counts = [0] * len(WAIT_BUCKETS_S)
        current = self._current
        for part in (self._passes["waits"], current.wait_histogram()[1] if current is not None else None):
            if part is not None:
                counts = [a + b for a, b in zip(counts, part)]
        return WAIT_BUCKETS_S, tuple(counts)

    def stats(self) -> Dict[str, Any]:
        """Counters of the passes run in this process, summed (the loaders' ``stats()``: ``batches``,
        ``samples``, ``skipped``, ``fallback_decodes``...), with the last pass's other entries (the
        decoder, the engine), ``passes``, ``stalls`` (:meth:`stall_report`) and the rank's Dataset's
        ``stats()`` under ``dataset``.

        With DataLoader workers the passes run in the worker processes, each with its own counts:
        this process then counts none (``passes`` 0); read with ``num_workers=0`` to see them here.
        """
        out = dict(self._passes["stats"])
        current = self._current
        if current is not None:
            _sum_stats(out, current.stats())
        out.update(passes=self._passes["passes"] + (current is not None), stalls=self.stall_report(),
                   dataset=self.dataset.stats())
        return out

    def stall_report(self) -> Dict[str, Any]:
        """The :meth:`dlstore.pipeline.Loader.stall_report` of the passes run in this process, together."""
        from dlstore.pipeline.stalls import StallMeter

        meter = StallMeter()
        done, current = self._passes["stalls"], self._current
        for part in ([done] if done is not None else []) + ([current._stalls] if current is not None else []):
            meter.add(part.totals)
        return meter.report()

    def set_epoch(self, epoch: int) -> None:
        """Chooses the epoch whose order and augmentation seeds the next pass uses.

        Call it before creating the epoch's DataLoader iterator: workers take a copy of the dataset then.
        Another epoch than a loaded state's forgets that state's resume point; the same epoch keeps it while
        no pass has started from it (see :meth:`load_state_dict`), also one loaded into the Dataset.
        """
        self._take_dataset_point()
        self._take_epoch(epoch)
        self._board.write(self.epoch)

    def _take_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        if self._resume is not None and self._resume["epoch"] != self.epoch:
            self._resume = None

    def state_dict(self, batches_seen: int, num_workers: int = 0,
                   records_per_batch: Optional[int] = None) -> Dict[str, int]:
        """Where a training loop is after drawing ``batches_seen`` items of this epoch from a
        ``DataLoader`` over this dataset with ``num_workers`` workers: save it with the checkpoint.

        With a pipeline an item is one of its batches (``DataLoader(ds, batch_size=None)``); without
        one, pass the DataLoader's ``batch_size`` as ``records_per_batch`` (``drop_last=False``). The
        DataLoader must hand out its workers' items in order (``in_order=True``, its default).

        After the epoch's last item the state is the next epoch's start (``epoch + 1``, ``batches_seen``
        0), as the Dataset's and the Loader's are: an epoch boundary, which resumes with any number of
        workers or world size.

        ``batches_seen`` counts the epoch's items from its start, also in a pass that began at a point loaded
        into the Dataset (its ``load_state_dict``, sample k): k records are k / ``records_per_batch`` items
        before the pass's first; a k that is no whole number of items is refused mid-epoch, as is a count
        short of it.

        Raises
        ------
        ValueError
            When ``batches_seen`` is more than the epoch's items for ``num_workers`` workers.
        """
        if int(batches_seen) < 0 or int(num_workers) < 0:
            raise ValueError(f"batches_seen and num_workers must be non-negative, got {batches_seen} and "
                             f"{num_workers}")
        self._take_dataset_point()
        per_item = self.batch_size if self.pipeline is not None else records_per_batch
        if per_item is None or int(per_item) < 1:
            raise ValueError("without a pipeline, state_dict needs records_per_batch: the DataLoader's batch_size")
        epoch, seen, num_workers, per_item = self.epoch, int(batches_seen), int(num_workers), int(per_item)
        began = self._began[1] if self._began is not None and self._began[0] == epoch else 0
        if seen and began and (began % per_item or seen < began // per_item):
            why = (f"{began} records are not a whole number of items of {per_item}, so no batches_seen names a point "
                   f"of this pass" if began % per_item else
                   f"batches_seen counts the epoch's items from its start, so it is at least {began // per_item} here")
            raise ValueError(f"epoch {epoch}'s pass began at sample {began}, where the Dataset was loaded (its "
                             f"load_state_dict): {why}. Save a state at the epoch's end, or resume from this "
                             f"dataset's own states")
        if seen and seen == self._items_in_epoch(epoch, num_workers, per_item, seen):
            epoch, seen = epoch + 1, 0
        return {"epoch": epoch, "batches_seen": seen, "num_workers": num_workers, "records_per_batch": per_item,
                "seed": self.seed,
                "num_consumers": self.dataset.world.with_worker(0, max(1, num_workers)).num_consumers}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resumes at a :meth:`state_dict`: the next DataLoader pass over this dataset yields exactly the
        items an uninterrupted pass would have yielded after the ones already seen, each worker starting
        at its own position in its share.

        A state at an epoch boundary (``batches_seen`` 0) resumes with any number of DataLoader workers and
        any world size; mid-epoch the world must be the same, and so must the DataLoader's ``num_workers``
        (which only its workers see: a pass with another number refuses when they start).

        The resume point serves one pass, as a :class:`~dlstore.Dataset`'s does
        (:class:`~dlstore.sources.source.SourcePosition`): :meth:`set_epoch` of the state's epoch keeps it
        until a pass starts (its workers, when it has any, all take it), another epoch forgets it, and any
        later pass of the epoch reads it whole from its start, as a Dataset does after ``set_epoch`` of that
        epoch (this dataset does not move on to the next epoch by itself: :meth:`set_epoch` does). A pass
        broken off is a pass. With ``persistent_workers``, load the state before the DataLoader's first pass:
        workers that started earlier keep the copy they were given. A point loaded into the rank's Dataset
        before is forgotten: this state's is the one.

        Raises
        ------
        ValueError
            When ``state`` is not one :meth:`state_dict` gives, its seed differs, it was saved mid-epoch in a
            world of another size, or its ``batches_seen`` is past the end of its epoch.
        """
        if not isinstance(state, Mapping):
            raise ValueError(f"not a DlstoreIterableDataset state: {state!r:.80} (ds.state_dict(batches_seen, "
                             f"num_workers=...) gives one)")
        missing = [key for key in _STATE_KEYS if key not in state]
        if missing:
            raise ValueError(f"not a DlstoreIterableDataset state: it lacks {', '.join(missing)} (it has "
                             f"{', '.join(map(str, state)) or 'nothing'}); ds.state_dict(batches_seen, "
                             f"num_workers=...) gives one")
        try:
            state = {key: operator.index(state[key]) for key in _STATE_KEYS}
        except TypeError:
            bad = next(key for key in _STATE_KEYS if not isinstance(state[key], (int, np.integer)))
            raise ValueError(f"not a DlstoreIterableDataset state: its {bad} is {state[bad]!r}, not an "
                             f"integer") from None
        if state["seed"] != self.seed:
            raise ValueError(f"the state was saved with seed {state['seed']}, this dataset has seed {self.seed}")
        epoch, seen, workers = state["epoch"], state["batches_seen"], state["num_workers"]
        self._take_dataset_point()  # and forgotten just below
        self._resume, self._began = None, None
        if seen:  # mid-epoch (or, in states saved before boundaries were normalised, at the epoch's end)
            now = self.dataset.world.with_worker(0, max(1, workers)).num_consumers
            if now != state["num_consumers"]:
                raise ValueError(f"the state was saved at item {seen} of epoch {epoch} by {state['num_consumers']} "
                                 f"consumers ({workers} DataLoader workers per rank); with {workers} workers this "
                                 f"world has {now}: the epoch's plan depends on them, so resume mid-epoch in a world "
                                 f"of the same size, or from a state saved at an epoch boundary")
            total = self._items_in_epoch(epoch, workers, state["records_per_batch"], seen)
            # At the end every item was handed out: nothing is left of the epoch, whatever the workers.
            self._resume = dict(state, finished=int(seen == total))
            self._board.offer_resume()
        self.epoch = epoch
        self._board.write(self.epoch)

    def _take_dataset_point(self) -> None:
        """Takes a point loaded into the rank's Dataset on its own (``dataset.load_state_dict(state)``, before or
        after this dataset was made) as this dataset's resume point, as the Loader takes its source's
        (:func:`~dlstore.sources.source.loaded_point`): the epoch becomes the point's, and the next pass starts
        at its sample, by :meth:`load_state_dict`'s rules (:meth:`set_epoch`, one pass). The Dataset hands the
        point over: DataLoader workers read copies of it, which would find it again at each pass. Asked between
        passes: in the main process where this dataset is told something, and in a worker where the point was
        loaded after that (the copy holds it)."""
        own = self._resume is not None and "batches_seen" in self._resume  # this dataset's load_state_dict's
        point = loaded_point(self.dataset, hand_over=True, loaded="DlstoreIterableDataset" if own else None)
        if point is None:
            return
        epoch, sample = point
        # A sample of the rank's share: `_worker_share` starts the rank's reader there, and refuses it to workers.
        self._resume = {"epoch": epoch, "sample_in_epoch": sample, "finished": 0}
        self._board.offer_resume()
        self.epoch = epoch
        self._board.write(self.epoch)

    def _items_in_epoch(self, epoch: int, num_workers: int, per: int, seen: int) -> int:
        """Items ``epoch`` hands out with ``num_workers`` DataLoader workers and ``per`` records each; raises
        ValueError when ``seen`` is more."""
        total = sum(self._epoch_items(epoch, num_workers, per)[2])
        if seen > total:
            raise ValueError(f"batches_seen {seen} is more than epoch {epoch}'s {total} items with {num_workers} "
                             f"DataLoader workers and {per} records each")
        return total

    def _epoch_items(self, epoch: int, num_workers: int, per: int) -> Tuple[List[Any], List[int], List[int]]:
        """``(Datasets, records, items)`` of each DataLoader worker of ``num_workers`` (0: none) in ``epoch``,
        ``per`` records to an item, as the Loader makes them (Loader._agree): PARTIAL and FILL top a short
        share up to the agreed count, DROP stops every share at the smallest one's full batches."""
        consumers = [self._consumer(w, num_workers, epoch) for w in range(max(1, num_workers))]
        if self.pipeline is not None:  # each worker's Loader gives its Dataset the batch size, which pads its share
            for consumer in consumers:
                consumer.use_batch_size(per)
        shares = [len(c) for c in consumers]
        smallest = getattr(consumers[0], "smallest_share", None)
        if self.pipeline is not None and self.last_batch in (LastBatch.PARTIAL, LastBatch.FILL) and \
                isinstance(consumers[0].num_batches, int):
            items = [consumers[0].num_batches] * len(shares)
        elif self.pipeline is not None and self.last_batch == LastBatch.DROP:
            items = [smallest // per if isinstance(smallest, int) else n // per for n in shares]
        else:
            items = [-(-n // per) for n in shares]
        return consumers, shares, items

    def _worker_share(self, worker: int, num_workers: int, state: Optional[Dict[str, int]]) -> Tuple[Any, int, int]:
        """``(its Dataset, sample, batches to drop)`` of DataLoader worker ``worker`` of ``num_workers`` (0:
        none) this pass, resumed at ``state`` (a :meth:`load_state_dict` point, or None). Resumed, the workers
        take the turns of the saved pass from the one whose turn was next: worker ``w`` reads the share of the
        saved pass's worker ``(w + next) % num_workers``, from the sample that worker had reached (the
        batches to drop are agreed empty ones it had already handed out)."""
        if state is None or state["epoch"] != self.epoch:
            return self._consumer(worker, num_workers), 0, 0
        if "sample_in_epoch" in state:  # a point of the rank's Dataset (_take_dataset_point)
            sample = state["sample_in_epoch"]
            if num_workers and sample:
                raise ValueError(f"the Dataset this reads was loaded at sample {sample} of epoch {state['epoch']} (its "
                                 f"load_state_dict), a point in the rank's order, which the {num_workers} DataLoader "
                                 f"workers split: resume it with num_workers=0, or from this dataset's own state "
                                 f"(ds.state_dict(batches_seen, num_workers=...), through ds.load_state_dict)")
            return self._consumer(worker, num_workers), sample, 0
        if state["num_workers"] != num_workers:
            # The DataLoader's worker count reaches only its workers (get_worker_info), so this is said here.
            raise ValueError(f"the state was saved at item {state['batches_seen']} of epoch {state['epoch']} reading "
                             f"with {state['num_workers']} DataLoader workers; this pass has {num_workers}: the "
                             f"epoch's plan depends on them, so resume with num_workers={state['num_workers']}, or "
                             f"from a state saved at an epoch boundary")
        per = state["records_per_batch"]
        consumers, shares, items = self._epoch_items(self.epoch, num_workers, per)
        taken, turn = items_per_worker(items, state["batches_seen"])
        plays = (worker + turn) % len(shares)
        full = -(-shares[plays] // per)
        return consumers[plays], min(taken[plays] * per, shares[plays]), max(0, taken[plays] - full)

    def share(self) -> Any:
        """The records this process (or, in a DataLoader worker, this worker) reads this epoch."""
        info = _torch().utils.data.get_worker_info()
        self._take_dataset_point()
        return self._worker_share(info.id if info else 0, info.num_workers if info else 0, self._resume)[0]

    def _consumer(self, worker: int, num_workers: int, epoch: Optional[int] = None) -> Any:
        """The Dataset of DataLoader worker ``worker`` of ``num_workers`` (0: no workers) at ``epoch`` (default:
        this epoch)."""
        ds = self.dataset.for_worker(worker, num_workers) if num_workers else self.dataset
        ds.set_epoch(self.epoch if epoch is None else epoch)
        return ds

    def _take_resume(self, info: Any) -> Optional[Dict[str, int]]:
        """The resume point this pass starts from, if any: the loaded one of this epoch, unless an earlier pass
        took it. It serves one pass (:meth:`load_state_dict`): this process forgets it now (a later pass here, in
        the main process or a persistent worker, reads the epoch whole), and the board says which pass took
        it, so that the workers of a later pass, copies of the main process's dataset that still holds it, do
        not take it again. ``info``: the DataLoader worker's ``WorkerInfo``, None in the main process."""
        resume, self._resume = self._resume, None
        if resume is None or resume["epoch"] != self.epoch:
            return None
        # A pass's workers share torch's base seed (worker seed = base seed + worker id), drawn anew for each
        # iterator over the DataLoader (kept by persistent workers, which forget the point themselves): the
        # pass's name on the board. (A DataLoader made anew for each pass with a generator seeded alike draws the
        # same seed each time: its passes look like one, and each resumes.)
        taker = _MAIN_PASS if info is None else info.seed - info.id
        return resume if self._board.take_resume(taker) else None

    def __iter__(self) -> Iterator[Any]:
        torch = _torch()
        info = torch.utils.data.get_worker_info()
        if info is not None:  # a persistent worker's copy was taken epochs ago: the epoch set since is on the board
            epoch = self._board.read()
            if epoch is not None and epoch != self.epoch:
                self._take_epoch(epoch)  # the board already says it
        self._take_dataset_point()
        resume = self._take_resume(info)
        if resume is not None and resume["finished"]:
            return  # a state saved after the epoch's last item: every worker's share was handed out
        source, start, drop = self._worker_share(info.id if info else 0, info.num_workers if info else 0, resume)
        self._began = (self.epoch, start) if resume is not None and "sample_in_epoch" in resume else None
        if self.pipeline is None:
            start_at(source, self.epoch, start)
            yield from _records(source)
            return
        from dlstore.pipeline import Loader

        in_worker = torch.utils.data.get_worker_info() is not None
        # Each consumer draws its own augmentations, the same on every run with the same seed and world.
        seed = int(np.random.SeedSequence([self.seed, self.epoch, source.world.consumer]).generate_state(1)[0])
        # Owned batches (copy=True): the DataLoader holds several batches in its queues, more than the
        # loader's ring of reused buffers would keep valid. In a worker one decode thread each by
        # default: the workers are the parallelism.
        threads = self.threads if self.threads is not None or not in_worker else 1
        loader = Loader(source, self.pipeline, self.batch_size, prefetch=self.prefetch,
                        last_batch=self.last_batch, threads=threads, seed=seed, epochs=1, copy=True,
                        record_key=self.record_key, report_stalls=self.report_stalls)
        loader.load_state_dict({"epoch": self.epoch, "sample_in_epoch": start, "seed": seed})
        self._current = loader
        # Exported as this dataset, one series over its passes (stats() sums them), not one per epoch's
        # loader: those vanished when their pass ended, with what they counted since the last scrape. The
        # Dataset the pass reads (a worker's copy too) stays out of the scrape: its records are in this series.
        metrics.untrack(loader)
        metrics.track(self)
        try:
            for batch in loader:
                if drop:  # an agreed empty batch handed out before the stop
                    drop -= 1
                    continue
                yield {name: _as_tensor(torch, array) for name, array in batch.items()}
        finally:
            self._current = None
            self._fold(loader)


#: Who took a loaded resume point, on the board: nobody yet; a pass in the main process (a DataLoader's passes
#: with workers are named by their base seed, which torch draws non-negative).
_UNTAKEN, _MAIN_PASS = -2, -1


class _EpochBoard:
    """The epoch :meth:`_IterableRecords.set_epoch` chose, and which pass took the resume point
    :meth:`_IterableRecords.load_state_dict` loaded, in a small file that DataLoader workers read when a pass
    starts. A worker works on a copy of the dataset taken when it started, so with ``persistent_workers`` an
    epoch set later never reached it: every epoch had the first one's order and seeds; and the workers of each
    pass copied a resume point that an earlier pass had used. Only the file's name is pickled, so the board
    crosses any start method; the process that made it removes it."""

    _EPOCH, _TAKER = 0, 8  # byte offsets of the two little-endian int64 fields

    def __init__(self) -> None:
        fd, self.path = tempfile.mkstemp(prefix="dlstore-epoch-")
        os.close(fd)
        self.write(0)
        self.offer_resume()
        weakref.finalize(self, _remove_board, self.path, os.getpid())

    def write(self, epoch: int) -> None:
        self._put(self._EPOCH, epoch)

    def read(self) -> Optional[int]:
        """The epoch; None when the board is gone (its dataset was collected: a copy reads its own)."""
        return self._get(self._EPOCH)

    def offer_resume(self) -> None:
        """A resume point was loaded: no pass has taken it."""
        self._put(self._TAKER, _UNTAKEN)

    def take_resume(self, taker: int) -> bool:
        """Whether pass ``taker`` resumes from the loaded point: the first pass to ask takes it, and its other
        workers, asking after, resume too (two asking at once both write their one name); a later pass does not.
        Where the board is gone, yes (a copy's own point, as it was loaded)."""
        now = self._get(self._TAKER)
        if now == _UNTAKEN:
            self._put(self._TAKER, taker)
        return now in (_UNTAKEN, taker, None)

    def _put(self, offset: int, value: int) -> None:
        with open(self.path, "r+b") as f:
            f.seek(offset)
            f.write(struct.pack("<q", int(value)))

    def _get(self, offset: int) -> Optional[int]:
        try:
            with open(self.path, "rb") as f:
                f.seek(offset)
                return struct.unpack("<q", f.read(8))[0]
        except (OSError, struct.error):
            return None


def _remove_board(path: str, owner: int) -> None:
    if os.getpid() == owner:  # a forked worker exiting leaves it to the process that made it
        try:
            os.remove(path)
        except OSError:
            pass


#: What :meth:`_IterableRecords.state_dict` saves.
_STATE_KEYS = ("epoch", "batches_seen", "num_workers", "records_per_batch", "seed", "num_consumers")

#: The loader's counters and timings, summed over passes; its other entries (sizes, the decoder) are the last pass's.
_SUMMED = ("batches", "samples", "padding", "empty_batches", "records", "bytes", "skipped", "skipped_pipeline",
           "skipped_source", "failovers", "retries", "fallback_decodes", "source_s", "pipeline_s", "producer_wait_s",
           "consumer_wait_s")


def _sum_stats(into: Dict[str, Any], stats: Dict[str, Any]) -> None:
    """Adds a loader's counters (:data:`_SUMMED`) to ``into``; its other entries replace theirs."""
    for key, value in stats.items():
        into[key] = into.get(key, 0) + value if key in _SUMMED else value


def _cuda_index(torch, device: Any, loader: Any) -> Optional[int]:
    """The CUDA device index ``device`` names for ``loader`` (``"cuda"``: torch's current device; ``cuda:local``:
    the local rank of the loader's source), None for the CPU."""
    if str(device).strip().lower() == "cuda":
        return torch.cuda.current_device() if torch.cuda.is_available() else 0
    world = getattr(getattr(loader, "source", None), "world", None)
    return parse_device(device, world.local_rank if world is not None else detect_world().local_rank)


def items_per_worker(items: Sequence[int], seen: int) -> Tuple[List[int], int]:
    """How many of ``seen`` items each worker had handed out, when worker ``w`` has ``items[w]`` in all
    and a DataLoader takes them in turns, skipping a worker once it has none left (``in_order=True``);
    and the worker whose turn is next."""
    counts = np.asarray(items, dtype=np.int64)
    if seen > int(counts.sum()):
        raise ValueError(f"batches_seen {seen} is more than the epoch's {int(counts.sum())} items")
    lo, hi = 0, int(counts.max(initial=0))  # the most rounds r completed: sum(min(counts, r)) <= seen
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if int(np.minimum(counts, mid).sum()) <= seen:
            lo = mid
        else:
            hi = mid - 1
    taken = np.minimum(counts, lo)
    rest = seen - int(taken.sum())  # the next round's first workers that still have items
    turn = np.flatnonzero(counts > lo)[:rest]
    taken[turn] += 1
    if len(turn):
        last = int(turn[-1])
    else:  # a round just ended: its last worker was the last one holding that many
        last = int(np.flatnonzero(counts >= lo)[-1]) if lo else len(counts) - 1
    return taken.tolist(), (last + 1) % len(counts)


def _records(source) -> Iterator[bytes]:
    """Each record of ``source`` as ``bytes`` (the pipeline-less path: the user decodes)."""
    for batch in source.batches():
        view = memoryview(batch).cast("B")
        for offset, length in zip(batch.offsets.tolist(), batch.lengths.tolist()):
            yield bytes(view[offset:offset + length])


def _dataset_class():
    torch = _torch()

    class DlstoreIterableDataset(_IterableRecords, torch.utils.data.IterableDataset):
        """A ``torch.utils.data.IterableDataset`` of dlstore records or batches, each seen once per epoch
        across ranks and DataLoader workers.

        Every (rank, worker) pair is one *consumer*: the rank comes from ``world`` or
        :func:`dlstore.placement.world.detect_world` (mpirun, torchrun, Horovod, SLURM, PopRun...),
        the worker from ``torch.utils.data.get_worker_info()``; consumer ``rank * num_workers +
        worker`` reads its share of the records (see ``shard``).

        Parameters
        ----------
        source : dlstore.Dataset, or str, path-like or list of them
            A :class:`dlstore.Dataset` (its world, mounts and shuffle), or files, directories or
            globs (:func:`dlstore.sources.reader.expand_paths`) read through a Dataset made here.
        pipeline : ResNet50, Bert or None
            A :mod:`dlstore.pipeline` preset. With one, each item is a whole batch, a dict of
            tensors (use ``DataLoader(ds, batch_size=None)``); without one, each item is one record
            as ``bytes`` (give the DataLoader a ``collate_fn`` that decodes them).
        batch_size : int
            Samples per batch; required with a pipeline, not allowed without.
        world : World, optional
            Overrides the detected one (anything with ``with_worker``, ``consumer``, ``num_consumers``).
        shuffle : {"block", "none", "buffer", "global"}
            The Dataset's record shuffle (files given), drawn from ``(seed, epoch)``.
        seed : int
            Seeds the shuffle and, with ``(epoch, consumer)``, the pipeline's augmentations.
        remainder : {"uneven", "pad", "drop"}, optional
            The Dataset's remainder policy (files given): ``uneven`` reads every record exactly once.
            Default: ``uneven`` with a pipeline (a short share ends in agreed empty batches); without
            one the DataLoader batches the records, so only equal shares give every rank as many
            batches: ``pad`` over several ranks (every record at least once), ``uneven`` on one.
        last_batch : {"PARTIAL", "DROP", "FILL"}
            Each consumer's last batch, as in DALI. ``PARTIAL`` (default) keeps every sample
            exactly once.
        prefetch, threads, record_key, report_stalls
            The :class:`dlstore.pipeline.Loader`'s. ``threads=None`` in a DataLoader worker means one.
        **dataset_kwargs
            For the :class:`dlstore.Dataset` made from files: ``mounts``, ``buffer_size``, and reader
            options (``io``, ``verify``, ``on_error``...).

        Notes
        -----
        Every consumer yields the same number of batches per epoch (the Dataset agrees on it): with
        ``PARTIAL`` under ``uneven``, a consumer whose share ran out yields empty batches up to that
        count, so no rank waits for another in a collective.

        Mid-epoch resume through a DataLoader (in order, its default): save
        ``ds.state_dict(items_drawn, num_workers=loader.num_workers)`` (without a pipeline also
        ``records_per_batch=`` its batch size); later ``ds.load_state_dict(state)`` and a fresh
        DataLoader with the same number of workers goes on with exactly the items that came next. A
        state at an epoch boundary (after the last item it is the next epoch's start) resumes with any
        number of workers or world size. The resume point serves the next pass only, as a Dataset's
        does: a later pass of that epoch reads it whole, from its start. A point loaded into the rank's
        Dataset itself (``dataset.load_state_dict(state)``, before or after this dataset was made) becomes
        this dataset's, by the same rules: the next pass starts there; DataLoader workers split the rank's
        share, so with them only a point at an epoch's start is taken (one mid-epoch is refused).
        """

    # Named as the module attribute it becomes, so that pickle finds it: DataLoader workers started
    # with "spawn" or "forkserver" receive the dataset pickled.
    DlstoreIterableDataset.__module__ = __name__
    DlstoreIterableDataset.__qualname__ = "DlstoreIterableDataset"
    return DlstoreIterableDataset


def __getattr__(name: str):
    # The dataset class subclasses torch's, so it is made on first use, not at import.
    if name == "DlstoreIterableDataset":
        cls = _dataset_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def pinned_allocator():
    """An ``allocator`` for :class:`dlstore.pipeline.Loader` whose batch buffers are page-locked (pinned).

    The loader then assembles batches straight in pinned memory and :class:`TorchLoader` copies
    them to the GPU asynchronously without a staging copy. Pinning needs CUDA: without it (a CPU-only
    torch, or no GPU) the buffers are ordinary pageable memory, which is all a CPU consumer needs,
    and a ``RuntimeWarning`` says so once per process.

    Examples
    --------
    >>> loader = resnet50_loader(paths, batch_size=256, allocator=pinned_allocator())    # doctest: +SKIP
    >>> for batch in TorchLoader(loader):                                                 # doctest: +SKIP
    ...     ...
    """
    global _noted_no_cuda
    torch = _torch()
    if not torch.cuda.is_available():
        if not _noted_no_cuda:
            _noted_no_cuda = True
            warnings.warn("dlstore.adapters.torch.pinned_allocator(): CUDA is not available here, so batch "
                          "buffers are ordinary (pageable) memory; pinning only speeds up copies to a GPU",
                          RuntimeWarning, stacklevel=2)
        return _pageable

    def allocate(shape, dtype) -> np.ndarray:
        like = torch.from_numpy(np.empty(0, dtype))
        # The array's base is the tensor, so the pinned memory lives as long as the array.
        return torch.empty(tuple(shape), dtype=like.dtype, pin_memory=True).numpy()

    return allocate


def _pageable(shape, dtype) -> np.ndarray:
    """pinned_allocator's buffers without CUDA: ordinary memory."""
    return np.empty(tuple(shape), dtype)


class TorchLoader(BatchAdapter):
    """A :class:`dlstore.pipeline.Loader` yielding torch tensors, on the CPU or copied to the GPU.

    On the CPU each tensor shares the loader's array (``torch.from_numpy``/``torch.from_dlpack``,
    no copy), so it is valid as long as the loader's batch is: until the next batch is drawn (or
    always, with ``Loader(..., copy=True)``). To a CUDA device the copy is asynchronous
    (``non_blocking=True``) from page-locked memory: the loader's own buffers when it was made with
    ``allocator=pinned_allocator()``, else a pinned staging buffer per output. Before the next
    batch is drawn (which lets the loader reuse its buffer, and this adapter its staging buffer)
    the previous batch's copy is waited for: by then it has usually long finished, behind the
    training step the consumer queued. Device tensors are new each batch.

    Over a loader that yields on the GPU (``Loader(..., device="cuda:N")``: CuPy arrays, copied
    there from its pinned ring) each tensor is the loader's device array itself, through DLPack
    (``torch.from_dlpack``): no host copy, no second device copy. As with the loader's arrays, it is
    valid until the next batch is drawn (the loader's device buffers alternate), unless the loader
    copies (``copy=True``). Torch's current stream waits for the batch's copies (the DLPack stream
    hand-off; no host wait); the loader reuses a device buffer only after the work queued on CuPy's
    current stream, which is torch's default stream unless a program sets other streams.

    Parameters
    ----------
    loader : dlstore.pipeline.Loader
    device : str or torch.device, optional
        Default: the loader's GPU when it yields on one; else the current CUDA device when CUDA is
        available, else the CPU. Over a GPU loader only its own device is accepted.
    pin_memory : bool, optional
        Copy through pinned memory (asynchronous); default True for a CUDA device.

    Raises
    ------
    ValueError
        When ``device`` is not the GPU loader's own.
    """

    def __init__(self, loader, device: Any = None, pin_memory: Optional[bool] = None):
        super().__init__(loader)
        torch = self._torch = _torch()
        #: ``"cuda:N"`` when the loader's batches are on that GPU already (shared through DLPack).
        self.loader_device = getattr(loader, "device", None)
        if self.loader_device is not None:
            if device is not None and _cuda_index(torch, device, loader) != parse_device(self.loader_device):
                raise ValueError(f"TorchLoader(device={str(device)!r}) over a loader yielding on "
                                 f"{self.loader_device}: its batches stay where they are (make the Loader with "
                                 f"device={str(device)!r})")
            device = self.loader_device
        elif device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.to_cuda = self.device.type == "cuda" and self.loader_device is None
        self.pin_memory = self.to_cuda if pin_memory is None else bool(pin_memory)
        self._staging: Dict[str, Any] = {}  # name -> pinned tensor

    def convert(self, name: str, array: Any):
        return _as_tensor(self._torch, array)

    def convert_spec(self, name: str, shape: Tuple[Optional[int], ...], dtype: np.dtype):
        return shape, _as_tensor(self._torch, np.empty(0, dtype)).dtype

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        if not self.to_cuda:  # CPU batches as they are, or a GPU loader's shared through DLPack
            yield from super().__iter__()
            return
        torch = self._torch
        copied = None  # CUDA event after the last batch's copies
        for batch in self.loader:
            out = self._to_device(batch)
            copied = torch.cuda.Event()
            copied.record(torch.cuda.current_stream(self.device))
            yield out
            # The consumer wants the next batch: the loader may now reuse this batch's buffers, and the
            # staging buffers are filled again, so this batch's copies must be done.
            copied.synchronize()

    def _to_device(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        out = {}
        for name, array in batch.items():
            tensor = _as_tensor(self._torch, array)
            if tensor.device.type != "cpu" or tensor.is_pinned():
                out[name] = tensor.to(self.device, non_blocking=True)
            elif self.pin_memory:
                out[name] = self._stage(name, tensor).to(self.device, non_blocking=True)
            else:
                out[name] = tensor.to(self.device)
        return out

    def _stage(self, name: str, tensor):
        """``tensor`` copied into the pinned buffer for ``name`` (made, or remade when it does not fit)."""
        buf = self._staging.get(name)
        if buf is None or buf.dtype != tensor.dtype or buf.shape[1:] != tensor.shape[1:] \
                or buf.shape[0] < tensor.shape[0]:
            buf = self._torch.empty(tuple(tensor.shape), dtype=tensor.dtype, pin_memory=True)
            self._staging[name] = buf
        staged = buf[:tensor.shape[0]]
        staged.copy_(tensor)
        return staged
