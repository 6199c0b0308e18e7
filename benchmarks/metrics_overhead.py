#!/usr/bin/env python
"""What watching the input costs: shuffled BERT and ResNet-50 through the Loader with the Prometheus
exporter and the per-epoch stall report off, and on (scraped every second), side by side.

    python benchmarks/metrics_overhead.py                     # the cached BERT small and ImageNet-like sets
    python benchmarks/metrics_overhead.py --quick             # tiny sets, one round: a smoke test
    python benchmarks/metrics_overhead.py --save --markdown docs/metrics_overhead.md
    python benchmarks/metrics_overhead.py --baseline /path/to/other/checkout   # a third column: that tree's Loader

Each round runs one fresh interpreter per workload: it builds the loader (this rank's ``Dataset``,
``shuffle="block"``), runs one epoch untimed (buffers allocated, files in the page cache), then times
phases of ``--epochs`` epochs, *off* and *on* in turn (``--phases`` of each, the order alternating), the
consumer doing nothing but draw batches (the harshest case: any cost per batch shows). *on*: the
exporter (``dlstore.metrics.serve``, started once per process) scraped every ``--scrape-interval``
seconds by a thread (Prometheus scrapes every 15 s by default), and ``report_stalls`` taking each epoch's
line; *off*: no scrape and no line (the exporter's thread idles; the loader times each step either way:
that is always on). Side by side in one process, the two see the same machine; each round's ratio is
*on* over *off*, and the figure is the median over rounds.

Two figures: samples/s over the wall time, and the process's CPU time per sample (all its threads: the
loader's, the scraper's, the exporter's). On a shared machine the wall-clock rate swings with the
other work; the CPU time, what the metrics add to the job's work, swings less. The target (issue 22):
*on* within 3% of *off*, on both.

``--baseline TREE`` adds, per round, two more interpreters with the metrics off: this checkout's and
that tree's Loader (e.g. main before the step timing), for what the always-on step timing costs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:  # run from a checkout: measure this tree's dlstore
    sys.path.insert(0, ROOT)

from benchmarks import _harness  # noqa: E402

RESULT_PREFIX = "METRICS_OVERHEAD_RESULT "
TARGET = 0.97  # on / off
WORKLOADS = ("bert", "resnet50")


# ---- one measurement (in a worker process) --------------------------------------------------------

def _loader(plan: Dict, on: bool):
    from dlstore.pipeline import bert_loader, resnet50_loader

    lines: List[str] = []
    extra = dict(report_stalls=lines.append) if on else {}
    make = bert_loader if plan["workload"] == "bert" else resnet50_loader
    loader = make(plan["files"], batch_size=plan["batch_size"], shuffle="block", seed=plan["seed"], epochs=1,
                  **extra)
    return loader, lines


def _timed(loader, epochs: int) -> Dict:
    samples = 0
    t0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(epochs):
        for batch in loader:
            samples += len(next(iter(batch.values())))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"samples": samples, "seconds": elapsed, "cpu_s": cpu}


def _scraper(port: int, interval: float, active: Optional[threading.Event] = None):
    """A thread scraping ``/metrics`` every ``interval`` seconds (while ``active`` is set, if given):
    ``(scrape durations, stop event, thread)``, the thread started."""
    import urllib.request

    scrapes: List[float] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.wait(interval):
            if active is None or active.is_set():
                t0 = time.perf_counter()
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    r.read()
                scrapes.append(time.perf_counter() - t0)

    thread = threading.Thread(target=scrape, daemon=True)
    thread.start()
    return scrapes, stop, thread


def measure_paired(plan: Dict) -> Dict:
    """*off* and *on* phases in turn in this process: ``{"off": figures, "on": figures}``."""

    from dlstore import metrics

    port = metrics.serve(0, "127.0.0.1")
    on = threading.Event()
    lines: List[str] = []
    loader, _ = _loader(plan, False)
    loader._report_stalls = lambda line: lines.append(line) if on.is_set() else None
    for _ in loader:  # untimed: buffers allocated, files in the page cache
        pass
    scrapes, stop, scraper = _scraper(port, plan["scrape_interval"], on)
    sums = {mode: {"samples": 0, "seconds": 0.0, "cpu_s": 0.0} for mode in ("off", "on")}
    for k in range(plan["phases"]):
        for mode in (("off", "on") if k % 2 == 0 else ("on", "off")):
            (on.set if mode == "on" else on.clear)()
            for key, value in _timed(loader, plan["epochs"]).items():
                sums[mode][key] += value
    stop.set()
    scraper.join()
    out = {}
    for mode, s in sums.items():
        out[mode] = {"samples_per_s": s["samples"] / s["seconds"], "cpu_us_per_sample": 1e6 * s["cpu_s"] / s["samples"],
                     **s}
    out["on"].update(scrapes=len(scrapes), scrape_s=max(scrapes) if scrapes else None, epoch_lines=len(lines),
                     stall_line=loader.stall_report()["line"])
    return out


def measure(plan: Dict) -> Dict:
    if plan["mode"] == "paired":
        return measure_paired(plan)

    on = plan["mode"] == "on"
    port = None
    if on:
        from dlstore import metrics

        port = metrics.serve(0, "127.0.0.1")
    loader, lines = _loader(plan, on)
    for _ in loader:  # untimed: buffers allocated, files in the page cache
        pass
    scrapes, stop, scraper = _scraper(port, plan["scrape_interval"]) if on else ([], None, None)
    timed = _timed(loader, plan["epochs"])
    samples, elapsed, cpu = timed["samples"], timed["seconds"], timed["cpu_s"]
    if scraper is not None:
        stop.set()
        scraper.join()
    stats = loader.stats()
    return {"samples_per_s": samples / elapsed, "samples": samples, "seconds": elapsed,
            "cpu_us_per_sample": 1e6 * cpu / samples, "engine": stats["engine"],
            "scrapes": len(scrapes), "scrape_s": max(scrapes) if scrapes else None, "epoch_lines": len(lines),
            "stall_line": stats.get("stalls", {}).get("line")}


def worker(plan_path: str) -> int:
    with open(plan_path) as f:
        plan = json.load(f)
    print(RESULT_PREFIX + json.dumps(measure(plan)), flush=True)
    return 0


# ---- the side-by-side run ---------------------------------------------------------------------------

def _files(workload: str, quick: bool) -> List[str]:
    from dlstore.synthetic import cached_dataset

    if workload == "bert":
        return cached_dataset("bert", "tiny" if quick else "small", progress=False)
    files = cached_dataset("imagenet", "tiny" if quick else "default", progress=False)
    return files if quick else files[:2]  # ~1,100 images: an epoch of a few seconds on two cores


def run(args) -> Dict:
    from dlstore.bench import report, sysinfo

    modes = ["paired"] + (["off", "baseline"] if args.baseline else [])
    configs = [(w, m) for w in args.workloads for m in modes]
    files = {w: _files(w, args.quick) for w in args.workloads}
    results: Dict[tuple, List[Dict]] = {c: [] for c in configs}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="dlstore-metrics-overhead-") as tmp:
        for r in range(args.rounds):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            print(f"round {r + 1} of {args.rounds}", flush=True)
            for workload, mode in order:
                plan = dict(workload=workload, mode="off" if mode == "baseline" else mode, files=files[workload],
                            batch_size=args.batch_size[workload], seed=args.seed, scrape_interval=args.scrape_interval,
                            epochs=args.epochs[workload], phases=args.phases)
                path = os.path.join(tmp, "plan.json")
                with open(path, "w") as f:
                    json.dump(plan, f)
                env_root = args.baseline if mode == "baseline" else None
                got = _run(path, args.timeout, env_root)
                if mode == "paired":
                    results.setdefault((workload, "on"), []).append(got.get("on", got))
                    mode, got = "off" if not args.baseline else "paired_off", got.get("off", got)
                results.setdefault((workload, mode), []).append(got)
                shown = f"failed: {got['error']}" if "error" in got else f"{got['samples_per_s']:12,.0f} samples/s"
                print(f"{workload:<9} {mode:<9} {shown}", flush=True)
    if args.baseline:  # the paired off phases are "off" for the on/off ratio; the separate process for the baseline
        for workload in args.workloads:
            results[(workload, "off_process")] = results.pop((workload, "off"))
            results[(workload, "off")] = results.pop((workload, "paired_off"))
    modes = ["off", "on"] + (["off_process", "baseline"] if args.baseline else [])
    rows = []
    for workload in args.workloads:
        row: Dict = {"workload": workload, "batch_size": args.batch_size[workload], "epochs": args.epochs[workload],
                     "phases": args.phases}
        for mode in modes:
            runs = [g for g in results[(workload, mode)] if "error" not in g]
            if not runs:
                row[mode] = {"error": results[(workload, mode)][0].get("error")}
                continue
            rate, cpu = (report.summarize([g[k] for g in runs]) for k in ("samples_per_s", "cpu_us_per_sample"))
            row[mode] = {"samples_per_s": rate["median"], "spread_pct": rate["spread_pct"],
                         "cpu_us_per_sample": cpu["median"], "cpu_spread_pct": cpu["spread_pct"], "runs": runs}
        for mode, base in (("on", "off"), ("off_process", "baseline")):
            if mode in row and base in row:
                pairs = list(zip(results[(workload, mode)], results[(workload, base)]))
                row[f"{mode}_vs_{base}"] = _paired(pairs, lambda a, b: a["samples_per_s"] / b["samples_per_s"])
                row[f"{mode}_vs_{base}_cpu"] = _paired(pairs, lambda a, b: b["cpu_us_per_sample"]
                                                       / a["cpu_us_per_sample"])
        ratios = [row.get("on_vs_off_cpu"), row.get("on_vs_off")]
        row["verdict"] = None if None in ratios else "PASS" if min(ratios) >= TARGET else "FAIL"
        rows.append(row)
    info = sysinfo.collect(files[args.workloads[0]])
    return {"benchmark": "metrics_overhead",
            "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": ["python", "benchmarks/metrics_overhead.py"] + sys.argv[1:], "system": info,
            "load_before": load_before, "load_after": os.getloadavg()[0],
            "config": {"rounds": args.rounds, "scrape_interval_s": args.scrape_interval, "seed": args.seed,
                       "baseline": args.baseline, "target_on_vs_off": TARGET,
                       "data": {w: {"files": len(f), "bytes": sum(os.path.getsize(p) for p in f)}
                                for w, f in files.items()}},
            "rows": rows}


def _paired(pairs, ratio) -> Optional[float]:
    """The median over rounds of ``ratio(a, b)`` for the rounds where both measurements succeeded."""
    from dlstore.bench import report

    values = [ratio(a, b) for a, b in pairs if "error" not in a and "error" not in b]
    return report.summarize(values)["median"] if values else None


def _run(plan_path: str, timeout: float, root: Optional[str]) -> Dict:
    if root is None:
        return _harness.run_worker(__file__, ["--worker", plan_path], RESULT_PREFIX, timeout)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = root  # the other tree's dlstore first (run_worker puts this checkout after it)
    try:
        return _harness.run_worker(__file__, ["--worker", plan_path, "--tree", root], RESULT_PREFIX, timeout)
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


def _cell(row: Dict, mode: str) -> str:
    x = row.get(mode, {})
    if "samples_per_s" not in x:
        return f"failed: {x.get('error')}"
    spread = f" ({x['spread_pct']:.0f}%)" if x["spread_pct"] is not None else ""
    cpu = f" ({x['cpu_spread_pct']:.0f}%)" if x["cpu_spread_pct"] is not None else ""
    return f"{x['samples_per_s']:,.0f}{spread}, {x['cpu_us_per_sample']:.2f}{cpu}"


def _ratio(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"


def markdown(doc: Dict) -> str:
    s = doc["system"]
    out = ["# Metrics and stall report: their cost\n",
           f"`{' '.join(doc['command'])}` on {doc['when']}: {s['cpu']}, {s['cores']} cores, {s['kernel']}, "
           f"Python {s['python']}; load average {doc['load_before']:.2f} before, {doc['load_after']:.2f} after; "
           f"{doc['config']['rounds']} rounds, /metrics scraped every {doc['config']['scrape_interval_s']:g} s "
           f"when on.\n",
           "| workload | batch | off: samples/s (spread), CPU us/sample (spread) | on: the same | on / off, "
           "CPU | on / off, wall | target: both >= " + f"{TARGET} |",
           "|---|---:|---:|---:|---:|---:|---|"]
    for r in doc["rows"]:
        out.append(f"| {r['workload']} | {r['batch_size']} | {_cell(r, 'off')} | {_cell(r, 'on')} | "
                   f"{_ratio(r.get('on_vs_off_cpu'))} | {_ratio(r.get('on_vs_off'))} | {r['verdict'] or '-'} |")
    if any("baseline" in r for r in doc["rows"]):
        out += ["", f"Metrics off, this checkout against the baseline tree `{doc['config']['baseline']}` (its Loader, "
                "without the step timing), each in an interpreter of its own, paired by round:"]
        out += [f"- {r['workload']}: CPU {_ratio(r.get('off_process_vs_baseline_cpu'))}, wall "
                f"{_ratio(r.get('off_process_vs_baseline'))}; this checkout {_cell(r, 'off_process')}, baseline "
                f"{_cell(r, 'baseline')}" for r in doc["rows"]]
    return "\n".join(out) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", metavar="PLAN", help=argparse.SUPPRESS)
    p.add_argument("--tree", help=argparse.SUPPRESS)
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="the tiny sets, one round: a smoke test")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes when on")
    p.add_argument("--phases", type=int, default=4, help="off and on phases of each process (default: %(default)s)")
    p.add_argument("--baseline", metavar="TREE", help="also measure the Loader of this other dlstore checkout")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0)
    _harness.add_output_arguments(p, "metrics_overhead")
    _harness.add_page_arguments(p)
    args = p.parse_args(argv)
    if args.worker:
        if args.tree:  # measure that tree's dlstore, not this checkout's
            sys.path.insert(0, args.tree)
            for name in [m for m in sys.modules if m == "dlstore" or m.startswith("dlstore.")]:
                del sys.modules[name]
        return worker(args.worker)
    if args.render:
        return _harness.render(args.render, args.markdown, markdown)
    json_path = _harness.output_path(p, args, "metrics_overhead")
    args.workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown:
        p.error(f"unknown workloads {sorted(unknown)}; choose from {WORKLOADS}")
    args.batch_size = {"bert": 64, "resnet50": 64} if not args.quick else {"bert": 8, "resnet50": 8}
    args.epochs = {"bert": 20, "resnet50": 1} if not args.quick else {"bert": 2, "resnet50": 1}
    if args.quick:
        args.rounds, args.phases = 1, 2
    doc = run(args)
    print()
    print(markdown(doc))
    _harness.write_outputs(doc, json_path, args.markdown, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
