"""Live figures of a training job's input, in the Prometheus text format: one exporter per process.

:func:`serve` (or the environment variable ``DLSTORE_METRICS_PORT``) serves ``/metrics`` from a
background thread; every live :class:`~dlstore.pipeline.Loader` (and so the adapters, which read
through one) and every live :class:`~dlstore.Dataset` of the process is exported, read from its
``stats()`` at scrape time: nothing runs per record. Under a launcher each process serves on ``port +
local rank`` (``0``: a free port). The benchmark's ``--metrics-port`` serves through the same exporter
(:mod:`dlstore.bench.metrics` adds its gauges to :func:`registry`).

A Dataset that a live Loader reads (or an adapter over its passes, or a Loader that adapter folds
into its own series) is left out: that reader's series count the same records, bytes, corrupt records
and failovers, and a ``sum by (rank)`` over both would count each record twice. So every record read
in a process is in one series: its Loader's, or, for a Dataset read directly (``ds.batches()``, a
``DlstoreIterableDataset`` without a pipeline, the DALI adapter), its own.

Series, each labelled ``rank`` (the consumer's rank), ``loader`` (what is read: the pipeline and a
number for a Loader, ``dataset`` and a number for a Dataset read directly), ``mount`` (the mount
points the rank reads, comma-separated, or ``local``) and ``engine`` (the resolved I/O engine):

``dlstore_records_total``, ``dlstore_read_bytes_total``
    records and payload bytes taken from the source
``dlstore_batches_total``, ``dlstore_samples_total``
    batches and samples handed to the training loop (Loaders only)
``dlstore_skipped_records_total`` (label ``stage``: ``source`` for corrupt records the reader
skipped, ``pipeline`` for records the pipeline could not process; a Dataset has ``source`` only)
``dlstore_corrupt_records_total``
    corrupt records the source found and skipped (``on_error`` skip/warn)
``dlstore_failovers_total``, ``dlstore_retries_total``
    reads moved to another mount, reads retried (summed at each pass's end)
``dlstore_batch_wait_seconds``
    histogram of the time the training loop waited for each batch (Loaders only)
``dlstore_stall_seconds_total`` (label ``cause``: ``storage`` or ``decode``)
    that wait, split by what the batch cost the loader (see :meth:`~dlstore.pipeline.Loader.stall_report`;
    Loaders only)
``dlstore_engine_info``
    1, with the engine's reason as ``reason``

A Dataset's series come from ``stats()["life"]``, its counts over every pass (the one under way
included). ``prometheus_client`` is imported only when serving (``pip install prometheus_client``).
Loaders and Datasets in other processes (DataLoader workers) are exported by those processes only.
"""
from __future__ import annotations

import errno
import multiprocessing
import os
import threading
import warnings
import weakref
from typing import Any, Dict, Iterator, Optional, Tuple

from dlstore import settings
from dlstore.errors import DlstoreError
from dlstore.placement.world import detect_world

__all__ = ["serve", "serving", "registry", "exposition", "track", "untrack", "series_name", "stop", "prometheus",
           "ENV_PORT", "MetricsUnavailable"]

#: The environment variable that makes the first Loader or Dataset of the process start the exporter on
#: that port (the ``metrics_port`` setting).
ENV_PORT = settings.SETTINGS["metrics_port"].env

_LABELS = ("rank", "loader", "mount", "engine")
_lock = threading.Lock()
_live: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()  # loader or dataset -> its name
# Loaders another object exports (untrack): not exported, but the Datasets they read are that object's figures.
_folded: "weakref.WeakSet[Any]" = weakref.WeakSet()
_made = [0]
_state: Dict[str, Any] = {"registry": None, "server": None, "thread": None, "port": None}


class MetricsUnavailable(DlstoreError, ValueError):
    """Metrics were asked for but ``prometheus_client`` is not installed."""


def prometheus():
    """The ``prometheus_client`` module, imported now.

    Raises
    ------
    MetricsUnavailable
        When it is not installed (a usage error: the bench exits 2).
    """
    try:
        import prometheus_client
    except ImportError:
        raise MetricsUnavailable("metrics (--metrics-port, DLSTORE_METRICS_PORT) need prometheus_client: pip "
                                 "install prometheus_client (or dlstore[bench])") from None
    return prometheus_client


