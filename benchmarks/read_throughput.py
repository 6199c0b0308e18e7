#!/usr/bin/env python
"""dlstore's I/O engines beside tf.data, DALI, the ``tfrecord`` package and fio: the same files,
cold and warm, in one run.

    python benchmarks/read_throughput.py                       # the 3 GB ImageNet-like set, 3 passes each
    python benchmarks/read_throughput.py --quick               # tiny set, one pass: a smoke test
    python benchmarks/read_throughput.py --data '/data/train-*' --only dlstore-direct,fio
    python benchmarks/read_throughput.py --save --markdown docs/read_throughput.md  # the committed results

Every reader runs in its own process (``--worker NAME``, which prints its measurements as one
JSON line), so one framework's threads and memory do not disturb another, and the ``tfrecord``
package never shares a process with TensorFlow. The readers run in rounds (one timed pass each
per round, the order rotating), so drift on a shared machine spreads over all of them alike.
Each worker is timed by the same code as ``python -m dlstore.bench storage``
(:func:`dlstore.bench.storage.measure_passes`): an untimed
warm-up pass, then per pass the page cache dropped (cold) or not (warm), wall time and process
CPU time (all threads), the busiest core, and how much of the data the cache held before.

Throughput is record payload bytes (the same number for every reader: what the files hold between
the TFRecord frames) per second; ratios between readers are ratios of records per second. A peer
that is not installed, or fails, keeps its row with the reason.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run from a checkout: measure this tree's dlstore
    sys.path.insert(0, ROOT)

from benchmarks import _harness  # noqa: E402
from dlstore.bench import report, sysinfo  # noqa: E402
from dlstore.io.system import available_cores  # noqa: E402

RESULT_PREFIX = "READ_THROUGHPUT_RESULT "
# Records per batch for the peers that batch (tf.data, DALI), so Python works per batch, not per record.
BATCH_SIZE = 256
PHASES = ("cold", "warm")

PassFactory = Callable[[], Callable[[], Tuple[int, int]]]


# ---- the contenders ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Contender:
    """A reader in the comparison: its name (``--only``, ``--worker``), what the table calls it, its
    family, whether it checks the TFRecord CRCs, and the module it needs."""

    name: str
    label: str
    family: str
    crc: Optional[bool]
    requires: Optional[str] = None
    install: str = ""


CONTENDERS: Dict[str, Contender] = {
    c.name: c
    for c in [
        Contender("dlstore-buffered", "dlstore io=buffered", "dlstore", True),
        Contender("dlstore-mmap", "dlstore io=mmap", "dlstore", True),
        Contender("dlstore-direct", "dlstore io=direct", "dlstore", True),
        Contender("tfdata", "tf.data TFRecordDataset", "tf.data", True, "tensorflow",
                  "pip install tensorflow-cpu"),
        Contender("dali", "DALI readers.tfrecord", "dali", False, "nvidia.dali",
                  "pip install nvidia-dali-cuda130"),
        Contender("dali-no-mmap", "DALI dont_use_mmap", "dali", False, "nvidia.dali",
                  "pip install nvidia-dali-cuda130"),
        Contender("dali-o-direct", "DALI use_o_direct", "dali", False, "nvidia.dali",
                  "pip install nvidia-dali-cuda130"),
        Contender("tfrecord", "tfrecord pkg (iterator)", "tfrecord", False, "tfrecord",
                  "pip install tfrecord"),
        Contender("fio", "fio direct=1 psync qd1", "fio", None),
    ]
}


def missing_reason(c: Contender) -> Optional[str]:
    """Why a contender cannot run here (None when it can), found without importing the framework."""
    if c.family == "fio":
        from dlstore.bench.fio import fio_missing_reason

        return fio_missing_reason()
    return _harness.module_missing(c.requires, c.install) if c.requires else None


def tfdata_passes(plan: dict) -> PassFactory:
    """tf.data: ``TFRecordDataset`` reading ``cores`` files at once, batched and prefetched, the
    record count and byte count computed in the graph, so Python sees one small tuple per batch."""
    import tensorflow as tf

    def count(batch):
        return tf.size(batch, out_type=tf.int64), tf.reduce_sum(tf.cast(tf.strings.length(batch), tf.int64))

    files = plan["files"]
    # One reader per core, interleaved across files (TFRecordDataset's parallel interleave);
    # a 1 MiB read buffer instead of 256 KiB, like fio's bs, so TF is not held back by small reads.
    ds = tf.data.TFRecordDataset(files, buffer_size=1 << 20, num_parallel_reads=min(len(files), available_cores()))
    ds = ds.batch(BATCH_SIZE).map(count, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    def prepare():
        def one_pass() -> Tuple[int, int]:
            records = nbytes = 0
            for n, b in ds.as_numpy_iterator():
                records += int(n)
                nbytes += int(b)
            return records, nbytes
        return one_pass
    return prepare


def dali_passes(plan: dict, variant: str) -> PassFactory:
    """DALI ``fn.readers.tfrecord`` on the CPU (``device_id=None``), with DALI's index files, in one
    of three variants: ``default`` (mmap), ``no-mmap`` (``dont_use_mmap``), ``o-direct``
    (``use_o_direct``, which needs ``dont_use_mmap``). The pipeline returns the shape of each
    image (to count bytes without touching them) and the label; a fresh pipeline per pass."""
    import gc

    import nvidia.dali.tfrecord as tfrec
    from nvidia.dali import fn, pipeline_def

    files, indexes = plan["files"], plan["indexes"]
    no_mmap = variant in ("no-mmap", "o-direct")
    o_direct = variant == "o-direct"

    @pipeline_def(batch_size=BATCH_SIZE, num_threads=available_cores(), device_id=None)
    def reader_pipeline():
        inputs = fn.readers.tfrecord(
            path=files, index_path=indexes, name="Reader", dont_use_mmap=no_mmap, use_o_direct=o_direct,
            features={"image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                      "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1)})
        return inputs["image/encoded"].shape(), inputs["image/class/label"]

    held = {"pipe": None}

    def prepare():
        held["pipe"] = None  # the previous pipeline's threads and buffers go before the next starts
        gc.collect()
        pipe = reader_pipeline()
        pipe.build()
        held["pipe"] = pipe
        epoch = pipe.epoch_size("Reader")

        def one_pass() -> Tuple[int, int]:
            records = nbytes = 0
            for _ in range(math.ceil(epoch / BATCH_SIZE)):
                shapes, _labels = pipe.run()
                # The last batch is filled from the next epoch: count only this epoch's records.
                take = min(BATCH_SIZE, epoch - records)
                nbytes += int(shapes.as_array()[:take].sum())
                records += take
            return records, nbytes
        return one_pass
    return prepare


def tfrecord_package_passes(plan: dict) -> PassFactory:
    """The ``tfrecord`` package's ``tfrecord_iterator``: raw records, file after file (it checks
    no CRC, and yields each record to Python)."""
    from tfrecord.reader import tfrecord_iterator

    def prepare():
        def one_pass() -> Tuple[int, int]:
            records = nbytes = 0
            for path in plan["files"]:
                for record in tfrecord_iterator(path):
                    records += 1
                    nbytes += len(record)
            return records, nbytes
        return one_pass
    return prepare


PEER_PASSES: Dict[str, Callable[[dict], PassFactory]] = {
    "tfdata": tfdata_passes,
    "dali": lambda plan: dali_passes(plan, "default"),
    "dali-no-mmap": lambda plan: dali_passes(plan, "no-mmap"),
    "dali-o-direct": lambda plan: dali_passes(plan, "o-direct"),
    "tfrecord": tfrecord_package_passes,
}


def worker(name: str, plan_path: str, phases: Sequence[str], repeat: int, fio_jobs: int) -> int:
    """``--worker NAME``: measures one contender in each phase and prints one JSON result line."""
    from dlstore.bench.fio import FioError, run_fio
    from dlstore.bench.storage import measure_passes, timed_passes

    with open(plan_path) as f:
        plan = json.load(f)
    files = plan["files"]

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    out: Dict = {"name": name, "phases": {}}
    contender = CONTENDERS[name]
    factory = PEER_PASSES[name](plan) if contender.family != "dlstore" else None
    fio_runs: List[dict] = []

    def fio_between_passes(i: int) -> None:  # fio interleaved with the passes it is compared with
        try:
            fio_runs.append(run_fio(files, jobs=fio_jobs).to_dict())
        except FioError as e:
            fio_runs.append({"error": str(e)})

    for phase in phases:
        after = fio_between_passes if fio_jobs and phase == "cold" else None
        if contender.family == "dlstore":
            engine = name.split("-", 1)[1]
            measured = timed_passes(files, io=engine, cache=phase, repeat=repeat, verify=True,
                                    after_pass=after, log=log)
        else:
            measured = measure_passes(factory, files, cache=phase, repeat=repeat, after_pass=after, log=log)
        if after is not None:
            measured["fio"] = fio_runs
        out["phases"][phase] = measured
    out["versions"] = _harness.framework_versions()
    print(RESULT_PREFIX + json.dumps(out), flush=True)
    return 0


# ---- the run -------------------------------------------------------------------------------------

def index_files(paths: Sequence[str]) -> Tuple[List[str], int, int]:
    """DALI's index files (``offset size`` per record), built once into the cache directory and
    reused while newer than their data; also the records and payload bytes they describe."""
    from dlstore import settings
    from dlstore.formats.index import parse_tfrecord_index
    from dlstore.sources.indexing import build_index, load_index

    out, records, payload = [], 0, 0
    root = os.path.join(settings.get("cache_dir"), "bench-indexes")
    for p in paths:
        digest = hashlib.sha1(os.path.abspath(p).encode()).hexdigest()[:16]
        idx = os.path.join(root, f"{os.path.basename(p)}.{digest}.idx")
        try:
            load_index(p, idx, "tfrecord")  # present, newer than the data, and matching its size
        except (OSError, ValueError):
            build_index(p, "tfrecord", out=idx)
        with open(idx) as f:
            _, sizes = parse_tfrecord_index(f.read(), idx)
        out.append(idx)
        records += len(sizes)
        payload += int(sizes.sum()) - 16 * len(sizes)  # frames minus length, two CRCs
    return out, records, payload


def run_worker(name: str, plan_path: str, phases: Sequence[str], repeat: int, fio_jobs: int,
               timeout: float) -> Dict:
    """Runs ``--worker name`` in a fresh interpreter; returns its result, or ``{"error": why}``."""
    return _harness.run_worker(__file__, ["--worker", name, "--plan", plan_path, "--phases", ",".join(phases),
                                          "--repeat", str(repeat), "--fio-jobs", str(fio_jobs)],
                               RESULT_PREFIX, timeout)


def summarize_phase(c: Contender, measured: Dict, records: int, payload: int) -> Dict:
    """A table row from one contender's passes in one phase; throughput counted on ``payload`` bytes."""
    passes = measured["passes"]
    row: Dict = {"name": c.name, "reader": c.label, "crc": c.crc,
                 "cache_method": measured.get("cache_method")}
    per_pass = [{"gb_per_s": payload / 1e9 / p["seconds"], "records_per_s": p["records"] / p["seconds"],
                 "cpu_seconds_per_gb": p["cpu_seconds"] / (payload / 1e9)} for p in passes]
    for key in ("gb_per_s", "records_per_s", "cpu_seconds_per_gb"):
        row[key] = _harness.median([p[key] for p in per_pass])
    spread = report.summarize([p["gb_per_s"] for p in per_pass])["spread_pct"]
    row["spread_pct"] = spread if len(passes) > 1 else None
    row["busiest_core_pct"] = _harness.median([p.get("busiest_core_pct") for p in passes])
    row["cached_before"] = _harness.median([p.get("cached_before") for p in passes])
    row["records"] = passes[0]["records"]
    row["bytes_seen"] = passes[0]["bytes"]
    row["passes"] = passes
    if c.family == "dlstore":
        row["engine"] = measured.get("engine")
        row["engine_reason"] = measured.get("engine_reason")
        row["notes"] = measured.get("notes", [])
    status = "ok"
    if row["records"] != records:
        status = f"read {row['records']} of {records} records"
    elif c.family in ("dlstore", "tf.data", "tfrecord") and row["bytes_seen"] != payload:
        status = f"read {row['bytes_seen']} of {payload} payload bytes"
    if c.family == "dlstore" and row.get("engine") != c.name.split("-", 1)[1]:
        status = f"ran {row.get('engine')}: {row.get('engine_reason')}"
    row["status"] = status
    return row


