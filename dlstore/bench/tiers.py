"""One loader, one tier: what a pipeline benchmark reads (the workload and the loader's spec), the
cache made warm or cold before it, and the tier's run through the step runner."""
from __future__ import annotations

import argparse
import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from dlstore import settings
from dlstore._progress import Progress
from dlstore.bench.steps import CountingSource, run_steps
from dlstore.io import pagecache as cache_control
from dlstore.io.select import ENGINES
from dlstore.pipeline import Loader
from dlstore.sources.dataset import Dataset

__all__ = ["TIERS", "HOST_IO_HELP", "host_io", "Workload", "LoaderSpec", "close_loader", "warm_up", "run_tier",
           "read_share"]

TIERS = ("page-cache", "local-cold", "target")

#: ``--io``'s help in the benches whose loaders read into host memory (all but bench storage).
HOST_IO_HELP = (settings.IO_HOST_HELP + " gds (into GPU memory): bench storage --io gds. "
                f"Default: ${settings.SETTINGS['io'].env}, else auto.")


def host_io(given: Optional[str]) -> str:
    """The engine a bench reading into host memory runs: ``--io`` (``given``), else ``$DLSTORE_IO``, else auto.

    Raises
    ------
    ValueError
        gds from the environment (``--io``'s choices refuse it on the command line): only bench storage
        reads into GPU memory.
    """
    io = settings.get("io", given)
    if io not in ("auto",) + ENGINES:
        where = f"from {settings.SETTINGS['io'].env}" if given is None else "given"
        raise ValueError(f"io={io!r} ({where}) is for bench storage; this bench reads with one of auto, "
                         f"{', '.join(ENGINES)}")
    return io


@dataclass(frozen=True)
class Workload:
    """What differs between ``resnet50`` and ``bert``: names, units, data, pipeline and presets.

    ``pipeline`` names a class of :mod:`dlstore.pipeline` built with the keyword arguments that
    ``pipeline_kwargs(args)`` returns; ``--size`` picks a preset of :data:`dlstore.synthetic.PRESETS`
    for ``dataset_kind`` (``default`` unless given) and ``dataset_overrides(args)`` adds generator arguments.
    """

    name: str
    unit: str  # "images" or "samples": the JSON key is f"{unit}_per_s"
    dataset_kind: str
    pipeline: str
    default_batch_size: int
    pipeline_kwargs: Callable[[argparse.Namespace], Dict[str, Any]]
    dataset_overrides: Callable[[argparse.Namespace], Dict[str, Any]] = field(default=lambda args: {})
    variant: Callable[[argparse.Namespace], Optional[int]] = field(default=lambda args: None)
    describe: Callable[[argparse.Namespace], str] = field(default=lambda args: "")
    #: The --size preset of the generated baseline set: large enough that a tier lasts seconds.
    default_size: str = "default"
    size_help: str = ""

    @property
    def rate_key(self) -> str:
        return f"{self.unit}_per_s"


@dataclass(frozen=True)
class LoaderSpec:
    """Everything needed to build one loader, in this process or in a job's (picklable).

    The loader reads a :class:`dlstore.Dataset`: this rank's share of the records (rank and size from
    the launcher, so under mpirun each rank reads its own), in ``shuffle`` order, as training reads.
    """

    pipeline: str
    pipeline_kwargs: Dict[str, Any]
    paths: Tuple[str, ...]  # the files (what the cache is dropped or warmed for)
    batch_size: int
    io: str = "auto"
    verify: bool = True
    prefetch: int = 2
    threads: Optional[int] = None
    epochs: int = 1
    mounts: Tuple[str, ...] = ()  # with mounts: the Dataset reads `shards`, relative to them
    shards: Tuple[str, ...] = ()
    mounts_per_rank: int = 1  # with mounts: how many of them each rank reads through at once
    shuffle: str = "block"
    seed: int = 0
    device: Optional[str] = None  # "cuda:N": batches delivered to that GPU (Loader(device=...))
    io_why: Optional[str] = None  # why the bench, not the user, chose ``io`` for this tier

    def dataset(self):
        """This rank's :class:`dlstore.Dataset` of the spec's data."""
        if self.mounts:
            where: Dict[str, Any] = dict(shards=list(self.shards), mounts=list(self.mounts),
                                         mounts_per_rank=self.mounts_per_rank)
        else:
            where = dict(shards=list(self.paths))
        return Dataset(**where, io=self.io, verify=self.verify, shuffle=self.shuffle, seed=self.seed,
                       remainder="uneven", batch_size=self.batch_size)

    def open(self) -> Tuple[Any, CountingSource]:
        """``(loader, source)``: a :class:`dlstore.pipeline.Loader` over a counting :meth:`dataset`."""
        pipeline_cls = getattr(importlib.import_module("dlstore.pipeline"), self.pipeline)
        source = CountingSource(self.dataset())
        loader = Loader(source, pipeline_cls(**self.pipeline_kwargs), self.batch_size, prefetch=self.prefetch,
                        last_batch="DROP", threads=self.threads, epochs=self.epochs, seed=self.seed,
                        device=self.device)
        return loader, source

    def for_job(self, job: int) -> "LoaderSpec":
        """The spec of concurrent job ``job``: its own seed, so jobs read the shared files in different orders."""
        return dataclasses.replace(self, seed=self.seed + job)


