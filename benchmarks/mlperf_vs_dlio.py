"""MLPerf Storage's figure, side by side: DLIO (MLPerf Storage's engine) and ``bench mlperf`` on the same
files, the same workload parameters, from a cold cache, at 1..N emulated accelerators.

    python benchmarks/mlperf_vs_dlio.py --install-dlio /work/wt/mlperf-dlio-venv     # once
    python benchmarks/mlperf_vs_dlio.py --dlio-venv /work/wt/mlperf-dlio-venv --data DIR \\
        [--generate-dlio --files 32 --records-per-file 1024] [--accelerators 1,2,3,4] [--repeat 3] [--save]

- **The files** are DLIO's: ``--generate-dlio`` has DLIO write them (its TFRecord generator, which
  calls DALI's ``tfrecord2idx``); without it ``--data`` must already hold DLIO's layout.
- **Each run**: the page cache dropped (``sync; echo 3 > /proc/sys/vm/drop_caches``, root), then
  ``mpirun -n N dlio_benchmark workload=<workload>_<accelerator>`` with the dataset's size and one
  epoch; the page cache dropped again, then ``python -m dlstore.bench mlperf --accelerators N --tiers
  cold --launch mpirun`` (which drops it once more after its ranks are built). The two alternate
  within each repeat; the medians over ``--repeat`` runs are reported.
- **The same rule**: both AU figures are MLPerf's (computation time of steps 2..n over the epoch's time
  less the first step, mean over ranks); DLIO's from its own summary, and recomputed from its
  per-rank step logs to show the rule is the same; samples/s summed over ranks as DLIO sums them.
- **Records**: each rank's samples per epoch, DLIO's from its step logs, dlstore's from its own; the
  script checks that their numbers are equal (``floor(records / batch / N)`` steps of ``batch``). Both
  deal the files to ranks alike (rank r reads every N-th file from its own); which records fall at a
  rank's cut, or are read twice, differs (:func:`dlstore.bench.mlperf.describe_records`).
- **Accounting differences**, which favour neither side's figure by construction but are named:
  DLIO holds an MPI barrier after every step, so every rank waits for the slowest at each step (its
  window counts the wait); and its reader's shutdown at the end of an epoch (``finalize``) falls
  outside the window it measures. dlstore's ranks never wait for each other, and each rank's window
  ends when its last step does (its loader's close is outside it too).

DLIO does not install as published (``pip install dlio-benchmark==2.0.0`` needs ``nvidia-dali-cuda110``,
a placeholder on PyPI): ``--install-dlio VENV`` makes a venv that sees this environment's packages
(TensorFlow, DALI, mpi4py, h5py, torch), installs ``dlio-benchmark==2.0.0 --no-deps`` and the rest of
its listed dependencies into the venv only, and checks ``pip check`` of this environment before and
after (it must not change).

The JSON goes to benchmarks/results/mlperf_vs_dlio-latest.json; --save writes the committed
benchmarks/results/mlperf_vs_dlio.json that docs/bench.md quotes.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _harness  # noqa: E402
from dlstore.bench import report, sysinfo  # noqa: E402
from dlstore.bench.mlperf import mpirun_command  # noqa: E402
from dlstore.bench.mlperf_au import epoch_au  # noqa: E402
from dlstore.bench.mlperf_records import train_files  # noqa: E402
from dlstore.bench.mlperf_workloads import workload  # noqa: E402
from dlstore.io import pagecache  # noqa: E402

NAME = "mlperf_vs_dlio"
DLIO = "dlio-benchmark==2.0.0"
#: dlio-benchmark 2.0.0's Requires-Dist that this environment does not provide, installed into the venv.
#: Left out: nvidia-dali-cuda110 (a PyPI placeholder; nvidia-dali-cuda130 is here and provides
#: tfrecord2idx), tensorflow (tensorflow_cpu is here), torch (here), torchaudio and torchvision (its
#: PyTorch readers only; the TFRecord workloads run TensorFlow's).
DLIO_DEPS = ("omegaconf", "hydra-core", "pandas", "psutil", "pydftracer==1.0.2")
ACCOUNTING = [
    "DLIO holds an MPI barrier after every step: each rank waits for the slowest at every step, and its "
    "measured window counts the wait; dlstore's ranks never wait for each other.",
    "DLIO's reader shutdown at the end of an epoch (finalize) falls outside the window it measures; "
    "dlstore's window ends with its last step too, its loader's close outside it.",
    "Both count the configured computation_time (not the measured sleep) over the window less the first "
    "step, mean over ranks; samples/s is the sum of the ranks' samples over their own windows.",
]


def pip_check(python: str = sys.executable) -> str:
    """``pip check`` of an interpreter's environment: its last line."""
    done = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True)
    return (done.stdout.strip() or done.stderr.strip()).splitlines()[-1]


