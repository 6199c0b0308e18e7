"""dlstore.bench.metrics: the series a run exposes (in a private registry), the server, the options."""
from __future__ import annotations

import argparse
import socket
import re
import sys
import urllib.request

import numpy as np
import pytest

prometheus_client = pytest.importorskip("prometheus_client", reason="--metrics-port needs prometheus_client")

from dlstore.bench import metrics as bench_metrics  # noqa: E402
from dlstore.bench.__main__ import main as bench_main  # noqa: E402
from dlstore.bench.metrics import BenchMetrics, MetricsUnavailable  # noqa: E402
from dlstore.bench.steps import run_steps  # noqa: E402
from dlstore.bench.storage import measure_passes  # noqa: E402


def _labels(tier="page-cache", engine="buffered", bench="resnet50"):
    return {"bench": bench, "engine": engine, "tier": tier}


def _value(m: BenchMetrics, name: str, **labels):
    return m.registry.get_sample_value(name, labels)


def test_a_step_sets_the_gauges_and_counts_records_and_bytes():
    m = BenchMetrics("resnet50", "images", registry=prometheus_client.CollectorRegistry())
    m.begin("page-cache", "buffered")
    lab = _labels()
    assert _value(m, "dlstore_bench_running", **lab) == 1 and _value(m, "dlstore_bench_step", **lab) == 0
    m.step("page-cache", "buffered", {"step": 1, "rate": 812.5, "mb_per_s": 95.0, "bytes": 4_000_000,
                                      "busiest_core_pct": 87.0, "accelerator_util_pct": None}, records=300)
    assert _value(m, "dlstore_bench_samples_per_second", unit="images", **lab) == 812.5
    assert _value(m, "dlstore_bench_read_bytes_per_second", **lab) == pytest.approx(95e6)
    assert _value(m, "dlstore_bench_busiest_core_ratio", **lab) == pytest.approx(0.87)
    assert _value(m, "dlstore_bench_accelerator_utilisation_ratio", **lab) is None  # no --compute: no series
    assert _value(m, "dlstore_bench_step", **lab) == 1
    assert _value(m, "dlstore_bench_records_total", **lab) == 300
    # records is the tier's running total: the counter grows by the difference.
    m.step("page-cache", "buffered", {"step": 2, "rate": 700.0, "mb_per_s": 80.0, "bytes": 1_000_000,
                                      "busiest_core_pct": 90.0, "accelerator_util_pct": 45.0}, records=512)
    assert _value(m, "dlstore_bench_records_total", **lab) == 512
    assert _value(m, "dlstore_bench_read_bytes_total", **lab) == 5_000_000
    assert _value(m, "dlstore_bench_samples_per_second", unit="images", **lab) == 700.0
    assert _value(m, "dlstore_bench_accelerator_utilisation_ratio", **lab) == pytest.approx(0.45)
    m.end("page-cache", "buffered", needed_mb_per_s=110.0)
    assert _value(m, "dlstore_bench_running", **lab) == 0 and _value(m, "dlstore_bench_step", **lab) == 2
    assert _value(m, "dlstore_bench_needed_bytes_per_second_per_accelerator", **lab) == pytest.approx(110e6)


def test_tiers_and_engines_are_separate_series_and_the_text_format_names_them():
    m = BenchMetrics("bert", "samples")
    m.begin("page-cache", "buffered")
    m.step("page-cache", "buffered", {"step": 1, "rate": 100.0}, records=10)
    m.end("page-cache", "buffered")
    m.begin("local-cold", "direct")
    m.step("local-cold", "direct", {"step": 1, "rate": 50.0}, records=10)
    assert _value(m, "dlstore_bench_running", **_labels("page-cache", bench="bert")) == 0
    assert _value(m, "dlstore_bench_running", **_labels("local-cold", "direct", "bert")) == 1
    text = m.exposition()
    assert ('dlstore_bench_samples_per_second{bench="bert",engine="direct",tier="local-cold",unit="samples"} 50.0'
            in text)
    assert re.search(r"^# TYPE dlstore_bench_records(_total)? counter$", text, re.M)  # the name varies by version
    assert 'dlstore_bench_records_total{bench="bert",engine="direct",tier="local-cold"} 10.0' in text
    # A private registry each: two runs in one process do not collide, the global registry stays clean.
    BenchMetrics("bert", "samples")
    assert prometheus_client.REGISTRY.get_sample_value("dlstore_bench_step", _labels("page-cache", bench="bert")) \
        is None


