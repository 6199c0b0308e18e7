"""``python -m dlstore.bench ... --metrics-port 0``: a real run scraped over HTTP on localhost.

The run is started in a subprocess; the test reads the port it prints, scrapes ``/metrics`` while it
runs, and again while it lingers after the end (``--metrics-linger``), then compares the final
figures with the run's own JSON.
"""
from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.helpers import REPO as ROOT

pytestmark = pytest.mark.slow  # runs the bench in subprocesses

pytest.importorskip("prometheus_client", reason="--metrics-port needs prometheus_client")

_SAMPLE = re.compile(r'^(\w+)\{([^}]*)\} (\S+)$')


def _parse(text: str) -> dict:
    """{(name, frozenset of label pairs): value} of a scrape (our series only)."""
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1).startswith("dlstore_bench_"):
            labels = frozenset(tuple(kv.split("=", 1)) for kv in re.findall(r'\w+="[^"]*"', m.group(2)))
            out[(m.group(1), frozenset((k, v.strip('"')) for k, v in labels))] = float(m.group(3))
    return out


def _scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return _parse(r.read().decode())


def _lines(stream, q: "queue.Queue[str]") -> None:
    for line in stream:
        q.put(line.rstrip("\n"))
    q.put(None)


def _wait_for(q: "queue.Queue[str]", pattern: str, seen: list, timeout: float) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = q.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        m = re.search(pattern, line)
        if m:
            return m
    raise AssertionError(f"no line matching {pattern!r} on stderr; got:\n" + "\n".join(seen[-30:]))


def _run_scraped(tmp_path, *args):
    """Runs the bench with metrics on a free port; returns (scrape while lingering, the JSON document)."""
    out = tmp_path / "r.json"
    env = dict(os.environ, DLSTORE_CACHE=os.fspath(tmp_path / "cache"), DLSTORE_NO_PROGRESS="1")
    proc = subprocess.Popen([sys.executable, "-m", "dlstore.bench", *args, "--quiet", "--json", os.fspath(out),
                             "--metrics-port", "0", "--metrics-linger", "120"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    q: "queue.Queue[str]" = queue.Queue()
    reader = threading.Thread(target=_lines, args=(proc.stderr, q), daemon=True)
    reader.start()
    seen: list = []
    try:
        port = int(_wait_for(q, r"metrics: serving on http://0\.0\.0\.0:(\d+)/metrics", seen, 120).group(1))
        _scrape(port)  # answers while the run is under way (or already over: it lingers)
        _wait_for(q, r"metrics: benchmark done; serving the final figures for 120 s more", seen, 300)
        final = _scrape(port)
        assert proc.poll() is None, "the run ended instead of lingering"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        reader.join(timeout=30)  # it reads to the end of stderr, which the exit closed
        proc.stderr.close()
    with open(out) as f:
        return final, json.load(f)


def _get(series: dict, name: str, **labels) -> float:
    key = (name, frozenset(labels.items()))
    assert key in series, f"{name}{labels} not served; served: {sorted(k[0] for k in series)}"
    return series[key]


def test_bert_run_serves_its_step_figures(tmp_path):
    series, doc = _run_scraped(tmp_path, "bert", "--size", "tiny", "--compute", "5")
    assert [t["tier"] for t in doc["tiers"]] == ["page-cache", "local-cold"]
    for t in doc["tiers"]:
        lab = {"bench": "bert", "engine": t["io"], "tier": t["tier"]}
        last = t["step_details"][-1]
        assert _get(series, "dlstore_bench_step", **lab) == last["step"] == len(t["steps"])
        assert _get(series, "dlstore_bench_running", **lab) == 0
        assert _get(series, "dlstore_bench_samples_per_second", unit="samples", **lab) == pytest.approx(last["rate"])
        # A step too short for /proc/stat's ticks has no figure: the gauge keeps the step before's.
        busiest = [s["busiest_core_pct"] for s in t["step_details"] if s["busiest_core_pct"] is not None]
        if busiest:
            assert _get(series, "dlstore_bench_busiest_core_ratio", **lab) == pytest.approx(busiest[-1] / 100)
        assert _get(series, "dlstore_bench_accelerator_utilisation_ratio", **lab) == pytest.approx(
            last["accelerator_util_pct"] / 100)
        assert _get(series, "dlstore_bench_needed_bytes_per_second_per_accelerator", **lab) == pytest.approx(
            t["required_mb_per_s_per_accelerator"] * 1e6)
        assert _get(series, "dlstore_bench_read_bytes_total", **lab) == t["bytes"]
        # The loader reads ahead of the steps: at least the records of the samples drawn.
        assert _get(series, "dlstore_bench_records_total", **lab) >= t["samples"] > 0


def test_storage_run_serves_its_pass_figures(tmp_path):
    pytest.importorskip("PIL", reason="the synthetic ImageNet-like set needs pillow")
    series, doc = _run_scraped(tmp_path, "storage", "--size", "tiny", "--cache", "warm", "--repeat", "2",
                               "--no-fio")
    lab = {"bench": "storage", "engine": doc["io"], "tier": "warm"}
    last = doc["repeats"][-1]
    assert _get(series, "dlstore_bench_step", **lab) == 2
    assert _get(series, "dlstore_bench_records_total", **lab) == 2 * doc["records"]
    assert _get(series, "dlstore_bench_samples_per_second", unit="records", **lab) == pytest.approx(
        last["records_per_s"])
    assert _get(series, "dlstore_bench_read_bytes_per_second", **lab) == pytest.approx(last["gb_per_s"] * 1e9)
