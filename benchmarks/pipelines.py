#!/usr/bin/env python
"""dlstore's ResNet-50 and BERT input pipelines beside DALI (CPU), tf.data and a PyTorch DataLoader
with PIL: the same pipeline on the same data and the same cores, in one run, every contender reading
shuffled, as training reads.

    python benchmarks/pipelines.py                          # the cached 3 GB ImageNet-like set (else 1 GB)
    python benchmarks/pipelines.py --quick                  # tiny sets, small batches: a smoke test
    python benchmarks/pipelines.py --size small --repeat 1 --only resnet50
    python benchmarks/pipelines.py --data '/data/train-*' --bert-data '/data/bert/part-*'
    python benchmarks/pipelines.py --save --markdown docs/pipelines.md  # the committed results and page

ResNet-50 train pipeline, in each contender: read the TFRecord ImageNet-like records, decode a
random crop (RandomResizedCrop: area 0.08..1 of the image, aspect ratio 3/4..4/3, 10 attempts,
then the whole image clamped to the ratio range), resize it to 224 x 224, flip it horizontally
with probability 1/2 and batch it: uint8 NHWC (``--output uint8``, the default: what dlstore's
loader gives by default, and what a GPU job normalises on the GPU), or normalised with ImageNet's
mean and std (``--output float``: float32, NCHW except tf.data's NHWC).
BERT: the seven pretraining features of ``tf.train.Example`` records parsed into fixed-shape
batches (batch 64, sequence 128). docs/pipelines.md lists where the contenders' semantics differ.

Shuffles: dlstore reads through ``dlstore.Dataset`` three times, with ``shuffle="none"`` (the
unshuffled reference), ``"block"`` (its default) and ``"global"``; every peer shuffles with a buffer
of ``--shuffle-buffer`` records (10,000): DALI ``readers.tfrecord(random_shuffle=True,
initial_fill=N)``, tf.data ``.shuffle(N)`` on the records, the PyTorch DataLoader a per-epoch file
order and a shuffle buffer of N / workers records in each worker. Each row says its shuffle.

Every contender runs in its own process (``--worker NAME``, which prints its measurement as one
JSON line), pinned to the same ``--cores`` CPUs (``sched_setaffinity``, which its threads and
worker processes inherit); DALI, tf.data and the DataLoader get that many threads or workers,
dlstore its default for those cores. So one framework's threads and memory do not disturb
another, and the ``tfrecord`` package never shares a process with TensorFlow. Contenders run in
rounds (one measurement each per round, the order rotating), so drift on a shared machine
spreads over all of them alike; figures are medians over rounds.

A measurement: build the pipeline, draw batches untimed for ``--warmup`` batches and
``--warmup-seconds`` (so that prefetch queues filled during start-up are drained and tf.data's
AUTOTUNE settles), then time the batches holding the next ``--images`` images (``--samples`` for
BERT): wall time, the CPU time of the contender's whole process tree (all threads, DataLoader
workers included), the busiest core (system-wide) and the tree's resident memory at the end. The
files are read once before every measurement, so the page cache holds them (warm-cache figures,
even where a neighbour on a shared machine drops the cache); the fraction cached is recorded.
A contender that is not installed, not built yet, or fails keeps its row with the reason.

This script plans and runs; the contenders, one module a framework, and what a worker measures are
in ``benchmarks/contenders/``; the tables, targets and the markdown page in
``benchmarks/pipelines_report.py``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run from a checkout: measure this tree's dlstore
    sys.path.insert(0, ROOT)

from benchmarks import _harness  # noqa: E402
from benchmarks.contenders.measure import RESULT_PREFIX, worker  # noqa: E402
from benchmarks.contenders.spec import (  # noqa: E402
    BERT_MAX_PREDICTIONS,
    BERT_SEQ_LEN,
    CONTENDERS,
    OUTPUTS,
    TASKS,
    missing_reason,
    select,
)
from benchmarks.pipelines_report import TARGET_COLUMNS, columns, markdown_doc, plan_line, targets, task_rows  # noqa: E402
from benchmarks.read_throughput import index_files  # noqa: E402
from dlstore.bench import report, sysinfo  # noqa: E402
from dlstore.io.pagecache import make_warm, resident_fraction  # noqa: E402
from dlstore.bench.storage import SIZES, dataset_paths  # noqa: E402
from dlstore.errors import DlstoreError  # noqa: E402
from dlstore.sources.reader import open_records  # noqa: E402
from dlstore.synthetic import PRESETS, cached_paths  # noqa: E402


def run_worker(name: str, plan_path: str, timeout: float) -> Dict:
    """Runs ``--worker name`` in a fresh interpreter; returns its result, or ``{"error": why}``."""
    return _harness.run_worker(__file__, ["--worker", name, "--plan", plan_path], RESULT_PREFIX, timeout)


# ---- the run -------------------------------------------------------------------------------------

def default_sizes(args) -> Dict[str, str]:
    """The generated sets' presets: ``--quick`` tiny; else the cached 3 GB ImageNet-like set, or the
    1 GB one when it is not cached; BERT's 65,536 records."""
    if args.quick:
        return {"imagenet": args.size or "tiny", "bert": args.bert_size or "tiny"}
    image = args.size or ("3gb" if cached_paths("imagenet", "3gb") else "default")
    return {"imagenet": image, "bert": args.bert_size or "default"}