def close_loader(loader: Any) -> None:
    """Stops ``loader``'s threads, for loaders that have a ``close`` (test doubles may not)."""
    close = getattr(loader, "close", None)
    if close is not None:
        close()


def warm_up(spec: LoaderSpec, batches: int = 1) -> None:
    """Draws ``batches`` batches from a loader of ``spec``, untimed, then closes it.

    The first loader of a process pays one-off costs (imports, thread pools, the decoder's
    tables); without this the first tier would carry them and look slower than the others.
    """
    loader, _ = spec.open()
    try:
        for i, _batch in enumerate(loader, 1):
            if i >= batches:
                break
    finally:
        close_loader(loader)


def run_tier(tier: str, spec: LoaderSpec, plan: Sequence[int], *, cold: bool, compute_s: float = 0.0,
             quiet: bool = True, log: Callable[[str], None] = print, unit: str = "images",
             metrics: Optional[Any] = None) -> Dict[str, Any]:
    """One tier: the cache prepared (warm: read once; cold: dropped or evicted), then :func:`run_steps`.

    ``metrics`` (a :class:`dlstore.bench.metrics.BenchMetrics`) gets each step as it completes.

    Returns
    -------
    dict
        :func:`run_steps`' figures plus ``tier``, ``io``, ``io_reason``, ``cache``,
        ``cache_method``, ``read_records`` and ``read_bytes`` (all the source delivered, read-ahead
        included) and ``cached_before`` (fraction of the files in the page cache when
        the tier started), and the loader's ``loader_stats`` when it has them.
    """
    paths = list(spec.paths)
    method = None if cold else cache_control.make_warm(paths)
    loader, source = spec.open()
    try:
        if cold:
            method = cache_control.make_cold(paths)
        resident = cache_control.resident_fraction(paths)
        if not cold and resident is not None and resident < 0.95:
            log(f"note: {tier}: only {100 * resident:.0f}% of the data stayed in the page cache: the warm tier "
                "is partly cold")
        bar = Progress(sum(plan) * spec.batch_size, tier, unit=unit, enabled=False if quiet else None)
        on_step = None
        if metrics is not None:
            metrics.begin(tier, source.engine)

            def on_step(step: Dict[str, Any]) -> None:
                metrics.step(tier, source.engine, step, records=source.records)
        try:
            measured = run_steps(loader, plan, compute_s=compute_s, counter=source,
                                 progress=bar.update if bar.enabled else None, on_step=on_step)
        finally:
            bar.close()
        stats = loader.stats() if hasattr(loader, "stats") else None
    finally:
        close_loader(loader)
    reason = source.engine_reason
    if spec.io_why and reason == "requested":  # the bench asked for it, not the user
        reason = spec.io_why
    # What storage delivered per record: the steps' bytes include the records read ahead for the
    # next step, which a short run's samples do not (needed MB/s would count them).
    return dict(measured, read_records=source.records, read_bytes=source.bytes,
                tier=tier, io=source.engine, io_reason=reason,
                cache="cold" if cold else "warm", cache_method=method, cached_before=resident,
                read_share_pct=read_share(stats), loader_stats=stats)


def read_share(stats: Optional[Dict[str, Any]]) -> Optional[float]:
    """Of the loader's producer time, the percentage spent waiting for the source (reading) rather than
    decoding: near 100 the storage is the limit, near 0 the CPU is. None when the loader does not say."""
    if not stats:
        return None
    reading, decoding = stats.get("source_s"), stats.get("pipeline_s")
    if reading is None or decoding is None or reading + decoding <= 0:
        return None
    return 100.0 * reading / (reading + decoding)