def fio_row(runs: Sequence[dict], phase: str) -> Dict:
    """The fio row of a phase: the median of its runs (the same runs in both phases: O_DIRECT
    bypasses the page cache)."""
    label = CONTENDERS["fio"].label
    good = [r for r in runs if "gb_per_s" in r]
    if not good:
        return {"name": "fio", "reader": label, "status": "failed: " + runs[0].get("error", "?")}
    first = good[0]
    status = f"ok: {first['jobs']} jobs, bs {first['config'].get('bs')}, {first['config'].get('ioengine')}"
    spread = report.summarize([r["gb_per_s"] for r in good])["spread_pct"]
    return {"name": "fio", "reader": label, "crc": None,
            "gb_per_s": _harness.median([r["gb_per_s"] for r in good]),
            "cpu_seconds_per_gb": _harness.median([r["cpu_seconds_per_gb"] for r in good]),
            "spread_pct": spread if len(good) > 1 else None,
            "status": status + ("" if phase == "cold" else "; O_DIRECT: no cache"), "runs": list(runs)}


def add_ratios(rows: List[Dict]) -> None:
    """``vs_fio`` (GB/s), ``vs_tfdata`` and ``vs_dali`` (records/s) within one phase's rows."""
    by = {r["name"]: r for r in rows}

    def base(name: str, key: str) -> Optional[float]:
        r = by.get(name)
        return r.get(key) if r and str(r.get("status", "")).startswith("ok") else None

    fio, tfd, dali = base("fio", "gb_per_s"), base("tfdata", "records_per_s"), base("dali", "records_per_s")
    for r in rows:
        if r["name"] == "fio" or r.get("gb_per_s") is None:
            continue
        r["vs_fio"] = r["gb_per_s"] / fio if fio else None
        r["vs_tfdata"] = r["records_per_s"] / tfd if tfd and r.get("records_per_s") else None
        r["vs_dali"] = r["records_per_s"] / dali if dali and r.get("records_per_s") else None