def task_plan(task: str, paths: List[str], args) -> Dict:
    """What the workers of one task need: files, DALI indexes (cached, as the read benchmark's), batch
    size and counts."""
    probe = open_records(paths, io="auto")
    if probe.format != "tfrecord" or any(c != "none" for c in probe.compression):
        raise ValueError(f"{task}: the pipelines read uncompressed TFRecord files; these are {probe.format} "
                         f"({', '.join(sorted(set(probe.compression)))})")
    indexes, records, payload = index_files(paths)
    if task == "resnet50":
        batch = args.batch_size or (16 if args.quick else 256)
        items = args.images or (64 if args.quick else 7680)
        warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    else:
        batch = args.bert_batch_size or 64
        items = args.samples or (640 if args.quick else 320_000)
        warmup = args.warmup if args.warmup is not None else (1 if args.quick else 20)
    if records < batch:
        raise ValueError(f"{task}: {records} records, fewer than one batch of {batch}")
    return {"task": task, "files": paths, "indexes": indexes, "records": records, "payload_bytes": payload,
            "file_bytes": sum(os.path.getsize(p) for p in paths), "batch_size": batch, "items": items,
            "warmup": warmup, "warmup_seconds": args.warmup_seconds if args.warmup_seconds is not None else (
                0.0 if args.quick else 3.0), "output": args.output, "seq_len": BERT_SEQ_LEN,
            "shuffle_buffer": args.shuffle_buffer,
            "max_predictions": BERT_MAX_PREDICTIONS}


