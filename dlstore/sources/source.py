"""What every record source is, and how it reads: the :class:`Source` protocol and :class:`ReadOptions`.

A *source* hands out the records of one consumer (a rank, or a DataLoader worker of a rank) as
``RecordBatch`` objects, epoch after epoch, and can say where it stands so that a run resumes
exactly. Two classes implement it: :class:`dlstore.RecordReader` (``open_records``: files read in
order, no placement) and :class:`dlstore.Dataset` (placement over ranks, workers and mounts, with a
shuffle). The loader, the framework adapters and the benchmark read through this protocol only.

:class:`ReadOptions` is the one description of how records are read (engine, read size, reads in
flight, threads, CRC checks, error policy, timeouts). Sources take it whole, or as keyword
arguments that build it; nothing re-lists its fields.
"""
from __future__ import annotations

import dataclasses
import operator
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Mapping, MutableMapping, Optional, Protocol, Tuple, runtime_checkable

from dlstore import settings
from dlstore.io.system import open_files_budget

__all__ = ["Source", "SourceWrapper", "SourcePosition", "ReadOptions", "ON_ERROR", "state_at", "start_at",
           "loaded_point"]

#: What a source does with a corrupt record: raise, skip (counted), or skip with a warning each.
ON_ERROR = ("raise", "skip", "warn")