# Issue 2's targets, measured with CRC verification on.
COLD_DIRECT_VS_FIO = 0.95      # cold io=direct, GB/s, at least this times fio direct=1
COLD_DIRECT_CPU_S_PER_GB = 0.2  # cold io=direct, CPU seconds per GB, at most
WARM_VS_DALI = 2.0             # warm best engine, records/s, at least this times DALI default
WARM_VS_TFDATA = 3.0           # warm best engine, records/s, at least this times tf.data


def targets(phases: Dict[str, List[Dict]]) -> List[Dict]:
    """The targets of issue 2 (CRC on): each with the measured value and PASS, FAIL or SKIP."""
    def row(phase: str, name: str) -> Optional[Dict]:
        for r in phases.get(phase, []):
            if r["name"] == name and str(r.get("status", "")).startswith("ok") and r.get("gb_per_s"):
                return r
        return None

    def verdict(target: str, value: Optional[float], ok: Callable[[float], bool], text: str) -> Dict:
        return {"target": target, "value": value, "text": text if value is not None else "-",
                "verdict": "SKIP" if value is None else ("PASS" if ok(value) else "FAIL")}

    direct, fio = row("cold", "dlstore-direct"), row("cold", "fio")
    ratio = direct["gb_per_s"] / fio["gb_per_s"] if direct and fio else None
    cpu = direct["cpu_seconds_per_gb"] if direct else None
    out = [verdict(f"cold io=direct >= {COLD_DIRECT_VS_FIO:g} x fio direct=1 (GB/s)", ratio,
                   lambda v: v >= COLD_DIRECT_VS_FIO, f"{ratio or 0:.2f}x"),
           verdict(f"cold io=direct CPU <= {COLD_DIRECT_CPU_S_PER_GB:g} s/GB", cpu,
                   lambda v: v <= COLD_DIRECT_CPU_S_PER_GB, f"{cpu or 0:.3f} s/GB")]
    warm = [r for r in (row("warm", n) for n in ("dlstore-buffered", "dlstore-mmap", "dlstore-direct")) if r]
    best = max(warm, key=lambda r: r["records_per_s"]) if warm else None
    for peer, factor, label in (("dali", WARM_VS_DALI, "DALI readers.tfrecord default"),
                                ("tfdata", WARM_VS_TFDATA, "tf.data")):
        p = row("warm", peer)
        ratio = best["records_per_s"] / p["records_per_s"] if best and p else None
        who = f" ({best['reader']})" if best else ""
        out.append(verdict(f"warm best engine >= {factor:g} x {label} (records/s)", ratio,
                           lambda v, f=factor: v >= f, f"{ratio or 0:.2f}x{who}"))
    return out