def test_storage_passes_map_records_per_s_and_gb_per_s():
    m = BenchMetrics("storage", "records")
    m.begin("cold", "direct")
    m.step("cold", "direct", {"records": 1000, "bytes": 2_000_000, "records_per_s": 5000.0, "gb_per_s": 1.5,
                              "busiest_core_pct": 40.0})
    m.step("cold", "direct", {"records": 1000, "bytes": 2_000_000, "records_per_s": 4000.0, "gb_per_s": 1.25,
                              "busiest_core_pct": 30.0})
    lab = _labels("cold", "direct", "storage")
    assert _value(m, "dlstore_bench_step", **lab) == 2  # no step number given: counts passes
    assert _value(m, "dlstore_bench_records_total", **lab) == 2000
    assert _value(m, "dlstore_bench_samples_per_second", unit="records", **lab) == 4000.0
    assert _value(m, "dlstore_bench_read_bytes_per_second", **lab) == pytest.approx(1.25e9)


def test_run_steps_reports_each_step_as_it_completes():
    seen = []
    batches = ({"x": np.zeros(4)} for _ in range(7))
    out = run_steps(batches, [3, 3, 3], on_step=lambda s: seen.append(dict(s)))
    assert [s["step"] for s in seen] == [1, 2, 3] and [s["samples"] for s in seen] == [12, 12, 4]
    assert seen == out["steps"]


def test_measure_passes_reports_each_timed_pass(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    seen = []
    out = measure_passes(lambda: (lambda: (5, 100)), [str(path)], cache="warm", repeat=3, on_pass=seen.append)
    assert seen == out["passes"] and len(seen) == 3  # the untimed warm-up pass is not reported


@pytest.mark.slow
def test_serve_on_port_zero_picks_a_free_port_and_answers_a_scrape():
    m = BenchMetrics("storage", "records")
    port = m.serve(0, addr="127.0.0.1")
    try:
        assert port > 0
        m.begin("warm", "mmap")
        m.step("warm", "mmap", {"records": 7, "records_per_s": 70.0})
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            body = r.read().decode()
        assert 'dlstore_bench_records_total{bench="storage",engine="mmap",tier="warm"} 7.0' in body
    finally:
        m.close()


def _args(**kw):
    return argparse.Namespace(**dict({"metrics_port": None, "metrics_linger": 0.0}, **kw))


@pytest.mark.slow
def test_serve_from_args_only_when_asked_and_checks_its_values():
    assert bench_metrics.serve_from_args(_args(), "bert", "samples") is None
    with pytest.raises(ValueError, match="0..65535"):
        bench_metrics.serve_from_args(_args(metrics_port=70000), "bert", "samples")
    with pytest.raises(ValueError, match="linger"):
        bench_metrics.serve_from_args(_args(metrics_port=0, metrics_linger=-1), "bert", "samples")
    lines = []
    m = bench_metrics.serve_from_args(_args(metrics_port=0), "bert", "samples", log=lines.append)
    try:
        port = m.port
        assert lines == [f"metrics: serving on http://0.0.0.0:{port}/metrics"]
    finally:
        m.close()


def test_linger_keeps_serving_then_returns():
    lines, slept = [], []
    m = BenchMetrics("bert", "samples")
    bench_metrics.linger(m, 2.5, log=lines.append, sleep=slept.append)
    assert slept == [2.5] and "2.5 s more" in lines[0]
    bench_metrics.linger(m, 0, log=lines.append, sleep=slept.append)
    bench_metrics.linger(None, 5, log=lines.append, sleep=slept.append)
    assert slept == [2.5] and len(lines) == 1


def test_missing_prometheus_client_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import raises ImportError
    with pytest.raises(MetricsUnavailable):
        BenchMetrics("bert")
    assert bench_main(["storage", "--size", "tiny", "--metrics-port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install prometheus_client" in err and "Traceback" not in err


@pytest.mark.slow
def test_a_port_in_use_is_one_line_and_exit_2(capsys):
    taken = socket.socket()  # another program's: one exporter serves this process, whatever asks
    taken.bind(("0.0.0.0", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        assert bench_main(["storage", "--size", "tiny", "--metrics-port", str(port)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"--metrics-port {port}" in err and "Traceback" not in err
    finally:
        taken.close()


@pytest.mark.slow
def test_the_bench_and_the_loaders_share_one_exporter(tmp_path):
    """--metrics-port serves through dlstore.metrics: one scrape has the bench's figures and every live loader's."""
    from dlstore import metrics
    from dlstore.pipeline import bert_loader
    from dlstore.synthetic import generate_bert

    generate_bert(str(tmp_path), shards=1, records_per_shard=8, progress=False)
    loader = bert_loader(str(tmp_path), batch_size=4)
    assert sum(1 for _ in loader) == 2
    m = BenchMetrics("bert", "samples")
    port = m.serve(0, addr="127.0.0.1")
    try:
        assert metrics.serving() == port
        m.begin("page-cache", loader.stats()["engine"])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            body = r.read().decode()
        assert re.search(r'^dlstore_bench_running\{bench="bert",.*\} 1\.0$', body, re.M)
        assert re.search(r'^dlstore_batches_total\{.*loader="bert-\d+".*\} 2\.0$', body, re.M)
    finally:
        m.close()
    assert metrics.serving() is None