def run_all(selected: Sequence[str], plan: Dict, repeat: int, timeout: float) -> Dict[str, Dict]:
    """Runs the selected contenders, each in its own process, in ``repeat`` rotating rounds; returns
    per name ``{"runs": [...]}``, ``{"skipped": why}`` or ``{"error": why}``."""
    results: Dict[str, Dict] = {}
    runnable = []
    for name in selected:
        reason = missing_reason(CONTENDERS[name])
        if reason:
            results[name] = {"skipped": reason}
            print(f"{CONTENDERS[name].label:<26} {reason}", flush=True)
        else:
            runnable.append(name)
    with tempfile.TemporaryDirectory(prefix="dlstore-pipelines-") as tmp:
        plan_path = os.path.join(tmp, "plan.json")
        with open(plan_path, "w") as f:
            json.dump(plan, f)
        for r in range(repeat):
            order = runnable[r % len(runnable):] + runnable[:r % len(runnable)] if runnable else []
            print(f"round {r + 1} of {repeat}: {', '.join(order)}", flush=True)
            for name in order:
                if "error" in results.get(name, {}) or "skipped" in results.get(name, {}):
                    continue  # failed or unavailable in its first round: not retried
                c = CONTENDERS[name]
                # Pipelines on data in RAM, not the disk (a neighbour may have dropped the cache).
                make_warm(plan[c.task]["files"])
                cached = resident_fraction(plan[c.task]["files"])
                got = run_worker(name, plan_path, timeout)
                if "unavailable" in got:
                    results[name] = {"skipped": got["unavailable"], "versions": got.get("versions", {})}
                    print(f"{c.label:<26} {got['unavailable']}", flush=True)
                    continue
                if "error" in got:
                    print(f"{c.label:<26} failed in round {r + 1}: {got['error']}", flush=True)
                    if "runs" in results.get(name, {}):
                        results[name].setdefault("round_errors", []).append(got["error"])
                    else:
                        results[name] = got
                    continue
                got["cached_before"] = cached
                unit = TASKS[c.task]["unit"]
                print(f"{c.label:<26} {got['items_per_s']:10,.0f} {unit}/s  {got['cpu_ms_per_item']:.3f} CPU ms "
                      f"each  (startup {got['startup_seconds']:.1f} s)", flush=True)
                entry = results.setdefault(name, {"runs": [], "versions": got.get("versions", {})})
                entry["runs"].append(got)
    return results


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", metavar="GLOB", help="ImageNet-like TFRecord files (default: a generated set)")
    p.add_argument("--size", choices=SIZES, default=None,
                   help="generated ImageNet-like set without --data (default: 3gb when cached, else default; "
                        "tiny with --quick)")
    p.add_argument("--bert-data", metavar="GLOB", help="BERT pretraining TFRecord files (default: a generated set)")
    p.add_argument("--bert-size", choices=tuple(PRESETS["bert"]), default=None,
                   help="generated BERT set without --bert-data (default: default, 65,536 records; tiny with --quick)")
    p.add_argument("--only", metavar="NAMES",
                   help="comma-separated contenders, families or tasks: " + ", ".join(CONTENDERS))
    p.add_argument("--output", choices=OUTPUTS, default="uint8",
                   help="ResNet-50 batches: uint8 (NHWC, not normalised) or float (float32, normalised; NCHW, "
                        "tf.data NHWC) (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=None, help="ResNet-50 batch (default: 256; 16 with --quick)")
    p.add_argument("--bert-batch-size", type=int, default=None, help="BERT batch (default: 64)")
    p.add_argument("--images", type=int, default=None,
                   help="ResNet-50 images timed after the warm-up (default: 7680; 64 with --quick)")
    p.add_argument("--samples", type=int, default=None,
                   help="BERT samples timed after the warm-up (default: 320000; 640 with --quick)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed batches first, the first included (default: 2 ResNet-50, 20 BERT; 1 with --quick)")
    p.add_argument("--warmup-seconds", type=float, default=None,
                   help="and at least this long after the first batch (default: 3; 0 with --quick)")
    p.add_argument("--cores", type=int, default=2, help="CPUs every contender is pinned to (default: %(default)s)")
    p.add_argument("--repeat", type=int, default=None, metavar="N",
                   help="rounds, one measurement per contender each (default: 3; 1 with --quick)")
    p.add_argument("--seed", type=int, default=0, help="shuffle and augmentation seed (default: %(default)s)")
    p.add_argument("--shuffle-buffer", type=int, default=10_000, metavar="N",
                   help="records in the peers' shuffle buffers: DALI's initial_fill, tf.data's shuffle, the "
                        "DataLoader's (split among its workers) (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="tiny sets, small counts, one round: a smoke test")
    _harness.add_output_arguments(p, "pipelines")
    p.add_argument("--markdown", metavar="FILE", help="also write the tables as a markdown page")
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed to each contender's process")
    p.add_argument("--render", metavar="JSON",
                   help="measure nothing: write --markdown from the results JSON of an earlier run")
    p.add_argument("--worker", metavar="NAME", help=argparse.SUPPRESS)
    p.add_argument("--plan", help=argparse.SUPPRESS)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.worker:
        if args.worker not in CONTENDERS or not args.plan:
            p.error(f"--worker takes a contender name and --plan, not {args.worker!r}")
        return worker(args.worker, args.plan)
    if args.render:
        return _harness.render(args.render, args.markdown, markdown_doc)
    try:
        selected = select(args.only)
        json_path = _harness.results_path("pipelines", json_path=args.json, save=args.save, quick=args.quick)
    except ValueError as e:
        p.error(str(e))
    repeat = args.repeat or (1 if args.quick else 3)
    for flag in ("repeat", "cores", "batch_size", "bert_batch_size", "images", "samples"):
        value = repeat if flag == "repeat" else getattr(args, flag)
        if value is not None and value < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    allowed = sorted(os.sched_getaffinity(0))
    cores = allowed[:args.cores]

    sizes = default_sizes(args)
    tasks = [t for t in TASKS if any(CONTENDERS[n].task == t for n in selected)]
    plans: Dict[str, Dict] = {}
    try:
        for task in tasks:
            kind, data = ("imagenet", args.data) if task == "resnet50" else ("bert", args.bert_data)
            plans[task] = task_plan(task, dataset_paths(data, sizes[kind], kind), args)
            plans[task]["size"] = None if data else sizes[kind]
    except (DlstoreError, ValueError) as e:
        print(f"pipelines: {e}", file=sys.stderr)
        return 2

    info = sysinfo.collect(plans[tasks[0]]["files"] if tasks else [])
    extra = [("cores", f"CPUs {cores} for every contender" + (
        f" (only {len(cores)} of the {args.cores} asked for are available)" if len(cores) < args.cores else ""))]
    extra += [(task, plan_line(task, plan)) for task, plan in plans.items()]
    extra.append(("rounds", str(repeat)))
    load_before = os.getloadavg()[0]
    extra.append(("load", f"1-minute load average {load_before:.2f} (other work competes for the cores)"))
    print(sysinfo.format_header(info, extra=extra) + "\n", flush=True)

    results = run_all(selected, dict(plans, cores=cores, seed=args.seed), repeat, args.timeout)
    tables = {task: task_rows(task, selected, results, plans[task]) for task in tasks}
    for task, rows in tables.items():
        print(f"\n{TASKS[task]['title'].upper()}")
        print(report.text_table(rows, columns(task)))
    for row in (r for rows in tables.values() for r in rows if r.get("how")):
        print(f"{row['contender']}: {row['how']}")
    verdicts = targets(tables)
    if verdicts:
        print()
        print(report.text_table(verdicts, TARGET_COLUMNS))
    print("\nCRC: dlstore and tf.data check every record's CRC-32C; DALI and the tfrecord package do not. "
          "docs/pipelines.md lists the other differences.")
    if args.quick:
        print("--quick: a smoke test on tiny sets; start-up costs dominate and the ratios say nothing about "
              "the targets.")

    doc = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": ["python", "benchmarks/pipelines.py"] + list(sys.argv[1:] if argv is None else argv),
        "sysinfo": info, "cores": cores, "repeat": repeat, "load_average": load_before, "quick": args.quick,
        "seed": args.seed,
        "plans": {t: {k: v for k, v in plan.items() if k != "indexes"} for t, plan in plans.items()},
        "tables": tables, "targets": verdicts,
        "versions": {k: v for r in results.values() for k, v in r.get("versions", {}).items()},
    }
    _harness.write_outputs(doc, json_path, args.markdown, markdown_doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