COLUMNS = [
    report.Column("reader", "reader", align="<"),
    report.Column("crc", "CRC", lambda v: "yes" if v else "no", align="<"),
    report.Column("gb_per_s", "GB/s", "{:.2f}"),
    report.Column("records_per_s", "records/s", "{:,.0f}"),
    report.Column("cpu_seconds_per_gb", "CPU s/GB", "{:.3f}"),
    report.Column("vs_fio", "vs fio", report.fmt_ratio),
    report.Column("vs_tfdata", "vs tf.data", report.fmt_ratio),
    report.Column("vs_dali", "vs DALI", report.fmt_ratio),
    report.Column("spread_pct", "spread", lambda v: f"{v:.0f}%"),
    report.Column("busiest_core_pct", "busiest core", lambda v: f"{v:.0f}%"),
    report.Column("cached_before", "cached", lambda v: f"{100 * v:.0f}%"),
    report.Column("status", "status", align="<"),
]
TARGET_COLUMNS = [
    report.Column("target", "target (issue 2, CRC on)", align="<"),
    report.Column("text", "measured", align="<"),
    report.Column("verdict", "verdict", align="<"),
]


def _markdown_doc(doc: Dict) -> str:
    """The results as a markdown page (docs/read_throughput.md)."""
    info, data = doc["sysinfo"], doc["data"]
    passes = f"{doc['repeat']} timed {'pass' if doc['repeat'] == 1 else 'passes'}"
    mean = report.fmt_bytes(data["payload_bytes"] / max(data["records"], 1))
    versions = [f"dlstore {info['dlstore']}", f"Python {info['python']}"]
    versions += [f"{k} {v}" for k, v in sorted(doc["versions"].items())]
    lines = [
        "# Read throughput: dlstore beside tf.data, DALI, the tfrecord package and fio",
        "",
        f"Written by `{' '.join(doc['command'])}` on {doc['date']}.",
        "",
        (f"- **Machine**: {info['cpu']}, {info['cores']} cores, {info['memory_bytes'] / 1e9:.0f} GB RAM, "
         f"{info['kernel']}; {info['crc']}; GPU: {info['gpu']}"),
        (f"- **Data**: {data['files']} TFRecord files, {report.fmt_bytes(data['file_bytes'])}, "
         f"{data['records']:,} records (mean {mean}) on {info.get('filesystem', '?')} "
         f"({info.get('device', '?')})"),
        (f"- **Method**: {passes} per reader and cache state, in rounds: each round runs every reader once "
         "(in its own process, an untimed warm-up pass first, the order rotating between rounds), so drift on "
         "the shared machine hits all readers alike; "
         f"cold: before every pass, {doc.get('cache_method') or 'the page cache dropped'}; "
         "GB/s counts record payload bytes; CPU s/GB is the reader process's user + system time over all "
         "its threads; medians; spread = (max - min) / median."),
        f"- **io=auto** on this data: {doc['auto']}",
        "- **Versions**: " + ", ".join(versions),
        "",
        ("fio runs between the cold passes of `dlstore io=direct`, so the two figures the first target "
         "compares are taken side by side. `busiest core` is system-wide: near 100% on every row means "
         "the two cores were the limit (or something else was running)."),
        "",
    ]
    for phase in PHASES:
        if doc["phases"].get(phase):
            lines += [f"## {phase.capitalize()}", "", report.markdown_table(doc["phases"][phase], COLUMNS)]
    lines += ["## Targets", "", report.markdown_table(doc["targets"], TARGET_COLUMNS)]
    lines += [("CRC: dlstore and tf.data check each record's CRC-32C; DALI and the tfrecord package do not. "
               "fio reads with O_DIRECT, so its figure is the same in both states; with psync at queue depth 1 "
               "it is a reference, not the device's ceiling (benchmarks/direct_sweep.py tries deeper queues)."), ""]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    from dlstore.bench.storage import SIZES

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", metavar="GLOB",
                   help="TFRecord files (default: the generated ImageNet-like set of --size)")
    p.add_argument("--size", choices=SIZES, default=None,
                   help="generated set when --data is not given (default: 3gb; tiny with --quick)")
    p.add_argument("--repeat", type=int, default=None, metavar="N",
                   help="timed passes per reader and state (default: 3; 1 with --quick)")
    p.add_argument("--only", metavar="NAMES",
                   help="comma-separated readers or families to run; readers: " + ", ".join(CONTENDERS))
    p.add_argument("--phases", default="cold,warm", help="cache states to measure (default: cold,warm)")
    p.add_argument("--quick", action="store_true", help="tiny set, one pass: a smoke test")
    _harness.add_output_arguments(p, "read_throughput")
    p.add_argument("--markdown", metavar="FILE", help="also write the tables as a markdown page")
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed to each reader's process")
    p.add_argument("--worker", metavar="NAME", help=argparse.SUPPRESS)
    p.add_argument("--plan", help=argparse.SUPPRESS)
    p.add_argument("--fio-jobs", type=int, default=0, help=argparse.SUPPRESS)
    return p


