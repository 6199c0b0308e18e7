"""What ``python -m dlstore.bench resnet50`` and ``... bert`` share: tiers, steps, jobs, accelerator emulation.

The benchmark runs a whole input pipeline as training runs it (records read through a shuffled
:class:`dlstore.Dataset`, ``--shuffle``, this rank's share; decoded or parsed, batched by
:class:`dlstore.pipeline.Loader`) and reports it the way the Graphcore IPU-POD64 + DDN AI400X2
reference architecture does:

- **Tiers**, side by side in one run, on the same step plan:

  - ``page-cache``: the baseline data read once first (untimed) so that it sits in the page cache,
    checked with ``mincore``; then read through the page cache (``buffered``, or ``mmap`` when
    asked for).
  - ``local-cold``: the same files, the page cache dropped (root) or the files evicted
    (``posix_fadvise``) just before; the report says which.
  - ``target``: the ``--data`` files (the storage under test), made cold the same way.

  The baseline data is the generated synthetic set (or ``--local``), on the local disk that
  holds the dlstore cache directory.
- **Steps**: a step is a fixed number of batches, ``step_batches`` (a training step's worth of
  data, as the paper's "images per second" of training steps 1..9). By default the baseline
  set's batches are dealt into ``--steps`` (9) near-equal steps, so one tier reads the set once;
  ``--step-batches`` fixes it. The rate of a step is the samples of its batches over the wall
  time from the end of the previous step to the end of its last batch, so step 1 includes the
  pipeline's start (threads started, first reads), as a training job's first step does. Every
  tier, the target included, follows the same plan; a tier whose data ends early has fewer steps.
- **Jobs** (``--jobs N``): rows 1..N; row ``n`` runs ``n`` loader processes at once, each one
  an independent job reading *the same* files (its own loader, its own shuffle: job ``j`` uses
  seed ``--seed + j``, so concurrent jobs do not read the same place at the same moment), each
  for ``--jobs-steps`` steps of the plan (the paper's jobs table is the first
  training step). The cache is prepared as for the tier named by ``--jobs-tier`` before each row.
  Aggregate rate = all samples of all jobs over the time from the common start to the last
  finish.
- **Accelerator emulation** (``--compute a100|h100|...|MS``), as MLPerf Storage does: after each
  batch the consumer sleeps the accelerator's time per batch while the loader keeps prefetching.
  Accelerator utilisation (AU) = time spent computing / wall time; "storage sustains X% of what N
  accelerators need" = delivered rate / (N x one accelerator's rate).
- **CPU**: ``/proc/stat`` per core, sampled at every step boundary and over each tier; the
  busiest core's utilisation is the bottleneck signal of the Dell EMC Isilon reference
  architecture (system-wide, not only this process), beside the process's own CPU time.
- **MB/s** counts the record bytes the loader's source delivered (payload, without framing)
  over wall time.

Under MPI (``mpi4py`` importable and a launcher's world size > 1) every rank runs the tiers on
its share of the records (its Dataset's: ranks are consumers of one epoch plan) at the same time,
synchronised by a barrier before each tier, and rank 0 prints one table per rank and the aggregate.
"""
from __future__ import annotations

import argparse
import functools
import os
import socket
import sys
from typing import Dict, List, NamedTuple, Optional, Sequence

from dlstore.bench import report, sysinfo
from dlstore.bench.compute import COMPUTE_PRESETS, resolve_compute
from dlstore.bench.jobs import run_jobs
from dlstore.bench.pipeline_report import build_document, format_report, markdown_report, tier_entry
from dlstore.bench.plot import MatplotlibMissing, plot_document
from dlstore.bench.ranks import aggregate_ranks
from dlstore.bench.steps import DEFAULT_STEPS, fit_batch_size, plan_steps
from dlstore.bench.storage import dataset_paths
from dlstore.bench.tiers import HOST_IO_HELP, TIERS, LoaderSpec, Workload, host_io, run_tier, warm_up
from dlstore.distributed import mpi_comm
from dlstore.io import pagecache as cache_control
from dlstore.io.memory import check_device
from dlstore.io.select import ENGINES
from dlstore.placement.sharding import SHUFFLES
from dlstore.placement.world import detect_world
from dlstore.sources.layout import scan_layout
from dlstore.sources.reader import expand_paths
from dlstore.synthetic import PRESETS

