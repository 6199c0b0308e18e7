# Over 500 lines: one class, the Loader (its thread, buffer ring, last-batch policies, resume and error policy).
"""The loader: records from a source -> fixed-size batches in reused buffers, prepared ahead in a thread.

A background thread pulls ``RecordBatch`` objects from a :class:`~dlstore.sources.source.Source` (the C++
reader releases the GIL), cuts them into runs that fill output batches of exactly ``batch_size`` rows
(a :class:`~dlstore.Dataset` hands out batches of the loader's size, one run each; a reader's chunks
may take two runs per batch, with no copy of the records), runs the pipeline's C++ batch function once
per run, and hands finished batches to the consumer through a bounded queue. Output arrays come from
a ring of ``prefetch + 2`` buffers (fewer when an epoch holds fewer batches) allocated once.
"""
from __future__ import annotations

import collections
import sys
import time
import warnings
import weakref
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple, Union

import numpy as np

from dlstore import metrics
from dlstore._args import whole
from dlstore.errors import DlstoreError
from dlstore.io import memory
from dlstore.io.system import available_page_cache_bytes, cgroup_memory_room, format_bytes
from dlstore.pipeline.prefetch import BatchRing, Prefetcher
from dlstore.pipeline.stalls import WAIT_BUCKETS_S, StallMeter
from dlstore.pipeline.stages import Pipeline, check_last_batch
from dlstore.placement.world import detect_world
from dlstore.sources.source import Source, loaded_point, start_at, state_at

# The positions a loader keeps after its last batches handed out (Loader.state_after): well beyond what a
# consumer draws ahead of its step (Keras fit's iterator, a few batches).
_RECENT_POSITIONS = 256

__all__ = ["Loader"]


class _Batch:
    """A filled slot, as the producer publishes it."""

    __slots__ = ("slot", "rows", "padding", "epoch", "position", "delivered", "final")

    def __init__(self, slot: int, rows: int, padding: int, epoch: int, position: int, delivered: int,
                 final: bool = False):
        self.slot, self.rows, self.padding, self.epoch, self.position = slot, rows, padding, epoch, position
        self.delivered = delivered  # samples of the epoch handed out through it (position less skipped records)
        # The epoch's last batch for this consumer, as the producer knew when it published it: the state after
        # it is the next epoch's start, as after the _EpochEnd that follows.
        self.final = final


class _EpochEnd:
    __slots__ = ("epoch",)

    def __init__(self, epoch: int):
        self.epoch = epoch