def select(only: Optional[str]) -> List[str]:
    """Contender names from ``--only`` (names or families), in table order; ValueError naming what is unknown."""
    return _harness.select(only, CONTENDERS, ("family",))


def run_all(selected: Sequence[str], paths: List[str], indexes: List[str], phases: Sequence[str],
            repeat: int, timeout: float) -> Dict[str, Dict]:
    """Runs each selected contender in its own process; returns its result, ``{"skipped": why}``
    or ``{"error": why}`` by name. fio's runs are under ``results["fio"]["fio_runs"]``."""
    from dlstore import settings
    from dlstore.bench.fio import FioError, run_fio

    fio_jobs = settings.get("io_threads")  # dlstore's reading threads for one reader
    # fio runs inside the dlstore-direct worker, between its cold passes, so the two numbers the
    # main target compares are taken side by side in time; alone when that worker is not run.
    fio_inside = "fio" in selected and "dlstore-direct" in selected and "cold" in phases
    results: Dict[str, Dict] = {}
    runnable = []
    for name in selected:
        c = CONTENDERS[name]
        reason = missing_reason(c)
        if reason:
            results[name] = {"skipped": reason}
            print(f"{c.label:<26} skipped: {reason}", flush=True)
        elif name != "fio":
            runnable.append(name)
    # Rounds, not one contender after another: each round runs every contender once (one timed pass
    # per cache state, after its warm-up), the order rotating from round to round. Drift on this
    # shared machine (a neighbour's memory or disk traffic) then spreads over all contenders alike
    # instead of landing on whichever ran during it, and each figure is the median of its rounds.
    with tempfile.TemporaryDirectory(prefix="dlstore-read-throughput-") as tmp:
        plan_path = os.path.join(tmp, "plan.json")
        with open(plan_path, "w") as f:
            json.dump({"files": paths, "indexes": indexes}, f)
        for r in range(repeat):
            order = runnable[r % len(runnable):] + runnable[:r % len(runnable)] if runnable else []
            print(f"round {r + 1} of {repeat}: {', '.join(order)}", flush=True)
            for name in order:
                if "error" in results.get(name, {}):  # failed in its first round: not retried
                    continue
                with_fio = fio_jobs if (fio_inside and name == "dlstore-direct") else 0
                got = run_worker(name, plan_path, phases, 1, with_fio, timeout)
                if "error" in got:
                    print(f"{CONTENDERS[name].label:<26} failed in round {r + 1}: {got['error']}", flush=True)
                    if "phases" in results.get(name, {}):  # keep the rounds that worked, and say so
                        results[name].setdefault("round_errors", []).append(got["error"])
                    else:
                        results[name] = got
                    continue
                _merge_round(results, name, got)
    if "fio" in selected and "fio" not in results:
        runs = results.get("dlstore-direct", {}).get("phases", {}).get("cold", {}).get("fio") or []
        if not fio_inside or not runs:
            runs = []
            for _ in range(repeat):
                try:
                    runs.append(run_fio(paths, jobs=fio_jobs).to_dict())
                except FioError as e:
                    runs.append({"error": str(e)})
        results["fio"] = {"fio_runs": runs}
    return results