@dataclass(frozen=True)
class ReadOptions:
    """How a source reads records. Every field left ``None`` takes the setting of the same name
    (:mod:`dlstore.settings`: its environment variable, else its default).

    Parameters
    ----------
    io : {"auto", "buffered", "mmap", "direct", "io_uring", "gds"}, optional
        The I/O engine (:data:`dlstore.io.ENGINES`, or ``gds``). ``auto`` resolves once and says why
        (``source.engine_reason``): ``direct`` when the data is larger than the memory the page cache
        can have (``io_uring`` for a global shuffle, where the kernel allows it), else ``buffered``
        (``mmap`` for a global shuffle).
        ``gds`` raises :class:`~dlstore.GdsUnavailableError` saying why it cannot run here.
    verify : bool
        Check TFRecord CRCs (hardware CRC-32C where the CPU has it).
    on_error : {"raise", "skip", "warn"}
        A corrupt record: ``raise`` (after the good records before it) a
        :class:`~dlstore.CorruptRecordError` naming the file, the offset and what was wrong; ``skip``
        it, counted in ``stats()["skipped"]`` and listed by ``corruptions()``; ``warn``: skip with a
        ``RuntimeWarning`` each.
    chunk_size : int, optional
        Bytes per read.
    depth : int, optional
        Reads in flight.
    io_threads : int, optional
        Threads issuing reads (a :class:`~dlstore.Dataset` also checks frames and CRCs on them).
    verify_threads : int, optional
        Threads besides the consumer checking CRCs of a file read in order (:func:`~dlstore.open_records`).
    read_timeout : float, optional
        Seconds an open or a read may take before it fails (and a :class:`~dlstore.Dataset` fails
        over to a replica mount); 0 waits forever.
    max_retries : int, optional
        Retries of a failed read at the same place once no replica is left (:class:`~dlstore.Dataset`).
    """

    io: Optional[str] = None
    verify: bool = True
    on_error: str = "raise"
    chunk_size: Optional[int] = None
    depth: Optional[int] = None
    io_threads: Optional[int] = None
    verify_threads: Optional[int] = None
    read_timeout: Optional[float] = None
    max_retries: Optional[int] = None

    def __post_init__(self):
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be 'raise', 'skip' or 'warn', not {self.on_error!r}")
        if not isinstance(self.verify, bool):
            raise ValueError(f"verify must be True or False, not {self.verify!r}")
        for name in ("io", "chunk_size", "depth", "io_threads", "verify_threads", "read_timeout", "max_retries"):
            settings.get(name, getattr(self, name))  # a bad value fails here, naming the setting

    @classmethod
    def names(cls) -> tuple:
        """The option names (the keyword arguments sources accept for them)."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def take(cls, options: Optional["ReadOptions"], kwargs: MutableMapping[str, Any]) -> "ReadOptions":
        """``options``, or the options named in ``kwargs`` (popped from it); not both.

        Raises
        ------
        TypeError
            When both are given.
        """
        given = {k: kwargs.pop(k) for k in cls.names() if k in kwargs}
        if options is None:
            return cls(**given)
        if given:
            raise TypeError(f"pass the reader options either as options=ReadOptions(...) or as keyword "
                            f"arguments, not both ({', '.join(sorted(given))} given beside options)")
        if not isinstance(options, ReadOptions):
            raise TypeError(f"options must be a dlstore.ReadOptions, not {type(options).__name__}")
        return options

    def replace(self, **changes: Any) -> "ReadOptions":
        return dataclasses.replace(self, **changes)

    def get(self, name: str) -> Any:
        """The effective value of option ``name``: the field, else its setting."""
        return settings.get(name, getattr(self, name))

    def core(self, engine: str, *, in_order: bool = True, mounts: int = 1, reorders: bool = False):
        """The C++ reader's options for ``engine`` (``io="auto"`` resolved): a ``dlstore._C.ReaderOptions``
        for files read in order, else a ``dlstore._C.PlanOptions`` (no ``headroom``: a read plan reads
        whole records, never joining one split between reads).

        Parameters
        ----------
        in_order : bool
            Files read front to back (:func:`~dlstore.open_records`), rather than a read plan.
        mounts : int
            Mount points read at once; each needs reads in flight of its own.
        reorders : bool
            A read plan whose records go through a shuffle buffer (its reads are blocks in a seeded
            order).

        Explicit values always win; otherwise a few defaults depend on the case, by the rules of
        :data:`dlstore.settings.SETTINGS` (listed with their reasons in docs/settings.md).
        """
        from dlstore import _C

        case = settings.Case(engine, in_order=in_order, mounts=mounts, reorders=reorders)
        out = _C.ReaderOptions() if in_order else _C.PlanOptions()
        out.engine = engine
        out.chunk_size = settings.effective("chunk_size", self.chunk_size, case)
        out.depth = settings.effective("depth", self.depth, case)
        out.io_threads = self.get("io_threads")
        out.read_timeout = float(self.get("read_timeout"))
        out.queue_depth = settings.get("queue_depth")
        out.direct_cache = settings.get("direct_cache")
        out.verify = self.verify
        out.on_error = "skip" if self.on_error == "warn" else self.on_error
        if not in_order:
            out.max_open_files = open_files_budget()
        if in_order:
            out.headroom = settings.get("headroom")
            out.verify_threads = settings.effective("verify_threads", self.verify_threads, case)
        return out


class ReadsWithOptions:
    """What dlstore's own sources share: an engine choice (``self.choice``, ``io="auto"`` resolved) and
    :class:`ReadOptions` (``self.options``), shown as the attributes the loader and the reports read."""

    choice: Any
    options: ReadOptions

    engine = property(lambda self: self.choice.engine, doc="The engine that runs (``io='auto'`` resolved).")
    engine_reason = property(lambda self: self.choice.reason, doc="Why that engine.")
    verify = property(lambda self: self.options.verify, doc="Whether TFRecord CRCs are checked.")
    on_error = property(lambda self: self.options.on_error,
                        doc="What a corrupt record does: ``raise``, ``skip`` or ``warn``.")


class SourcePosition:
    """Where one of dlstore's own sources stands, ``epoch`` and ``sample_in_epoch`` (records of the epoch
    handed out), and the one rule :meth:`set_epoch` follows after a resume.

    A point :meth:`_resume_at` set (a source's ``load_state_dict``) stays when :meth:`set_epoch` names its
    epoch before that epoch's pass starts, so a training loop that sets each epoch, ``for epoch in
    range(state["epoch"], n): ds.set_epoch(epoch)``, resumes where the state says rather than read the
    epoch's first records again; another epoch forgets the point, and so does the start of a pass
    (:meth:`_pass_starts`). Otherwise ``set_epoch`` starts the epoch from its first record, as after a
    loop broken off mid-epoch. A consumer over the source (a :class:`~dlstore.pipeline.Loader`, the DALI feed,
    :class:`~dlstore.adapters.torch.DlstoreIterableDataset`) starts its next iteration at the point
    (:attr:`resume_point`, :func:`loaded_point`), whoever loaded it. DlstoreIterableDataset keeps a resume point
    of its own by the same rule: for the epoch it was saved in, forgotten at another, and used by one pass.
    """

    epoch: int = 0
    sample_in_epoch: int = 0
    #: ``(epoch, sample_in_epoch)`` loaded by ``load_state_dict`` and not yet started from, else None.
    _resume_point: Optional[Tuple[int, int]] = None

    def set_epoch(self, epoch: int) -> None:
        """Starts ``epoch`` from its first record, or from the point ``load_state_dict`` loaded for it when
        no pass has started since (another epoch forgets that point).

        Raises
        ------
        TypeError
            When ``epoch`` is not an integer.
        ValueError
            When it is negative.
        """
        try:
            epoch = operator.index(epoch)  # 1.5 or "1" is no epoch: it was truncated, or failed comparing
        except TypeError:
            raise TypeError(f"epoch must be an integer, not {epoch!r}") from None
        if epoch < 0:
            raise ValueError(f"epoch must be non-negative, not {epoch}")
        point = self._resume_point
        if point is not None and point[0] == epoch:
            self.epoch, self.sample_in_epoch = point
        else:
            self._resume_point = None
            self.epoch, self.sample_in_epoch = epoch, 0

    @property
    def resume_point(self) -> Optional[Tuple[int, int]]:
        """``(epoch, sample_in_epoch)`` that ``load_state_dict`` loaded and no pass has started from, else None:
        where the next pass starts (also after :meth:`set_epoch` of that epoch)."""
        return self._resume_point

    def _resume_at(self, epoch: int, sample_in_epoch: int) -> None:
        """Puts the position at a loaded state, kept for :meth:`set_epoch` of ``epoch``."""
        self._resume_point = (int(epoch), int(sample_in_epoch))
        self.epoch, self.sample_in_epoch = self._resume_point

    def _pass_starts(self) -> None:
        """A pass reads from the position: a loaded point is used, and set_epoch means the epoch's start again."""
        self._resume_point = None


@runtime_checkable
class Source(Protocol):
    """A consumer's records, epoch after epoch, resumable: what the loader, the adapters and the
    benchmark read through.

    Attributes
    ----------
    format : str
        ``tfrecord`` or ``recordio`` (the pipeline needs to know).
    engine, engine_reason : str
        The I/O engine that runs (``io="auto"`` resolved) and why.
    num_batches : int or None
        Batches every consumer yields per epoch when consumers must agree on a count (ranks that
        split an epoch unevenly), else None.
    """

    format: str

    @property
    def engine(self) -> str: ...

    @property
    def engine_reason(self) -> str: ...

    @property
    def num_batches(self) -> Optional[int]: ...

    def batches(self) -> Iterator[Any]:
        """``RecordBatch`` objects of the current epoch from the current position; the position
        advances as they are handed out, and moves to the next epoch when this one ends."""

    def set_epoch(self, epoch: int) -> None:
        """Starts ``epoch`` from its first record; dlstore's own sources from the point
        :meth:`load_state_dict` loaded for ``epoch`` while that epoch's pass has not started
        (:class:`SourcePosition`)."""

    def use_batch_size(self, batch_size: int) -> None:
        """The consumer's batch size: a source whose own was left unset reads batches of it."""

    def state_dict(self) -> Dict[str, Any]:
        """``epoch`` and ``sample_in_epoch`` (records already handed out), and what else the source
        needs to resume exactly."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes at ``state``: the next :meth:`batches` starts there (also after :meth:`set_epoch` of
        that epoch)."""

    def stats(self) -> Dict[str, Any]:
        """Counters of the last pass, with ``engine`` and ``engine_reason``."""


class SourceWrapper:
    """A :class:`Source` that hands every member of the protocol to the source it wraps.

    Wrappers that change one thing (count the bytes, repeat an epoch) subclass it and override that.
    Each member is spelt out rather than reached through ``__getattr__``: from Python 3.12,
    ``isinstance(x, Source)`` looks members up without calling ``__getattr__``, so a wrapper built on
    it alone is refused by the loader there.
    """

    def __init__(self, source: Source):
        self._source = source

    @property
    def wrapped(self) -> Source:
        """The source this one wraps (a Loader over a wrapper of a Dataset reads that Dataset)."""
        return self._source

    @property
    def format(self) -> str:
        return self._source.format

    @property
    def engine(self) -> str:
        return self._source.engine

    @property
    def engine_reason(self) -> str:
        return self._source.engine_reason

    @property
    def num_batches(self) -> Optional[int]:
        return self._source.num_batches

    def batches(self) -> Iterator[Any]:
        return self._source.batches()

    def set_epoch(self, epoch: int) -> None:
        self._source.set_epoch(epoch)

    def use_batch_size(self, batch_size: int) -> None:
        self._source.use_batch_size(batch_size)

    def state_dict(self) -> Dict[str, Any]:
        return self._source.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._source.load_state_dict(state)

    def stats(self) -> Dict[str, Any]:
        return self._source.stats()

    def __len__(self) -> int:  # a Dataset's share; len() looks dunders up on the class, never in __getattr__
        return len(self._source)

    def __getattr__(self, name: str) -> Any:  # what a Source has beyond the protocol (a Dataset's plan, say)
        return getattr(self._source, name)


def state_at(source: Source, epoch: int, sample_in_epoch: int) -> Dict[str, Any]:
    """``source``'s state with its position moved to sample ``sample_in_epoch`` of ``epoch``: what a
    consumer (a loader, an adapter) that prefetches saves for it, at the position it has really used."""
    return dict(source.state_dict(), epoch=int(epoch), sample_in_epoch=int(sample_in_epoch))


def start_at(source: Source, epoch: int, sample_in_epoch: int = 0) -> None:
    """Puts ``source`` at sample ``sample_in_epoch`` of ``epoch``: its next :meth:`~Source.batches`
    starts there (the epoch's start through ``set_epoch``, mid-epoch through ``load_state_dict``).

    The consumer that calls it (a loader, an adapter) counts its own position: at sample 0 the source starts
    there also where ``set_epoch`` kept a point loaded into the source for that epoch
    (:class:`SourcePosition`). The consumer first takes such a point as its own position
    (:func:`loaded_point`), so that it starts there."""
    if sample_in_epoch:
        source.load_state_dict(state_at(source, epoch, sample_in_epoch))
        return
    source.set_epoch(epoch)
    if getattr(source, "sample_in_epoch", 0):  # a kept point; the epoch as set_epoch set it (a wrapper may map it)
        source.load_state_dict(state_at(source, getattr(source, "epoch", epoch), 0))


def loaded_point(source: Source, own: Optional[Tuple[int, int]] = None, *, hand_over: bool = False,
                 loaded: Optional[str] = None) -> Optional[Tuple[int, int]]:
    """The point loaded into ``source`` on its own (``source.load_state_dict(state)``: its
    :attr:`~SourcePosition.resume_point`, no pass started from it), ``(epoch, sample_in_epoch)``, where a
    consumer that stands at ``own`` takes it as its position: its next pass starts there. None where the source
    keeps no point, or keeps ``own`` (the consumer's own load put it there).

    The one rule by which the consumers that count their own positions and put their source there at each pass
    (:func:`start_at`: the :class:`~dlstore.pipeline.Loader`, the DALI feed,
    :class:`~dlstore.adapters.torch.DlstoreIterableDataset`) resume where their source was resumed. They ask
    between passes only: once a pass has started the source keeps no point, and a consumer's own pass puts
    the source where it reads. ``hand_over``: the source forgets the point (its position stays), for a consumer
    that keeps it as its own resume point and whose passes read copies of the source (DataLoader workers):
    those would find it again at each pass. ``loaded``: the consumer's name where its own state was loaded since
    its last pass; the source's point, loaded after it, still wins (the later load), with a RuntimeWarning: a
    checkpoint that restores both a consumer and its source restores the source ahead of the consumer (the
    source reads ahead while a pass runs), so its records in between would be skipped.
    """
    point = getattr(source, "resume_point", None)
    if point is None or tuple(point) == own:
        return None
    if loaded is not None:
        warnings.warn(f"the source was resumed at epoch {point[0]}, sample {point[1]} (its load_state_dict) after this "
                      f"{loaded}'s own load_state_dict: reading from the source's point, the later one. Restore the "
                      f"{loaded}'s state alone (it restores its source): a source's state saved while a pass ran is "
                      f"ahead of its consumer's by what was read ahead", RuntimeWarning, stacklevel=3)
    if hand_over:
        source._pass_starts()  # the consumer's now: forgotten here as when a pass starts from it
    return int(point[0]), int(point[1])