def install_dlio(venv: str) -> Dict[str, str]:
    """A venv with DLIO as it can be installed: ``--no-deps`` plus its other dependencies by hand."""
    before = pip_check()
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True)
    pip = [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q"]
    subprocess.run(pip + ["--no-deps", DLIO], check=True)
    subprocess.run(pip + list(DLIO_DEPS), check=True)
    after = pip_check()
    if after != before:
        raise RuntimeError(f"pip check of the shared environment changed: {before!r} -> {after!r}")
    return {"venv": venv, "pip_check_before": before, "pip_check_after": after}


def drop_caches() -> str:
    """``sync; echo 3 > /proc/sys/vm/drop_caches`` (root), else the files evicted (dlstore's fallback)."""
    os.sync()
    return pagecache.drop_page_cache()


def busy_cores() -> List[tuple]:
    return sysinfo.per_core_cpu_ticks()


def cores_busy_between(before: List[tuple], after: List[tuple]) -> Optional[float]:
    """Cores the whole machine kept busy between two samples (the contender's own work included)."""
    pct = [p for p in sysinfo.per_core_percent(before, after) if p is not None]
    return sum(pct) / 100.0 if pct else None


def _dlio_overrides(wl, data: str, files: int, per_file: int, generate: bool, out: str) -> List[str]:
    return [f"workload={wl.name}", f"++workload.workflow.generate_data={generate}",
            f"++workload.workflow.train={not generate}", f"++workload.dataset.num_files_train={files}",
            f"++workload.dataset.num_samples_per_file={per_file}", f"++workload.dataset.data_folder={data}",
            "++workload.train.epochs=1", f"++hydra.run.dir={out}"]


def run_dlio(venv: str, wl, data: str, files: int, per_file: int, n: int, generate: bool = False) -> Dict[str, Any]:
    """One DLIO run at ``n`` ranks: its summary's figures, and AU recomputed from its step logs."""
    exe = os.path.join(venv, "bin", "dlio_benchmark")
    with tempfile.TemporaryDirectory(prefix="dlio-out-") as out:
        cmd = mpirun_command(n) + [exe] + _dlio_overrides(wl, data, files, per_file, generate, out)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        ticks, t0 = busy_cores(), time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
        seconds, busy = time.monotonic() - t0, cores_busy_between(ticks, busy_cores())
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        if generate:
            return {"seconds": seconds}
        with open(os.path.join(out, "summary.json")) as f:
            metric = json.load(f)["metric"]
        ranks = []
        for path in sorted(glob.glob(os.path.join(out, "*_output.json"))):
            with open(path) as f:
                epoch = json.load(f)["1"]
            proc, compute = epoch["proc"]["block1"], epoch["compute"]["block1"]
            ranks.append({"steps": len(proc), "samples": len(proc) * wl.batch_size, "au_pct": epoch["au"]["block1"],
                          "proc_s": proc, "load_s": epoch["load"]["block1"], "compute_s": compute})
    return {"au_pct": metric["train_au_mean_percentage"],
            "samples_per_s": metric["train_throughput_mean_samples_per_second"],
            "mib_per_s": metric["train_io_mean_MB_per_second"], "verdict": metric["train_au_meet_expectation"],
            "au_per_rank_pct": [r["au_pct"] for r in ranks], "samples_per_rank": [r["samples"] for r in ranks],
            "ranks": ranks, "seconds": seconds, "machine_busy_cores": busy}


def run_dlstore(wl, data: str, n: int) -> Dict[str, Any]:
    """One ``bench mlperf`` run at ``n`` ranks under mpirun, cold."""
    with tempfile.TemporaryDirectory(prefix="dlstore-mlperf-") as out:
        path = os.path.join(out, "r.json")
        cmd = [sys.executable, "-m", "dlstore.bench", "mlperf", "--workload", wl.workload, "--accelerator",
               wl.accelerator, "--data", data, "--accelerators", str(n), "--tiers", "cold", "--launch", "mpirun",
               "--quiet", "--json", path]
        ticks, t0 = busy_cores(), time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                  [_harness.ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])))
        seconds, busy = time.monotonic() - t0, cores_busy_between(ticks, busy_cores())
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        with open(path) as f:
            doc = json.load(f)
    got = doc["tiers"]["cold"]["runs"][str(n)]
    first = got["repeats"][0]
    return {"au_pct": got["au_pct"], "au_whole_pct": got["au_whole_pct"], "samples_per_s": got["samples_per_s"],
            "mib_per_s": got["mib_per_s"], "verdict": "success" if got["passed"] else "fail",
            "au_per_rank_pct": first["au_per_rank_pct"],
            "samples_per_rank": [r[0]["samples"] for r in first["ranks"]],
            "engine": first["engine"], "others_cores": got["others_cores"],
            "cache": doc["tiers"]["cold"]["cache_method"],
            "shuffle": dict(doc["header"]).get("shuffle"), "records": dict(doc["header"]).get("records"),
            "seconds": seconds, "machine_busy_cores": busy}