__all__ = ["add_common_arguments", "target_paths", "run_workload"]


def add_common_arguments(p: argparse.ArgumentParser, workload: Workload) -> None:
    """Options both pipeline scenarios take."""

    unit = workload.unit
    p.add_argument("--data", metavar="GLOB",
                   help="the storage under test (a glob, directory or file): adds the 'target' tier. With "
                        "--mounts, shard paths relative to each mount point")
    p.add_argument("--mounts", nargs="+", metavar="DIR",
                   help="mount points holding the --data shards (placement across mounts); every one is read: one "
                        "process reads through all of them at once, ranks share them out (--mounts-per-rank)")
    p.add_argument("--mounts-per-rank", type=int, default=None, metavar="K",
                   help="with --mounts: mounts each rank (each process) reads through at once, given out round "
                        "robin (default: the mounts over the ranks, rounded up, so that every mount is read: all of "
                        "them in one process, one each with as many ranks as mounts)")
    p.add_argument("--local", metavar="GLOB",
                   help="data for the page-cache and local-cold baselines (default: a generated "
                        f"{workload.dataset_kind} set of --size, cached under the dlstore cache directory)")
    p.add_argument("--size", choices=tuple(PRESETS[workload.dataset_kind]), default=workload.default_size,
                   help=f"size of the generated baseline set (default: %(default)s{workload.size_help}; tiny is "
                        "for smoke tests)")
    p.add_argument("--tiers", default=None, metavar="LIST",
                   help=f"comma-separated tiers to run, of {', '.join(TIERS)} (default: page-cache,local-cold, "
                        "and target with --data)")
    p.add_argument("--io", choices=("auto",) + ENGINES, default=None,
                   help=HOST_IO_HELP + " --device copies these batches to a GPU. The page-cache tier reads with "
                        "buffered (or mmap) I/O.")
    p.add_argument("--device", metavar="cuda:N",
                   help="deliver the batches to this GPU: the loader assembles them in pinned memory and copies "
                        "them on a stream (Loader(device=...)); each step's clock stops after its copies have "
                        "finished. cuda:local: each rank onto the GPU numbered as its local rank. Without a GPU "
                        "or CuPy: exit 2, saying what is missing, before any data is generated")
    p.add_argument("--no-verify", dest="verify", action="store_false", help="do not check TFRecord CRCs")
    p.add_argument("--shuffle", choices=tuple(SHUFFLES), default="block",
                   help="the record shuffle of the Dataset each tier reads, as training reads (default: "
                        "%(default)s: blocks read whole in a seeded order through a shuffle buffer; none, buffer, "
                        "or global: a full permutation)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the shuffle and the augmentation")
    p.add_argument("--batch-size", type=int, default=workload.default_batch_size, metavar="N",
                   help=f"{unit} per batch (default: %(default)s; lowered, saying so, when the data is too small "
                        "for the steps)")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="K",
                   help="steps per tier (default: %(default)s, as in the per-step table of the Graphcore "
                        "IPU-POD64 + DDN AI400X2 reference architecture)")
    p.add_argument("--step-batches", type=int, default=None, metavar="B",
                   help="batches per step (default: the baseline set's batches dealt into --steps steps, so a "
                        "tier reads it once; the batch size is lowered, saying so, when the data is too small for "
                        "the steps)")
    p.add_argument("--epochs", type=int, default=1, metavar="E",
                   help="passes over the data per tier (default: %(default)s). A cold tier is cold in its first "
                        "epoch only: later ones come from the page cache, as the Graphcore + DDN "
                        "reference architecture's later steps do")
    p.add_argument("--jobs", type=int, default=0, metavar="N",
                   help="also run the jobs table: 1..N concurrent loader processes")
    p.add_argument("--jobs-steps", type=int, default=1, metavar="S",
                   help="steps each job runs in the jobs table (default: %(default)s: the first training step, as "
                        "in the Graphcore + DDN reference architecture's jobs table)")
    p.add_argument("--jobs-tier", choices=TIERS, default=None,
                   help="cache state and data of the jobs table (default: target with --data, else local-cold)")
    p.add_argument("--compute", metavar="PRESET|MS",
                   help="emulate an accelerator that takes this long per batch, as MLPerf Storage does: a preset ("
                        + ", ".join(COMPUTE_PRESETS[workload.name]) + ") or milliseconds per batch")
    p.add_argument("--prefetch", type=int, default=2, metavar="N", help="batches the loader prepares ahead "
                   "(default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="loader threads (default: the loader's choice)")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--markdown", metavar="FILE", help="write the tables as markdown")
    p.add_argument("--plot", metavar="FILE.png", help="plot the per-step and jobs figures (needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _tiers_wanted(args: argparse.Namespace) -> List[str]:
    if args.tiers is None:
        return ["page-cache", "local-cold"] + (["target"] if args.data else [])
    wanted = [t.strip() for t in args.tiers.split(",") if t.strip()]
    unknown = [t for t in wanted if t not in TIERS]
    if unknown or not wanted:
        raise ValueError(f"--tiers: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(TIERS)}")
    if "target" in wanted and not args.data:
        raise ValueError("--tiers target needs --data (the storage under test)")
    return [t for t in TIERS if t in wanted]


class Target(NamedTuple):
    """The target tier's data: ``files`` (every copy: what the cache is dropped or evicted for), and the
    ``shards`` they are copies of with the bytes of one copy of each."""

    files: List[str]
    shards: int
    shard_bytes: int


def target_paths(data: str, mounts: Optional[Sequence[str]]) -> Target:
    """The target tier's files: ``--data`` expanded; with ``--mounts``, every copy of the shards on them.

    With ``--mounts``, ``--data`` is a shard path or glob relative to each mount point; the files
    returned are what the cache is dropped or evicted for, while the tier itself reads through a
    :class:`dlstore.Dataset` over the mounts (:meth:`LoaderSpec.open`).
    """
    if not mounts:
        files = expand_paths(data)
        return Target(files, len(files), sum(map(os.path.getsize, files)))
    layout = scan_layout(list(mounts), [data])
    files = [layout.path(s, m) for s in range(len(layout.shards)) for m in layout.holders[s]]
    one_each = sum(os.path.getsize(layout.path(s, layout.holders[s][0])) for s in range(len(layout.shards)))
    return Target(files, len(layout.shards), one_each)


def _baseline_paths(workload: Workload, args: argparse.Namespace) -> List[str]:
    return dataset_paths(args.local, args.size, workload.dataset_kind, progress=not args.quiet,
                         **workload.dataset_overrides(args))


def _ranks_devices(requested: Optional[str], device: str) -> str:
    """The header's MPI line's words on where the ranks' batches go (``device``: rank 0's)."""
    if device == "cpu":
        return ""
    if str(requested).strip().lower() == "cuda:local":
        return ", each onto the GPU numbered as its local rank (rank 0: " + device + ")"
    return f", all onto {device} (--device cuda:local gives each rank the GPU of its local rank)"


def run_workload(workload: Workload, args: argparse.Namespace) -> int:
    """Entry point shared by ``python -m dlstore.bench resnet50`` and ``... bert``."""
    for name in ("batch_size", "steps", "jobs_steps", "prefetch", "epochs"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.jobs < 0:
        raise ValueError("--jobs must be at least 0")
    if args.mounts and not args.data:
        raise ValueError("--mounts needs --data (the shard paths relative to each mount point)")
    if args.mounts_per_rank is not None and not args.mounts:
        raise ValueError("--mounts-per-rank needs --mounts")
    if args.mounts_per_rank is not None and not 1 <= args.mounts_per_rank <= len(args.mounts):
        raise ValueError(f"--mounts-per-rank must be 1..{len(args.mounts)} (the number of --mounts), not "
                         f"{args.mounts_per_rank}")
    args.io = host_io(args.io)
    wanted = _tiers_wanted(args)
    # What is missing is said before any data is made; cuda:local is this rank's GPU among its host's.
    gpu = sysinfo.device_fields(check_device(args.device, detect_world().local_rank))
    if args.jobs and args.jobs_tier == "target" and not args.data:
        raise ValueError("--jobs-tier target needs --data")
    comm = mpi_comm()
    rank, world = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
    # Every mount given is read: one process reads through all of them, ranks share them out.
    mounts_per_rank = args.mounts_per_rank or (-(-len(args.mounts) // world) if args.mounts else 1)
    quiet = args.quiet or rank != 0
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if rank == 0 else (lambda s: None)
    notes: List[str] = []
    warnings: List[str] = []  # why a figure may not be trusted: a tier too short, other processes busy

    baseline = _baseline_paths(workload, args) if {"page-cache", "local-cold"} & set(wanted) else []
    target_data = target_paths(args.data, args.mounts) if "target" in wanted else None
    target = target_data.files if target_data else []
    # Every tier reads a dlstore.Dataset, which gives each rank (from the launcher) its share of the
    # records, in the --shuffle order.
    spec_common = dict(pipeline=workload.pipeline, pipeline_kwargs=workload.pipeline_kwargs(args),
                       verify=args.verify, prefetch=args.prefetch, threads=args.threads, epochs=args.epochs,
                       shuffle=args.shuffle, seed=args.seed,
                       device=None if gpu["device"] == "cpu" else gpu["device"])
    # The page-cache tier reads from RAM: buffered, or mmap when asked for or when a global shuffle
    # reads record by record (what io="auto" picks for data that fits in the page cache).
    page_io = "mmap" if args.io == "mmap" or (args.io == "auto" and SHUFFLES[args.shuffle].random_reads) else "buffered"
    page_why = None if page_io == args.io else (
        f"the page-cache tier reads from RAM: {page_io}"
        + (f" ({args.shuffle} reads record by record)" if page_io == "mmap" else ""))

    def specs_for(batch: int) -> Dict[str, LoaderSpec]:
        return {"page-cache": LoaderSpec(paths=tuple(baseline), io=page_io, io_why=page_why, batch_size=batch,
                                         **spec_common),
                "local-cold": LoaderSpec(paths=tuple(baseline), io=args.io, batch_size=batch, **spec_common),
                "target": LoaderSpec(paths=tuple(target), io=args.io, mounts=tuple(args.mounts or ()),
                                     shards=(args.data,) if args.mounts else (), mounts_per_rank=mounts_per_rank,
                                     batch_size=batch, **spec_common)}

    # The step plan comes from the baseline set (this rank's records), and every tier follows it, so
    # the tiers' steps hold the same samples.
    first = specs_for(args.batch_size)
    probe = first["target" if target else "local-cold"].dataset()  # what the header says is read, and how
    read_mounts = probe.rank_mounts if target and args.mounts else []
    # This rank's records: of the baseline set where there is one, else of the target's.
    planned_on = first["local-cold"].dataset() if baseline and target else probe
    records, all_records = len(planned_on), int(planned_on.counts.sum())
    if comm is not None:  # one plan for every rank: the smallest share decides
        records = min(comm.allgather(records))
    # --step-batches fixes the batches: the batch size fits them all in the data, as it fits --steps.
    batch_size, lowered = fit_batch_size(records, args.batch_size, args.steps, args.step_batches, args.epochs,
                                         holder="the smallest rank's share" if comm is not None else "the data")
    if lowered:
        notes.append(lowered)
    target_share = None
    if baseline and target:  # the plan is the baseline's: a target short of one batch would yield none
        share = target_share = len(probe)
        if comm is not None:
            share = min(comm.allgather(share))
        if share < batch_size:
            held = f"{share:,} records" + (" in the smallest rank's share" if comm is not None else "")
            fix = (f"--batch-size {share} or less, or --tiers target (its steps are then sized from its own "
                   "records)" if share else "fewer ranks")
            raise ValueError(f"--data: the target holds {held}, fewer than one batch of {batch_size}: its tier would "
                             f"read nothing. Use more data or {fix}")
    plan = plan_steps(args.epochs * (records // batch_size), args.steps, args.step_batches)
    if target_share is not None and sum(plan) * batch_size < args.epochs * target_share:
        planned, held = sum(plan) * batch_size, args.epochs * target_share
        whole = f"{args.epochs} epochs" if args.epochs > 1 else "a whole epoch"
        notes.append(f"target: the steps are planned on the baseline, so the target tier reads {planned:,} of its "
                     f"{held:,} records{' per rank' if comm is not None else ''} ({100 * planned / held:.0f}%), not "
                     f"{whole} of it; --tiers target alone, or --local with a copy of it, reads it whole")
    compute = resolve_compute(args.compute, workload.name, batch_size, workload.variant(args))
    step_text = (f"{plan[0]} batch{'es' if plan[0] != 1 else ''} of {batch_size} {workload.unit}"
                 if len(set(plan)) == 1 else
                 f"{min(plan)}-{max(plan)} batches of {batch_size} {workload.unit}")

    probe_paths = target or baseline
    info = sysinfo.collect(probe_paths, probe.engine, probe.engine_reason)
    data_lines = []
    if baseline:
        # With a baseline the plan is made on it: the set's records, and under MPI the share that decided.
        held = f"{all_records:,} records" + (f" ({records:,} in the smallest rank's share)" if comm is not None else "")
        data_lines.append(("baseline", f"{len(baseline)} files, {report.fmt_bytes(sum(map(os.path.getsize, baseline)))}"
                                        f", {held} in {os.path.dirname(baseline[0])}"))
    if target_data and args.mounts:
        copies = len(target_data.files)
        held = (f"{copies} copies in all, {report.fmt_bytes(sum(map(os.path.getsize, target)))}"
                if copies > target_data.shards else "one copy each")
        mine = "all of them" if len(read_mounts) == len(args.mounts) else ", ".join(read_mounts)
        who = (f"each rank through {mounts_per_rank} at once, round robin (rank 0: {', '.join(read_mounts)})"
               if comm is not None else f"this process through {mine} at once")
        data_lines.append(("target", f"{target_data.shards} shards, {report.fmt_bytes(target_data.shard_bytes)} "
                                      f"({held}) on {len(args.mounts)} mounts ({', '.join(args.mounts)}), read "
                                      f"through dlstore.Dataset, {who}"))
    elif target_data:
        data_lines.append(("target", f"{len(target)} files, {report.fmt_bytes(target_data.shard_bytes)} in "
                                      f"{os.path.dirname(target[0])}"))
    extra = [("workload", f"{workload.name} ({workload.describe(args)}), batch {batch_size}, prefetch "
                          f"{args.prefetch}, CRC {'checked' if args.verify else 'not checked'}")]
    extra += data_lines
    extra.append(("shuffle", f"{probe.describe_shuffle()}; seed {args.seed}"))
    del probe
    epochs = (f"{args.epochs} epochs" if args.epochs > 1 else "1 epoch") + (" of the baseline" if baseline else "")
    extra.append(("step", f"{step_text}; {len(plan)} steps per tier over {epochs}; the rate of a step is its "
                          f"{workload.unit} "
                          "over its wall time, step 1 including the pipeline's start"))
    if compute is not None:
        extra.append(("compute", f"{compute.label}, slept per batch while the loader prefetches ({compute.source})"))
    if gpu["device"] != "cpu":
        extra.append(sysinfo.device_row(gpu))
    if comm is not None:
        extra.append(("MPI", f"{world} ranks, each reading its share of the records (dlstore.Dataset)"
                             + _ranks_devices(args.device, gpu["device"])))
    if rank == 0:
        print(sysinfo.format_header(info, extra=extra) + "\n", flush=True)

    specs = specs_for(batch_size)
    compute_s = compute.seconds_per_batch if compute else 0.0
    metrics = getattr(args, "metrics", None)  # --metrics-port: live figures (dlstore.bench.metrics)
    warm_up(specs[wanted[0]])  # before any cache is prepared: the cold tiers undo what it read
    results = []
    for tier in wanted:
        if comm is not None:
            comm.Barrier()
        results.append(run_tier(tier, specs[tier], plan, cold=tier != "page-cache", compute_s=compute_s,
                                quiet=quiet, log=log, unit=workload.unit, metrics=metrics))
        if metrics is not None:
            entry = tier_entry(results[-1], workload.rate_key, compute, batch_size)
            metrics.end(tier, results[-1]["io"], entry.get("required_mb_per_s_per_accelerator"))
        if results[-1]["ended_early"]:
            notes.append(f"{tier}: the data ended after {results[-1]['batches']} of {sum(plan)} batches")
        if comm is not None:  # the ranks on this host are the run, not other processes
            measured = comm.allgather((socket.gethostname(), results[-1]["other_processes_cores"],
                                       results[-1]["process_cpu_pct"]))
            results[-1]["other_processes_cores"] = sysinfo.outside_the_run(measured)[rank]
        warnings += sysinfo.trust_warnings(f"tier {tier}" + (f" (rank {rank})" if comm is not None else ""),
                                           results[-1]["seconds"], results[-1]["other_processes_cores"])

    jobs = None
    if args.jobs:
        if comm is not None:
            notes.append("--jobs is not run under MPI: the ranks are the concurrent jobs")
        else:
            jobs_tier = args.jobs_tier or ("target" if target else "local-cold")
            spec = specs[jobs_tier]
            paths = list(spec.paths)
            make = cache_control.make_warm if jobs_tier == "page-cache" else cache_control.make_cold
            prepare = functools.partial(make, paths)
            jobs = run_jobs(spec, args.jobs, plan[:args.jobs_steps], prepare=prepare, compute=compute, quiet=quiet)
            jobs["tier"] = jobs_tier

    ranks = None
    if comm is not None:
        gathered = comm.gather(results, root=0)
        warnings = [w for mine in comm.gather(warnings, root=0) or [] for w in mine]
        if rank != 0:
            return 0
        ranks = gathered
        results = aggregate_ranks(gathered)

    config = {"tiers": wanted, "io": args.io, "verify": args.verify, "shuffle": args.shuffle, "seed": args.seed,
              "steps": len(plan), "plan": plan,
              "epochs": args.epochs,
              "step_batches_text": step_text, "prefetch": args.prefetch, "threads": args.threads,
              "size": None if args.local else args.size, "baseline": baseline, "target": target,
              "mounts": args.mounts, "mounts_per_rank": mounts_per_rank if args.mounts else None,
              "pipeline": workload.pipeline, "pipeline_kwargs": workload.pipeline_kwargs(args),
              **gpu}
    doc = build_document(workload, results, info=info, config=config, compute=compute, batch_size=batch_size,
                         jobs=jobs, ranks=ranks, notes=notes, warnings=warnings)
    doc["command"] = ["python", "-m", "dlstore.bench"] + sys.argv[1:]
    print(format_report(doc), flush=True)
    report.write_outputs(doc, args.json, args.markdown, lambda: markdown_report(doc))
    if args.plot:
        try:
            print(f"wrote {plot_document(doc, args.plot)}")
        except MatplotlibMissing as e:
            print(f"--plot: {e}", file=sys.stderr)
    return 0