def track(reader: Any) -> None:
    """Exports ``reader`` while it lives: a Loader (anything with ``stats()`` and ``wait_histogram()``), or a
    Dataset (``stats()`` with its counts over its life under ``life``), left out while a Loader reads it.

    Loaders and Datasets call this when made (a Dataset's copy, a DataLoader worker's, when it starts
    reading); with ``DLSTORE_METRICS_PORT`` set, the first one starts the exporter (in a process
    started by the launcher, not in one started through ``multiprocessing``, such as a DataLoader
    worker). Only a weak reference is kept: tracking never keeps a reader alive.
    """
    with _lock:
        if reader in _live:  # tracked already: one series
            return
        kind = getattr(getattr(reader, "pipeline", None), "name", "loader") if _is_loader(reader) else "dataset"
        name = f"{kind}-{_made[0]}"
        _made[0] += 1
        _live[reader] = name
        _folded.discard(reader)
    # Only a launched process serves by itself: processes it starts through multiprocessing (DataLoader
    # workers) would all ask for its port.
    if _state["server"] is None and not _state.get("refused") and settings.get("metrics_port") is not None and \
            multiprocessing.parent_process() is None:
        try:
            serve()
        except (OSError, MetricsUnavailable) as e:
            # The exporter is optional: a port another job holds must not stop training. Said once.
            _state["refused"] = True
            warnings.warn(f"{ENV_PORT} is set, but no metrics are served: {e}", stacklevel=3)


def _is_loader(reader: Any) -> bool:
    """Whether ``reader`` hands batches to a training loop (a Loader, an adapter), not a Dataset."""
    return hasattr(reader, "wait_histogram")


def _forked() -> None:
    # A forked child (a DataLoader worker) holds copies of its parent's loaders and datasets, frozen (serving
    # them would export the parent's counts a second time), and of its server object without its thread: it
    # serves nothing until it serves its own readers on its own port (a worker's Dataset, a copy, is tracked
    # when it starts reading).
    _live.clear()
    _folded.clear()
    _state.update(server=None, thread=None, port=None)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def series_name(reader: Any) -> Optional[str]:
    """The ``loader`` label of ``reader``'s series, or None when it is not tracked (a Dataset a live Loader
    reads is tracked but left out of the scrape; see the module's notes)."""
    with _lock:
        return _live.get(reader)


def untrack(loader: Any) -> None:
    """Stops exporting ``loader`` (another object exports what it counts: an adapter over its passes); the
    Dataset it reads stays left out while it lives, its figures being that object's."""
    with _lock:
        if _live.pop(loader, None) is not None:
            _folded.add(loader)


def _sources(reader: Any) -> Iterator[Any]:
    """The sources ``reader`` (a Loader, an adapter) reads: its ``source`` or ``dataset``, and what a
    :class:`~dlstore.sources.source.SourceWrapper` among them wraps."""
    for attr in ("source", "dataset"):
        source, seen = getattr(reader, attr, None), set()
        # At most 16 deep, and never round a cycle: a scrape must end whatever a source's __getattr__ does.
        while source is not None and id(source) not in seen and len(seen) < 16:
            seen.add(id(source))
            yield source
            source = getattr(source, "wrapped", None)


def _label_values(reader: Any, name: str, stats: Dict[str, Any]) -> Tuple[str, ...]:
    source = reader
    if _is_loader(reader):
        source = getattr(reader, "source", None)
        if source is None:  # an adapter over its passes (an empty Dataset share is falsy: not `or`)
            source = getattr(reader, "dataset", None)
    world = getattr(source, "world", None)
    rank = str(world.rank) if world is not None else str(detect_world().rank)
    mounts = getattr(source, "rank_mounts", None) or []
    return rank, name, ",".join(mounts) if mounts else "local", str(stats.get("engine"))