def dlio_au_without_barrier(run: Dict[str, Any], computation_time: float) -> Optional[float]:
    """DLIO's AU by MLPerf's rule (dlstore's :func:`epoch_au`) over its per-rank step logs' ``proc`` times:
    each of them ends before the step's barrier, so this is DLIO's figure with its barrier waits
    left out; the gap to DLIO's own figure is what the barriers cost."""
    values = [epoch_au(r["proc_s"], computation_time)["au_pct"] for r in run["ranks"]]
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def markdown(doc: Dict[str, Any]) -> str:
    cols = [report.Column("accelerators", "emulated accelerators", "{}"),
            report.Column("dlio_samples_per_s", "DLIO samples/s", "{:,.0f}"),
            report.Column("dlio_au_pct", "DLIO AU %", "{:.1f}"),
            report.Column("dlio_au_without_barrier_pct", "DLIO AU % without its barrier waits", "{:.1f}"),
            report.Column("dlstore_samples_per_s", "dlstore samples/s", "{:,.0f}"),
            report.Column("dlstore_au_pct", "dlstore AU %", "{:.1f}"),
            report.Column("dlstore_au_whole_pct", "dlstore AU % (whole epoch)", "{:.1f}"),
            report.Column("records_equal", "same record count per rank", "{}", "<"),
            report.Column("busy", "machine busy cores (DLIO / dlstore)", "{}", "<")]
    lines = [doc["workload_text"], "",
             f"data: {doc['data']}", f"cache: {doc['cache']}", f"dlstore: {doc['dlstore_engine']}; {doc['shuffle']}",
             f"DLIO: {doc['dlio']['version']} ({doc['dlio']['reader']})", f"machine: {doc['machine']}"]
    if doc.get("records"):  # results written before the line was added lack it
        lines.append(f"records per rank: {doc['records']}")
    lines += ["",
             report.markdown_table(doc["rows"], cols), "Accounting differences:", ""]
    lines += [f"- {a}" for a in doc["accounting"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--install-dlio", metavar="VENV", help="make VENV with DLIO (see the module's docstring) and exit")
    p.add_argument("--dlio-venv", metavar="VENV", help="the venv DLIO was installed into")
    p.add_argument("--data", metavar="DIR", help="DLIO's data folder (DIR/train/*.tfrecord)")
    p.add_argument("--generate-dlio", action="store_true", help="have DLIO generate DIR first (when empty)")
    p.add_argument("--workload", default="resnet50")
    p.add_argument("--accelerator", default="h100")
    p.add_argument("--files", type=int, default=32, help="files DLIO generates (default: %(default)s)")
    p.add_argument("--records-per-file", type=int, default=1024, help="records per file (default: %(default)s)")
    p.add_argument("--accelerators", default="1,2,3,4", help="counts (default: %(default)s)")
    p.add_argument("--repeat", type=int, default=3, help="runs per count and contender (default: %(default)s)")
    _harness.add_output_arguments(p, NAME)
    _harness.add_page_arguments(p)
    args, json_path = _harness.parse(p, NAME, argv)
    if args.render:
        return _harness.render(args.render, args.markdown, markdown)
    if args.install_dlio:
        print(json.dumps(install_dlio(args.install_dlio), indent=2))
        return 0
    if not args.dlio_venv or not args.data:
        p.error("--dlio-venv and --data are needed (and --install-dlio VENV once before)")
    if os.geteuid() != 0:
        p.error("a cold cache needs root (echo 3 > /proc/sys/vm/drop_caches)")
    if shutil.which("mpirun") is None:
        p.error("mpirun is not on PATH")
    wl = workload(args.workload, args.accelerator)
    counts = [int(c) for c in args.accelerators.split(",")]
    data = os.path.abspath(args.data)
    if args.generate_dlio and not train_files(data):
        print(f"DLIO generates {args.files} files x {args.records_per_file} records in {data}", flush=True)
        run_dlio(args.dlio_venv, wl, data, args.files, args.records_per_file, 2, generate=True)
    files = train_files(data)
    if not files:
        p.error(f"{data}/train holds no .tfrecord files: --generate-dlio")
    per_file = args.records_per_file
    nbytes = sum(os.path.getsize(f) for f in files)
    load0 = os.getloadavg()
    runs: Dict[int, Dict[str, List[Dict[str, Any]]]] = {n: {"dlio": [], "dlstore": []} for n in counts}
    for r in range(args.repeat):
        for n in counts:
            order = ("dlio", "dlstore") if (r + n) % 2 == 0 else ("dlstore", "dlio")
            for who in order:
                cache = drop_caches()
                got = (run_dlio(args.dlio_venv, wl, data, len(files), per_file, n) if who == "dlio"
                       else run_dlstore(wl, data, n))
                got.update(cache=cache, loadavg=os.getloadavg())
                runs[n][who].append(got)
                print(f"repeat {r + 1}, {n} accelerators, {who}: AU {got['au_pct']:.1f}%, "
                      f"{got['samples_per_s']:,.0f} samples/s, machine busy {got['machine_busy_cores']:.2f} cores",
                      flush=True)
    rows = []
    for n in counts:
        dl, ds = runs[n]["dlio"], runs[n]["dlstore"]
        records_equal = all(a["samples_per_rank"] == b["samples_per_rank"] for a in dl for b in ds)
        rows.append({"accelerators": n,
                     "dlio_au_pct": _harness.median([x["au_pct"] for x in dl]),
                     "dlio_au_without_barrier_pct": _harness.median(
                         [dlio_au_without_barrier(x, wl.computation_time) for x in dl]),
                     "dlio_samples_per_s": _harness.median([x["samples_per_s"] for x in dl]),
                     "dlio_mib_per_s": _harness.median([x["mib_per_s"] for x in dl]),
                     "dlstore_au_pct": _harness.median([x["au_pct"] for x in ds]),
                     "dlstore_au_whole_pct": _harness.median([x["au_whole_pct"] for x in ds]),
                     "dlstore_samples_per_s": _harness.median([x["samples_per_s"] for x in ds]),
                     "dlstore_mib_per_s": _harness.median([x["mib_per_s"] for x in ds]),
                     "dlio_au_spread": report.summarize([x["au_pct"] for x in dl]),
                     "dlstore_au_spread": report.summarize([x["au_pct"] for x in ds]),
                     "samples_per_rank": ds[0]["samples_per_rank"], "records_equal": "yes" if records_equal else "NO",
                     "busy": f"{_harness.median([x['machine_busy_cores'] for x in dl]):.2f} / "
                             f"{_harness.median([x['machine_busy_cores'] for x in ds]):.2f}"})
    from importlib.metadata import version

    doc = {"benchmark": NAME, "command": ["python", "benchmarks/mlperf_vs_dlio.py"] + list(argv or sys.argv[1:]),
           "sysinfo": sysinfo.collect(files), "workload": {"name": wl.name, **dataclasses.asdict(wl)},
           "workload_text": wl.describe(),
           "data": f"{len(files)} files x {per_file} records, {report.fmt_bytes(nbytes)}, generated by DLIO, in {data}",
           "cache": "dropped before every run (sync; echo 3 > /proc/sys/vm/drop_caches), 1 epoch per run",
           "dlstore_engine": f"io engine {runs[counts[0]]['dlstore'][0]['engine']}, ranks under mpirun",
           "shuffle": f"dlstore shuffle: {runs[counts[0]]['dlstore'][0]['shuffle']}; DLIO: no sample shuffle "
                      f"(resnet50's config), files dealt to ranks round-robin",
           "records": runs[counts[0]]["dlstore"][0]["records"],
           "dlio": {"version": "dlio-benchmark " + subprocess.run(
               [os.path.join(args.dlio_venv, "bin", "python"), "-c",
                "from importlib.metadata import version; print(version('dlio-benchmark'))"],
               capture_output=True, text=True).stdout.strip(),
               "reader": (f"TensorFlow {version('tensorflow_cpu')} tf.data TFRecordDataset, "
                          f"{wl.read_threads} read threads"),
               "venv": args.dlio_venv},
           "machine": (f"2 cores shared with other engineers; load average {load0[0]:.2f} at the start; the "
                       "machine's busy cores during each run (the contender's own work included) in the table"),
           "accounting": ACCOUNTING, "rows": rows, "runs": {str(n): v for n, v in runs.items()},
           "repeat": args.repeat}
    print(markdown(doc))
    _harness.write_outputs(doc, json_path, args.markdown, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