class Loader:
    """Batches of a pipeline's outputs over a record source, prepared in a background thread.

    Parameters
    ----------
    source : Source
        This consumer's records: a :class:`~dlstore.Dataset` (placement, shuffle) or
        :func:`~dlstore.open_records` (files in order), or anything implementing
        :class:`~dlstore.sources.source.Source`. Its batches are ``RecordBatch``-like: the buffer protocol
        over one region, numpy ``offsets`` / ``lengths`` / ``file_offsets``, ``num_records`` and
        ``path(i)`` (to name the file of a bad record). A Dataset without a batch size of its own
        takes the loader's.
    pipeline : Pipeline
        What a record becomes: :class:`~dlstore.pipeline.Bert`, :class:`~dlstore.pipeline.ResNet50`.
    batch_size : int
        Rows per batch; every batch has exactly this many except, with ``PARTIAL``, an epoch's last.
    prefetch : int, optional
        Finished batches that may wait for the consumer (at least 1).
    last_batch : {"DROP", "PARTIAL", "FILL"}, optional
        An epoch's incomplete last batch is dropped, yielded short, or filled to ``batch_size`` by
        repeating the epoch's last sample (:attr:`padding` says how many rows are repeats). As
        DALI's ``LastBatchPolicy``. Batches never span two epochs.
    threads : int, optional
        Threads of the pipeline's C++ batch function; default: the pipeline's choice.
    seed : int, optional
        Seed of random augmentation. Each sample's randomness is a function of
        ``(seed, epoch, position in the epoch)`` only.
    epochs : int or None, optional
        Epochs one iteration of the loader covers (``None``: endless). The epoch counter carries
        on from one iteration to the next, so ``for epoch in range(3): for batch in loader:``
        sees epochs 0, 1, 2 with different random crops.
    copy : bool, optional
        Yield arrays the caller owns instead of views into the reused buffers.
    on_error : {"raise", "skip", "warn"}, optional
        A record the pipeline cannot process (malformed Example, undecodable image):
        ``raise`` an error naming the file, the byte offset, the sample position and what was
        wrong; ``skip`` it (counted in ``stats()["skipped"]``); ``warn``: skip with a
        ``RuntimeWarning``. Corrupt framing or CRCs are the source's concern (its own ``on_error``).
    allocator : callable, optional
        ``allocator(shape, dtype) -> numpy.ndarray`` for the output buffers, e.g. one returning
        page-locked memory; see :class:`~dlstore.pipeline.prefetch.BatchRing`.
    device : str, optional
        ``cuda:N``: batches are assembled in pinned host memory (:class:`~dlstore.io.memory.PinnedPool`)
        and yielded as CuPy arrays on that GPU, copied asynchronously on a stream of their own while
        the next batches are read. A batch's device arrays stay valid until the next one is drawn.
        Without CUDA or CuPy it raises a :class:`~dlstore.DlstoreError` naming what is missing
        (:func:`~dlstore.io.memory.check_device`). ``cuda:local``: the GPU numbered as this process's
        local rank (the source's world, else the launcher's), one GPU per rank on a host. ``None`` or
        ``"cpu"``: numpy batches.
    record_key : str, optional
        Adds each sample's identity to the batch dict: ``"index"`` gives ``shard`` and ``record``
        (int64: the shard's index in ``source.shards`` and the record's index in it; a
        :class:`~dlstore.Dataset` source), any other string names an int64 feature of the
        records (TFRecord ``tf.train.Example``), given as ``key``. Off by default.
    report_stalls : bool or callable, optional
        At each epoch's end, a line saying how often the consumer waited for its batch and why
        (:meth:`stall_report`'s ``line``): printed to stderr (True) or passed to the callable.

    Notes
    -----
    Yielded arrays are views into a ring of ``prefetch + 2`` reused buffers: a batch stays valid
    until the consumer draws the next one (``next()`` returns). Keep data longer by copying it
    (``copy=True``, or a framework's copy to the device). Breaking out of the loop, or
    :meth:`close`, stops the background thread and releases the source's files.

    Examples
    --------
    >>> reader = dlstore.open_records("/data/bert/part-*")            # doctest: +SKIP
    >>> loader = Loader(reader, Bert(seq_len=128), batch_size=64)      # doctest: +SKIP
    >>> for batch in loader:                                           # doctest: +SKIP
    ...     train_step(batch["input_ids"], batch["input_mask"])
    """

    def __init__(self, source: Any, pipeline: Pipeline, batch_size: int, *, prefetch: int = 2,
                 last_batch: str = "DROP", threads: Optional[int] = None, seed: int = 0,
                 epochs: Optional[int] = 1, copy: bool = False, on_error: str = "raise",
                 allocator: Optional[Callable[[Tuple[int, ...], Any], np.ndarray]] = None,
                 device: Optional[str] = None, record_key: Optional[str] = None,
                 report_stalls: Union[bool, Callable[[str], None]] = False):
        if not isinstance(source, Source):
            raise TypeError(f"source must be a dlstore Source (dlstore.Dataset, dlstore.open_records, or "
                            f"anything with the methods of dlstore.sources.source.Source; a wrapper can subclass "
                            f"dlstore.sources.source.SourceWrapper), got {type(source).__name__}")
        if getattr(source, "engine", None) == "gds":  # its batches are in GPU memory; the stages run on the host
            raise DlstoreError("a Loader runs its pipeline on host batches, and io='gds' reads into GPU memory: "
                               "iterate the source's batches() for the records on the GPU, or read with a host "
                               "engine (a Dataset without device= or with a host io=) and Loader(device='cuda:N') "
                               "for pipeline batches on the GPU")
        if not isinstance(pipeline, Pipeline):
            raise TypeError(f"pipeline must be a dlstore.pipeline.Pipeline (Bert, ResNet50), "
                            f"got {type(pipeline).__name__}")
        batch_size = whole("batch_size", batch_size, 1)
        prefetch = whole("prefetch", prefetch, 1)
        last_batch = check_last_batch(last_batch)  # DALI's LastBatchPolicy.FILL too
        epochs = whole("epochs", epochs, 1, none_means="endless")
        if on_error not in ("raise", "skip", "warn"):
            raise ValueError(f"on_error must be 'raise', 'skip' or 'warn', got {on_error!r}")
        seed = whole("seed", seed, 0)
        threads = whole("threads", threads, 1, none_means="the pipeline's choice")

        self.source = source
        self.pipeline = pipeline
        self.batch_size = batch_size
        source.use_batch_size(self.batch_size)  # a Dataset left without one reads batches of this size
        self.prefetch = prefetch
        self.last_batch = last_batch
        self.threads = threads if threads is not None else pipeline.default_threads()
        self.seed = seed
        self.epochs = epochs
        self.copy = bool(copy)
        self.on_error = on_error
        self.format = source.format
        self._fields = dict(pipeline.fields())
        _check_ring_fits(self._fields, self.batch_size, self.prefetch, self._ring_slots())
        self._run = pipeline.bind(format=self.format, seed=self.seed, threads=self.threads)
        self.record_key = record_key
        self._keys_of: Optional[Callable[[Any], Dict[str, np.ndarray]]] = None
        if record_key is not None:
            self._add_record_key(str(record_key))
        if report_stalls is True:
            report_stalls = _print_stderr
        self._report_stalls: Optional[Callable[[str], None]] = report_stalls or None
        self._stalls = StallMeter()

        local_rank = (getattr(source, "world", None) or detect_world()).local_rank  # for device="cuda:local"
        self._device_index, self._copier, self._device_path = memory.device_copier(device, local_rank,
                                                                                    rows=self.batch_size)
        #: ``"cuda:N"`` when batches are yielded on that GPU, else None (the CPU).
        self.device = None if self._device_index is None else f"cuda:{self._device_index}"
        self._pool = None
        if self._copier is not None and allocator is None:
            self._pool = memory.PinnedPool(device=self._device_index)
            allocator = self._pool.allocator
        self._allocator = allocator
        self._ring: Optional[BatchRing] = None
        # The consumer's position: the epoch under way and the samples of it already yielded.
        self._epoch = 0
        self._position = 0
        self._delivered = 0  # samples of the epoch handed out: the position less the records the source skipped
        # The position after each of the last batches handed out, by their count (the counter "batches", over
        # the loader's life): what a consumer that draws ahead of its training step resumes from (state_after).
        self._recent = collections.deque([(0, 0, 0, 0)], maxlen=_RECENT_POSITIONS)
        self._own_load = False  # load_state_dict ran since the last pass started
        self._active: Optional[Prefetcher] = None
        self._iterator: Optional[weakref.ref] = None
        self._producer: Optional[_Producer] = None
        #: Rows of the batch last yielded that repeat others: ``FILL``'s repeats of the epoch's last sample (its
        #: last rows), and the records a Dataset under ``remainder="pad"`` repeats so that every consumer has
        #: as many full batches (:attr:`dlstore.Dataset.repeated_records`: the epoch's last rows under the
        #: ``none`` and ``global`` shuffles; under ``block`` and ``buffer`` their number is right, not where they are).
        self.padding = 0
        self._counts = {"batches": 0, "samples": 0, "padding": 0, "bytes": 0, "records": 0, "skipped_pipeline": 0,
                        "skipped_source": 0, "failovers": 0, "retries": 0, "empty_batches": 0}
        self._seconds = {"source": 0.0, "pipeline": 0.0, "producer_wait": 0.0, "consumer_wait": 0.0}
        metrics.track(self)  # exported while it lives; with DLSTORE_METRICS_PORT set, the first one serves

    def _add_record_key(self, key: str) -> None:
        """Adds the outputs of ``record_key`` (see the class) to the fields and the batch function."""
        taken = [name for name in ("shard", "record", "key") if name in self._fields]
        if taken:
            raise ValueError(f"record_key: the {self.pipeline.name} pipeline has outputs named {taken} already")
        if key == "index":
            record_keys = getattr(self.source, "record_keys", None)
            if record_keys is None:
                raise ValueError(f"record_key='index' needs a dlstore.Dataset source (its shards are indexed), "
                                 f"not {type(self.source).__name__}; or name an int64 feature as the key")

            def keys_of(chunk: Any) -> Dict[str, np.ndarray]:
                shard, record = record_keys(chunk)
                return {"shard": shard, "record": record}

            self._keys_of = keys_of
            self._fields.update(shard=((), np.dtype(np.int64)), record=((), np.dtype(np.int64)))
            return
        if self.format != "tfrecord":
            raise ValueError(f"record_key={key!r} names a tf.train.Example feature; these records are "
                             f"{self.format}: use record_key='index'")
        from dlstore import _C

        run, parse, spec = self._run, _C.parse_example_batch, [(key, "int64", 1, None)]

        def run_with_key(buffer: Any, offsets: np.ndarray, lengths: np.ndarray, out: Dict[str, np.ndarray],
                         row: int, epoch: int, position: int) -> None:
            run(buffer, offsets, lengths, out, row, epoch, position)
            parse(buffer, offsets, lengths, spec, {key: out["key"]}, row, 1)

        self._run = run_with_key
        self._fields["key"] = ((), np.dtype(np.int64))

    # ---- what comes out ----

    @property
    def element_spec(self) -> Dict[str, Tuple[Tuple[Optional[int], ...], np.dtype]]:
        """Output name -> ``(shape with the batch dimension, numpy dtype)``.

        The batch dimension is ``batch_size``, or ``None`` with ``last_batch="PARTIAL"`` (an
        epoch's last batch may be shorter).
        """
        rows = None if self.last_batch == "PARTIAL" else self.batch_size
        return {name: ((rows, *shape), np.dtype(dtype)) for name, (shape, dtype) in self._fields.items()}

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from (the one under way, if any)."""
        self._take_resume_point()
        return self._epoch

    def __iter__(self) -> Iterator[Dict[str, np.ndarray]]:
        live = self._iterator() if self._iterator is not None else None
        if live is not None and live.gi_frame is not None:
            raise RuntimeError("this loader is already being iterated; finish or close() that loop first")
        iterator = self._consume()
        self._iterator = weakref.ref(iterator)
        return iterator

    def _consume(self) -> Iterator[Dict[str, np.ndarray]]:
        # The thread starts at the first next(), so an iterator never advanced holds nothing.
        self._take_resume_point()
        self._own_load = False  # a pass starts: a later load of the source alone is no conflict
        if self._ring is None:
            self._ring = BatchRing(self._fields, self.batch_size, self._ring_slots(), self._allocator)
        ring = self._ring
        producer = _Producer(self, self._epoch, self._position, self._delivered)
        prefetcher = Prefetcher(len(ring), producer.run, name="dlstore-loader")
        self._active, self._producer = prefetcher, producer
        held: Optional[int] = None
        stalls, epoch_start = self._stalls, self._stalls.snapshot()
        handed: Optional[float] = None  # when the last batch was handed over
        warned_empty = False
        try:
            while True:
                source_0, pipeline_0 = producer.busy()
                item = prefetcher.get()
                if held is not None:  # the consumer asked for the next batch: the last one is free
                    if self._copier is not None:
                        self._copier.done_with_host()  # its copy to the GPU has read the slot
                    prefetcher.release(held)
                    held = None
                if item is None:
                    return
                if isinstance(item, _EpochEnd):
                    self._epoch, self._position, self._delivered = item.epoch + 1, 0, 0
                    if self._recent[-1][0] == self.batches_handed:  # as state_dict() says from now on
                        self._recent[-1] = (self.batches_handed, self._epoch, 0, 0)
                    if self._report_stalls is not None:
                        self._report_stalls(f"dlstore loader, epoch {item.epoch}: "
                                            f"{stalls.report(since=epoch_start)['line']}")
                    epoch_start = stalls.snapshot()
                    continue
                # The wait, split by what the background thread did meanwhile: read or process records.
                wait = prefetcher.last_wait_s
                if wait >= 1e-4:
                    source_1, pipeline_1 = producer.busy()
                    source_0, pipeline_0 = source_1 - source_0, pipeline_1 - pipeline_0
                stalls.step(wait, time.perf_counter() - handed if handed is not None else wait, source_0, pipeline_0)
                held = item.slot
                if item.final:  # nothing of its epoch follows: a state saved on this step resumes any world
                    self._epoch, self._position, self._delivered = item.epoch + 1, 0, 0
                else:
                    self._epoch, self._position, self._delivered = item.epoch, item.position, item.delivered
                self.padding = item.padding
                self._counts["batches"] += 1
                self._recent.append((self._counts["batches"], self._epoch, self._position, self._delivered))
                self._counts["samples"] += item.rows - item.padding
                self._counts["padding"] += item.padding
                if item.rows == 0:
                    self._counts["empty_batches"] += 1
                    if not warned_empty:
                        warned_empty = True
                        warnings.warn(_empty_batch_note(self), RuntimeWarning, stacklevel=2)
                arrays = ring.slots[item.slot]
                if item.rows != self.batch_size:
                    arrays = {name: a[:item.rows] for name, a in arrays.items()}
                elif not self.copy:
                    arrays = dict(arrays)  # the consumer may add to or pop from it
                if self._copier is not None:
                    arrays = self._copier.send(arrays)
                if self.copy:
                    arrays = {name: a.copy() for name, a in arrays.items()}
                handed = time.perf_counter()
                yield arrays
        finally:
            prefetcher.close()
            _add_stats(self._counts, self._seconds, producer, prefetcher)
            self._active = self._producer = None

    def close(self) -> None:
        """Ends the iteration under way, if any: the background thread stops and the source is released.

        From another thread than the consumer's, the iteration stops and the consumer's loop ends
        at its next step.
        """
        iterator = self._iterator() if self._iterator is not None else None
        if iterator is None:
            return
        try:
            iterator.close()
        except ValueError:  # running right now, in another thread: stop it from here
            active = self._active
            if active is not None:
                active.close()

    def synchronize(self) -> None:
        """Waits until the copies of the batch last yielded to the GPU have finished; nothing on the CPU.

        Batches reach the GPU asynchronously (the consumer's stream waits for them, the host does
        not), so a clock read right after a batch is drawn may stop before its data has arrived: a
        timed loop calls this before reading the clock.
        """
        if self._copier is not None:
            self._copier.done_with_host()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- resumption ----

    def state_dict(self) -> Dict[str, Any]:
        """Where the consumer is: ``epoch``, ``sample_in_epoch`` (samples of it already yielded), ``seed``.

        Batches prepared ahead and not yet drawn do not count. The source's state is included under
        ``"source"`` with its ``epoch`` and ``sample_in_epoch`` set to the consumer's, so the source
        can be put back there.

        Records the source skipped as corrupt (its ``on_error="skip"``) count from the end of the source
        batch they were skipped in. When the source's batches are the loader's (a ``Dataset`` without a
        batch size of its own takes the loader's), every position is exact; with other sizes, a stop
        inside a source batch that skipped records resumes that many records early. ``delivered``
        counts the samples yielded without the skipped records: a resumed rank of an uneven split
        yields as many empty batches as the ranks agreed on.

        After the epoch's last batch (an uneven split's agreed ones included) the state is the next
        epoch's start, ``sample_in_epoch`` 0, which a world of another size may resume too, as a
        Dataset's state is. Where the loader cannot know a batch is the last when it makes it (a full
        batch from a source that does not say its length, such as ``open_records``, or before records
        the source skips at the end), the state says so once the consumer asks for the next batch.
        """
        self._take_resume_point()
        return self._state(self._epoch, self._position, self._delivered)

    def _state(self, epoch: int, position: int, delivered: int) -> Dict[str, Any]:
        return {"epoch": epoch, "sample_in_epoch": position, "delivered": delivered, "seed": self.seed,
                "source": state_at(self.source, epoch, position)}

    @property
    def batches_handed(self) -> int:
        """Batches this loader has handed out since it was made, over all its iterations and epochs."""
        return self._counts["batches"]

    def state_after(self, batches_handed: int) -> Dict[str, Any]:
        """The :meth:`state_dict` as it was once the loader had handed out ``batches_handed`` batches.

        For a consumer that draws batches ahead of the step that uses them (Keras ``fit``'s iterator
        prefetches one or two): the state of what the steps really used is
        ``state_after(batches_handed_before + steps)``; :func:`dlstore.adapters.tensorflow.trained_state`
        keeps that count for Keras.

        Raises
        ------
        ValueError
            For a count not among the last 256 batches handed out, or before the last
            :meth:`load_state_dict` (whose state is the first one kept).
        """
        self._take_resume_point()
        for count, epoch, position, delivered in reversed(self._recent):
            if count == batches_handed:
                return self._state(epoch, position, delivered)
        raise ValueError(f"no state after {batches_handed} batches handed out: this loader keeps the states after "
                         f"{self._recent[0][0]} to {self.batches_handed} batches (at most the last "
                         f"{_RECENT_POSITIONS}, since it was made or last given a state)")

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes at a :meth:`state_dict`: the next iteration starts at its epoch and sample.

        The source state is handed to the source, whose next ``batches()`` starts at that
        ``sample_in_epoch``. Random augmentation continues as it would have: sample seeds depend on
        positions only.

        A source resumed on its own (``dataset.load_state_dict(state)``, a :class:`~dlstore.Dataset`'s or
        ``open_records``' reader's, before or after this loader was made) is resumed the same way: the
        loader takes the point the source keeps (its ``resume_point``) as its position before it next
        iterates or says its state, and yields what this method given that point would. Such a state says
        nothing of records the source skipped before it as corrupt (this method's ``delivered``): under
        ``remainder="uneven"`` with skipped records, resume through this method.

        Raises
        ------
        ValueError
            When the state was saved with another seed, or is malformed.
        RuntimeError
            During an iteration.
        """
        if self._active is not None:
            raise RuntimeError("load_state_dict() during an iteration; close() it first")
        if isinstance(state, Mapping) and "source" not in state and "order" in state:
            raise ValueError("a Dataset's state (its records' order, no 'source'), not a loader's: load it with "
                             "dataset.load_state_dict, which this loader then resumes from, or save "
                             "loader.state_dict()")
        try:
            epoch, position, seed = int(state["epoch"]), int(state["sample_in_epoch"]), int(state["seed"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a loader state (needs epoch, sample_in_epoch, seed): {state!r}") from e
        if epoch < 0 or position < 0:
            raise ValueError(f"epoch and sample_in_epoch must be non-negative, got {epoch} and {position}")
        if seed != self.seed:
            raise ValueError(f"the state was saved with seed {seed}; this loader has seed {self.seed}: "
                             f"its samples would differ")
        delivered = int(state.get("delivered", position))  # a state saved before it was kept: as before
        self.source.load_state_dict(state.get("source") or state_at(self.source, epoch, position))
        self._restart(epoch, position, delivered)
        self._own_load = True

    def _restart(self, epoch: int, position: int, delivered: int) -> None:
        """Puts the consumer at ``position`` of ``epoch``, ``delivered`` samples of it handed out, as after a
        load: the states of batches handed out before are forgotten."""
        self._epoch, self._position, self._delivered = epoch, position, delivered
        self._recent.clear()
        self._recent.append((self.batches_handed, epoch, position, delivered))

    def _take_resume_point(self) -> None:
        """Takes the point a source resumed on its own keeps (:func:`~dlstore.sources.source.loaded_point`) as the
        consumer's position: the next iteration starts there. Between iterations only: during one the producer
        puts the source where it reads, and that point is its own."""
        if self._active is not None:
            return
        point = loaded_point(self.source, (self._epoch, self._position),  # None: ours (load_state_dict), or none
                             loaded="Loader" if self._own_load else None)
        if point is not None:
            self._own_load = False
            epoch, position = point
            self._restart(epoch, position, position)  # a source's state does not count skipped records apart

    # ---- what happened ----

    def stats(self) -> Dict[str, Any]:
        """Counters and timings over this loader's life (iterations finished or under way).

        Keys: ``batches``, ``samples`` (rows yielded, padding excluded), ``padding``, ``empty_batches``
        (0-row batches of an uneven share, see :attr:`dlstore.Dataset.num_batches`), ``skipped``
        (records left out: ``skipped_source``, corrupt records the source skipped with its
        ``on_error`` skip/warn, counted as the source moves past them and exactly at each pass's end,
        plus ``skipped_pipeline``, records the pipeline could not process, with the loader's
        ``on_error`` skip/warn), ``failovers`` and ``retries`` (the source's, summed at each pass's
        end), ``records`` and ``bytes`` (records and payload bytes taken from the source); the
        :meth:`stall_report` under ``stalls``; seconds the background
        thread spent waiting on the source (``source_s``: I/O), in the pipeline (``pipeline_s``:
        parse/decode) and waiting for the consumer to free a buffer (``producer_wait_s``), and
        that the consumer spent waiting for a batch (``consumer_wait_s``); ``buffers_allocated``
        (output arrays allocated: fields x ``(prefetch + 2)``, or x an epoch's batches + 2 where fewer, all at
        the first iteration) and
        ``buffer_bytes``; the pipeline's description (which decoder and why) and counters
        (ResNet-50: ``fallback_decodes``, images that were not JPEGs), ``batch_size``,
        ``prefetch``, ``last_batch``, ``threads``; and the source's ``engine`` / ``engine_reason``
        and its ``stats()`` under ``source``, when it has them.
        """
        counts, seconds = dict(self._counts), dict(self._seconds)
        active, producer = self._active, self._producer  # read once: a scrape runs in another thread
        if active is not None and producer is not None:
            _add_stats(counts, seconds, producer, active)
        out: Dict[str, Any] = dict(counts)
        out["skipped"] = counts["skipped_pipeline"] + counts["skipped_source"]
        out.update({f"{k}_s": v for k, v in seconds.items()})
        out["buffers_allocated"] = self._ring.arrays_allocated if self._ring is not None else 0
        out["buffer_bytes"] = self._ring.nbytes if self._ring is not None else 0
        out.update(self.pipeline.describe())
        out.update(self.pipeline.counters())
        out.update(batch_size=self.batch_size, prefetch=self.prefetch, last_batch=self.last_batch,
                   threads=self.threads)
        out["engine"], out["engine_reason"] = self.source.engine, self.source.engine_reason
        if self._copier is not None:
            out["device"] = self.device
            out["device_path"] = self._device_path
            out["device_copies"] = self._copier.copies
            if self._pool is not None:
                out["pinned"] = self._pool.stats()
        out["source"] = self.source.stats()
        out["stalls"] = self.stall_report()
        return out

    def stall_report(self) -> Dict[str, Any]:
        """Whether this consumer waits for its data, and why, over the loader's life.

        Per step (batch handed over) the consumer's wait in ``next()`` is split into waiting for
        storage and for decoding, by what the background thread did during that wait
        (:mod:`dlstore.pipeline.stalls`, after DS-Analyzer's fetch and prep stalls).

        Returns
        -------
        dict
            ``steps``, ``stalled_steps`` (waits over a millisecond), ``storage_steps``,
            ``decode_steps``, their ``*_fraction`` of the steps, ``wait_s``, ``wall_s``,
            ``wait_fraction``, ``storage_wait_s``, ``decode_wait_s``, ``storage_share`` and
            ``decode_share`` of the time waited, and ``line``, e.g. ``"waited for data in 23% of
            400 steps: storage 18%, decode 5% (9% of the time waiting, 80% of it for storage)"``.
        """
        return self._stalls.report()

    def wait_histogram(self) -> Tuple[Tuple[float, ...], Tuple[int, ...]]:
        """``(upper bounds in seconds, steps per bucket)`` of the consumer's wait for each batch (not
        cumulative; the last bound is infinity)."""
        return WAIT_BUCKETS_S, tuple(self._stalls.buckets)

    def _full_batches(self) -> Optional[int]:
        """Full batches of this loader's size in the smallest consumer's share, where the source says it (a
        Dataset): DROP stops every rank there."""
        smallest = getattr(self.source, "smallest_share", None)
        return smallest // self.batch_size if isinstance(smallest, int) else None

    def _ring_slots(self) -> int:
        """Batches of output buffers: ``prefetch + 2``, or an epoch's batches + 2 where that is fewer (more
        would only let the producer run into the next epoch; a tiny set with a large prefetch took GBs)."""
        per_epoch = self.batches_per_epoch()
        return self.prefetch + 2 if per_epoch is None else min(self.prefetch + 2, max(3, per_epoch + 2))

    def batches_per_epoch(self) -> Optional[int]:
        """Batches a whole epoch yields, when the source says its length and nothing is skipped
        (``on_error="raise"`` on the loader and the source); else None."""
        samples = _length(self.source)
        if samples is None:
            return None
        if self.on_error != "raise" or getattr(self.source, "on_error", "raise") != "raise":
            return None
        agreed = getattr(self.source, "num_batches", None)
        full = self._full_batches()
        if self.last_batch == "DROP":  # every rank stops at the full batches of the smallest share (_epoch)
            return full if full is not None else samples // self.batch_size
        if isinstance(agreed, int):  # PARTIAL and FILL top a short rank up to the agreed count (_agree)
            return max(agreed, -(-samples // self.batch_size))
        return -(-samples // self.batch_size)

    def __repr__(self) -> str:
        return (f"Loader({self.pipeline.name}, batch_size={self.batch_size}, prefetch={self.prefetch}, "
                f"last_batch={self.last_batch}, epoch={self._epoch}, sample_in_epoch={self._position})")


def _check_ring_fits(fields: Dict[str, Tuple[Tuple[int, ...], Any]], batch_size: int, prefetch: int,
                     slots: int) -> None:
    """Refuses a ring of output buffers (``slots`` batches, allocated at the first iteration) that would
    take more than half the memory available (MemAvailable, or a cgroup's room when less): a batch size
    or prefetch typed with a digit too many grew the process until the machine ran out of memory. Each
    process checks its own ring: DataLoader workers or ranks on one host are not summed."""
    per_sample = sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for shape, dtype in fields.values())
    ring = per_sample * batch_size * slots
    available = available_page_cache_bytes()  # MemAvailable; 0 where unknown: nothing to compare with
    room = cgroup_memory_room()  # a container's limit: MemAvailable is the host's
    if room is not None:
        available = min(available, room) if available else room
    if available and ring > available // 2:
        why = f"prefetch {prefetch} + 2" if slots == prefetch + 2 else f"an epoch's {slots - 2} + 2"
        raise DlstoreError(f"Loader: its output buffers, {slots} batches ({why}) of "
                           f"{batch_size} samples of {format_bytes(per_sample)}, would take {format_bytes(ring)}, "
                           f"more than half the {format_bytes(available)} of memory available: lower batch_size "
                           f"or prefetch")


class _Producer:
    """The background thread's work for one iteration of a :class:`Loader`."""

    def __init__(self, loader: Loader, epoch: int, position: int, delivered: int):
        self.source = loader.source
        self.run_pipeline = loader._run
        self.ring = loader._ring
        self.batch_size = loader.batch_size
        self.last_batch = loader.last_batch
        self.on_error = loader.on_error
        self.stage = loader.pipeline.name
        self.first_epoch = epoch
        self.first_position = position
        self.first_delivered = delivered
        self.epochs = loader.epochs
        self.keys_of = loader._keys_of
        self.loader = loader
        self.counts = {"skipped_pipeline": 0, "skipped_source": 0, "failovers": 0, "retries": 0, "bytes": 0,
                       "records": 0}
        self.seconds = {"source": 0.0, "pipeline": 0.0}
        # What the thread does now, read by the consumer while it waits: 0 waiting for the source, 1 in the
        # pipeline, None neither; since when.
        self.phase: Optional[int] = None
        self.phase_start = 0.0

    def busy(self) -> Tuple[float, float]:
        """Seconds so far (the phase under way included) waiting for the source and in the pipeline."""
        phase, start = self.phase, self.phase_start
        source, pipeline = self.seconds["source"], self.seconds["pipeline"]
        if phase == 0:
            source += max(0.0, time.perf_counter() - start)
        elif phase == 1:
            pipeline += max(0.0, time.perf_counter() - start)
        return source, pipeline

    def _publish(self, prefetcher: Prefetcher, slot: int, rows: int, padding: int, epoch: int,
                 position: int, delivered: int, final: bool = False) -> None:
        prefetcher.publish(_Batch(slot, rows, padding, epoch, position, delivered, final))

    def run(self, prefetcher: Prefetcher) -> None:
        epoch = self.first_epoch
        while self.epochs is None or epoch < self.first_epoch + self.epochs:
            first = epoch == self.first_epoch
            position = self.first_position if first else 0
            # The source starts where the consumer is: mid-epoch after a resume or a loop broken off.
            start_at(self.source, epoch, position)
            delivered, published = self._epoch(prefetcher, epoch, position, self.first_delivered if first else 0)
            if prefetcher.stopping:
                return
            if published == 0 and position == 0:
                full = self.loader._full_batches()
                share = len(self.source) if full is not None else delivered
                if full == 0 and self.last_batch == "DROP":  # not read at all: no full batch to stop at
                    delivered = share
                failed = self.counts["skipped_pipeline"]  # records the pipeline could not process (on_error)
                raise DlstoreError(_no_batch_note(self.loader, epoch, delivered, share, failed))
            prefetcher.publish(_EpochEnd(epoch))
            epoch += 1

    def _epoch(self, prefetcher: Prefetcher, epoch: int, position: int, delivered: int) -> Tuple[int, int]:
        """Fills and publishes the batches of one epoch, starting at ``position``; returns the samples
        delivered and the batches published.

        ``position`` is the source's: records handed out plus those it skipped as corrupt
        (``on_error="skip"`` on the source), so that a resume starts where the source stopped;
        ``delivered`` leaves the skipped ones out, for the batch count the ranks agree on.
        """
        batch_size = self.batch_size
        slot: Optional[int] = None
        out: Dict[str, np.ndarray] = {}
        row = 0
        published = 0
        skipped_here = 0  # records the source skipped in this pass, as its position showed them
        # A source that pads its epoch with repeats (a Dataset under remainder="pad") gives them last: from
        # this position on, the rows taken are padding, not samples.
        size = _length(self.source)
        repeats = int(getattr(self.source, "repeated_records", 0) or 0)
        fresh_until = size - repeats if repeats and size is not None else None
        padding = 0  # rows of the batch being filled that repeat records (the source's padding)
        keys = None
        # DROP over a source whose consumers' shares differ (a Dataset under remainder="uneven"): every rank
        # stops at the full batches of the smallest share, so that all yield as many.
        full = self.loader._full_batches() if self.last_batch == "DROP" else None
        limit = full - delivered // batch_size if full is not None else None
        agreed = full if self.last_batch == "DROP" else self.source.num_batches  # the ranks' count (_agree)
        # Records a batch needs: once fewer are left to read (a source that says its length), no batch of the
        # epoch's own follows.
        needed = batch_size if self.last_batch == "DROP" else 1
        chunks = self.source.batches()
        try:
            while limit is None or published < limit:
                t0 = self.phase_start = time.perf_counter()
                self.phase = 0
                chunk = next(chunks, None)
                self.seconds["source"] += time.perf_counter() - t0
                self.phase = None
                if chunk is None or prefetcher.stopping:
                    break
                # The source's position after this chunk, its skipped records included (a Dataset's).
                after = getattr(self.source, "sample_in_epoch", None)
                n = chunk.num_records
                start = 0
                offsets, lengths = chunk.offsets, chunk.lengths
                buffer = getattr(chunk, "buffer", chunk)
                self.counts["records"] += n
                self.counts["bytes"] += int(chunk.nbytes)
                if self.keys_of is not None:
                    keys = self.keys_of(chunk)
                while start < n:
                    if slot is None:
                        slot = prefetcher.acquire()
                        out = self.ring.slots[slot]
                        row = 0
                    take = min(batch_size - row, n - start)
                    t0 = self.phase_start = time.perf_counter()
                    self.phase = 1
                    row += self._process(chunk, buffer, offsets, lengths, start, take, out, row, epoch,
                                         position, keys)
                    self.seconds["pipeline"] += time.perf_counter() - t0
                    self.phase = None
                    if fresh_until is not None:
                        padding += max(0, position + take - max(position, fresh_until))
                    start += take
                    position += take
                    delivered += take
                    if start == n and isinstance(after, int) and after > position:
                        # records the source skipped before or within this chunk; a source that counts them
                        # (a Dataset: a record padded in again and skipped again is one) says how many
                        counted = getattr(self.source, "skipped_this_pass", None)
                        gone = after - position if counted is None else max(0, counted - skipped_here)
                        skipped_here += gone
                        self.counts["skipped_source"] += gone
                        position = after
                    if row == batch_size:
                        # The epoch's last batch when this pass makes no other (DROP's limit, or the source
                        # read to its length) and the ranks agreed on no more (_agree): a source that does
                        # not say its length, or skips records past it, leaves that to the _EpochEnd.
                        ends = ((limit is not None and published + 1 >= limit)
                                or (size is not None and size - position < needed))
                        final = ends and self._owed(agreed, delivered) == 0
                        self._publish(prefetcher, slot, row, padding, epoch, position, delivered, final)
                        published += 1
                        slot = None
                        padding = 0
                        if limit is not None and published >= limit:
                            break  # the rest of this rank's share is dropped, as its short batch would be
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()  # releases the reader's files and buffers now, in this thread
            self._pass_ended(skipped_here)
        if slot is not None:
            if row == 0 or self.last_batch == "DROP" or prefetcher.stopping:
                prefetcher.release(slot)
            elif self.last_batch == "PARTIAL":
                self._publish(prefetcher, slot, row, padding, epoch, position, delivered,
                              self._owed(agreed, delivered) == 0)
                published += 1
            else:  # FILL: repeat the last sample
                for a in out.values():
                    a[row:] = a[row - 1]
                self._publish(prefetcher, slot, batch_size, batch_size - row + padding, epoch, position, delivered,
                              self._owed(agreed, delivered) == 0)
                published += 1
                row = batch_size
        # The epoch's last sample (FILL repeats it in the batches the ranks agreed on), read before any slot is
        # taken again: the consumer only reads the slot it was given.
        last = {name: a[row - 1].copy() for name, a in out.items()} if out and row else None
        return delivered, published + self._agree(prefetcher, epoch, position, delivered, agreed, last)

    def _pass_ended(self, skipped_here: int) -> None:
        """Adds the source's counts of the pass that just ended: its failovers and retries, and the
        records it skipped that its position did not show (after the last batch)."""
        stats = self.source.stats()
        self.counts["skipped_source"] += max(0, int(stats.get("skipped", 0)) - skipped_here)
        self.counts["failovers"] += int(stats.get("failovers", 0))
        self.counts["retries"] += int(stats.get("retries", 0))

    def _owed(self, agreed: Optional[int], delivered: int) -> int:
        """Batches :meth:`_agree` adds to an epoch whose own batches took ``delivered`` samples, toward the
        ``agreed`` count (None: the ranks need not agree)."""
        if not isinstance(agreed, int):
            return 0
        yielded = delivered // self.batch_size if self.last_batch == "DROP" else -(-delivered // self.batch_size)
        return max(0, agreed - yielded)

    def _agree(self, prefetcher: Prefetcher, epoch: int, position: int, delivered: int, agreed: Optional[int],
               last: Optional[Dict[str, np.ndarray]] = None) -> int:
        # A source that splits an epoch unevenly between ranks (dlstore.Dataset, remainder "uneven")
        # agrees on a batch count so that no rank waits forever in a collective: a rank whose share ran
        # out early (or lost records the source skipped) yields batches up to that count. PARTIAL and DROP:
        # empty ones (0 rows); FILL: full ones repeating the epoch's last sample, or zeros where this pass
        # has none (resumed after its last sample): padding either way. DROP's count is the full batches of
        # the smallest share, where _epoch stops every rank. The last of them is the epoch's last batch.
        owed = self._owed(agreed, delivered)
        for k in range(owed):
            if prefetcher.stopping:
                return k
            slot = prefetcher.acquire()
            final = k == owed - 1
            if self.last_batch == "FILL":
                for name, a in self.ring.slots[slot].items():
                    a[:] = last[name] if last is not None else 0
                self._publish(prefetcher, slot, self.batch_size, self.batch_size, epoch, position, delivered, final)
            else:
                self._publish(prefetcher, slot, 0, 0, epoch, position, delivered, final)
        return owed

    def _process(self, chunk: Any, buffer: Any, offsets: np.ndarray, lengths: np.ndarray, start: int, count: int,
                 out: Dict[str, np.ndarray], row: int, epoch: int, position: int,
                 keys: Optional[Dict[str, np.ndarray]] = None) -> int:
        """Runs the pipeline on records ``start .. start + count - 1`` of ``chunk`` into rows from ``row``,
        with their ``keys`` (the chunk's record keys, if asked for).

        Returns the rows written: ``count``, or fewer when records were skipped (``on_error``).
        """
        stop = start + count
        try:
            self.run_pipeline(buffer, offsets[start:stop], lengths[start:stop], out, row, epoch, position)
            if keys:
                for name, values in keys.items():
                    out[name][row:row + count] = values[start:stop]
            return count
        except DlstoreError:
            pass  # one record or more is bad: find which, one at a time, below
        except Exception as e:
            _add_note(e, f"raised in the dlstore loader thread by the {self.stage} pipeline, records "
                         f"{position}..{position + count - 1} of epoch {epoch}{self._where(chunk, start)}")
            raise
        written = row
        for k in range(start, stop):
            try:
                self.run_pipeline(buffer, offsets[k:k + 1], lengths[k:k + 1], out, written, epoch,
                                  position + k - start)
            except DlstoreError as e:
                located = self._located(e, chunk, k, epoch, position + k - start)
                if self.on_error == "raise":
                    raise located from e
                self.counts["skipped_pipeline"] += 1
                if self.on_error == "warn":
                    warnings.warn(f"{located} (skipped)", RuntimeWarning, stacklevel=2)
                continue
            for name, values in (keys or {}).items():
                out[name][written] = values[k]
            written += 1
        return written - row

    def _location(self, chunk: Any, k: int) -> Tuple[Optional[str], Optional[int]]:
        """The file and byte offset of record ``k`` of ``chunk`` (None when the batch does not say)."""
        path = chunk.path(k)
        return path, (int(chunk.file_offsets[k]) if path is not None else None)

    def _where(self, chunk: Any, k: int) -> str:
        """``", in <file> at byte N"`` for record ``k`` of ``chunk``, or "" when unknown."""
        path, offset = self._location(chunk, k)
        if path is None:
            return ""
        return f", in {path}" + (f" at byte {offset}" if offset is not None else "")

    def _located(self, error: DlstoreError, chunk: Any, k: int, epoch: int, position: int) -> DlstoreError:
        """``error`` of record ``k`` of ``chunk``, re-made to name the file, offset, sample and stage.

        The parser and the decoder name the record by its index in their call, which here holds that
        one record: the index says nothing, so the message keeps only the error's ``reason``.
        """
        path, offset = self._location(chunk, k)
        where = "record" if path is None else f"{path}: record" + (f" at byte {offset}" if offset is not None else "")
        message = f"{where} (sample {position} of epoch {epoch}), {self.stage} pipeline: {error.reason}"
        fields = dict(errno=error.errno, reason=error.reason)
        try:
            return type(error)(message, path, offset, **fields)
        except TypeError:  # a subclass with another constructor
            return DlstoreError(message, path, offset, **fields)


def _add_stats(counts: Dict[str, int], seconds: Dict[str, float], producer: _Producer,
               prefetcher: Prefetcher) -> None:
    """Adds an iteration's counters and timings to ``counts`` and ``seconds``."""
    for k, v in producer.counts.items():
        counts[k] += v
    for k, v in producer.seconds.items():
        seconds[k] += v
    seconds["producer_wait"] += prefetcher.producer_wait_s
    seconds["consumer_wait"] += prefetcher.consumer_wait_s


def _length(source: Source) -> Optional[int]:
    """Records ``source`` hands out per epoch (a Dataset: its consumer's share), or None where it does not say."""
    try:
        return len(source)
    except TypeError:  # open_records: a file's records are not counted before they are read
        return None


def _print_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _share(loader: Loader) -> str:
    """``"consumer C of N"`` of the loader's source, or "this consumer"."""
    world = getattr(loader.source, "world", None)
    return f"consumer {world.consumer} of {world.num_consumers}" if world is not None else "this consumer"


def _no_batch_note(loader: Loader, epoch: int, samples: int, share: Optional[int] = None, failed: int = 0) -> str:
    """Why an epoch yielded no batch, and what to change: ``samples`` delivered of a share of ``share``,
    ``failed`` of them left out by the pipeline (``on_error``)."""
    share = samples if share is None else share
    if samples and failed >= samples:
        return (f"epoch {epoch} yields no batch for {_share(loader)}: the pipeline could process none of its "
                f"{samples} records (on_error={loader.on_error!r} left them out): see the warnings, or "
                f"on_error='raise' for the first one's error")
    smallest = getattr(loader.source, "smallest_share", None)
    if isinstance(smallest, int) and smallest < loader.batch_size <= share:  # another consumer's share is short
        return (f"epoch {epoch} yields no batch for {_share(loader)}: it has {share} samples, but the smallest "
                f"consumer's share has {smallest}, fewer than batch_size {loader.batch_size}, and last_batch='DROP' "
                f"stops every consumer at the full batches all of them make (so that none waits for another): use "
                f"a batch_size of at most {smallest}, or last_batch='PARTIAL' (or 'FILL')")
    what = f"epoch {epoch} yields no batch for {_share(loader)}: it has {samples} samples"
    if share > samples:
        what += f" (of its {share} records, the others skipped as corrupt)"
    if samples == 0:
        return (f"{what}; its share of the records is empty (fewer records than consumers?): check the data "
                f"and the world ({getattr(loader.source, 'world', 'unknown')})")
    usable = samples - min(failed, samples)
    if usable < samples:  # records the pipeline could not process (on_error) are not samples of a batch
        what = (f"{what}, {samples - usable} of which the pipeline could not process (on_error="
                f"{loader.on_error!r} left them out), so {usable}")
    if usable == 0:
        return (f"{what}: see the warnings, or on_error='raise' for the first one's error")
    return (f"{what}, fewer than batch_size {loader.batch_size}, and last_batch='{loader.last_batch}' drops the "
            f"short batch: use a batch_size of at most {usable}, or last_batch='PARTIAL' (or 'FILL')")


def _empty_batch_note(loader: Loader) -> str:
    # The same text every epoch: Python's default filter shows it once.
    return (f"dlstore loader: {_share(loader)} yields an empty batch (0 rows): its share ran out "
            f"before the batch count all consumers agree on (remainder 'uneven', or records skipped as corrupt), "
            f"so that none waits for another in a collective. A loss over 0 samples is NaN: skip empty batches in "
            f"the training step, or read with remainder='pad' (equal shares)")


def _add_note(error: BaseException, note: str) -> None:
    """Adds ``note`` to the traceback display of ``error`` (Python 3.11+; older: to its args)."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    elif error.args and isinstance(error.args[0], str):
        error.args = (f"{error.args[0]} ({note})",) + error.args[1:]