class _Collector:
    """Reads every live loader's and dataset's ``stats()`` at scrape time into metric families."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        def counter(name: str, text: str, extra: Tuple[str, ...] = ()) -> Any:
            return CounterMetricFamily(name, text, labels=_LABELS + extra)

        records = counter("dlstore_records", "Records taken from the source")
        read = counter("dlstore_read_bytes", "Payload bytes of the records taken from the source")
        batches = counter("dlstore_batches", "Batches handed to the training loop")
        samples = counter("dlstore_samples", "Samples handed to the training loop (padding excluded)")
        skipped = counter("dlstore_skipped_records", "Records left out: corrupt (source) or unprocessable "
                                                     "(pipeline)", ("stage",))
        corrupt = counter("dlstore_corrupt_records", "Corrupt records the source found and skipped")
        failovers = counter("dlstore_failovers", "Reads moved to another mount after a failure")
        retries = counter("dlstore_retries", "Reads retried after a failure")
        stalls = counter("dlstore_stall_seconds", "Seconds the training loop waited for batches, by cause",
                         ("cause",))
        wait = HistogramMetricFamily("dlstore_batch_wait_seconds", "Seconds the training loop waited for each batch",
                                     labels=_LABELS)
        engine = GaugeMetricFamily("dlstore_engine_info", "The I/O engine that runs (1), and why",
                                   labels=_LABELS + ("reason",))
        with _lock:
            tracked = list(_live.items())
            folded = list(_folded)
        loaders = [reader for reader, _ in tracked if _is_loader(reader)]
        # The Datasets a loader's series already count (ids of objects held alive by `tracked` and `folded`).
        read_by_loaders = {id(source) for reader in loaders + folded for source in _sources(reader)}
        for reader, name in tracked:
            loader = _is_loader(reader)
            if not loader and id(reader) in read_by_loaders:
                continue
            stats = reader.stats()
            labels = list(_label_values(reader, name, stats))
            engine.add_metric(labels + [str(stats.get("engine_reason"))], 1)
            # What it took from storage: a Loader's counts, or a Dataset's (read directly) over its life.
            counts = stats if loader else dict(stats["life"], skipped_source=stats["life"]["skipped"])
            records.add_metric(labels, counts["records"])
            read.add_metric(labels, counts["bytes"])
            skipped.add_metric(labels + ["source"], counts["skipped_source"])
            corrupt.add_metric(labels, counts["skipped_source"])
            failovers.add_metric(labels, counts["failovers"])
            retries.add_metric(labels, counts["retries"])
            if not loader:
                continue
            batches.add_metric(labels, stats["batches"])
            samples.add_metric(labels, stats["samples"])
            skipped.add_metric(labels + ["pipeline"], stats["skipped_pipeline"])
            report = stats["stalls"]
            stalls.add_metric(labels + ["storage"], report["storage_wait_s"])
            stalls.add_metric(labels + ["decode"], report["decode_wait_s"])
            bounds, counts = reader.wait_histogram()
            running, buckets = 0, []
            for bound, n in zip(bounds, counts):
                running += n
                buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
            wait.add_metric(labels, buckets, report["wait_s"])
        yield from (records, read, batches, samples, skipped, corrupt, failovers, retries, stalls, wait, engine)

    def describe(self) -> Iterator[Any]:
        return iter(())  # the families are made at scrape time


def registry() -> Any:
    """The process's registry (a ``prometheus_client.CollectorRegistry`` holding the readers' collector),
    made on first use; other figures of the process (the benchmark's) are registered in it."""
    with _lock:
        if _state["registry"] is None:
            prom = prometheus()
            _state["registry"] = prom.CollectorRegistry()
            _state["registry"].register(_Collector())
        return _state["registry"]


def exposition() -> str:
    """What a scrape of ``/metrics`` gets now (the Prometheus text format)."""
    return prometheus().generate_latest(registry()).decode()


def serve(port: Optional[int] = None, addr: str = "0.0.0.0") -> int:
    """Serves ``/metrics`` of every live loader and dataset of the process from a background thread.

    Parameters
    ----------
    port : int, optional
        Default: ``DLSTORE_METRICS_PORT``. Under a launcher the process serves on ``port + its local
        rank``, so that the ranks of a host do not fight over one port; ``0``: a free port.
    addr : str, optional
        The address to bind.

    Returns
    -------
    int
        The port served. Called again while serving, it returns the port served (one exporter per
        process).

    Raises
    ------
    MetricsUnavailable
        Without ``prometheus_client``.
    ValueError
        For a port out of 0..65535, or no port and no ``DLSTORE_METRICS_PORT``.
    OSError
        When the port cannot be bound, naming it.
    """
    if _state["server"] is not None:
        return _state["port"]
    port = settings.get("metrics_port", port)  # a bad value fails here, naming where it came from
    if port is None:
        raise ValueError(f"dlstore.metrics.serve(): give a port, or set {ENV_PORT}")
    if port:
        local = detect_world().local_rank
        if port + local > 65535:
            raise OSError(errno.EINVAL, f"{ENV_PORT}={port} plus this process's local rank {local} is past 65535: "
                                        f"set a port of at most {65535 - local} (each rank of a host serves on "
                                        f"port + its local rank)")
        port += local
    reg = registry()
    try:
        server, thread = prometheus().start_http_server(port, addr=addr, registry=reg)
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror} (dlstore metrics on {addr}:{port})") from None
    _state.update(server=server, thread=thread, port=server.server_port, refused=False)
    return server.server_port


def serving() -> Optional[int]:
    """The port served, or None."""
    return _state["port"]


def stop() -> None:
    """Stops serving (the registry and the tracked readers stay; :func:`serve` may start again)."""
    server = _state["server"]
    if server is not None:
        server.shutdown()
        server.server_close()
        _state.update(server=None, thread=None, port=None)
