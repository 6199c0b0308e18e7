"""Live figures of a running benchmark in the Prometheus text format (``--metrics-port``).

The Dell EMC reference architecture watched its runs in Prometheus and Grafana; with
``python -m dlstore.bench SCENARIO --metrics-port PORT`` the benchmark serves, while it runs, the
figures it computes anyway, updated as each step (``resnet50``, ``bert``) or pass (``storage``)
completes. Every series is labelled with ``bench`` (the scenario), ``engine`` (the resolved I/O
engine) and ``tier`` (``page-cache``, ``local-cold``, ``target``; ``cold`` or ``warm`` for
``storage``). Units follow Prometheus' conventions: bytes rather than MB, ratios 0..1 rather
than percentages.

``dlstore_bench_samples_per_second``
    images/s, samples/s or records/s (label ``unit``) of the last step or pass
``dlstore_bench_read_bytes_per_second``
    record bytes delivered per second in it (the bench's MB/s x 1e6)
``dlstore_bench_busiest_core_ratio``
    the busiest core's utilisation in it (system-wide, /proc/stat)
``dlstore_bench_accelerator_utilisation_ratio``
    the emulated accelerator's compute time over wall time in it (only with ``--compute``)
``dlstore_bench_needed_bytes_per_second_per_accelerator``
    what one emulated accelerator needs at the tier's record size, set when the tier ends
    (only with ``--compute``)
``dlstore_bench_step``
    number of the last completed step or pass of the tier
``dlstore_bench_running``
    1 while the tier runs, 0 once it is done
``dlstore_bench_records_total``, ``dlstore_bench_read_bytes_total``
    counters of the records and record bytes read; ``rate()`` of the bytes is smoother than the
    per-step figure, which is lumpy as the reader reads 8 MiB chunks ahead

The figures are served by the process's one exporter, :mod:`dlstore.metrics`, beside the series of
every loader the benchmark runs (``dlstore_records_total``, ``dlstore_batch_wait_seconds``...).
``prometheus_client`` is imported only when metrics are asked for (``pip install dlstore[bench]``).
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable, Dict, Iterator, Optional

from dlstore import metrics as exporter
from dlstore.metrics import MetricsUnavailable

__all__ = ["BenchMetrics", "MetricsUnavailable", "add_arguments", "serve_from_args", "linger"]

_LABELS = ("bench", "engine", "tier")


#: The gauges besides the rate, each labelled bench, engine and tier: attribute, series, help.
_GAUGES = (
    ("_bytes", "dlstore_bench_read_bytes_per_second",
     "Record bytes delivered per second in the last completed step or pass"),
    ("_core", "dlstore_bench_busiest_core_ratio",
     "Utilisation of the busiest core in the last completed step or pass (system-wide)"),
    ("_au", "dlstore_bench_accelerator_utilisation_ratio",
     "Emulated accelerator's compute time over wall time in the last completed step"),
    ("_needed", "dlstore_bench_needed_bytes_per_second_per_accelerator",
     "Bytes per second one emulated accelerator needs at the tier's record size"),
    ("_step", "dlstore_bench_step", "Number of the last completed step or pass of the tier"),
    ("_running", "dlstore_bench_running", "1 while the tier runs, 0 once it is done"),
)


def _prometheus():
    return exporter.prometheus()


class _Forward:
    """A collector handing on what a benchmark's own registry holds, so that the process's exporter
    serves it."""

    def __init__(self, registry: Any):
        self.registry = registry

    def collect(self) -> Iterator[Any]:
        yield from self.registry.collect()

    def describe(self) -> Iterator[Any]:
        return iter(())


def _ratio(pct: Optional[float]) -> Optional[float]:
    return None if pct is None else pct / 100.0


class BenchMetrics:
    """The gauges and the counter of one benchmark run, in their own registry.

    Parameters
    ----------
    bench : str
        The scenario (``resnet50``, ``bert``, ``storage``): the ``bench`` label of every series.
    unit : str
        What the rate counts (``images``, ``samples``, ``records``): the ``unit`` label of
        ``dlstore_bench_samples_per_second``.
    registry : prometheus_client.CollectorRegistry, optional
        Where the series are registered; a new private one by default (never the global registry,
        so that two instances in one process do not collide).
    """

    def __init__(self, bench: str, unit: str = "samples", registry: Any = None):
        prom = _prometheus()
        self.bench = bench
        self.unit = unit
        self.registry = prom.CollectorRegistry() if registry is None else registry
        self._forward: Optional[_Forward] = None
        self._started = False
        #: The port served, once :meth:`serve` has run.
        self.port: Optional[int] = None
        r = self.registry
        self._rate = prom.Gauge("dlstore_bench_samples_per_second", "Rate of the last completed step or pass",
                                _LABELS + ("unit",), registry=r)
        for attr, name, text in _GAUGES:
            setattr(self, attr, prom.Gauge(name, text, _LABELS, registry=r))
        self._records = prom.Counter("dlstore_bench_records", "Records read", _LABELS, registry=r)
        self._read = prom.Counter("dlstore_bench_read_bytes", "Record bytes read", _LABELS, registry=r)
        self._records_seen: Dict[tuple, int] = {}

    def _labels(self, tier: str, engine: str) -> Dict[str, str]:
        return {"bench": self.bench, "engine": engine, "tier": tier}

    def begin(self, tier: str, engine: str) -> None:
        """A tier (or cache state) starts: ``running`` 1, ``step`` 0."""
        labels = self._labels(tier, engine)
        self._running.labels(**labels).set(1)
        self._step.labels(**labels).set(0)

    def step(self, tier: str, engine: str, figures: Dict[str, Any], records: Optional[int] = None) -> None:
        """One step or pass completed.

        Parameters
        ----------
        figures : dict
            A step of :func:`dlstore.bench.steps.run_steps` or a pass of
            :func:`dlstore.bench.storage.measure_passes`: ``step`` (else the step gauge counts up),
            ``rate`` or ``records_per_s``, ``mb_per_s`` or ``gb_per_s``, ``busiest_core_pct``,
            ``accelerator_util_pct``, ``bytes`` (read in this step); missing or None figures leave
            their series as they were.
        records : int, optional
            Records read so far in this tier (a running total: the counter grows by the difference
            from the last call); else ``figures["records"]`` is this step's own count.
        """
        labels = self._labels(tier, engine)
        rate = figures.get("rate", figures.get("records_per_s"))
        if rate is not None:
            self._rate.labels(unit=self.unit, **labels).set(rate)
        mb = figures.get("mb_per_s")
        if mb is None and figures.get("gb_per_s") is not None:
            mb = figures["gb_per_s"] * 1e3
        if mb is not None:
            self._bytes.labels(**labels).set(mb * 1e6)
        for gauge, key in ((self._core, "busiest_core_pct"), (self._au, "accelerator_util_pct")):
            value = _ratio(figures.get(key))
            if value is not None:
                gauge.labels(**labels).set(value)
        number = figures.get("step")
        step = self._step.labels(**labels)
        if number is None:
            step.inc()
        else:
            step.set(number)
        key = (tier, engine)
        if records is not None:
            grown = records - self._records_seen.get(key, 0)
            self._records_seen[key] = records
        else:
            grown = figures.get("records") or 0
        if grown > 0:
            self._records.labels(**labels).inc(grown)
        if figures.get("bytes"):
            self._read.labels(**labels).inc(figures["bytes"])

    def end(self, tier: str, engine: str, needed_mb_per_s: Optional[float] = None) -> None:
        """The tier is done: ``running`` 0; with an emulated accelerator, the MB/s one needs."""
        labels = self._labels(tier, engine)
        self._running.labels(**labels).set(0)
        if needed_mb_per_s is not None:
            self._needed.labels(**labels).set(needed_mb_per_s * 1e6)

    def exposition(self) -> str:
        """The registry in the Prometheus text format (what a scrape gets)."""
        return _prometheus().generate_latest(self.registry).decode()

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serves ``/metrics`` through :func:`dlstore.metrics.serve` (``port`` + the local rank under a
        launcher; 0: a free one), these figures beside the loaders'; returns the port."""
        self._started = exporter.serving() is None
        self.port = exporter.serve(port, addr)
        if self._forward is None:
            self._forward = _Forward(self.registry)
            exporter.registry().register(self._forward)
        return self.port

    def close(self) -> None:
        """Takes these figures off the exporter, and stops it if :meth:`serve` started it."""
        if self._forward is not None:
            exporter.registry().unregister(self._forward)
            self._forward = None
        if self._started:
            exporter.stop()
            self._started = False


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--metrics-port`` and ``--metrics-linger``, for every scenario."""
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve live figures in the Prometheus text format on http://HOST:PORT/metrics while "
                        "the benchmark runs (0: a free port, printed); under a launcher each process serves on "
                        "PORT + its local rank; needs prometheus_client")
    p.add_argument("--metrics-linger", type=float, default=0.0, metavar="SECONDS",
                   help="with --metrics-port: keep serving this long after the benchmark ends, so that a last "
                        "scrape sees the final figures")


def serve_from_args(args: argparse.Namespace, bench: str, unit: str,
                    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)
                    ) -> Optional[BenchMetrics]:
    """The metrics of ``args`` (``--metrics-port``), already serving; None when not asked for.

    Raises
    ------
    MetricsUnavailable
        When ``prometheus_client`` is not installed.
    ValueError
        For a port out of range or a negative linger.
    OSError
        When the port cannot be bound (in use, privileged).
    """
    port = getattr(args, "metrics_port", None)
    if port is None:
        return None
    if not 0 <= port <= 65535:
        raise ValueError(f"--metrics-port must be 0..65535, not {port}")
    if args.metrics_linger < 0:
        raise ValueError(f"--metrics-linger must be 0 or more, not {args.metrics_linger}")
    metrics = BenchMetrics(bench, unit)
    try:
        bound = metrics.serve(port)
    except OSError as e:  # the port with the local rank added, as dlstore.metrics.serve binds it
        raise OSError(e.errno, f"--metrics-port {port}: {e.strerror}") from None
    log(f"metrics: serving on http://0.0.0.0:{bound}/metrics")
    return metrics


def linger(metrics: Optional[BenchMetrics], seconds: float,
           log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
           sleep: Callable[[float], None] = time.sleep) -> None:
    """After the run: keep serving ``seconds`` more (``--metrics-linger``); the caller then closes."""
    if metrics is not None and seconds > 0:
        log(f"metrics: benchmark done; serving the final figures for {seconds:g} s more")
        sleep(seconds)