def _merge_round(results: Dict[str, Dict], name: str, got: Dict) -> None:
    """Adds one round's passes (and fio runs) of a contender to what earlier rounds gave."""
    if name not in results:
        results[name] = got
        return
    for phase, measured in got["phases"].items():
        into = results[name]["phases"].setdefault(phase, measured)
        if into is measured:
            continue
        into["passes"].extend(measured["passes"])
        if "fio" in measured:
            into.setdefault("fio", []).extend(measured["fio"])


def phase_rows(selected: Sequence[str], results: Dict[str, Dict], phase: str, records: int,
               payload: int) -> List[Dict]:
    """One phase's table: a row per selected contender (measured, skipped or failed), with ratios."""
    rows = []
    for name in selected:
        c, res = CONTENDERS[name], results.get(name, {})
        base = {"name": name, "reader": c.label, "crc": c.crc}
        if "skipped" in res:
            rows.append(dict(base, status=f"skipped: {res['skipped']}"))
        elif "error" in res:
            rows.append(dict(base, status=f"failed: {res['error']}"))
        elif name == "fio":
            rows.append(fio_row(res["fio_runs"], phase))
        else:
            rows.append(summarize_phase(c, res["phases"][phase], records, payload))
    add_ratios(rows)
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    from dlstore.bench.storage import dataset_paths
    from dlstore.errors import DlstoreError
    from dlstore.sources.reader import open_records

    p = build_parser()
    args = p.parse_args(argv)
    phases = [s.strip() for s in args.phases.split(",") if s.strip()]
    if any(s not in PHASES for s in phases):
        p.error(f"--phases takes cold and/or warm, not {args.phases!r}")
    repeat = args.repeat or (1 if args.quick else 3)
    if repeat < 1:
        p.error("--repeat must be at least 1")
    if args.worker:
        if args.worker not in CONTENDERS or args.worker == "fio" or not args.plan:
            p.error(f"--worker takes a reader name and --plan, not {args.worker!r}")
        return worker(args.worker, args.plan, phases, repeat, args.fio_jobs)
    try:
        selected = select(args.only)
        json_path = _harness.results_path("read_throughput", json_path=args.json, save=args.save, quick=args.quick)
    except ValueError as e:
        p.error(str(e))

    size = args.size or ("tiny" if args.quick else "3gb")
    try:
        paths = dataset_paths(args.data, size)
        probe = open_records(paths, io="auto")
        if probe.format != "tfrecord" or any(c != "none" for c in probe.compression):
            raise DlstoreError("read_throughput compares TFRecord readers on uncompressed TFRecord files; "
                               f"these are {probe.format} ({', '.join(sorted(set(probe.compression)))})")
        indexes, records, payload = index_files(paths)
    except (DlstoreError, ValueError) as e:
        print(f"read_throughput: {e}", file=sys.stderr)
        return 2
    file_bytes = sum(os.path.getsize(f) for f in paths)
    info = sysinfo.collect(paths)
    auto = f"{probe.engine} ({probe.engine_reason})"
    dataset_line = (f"{len(paths)} files, {report.fmt_bytes(file_bytes)}, {records:,} records (mean "
                    f"{report.fmt_bytes(payload / max(records, 1))}); {repeat} timed "
                    f"{'pass' if repeat == 1 else 'passes'} per reader and state")
    header = sysinfo.format_header(info, extra=[("io=auto", auto), ("dataset", dataset_line)])
    print(header + "\n", flush=True)

    results = run_all(selected, paths, indexes, phases, repeat, args.timeout)
    table = {phase: phase_rows(selected, results, phase, records, payload) for phase in phases}
    for phase, rows in table.items():
        print(f"\n{phase.upper()}")
        print(report.text_table(rows, COLUMNS))
    verdicts = targets(table)
    print()
    print(report.text_table(verdicts, TARGET_COLUMNS))
    print("\nCRC: dlstore and tf.data check every record's CRC-32C; DALI and the tfrecord package do not.")
    if args.quick:
        print(f"--quick: a smoke test on {report.fmt_bytes(file_bytes)}; at this size start-up costs "
              "dominate and the ratios say nothing about the targets.")

    cold_method = next((r.get("cache_method") for r in table.get("cold", []) if r.get("cache_method")), None)
    doc = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": ["python", "benchmarks/read_throughput.py"] + list(sys.argv[1:] if argv is None else argv),
        "sysinfo": info, "auto": auto, "repeat": repeat, "cache_method": cold_method,
        "data": {"paths": paths, "files": len(paths), "file_bytes": file_bytes, "records": records,
                 "payload_bytes": payload, "size": None if args.data else size},
        "phases": table, "targets": verdicts,
        "versions": {k: v for r in results.values() for k, v in r.get("versions", {}).items()},
    }
    _harness.write_outputs(doc, json_path, args.markdown, _markdown_doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
