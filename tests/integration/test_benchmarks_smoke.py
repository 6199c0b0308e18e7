"""Smoke test of ``benchmarks/pipelines.py`` at tiny size (``--quick``), and checks of its pieces that
need no framework: the RandomResizedCrop window, contender selection, ratios and target verdicts."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import random
import subprocess
import sys

import pytest

from benchmarks.contenders.spec import RATIO_RANGE
from benchmarks.contenders.torch_dataloader import random_resized_crop
from benchmarks.pipelines_report import add_ratios, targets
from tests.helpers import REPO as ROOT

pytestmark = pytest.mark.slow  # runs the benchmark scripts in subprocesses
SCRIPT = os.path.join(ROOT, "benchmarks", "pipelines.py")


def _run_bench(tmp_path, script: str, *args: str) -> subprocess.CompletedProcess:
    """``benchmarks/<script>.py args`` in a fresh interpreter, its generated sets cached under ``tmp_path``."""
    env = dict(os.environ, DLSTORE_CACHE=os.fspath(tmp_path / "cache"))
    return subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", f"{script}.py"), *args],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)


def _run_cold_bench(tmp_path, script: str) -> dict:
    """``benchmarks/<script>.py --quick``, a cold script beside fio, and its JSON; skipped, saying why, where
    it cannot run (no root to drop the page cache, no fio, no pillow for the generated set)."""
    pytest.importorskip("PIL", reason="the synthetic ImageNet-like set needs pillow")
    from benchmarks import _harness

    why = _harness.cold_fio_refusal()
    if why:
        pytest.skip(f"{script} needs root and fio: {why}")
    out = tmp_path / f"{script}.json"
    r = _run_bench(tmp_path, script, "--quick", "--json", os.fspath(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(out.read_text())


def _load_script():
    spec = importlib.util.spec_from_file_location("dlstore_bench_pipelines", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pipelines():
    return _load_script()


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _dlstore_pipeline_built() -> bool:
    try:
        from dlstore.pipeline import bert_loader, resnet50_loader  # noqa: F401
    except ImportError:
        return False
    return True


# ---- pieces ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("height,width", [(375, 500), (500, 300), (224, 224), (40, 900), (900, 40), (1, 1)])
def test_random_resized_crop_window(height, width):
    rng = random.Random(3)
    lo, hi = RATIO_RANGE
    for _ in range(300):
        top, left, h, w = random_resized_crop(rng, height, width)
        assert 0 < h <= height and 0 < w <= width
        assert 0 <= top <= height - h and 0 <= left <= width - w
        if width / height > 4 * hi or height / width > 4 / lo:  # no draw fits: the clamped centre fallback
            assert (top, left) == ((height - h) // 2, (width - w) // 2)
            assert lo - 0.05 <= w / h <= hi + 0.05


def test_random_resized_crop_draws_area_and_ratio():
    rng = random.Random(0)
    areas, ratios = [], []
    for _ in range(2000):
        _, _, h, w = random_resized_crop(rng, 400, 400)
        areas.append(h * w / 160000)
        ratios.append(math.log(w / h))
    # Rounding to whole pixels moves the bounds a little; the draws cover the range.
    assert 0.07 <= min(areas) < 0.12 and max(areas) > 0.9
    assert min(ratios) < math.log(0.8) and max(ratios) > math.log(1.25)
    assert all(math.log(0.74) <= r <= math.log(1.35) for r in ratios)


def test_select_by_name_family_and_task(pipelines):
    assert pipelines.select(None) == list(pipelines.CONTENDERS)
    assert pipelines.select("bert") == ["bert-dlstore-none", "bert-dlstore-block", "bert-dlstore-global", "bert-dali",
                                        "bert-tfdata"]
    assert pipelines.select("dali") == ["resnet50-dali", "bert-dali"]
    assert pipelines.select("resnet50-torch,bert-tfdata") == ["resnet50-torch", "bert-tfdata"]
    with pytest.raises(ValueError, match="unknown nope"):
        pipelines.select("nope")


def test_targets_pass_fail_and_skip():
    def row(family, rate, shuffle=None, status="ok"):
        return {"family": family, "items_per_s": rate, "status": status, "shuffle": shuffle or "buffer 10,000"}

    tables = {"resnet50": [row("dlstore", 2000.0, "none"), row("dlstore", 1900.0, "block"),
                           row("dlstore", 1950.0, "global"), row("dali", 1000.0), row("tfdata", 1700.0),
                           row("torch", 680.0)],
              "bert": [row("dlstore", 500_000.0, "none"), row("dlstore", 300_000.0, "global"), row("dali", 70_000.0),
                       row("tfdata", 50_000.0)]}
    verdicts = targets(tables)
    # bert: global vs DALI, vs its unshuffled read; resnet50: vs unshuffled, DALI, tf.data.
    assert [v["verdict"] for v in verdicts] == ["PASS", "FAIL", "PASS", "PASS", "FAIL"]
    assert verdicts[0]["text"] == "4.29x DALI" and verdicts[1]["value"] == pytest.approx(0.6)
    assert verdicts[4]["value"] == pytest.approx(1950 / 1700)  # against the shuffled peer, not the block row
    tables["resnet50"][2] = row("dlstore", None, "global", status="not available: not built")
    assert targets(tables)[2]["verdict"] == "SKIP (dlstore global not measured)"
    add_ratios(tables["bert"])
    assert tables["bert"][1]["vs_dali"] == pytest.approx(300 / 70)
    assert tables["bert"][1]["vs_none"] == pytest.approx(0.6) and "vs_none" not in tables["bert"][2]


# ---- end to end ------------------------------------------------------------------------------------

def test_pipelines_quick(tmp_path):
    pytest.importorskip("PIL", reason="the synthetic ImageNet-like set needs pillow")
    out, md = tmp_path / "p.json", tmp_path / "p.md"
    r = _run_bench(tmp_path, "pipelines", "--quick", "--json", os.fspath(out), "--markdown", os.fspath(md))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    with open(out) as f:
        doc = json.load(f)
    assert doc["quick"] and doc["cores"] and doc["plans"]["resnet50"]["size"] == "tiny"
    built = _dlstore_pipeline_built()
    mine = [f"dlstore-{s}" for s in ("none", "block", "global")]
    for task, names in (("resnet50", [f"resnet50-{m}" for m in mine] + ["resnet50-dali", "resnet50-tfdata",
                                                                         "resnet50-torch"]),
                        ("bert", [f"bert-{m}" for m in mine] + ["bert-dali", "bert-tfdata"])):
        rows = {row["name"]: row for row in doc["tables"][task]}
        assert list(rows) == names  # every contender keeps its row: measured, not available or failed
        unit = "images" if task == "resnet50" else "samples"
        for name, row in rows.items():
            family = row["family"]
            expected_ok = built if family == "dlstore" else _installed(
                {"dali": "nvidia.dali", "tfdata": "tensorflow", "torch": "torch"}[family])
            # Every row says its shuffle: dlstore's Dataset shuffle, the peers' buffer.
            assert row["shuffle"] == (name.rsplit("-", 1)[1] if family == "dlstore" else "buffer 10,000")
            if expected_ok:  # measured, with batches of the agreed shapes and dtypes
                assert row["status"] == "ok", (name, row["status"])
                # CPU time comes in 10 ms clock ticks: a quick BERT row's timed part can end within one.
                assert row[f"{unit}_per_s"] > 0 and 0 <= row["cpu_ms_per_item"] < 1000
                assert task == "bert" or row["cpu_ms_per_item"] > 0
                assert row["runs"][0]["items"] >= doc["plans"][task]["items"]
            else:
                assert row["status"].startswith("not available: "), (name, row["status"])
    assert all(t["verdict"] in ("PASS", "FAIL") or t["verdict"].startswith("SKIP") for t in doc["targets"])
    assert len(doc["targets"]) == 5 and "verdict" in r.stdout
    text = md.read_text()
    assert "## Targets" in text and "Where the semantics differ" in text and "PyTorch DataLoader + PIL" in text
    # --render writes the same page from the JSON alone.
    again = tmp_path / "again.md"
    r = _run_bench(tmp_path, "pipelines", "--render", os.fspath(out), "--markdown", os.fspath(again))
    assert r.returncode == 0, r.stderr[-2000:]
    assert again.read_text() == text


def test_shuffles_quick(tmp_path):
    """benchmarks/shuffles.py at tiny size: every engine x shuffle x cache state measured, fio beside the
    cold rows, with its targets."""
    pytest.importorskip("PIL", reason="the synthetic ImageNet-like set needs pillow")
    out = tmp_path / "s.json"
    r = _run_bench(tmp_path, "shuffles", "--quick", "--json", os.fspath(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(out.read_text())
    rows = {row["key"]: row for row in doc["rows"]}
    assert len(rows) == 20 and all(row["status"] == "ok" for row in rows.values()), rows
    assert rows["cold/direct/none"]["neighbours"] > 0.9  # unshuffled: consecutive records are neighbours
    assert all(rows[k]["vs_none"] > 0 for k in rows)
    assert all(t["verdict"] in ("PASS", "FAIL") for t in doc["targets"]) and len(doc["targets"]) >= 3
    if doc["fio"]["skipped"] is None:  # fio beside the cold rows, and the targets against it
        keys = {f["key"].split("/")[1] + "/" + f["key"].split("/")[3] for f in doc["fio"]["rows"]}
        assert keys >= {"read/qd1x2", "read/qd4x2", "randread/qd1x2", "randread/qd4x2"}
        assert sum("fio" in t["target"] for t in doc["targets"]) == 6  # direct, io_uring x none, block, global
        # fio's buffers are huge pages, as dlstore's are, unless this process may not allow them (then why)
        for f in doc["fio"]["rows"]:
            assert f["description"].endswith(", huge-page buffers") != bool(f["buffers_notes"]), f
        if os.geteuid() == 0 and os.access("/proc/sys/vm/nr_overcommit_hugepages", os.W_OK):
            assert all(f["description"].endswith(", huge-page buffers") for f in doc["fio"]["rows"])
    assert doc["config"]["verify"] is True
    # --no-verify: the CRCs' cost, measured by leaving them unchecked, and said so on the page
    md = tmp_path / "nv.md"
    r = _run_bench(tmp_path, "shuffles", "--quick", "--no-verify", "--no-fio", "--cache", "cold", "--engines",
                   "direct", "--shuffles", "none", "--json", os.fspath(out), "--markdown", os.fspath(md))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["config"]["verify"] is False and doc["rows"][0]["status"] == "ok"
    assert "CRCs NOT checked (--no-verify)" in md.read_text()


@pytest.mark.slow  # subprocesses
def test_engine_settings_quick(tmp_path):
    """benchmarks/engine_settings.py at tiny size: each setting read through a Dataset with its environment
    variables (the engine says which queue depth it took), fio beside it, ratios against fio's best."""
    doc = _run_cold_bench(tmp_path, "engine_settings")
    rows = doc["rows"]
    dl = {k: v for k, v in rows.items() if v["kind"] == "dlstore"}
    assert len(dl) == 2 and sum(v["kind"] == "fio" for v in rows.values()) == 2
    assert all(v["gb_per_s"] and v["gb_per_s"] > 0 for v in rows.values()), rows
    # The setting reached the Dataset: the engine names the queue depth it was given.
    assert "the queue_depth setting" in dl["dlstore io_uring none: queue_depth=2"]["engine_reason"]
    assert "queue_depth setting" not in dl["dlstore io_uring none: defaults"]["engine_reason"]
    assert doc["best_fio_gb_per_s"] == max(v["gb_per_s"] for v in rows.values() if v["kind"] == "fio")


@pytest.mark.slow  # subprocesses
def test_direct_cache_quick(tmp_path):
    """benchmarks/direct_cache.py at tiny size: direct and io_uring epochs with the setting on and off, cold
    and warm; warm and on, every byte came from the page cache, and never otherwise."""
    pytest.importorskip("PIL", reason="the synthetic ImageNet-like set needs pillow")
    from dlstore.io.pagecache import drop_page_cache_refusal

    if drop_page_cache_refusal():
        pytest.skip(f"direct_cache drops the page cache: {drop_page_cache_refusal()}")
    out = tmp_path / "direct_cache.json"
    r = _run_bench(tmp_path, "direct_cache", "--quick", "--json", os.fspath(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 16 and all(v["median"] > 0 for v in rows.values()), rows
    for key, v in rows.items():
        assert v["from_cache"] == (1.0 if key.startswith("warm") and key.endswith("on") else 0.0), (key, v)


@pytest.mark.slow  # subprocesses
def test_read_footprint_quick(tmp_path):
    """benchmarks/read_footprint.py at tiny size: fio's job, plain O_DIRECT reads into rings of two sizes
    (one staged through a copy), and a Dataset epoch under a chunk-size setting, with ratios to fio."""
    doc = _run_cold_bench(tmp_path, "read_footprint")
    kinds = [v["kind"] for v in doc["rows"].values()]
    assert sorted(kinds) == ["dataset", "fio", "plain", "plain", "staged"], kinds
    assert all(v["gb_per_s"] and v["gb_per_s"] > 0 for v in doc["rows"].values()), doc["rows"]
    plain = sorted(v["footprint_bytes"] for v in doc["rows"].values() if v["kind"] == "plain")
    assert plain == [8 << 20, 64 << 20]
    dataset = next(v for v in doc["rows"].values() if v["kind"] == "dataset")
    assert dataset["chunk_size"] == "2M" and dataset["peak_held_bytes"][0] <= 4 << 20, dataset
    assert doc["fio_gb_per_s"] == next(v["gb_per_s"] for v in doc["rows"].values() if v["kind"] == "fio")


@pytest.mark.slow  # subprocesses
def test_metrics_overhead_quick(tmp_path):
    """benchmarks/metrics_overhead.py at tiny size: BERT and ResNet-50 measured off and on, the exporter
    scraped and the epoch lines taken when on."""
    pytest.importorskip("prometheus_client", reason="the exporter serves through prometheus_client")
    pytest.importorskip("PIL", reason="the synthetic ImageNet-like set needs pillow")
    out = tmp_path / "m.json"
    r = _run_bench(tmp_path, "metrics_overhead", "--quick", "--scrape-interval", "0.05", "--json", os.fspath(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = {row["workload"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"bert", "resnet50"}
    for row in rows.values():
        assert row["off"]["samples_per_s"] > 0 and row["on_vs_off"] > 0 and row["verdict"] in ("PASS", "FAIL")
        on = row["on"]["runs"][0]
        assert on["epoch_lines"] >= 1 and on["stall_line"].startswith("waited for data in ")


def test_a_run_never_overwrites_the_committed_results_unless_saved():
    from benchmarks import _harness

    results = os.path.join(ROOT, "benchmarks", "results")
    assert _harness.results_path("pipelines") == os.path.join(results, "pipelines-latest.json")
    assert _harness.results_path("pipelines", quick=True) == os.path.join(results, "pipelines-quick.json")
    assert _harness.results_path("pipelines", save=True) == os.path.join(results, "pipelines.json")
    assert _harness.results_path("pipelines", json_path="/tmp/x.json") == "/tmp/x.json"
    with pytest.raises(ValueError, match="--quick"):
        _harness.results_path("pipelines", save=True, quick=True)
    with pytest.raises(ValueError, match="--json"):
        _harness.results_path("pipelines", save=True, json_path="/tmp/x.json")
    # What a plain run writes is ignored by git; what --save writes is the committed file.
    names = ("pipelines-latest.json", "shuffles-quick.json", "pipelines.json")
    ignored = [subprocess.run(["git", "check-ignore", "-q", os.path.join(results, n)], cwd=ROOT).returncode
               for n in names]
    if 128 in ignored:
        pytest.skip("not a git checkout: cannot ask git what it ignores")
    assert ignored == [0, 0, 1]


def test_every_script_takes_save(tmp_path):
    for script in ("pipelines", "read_throughput", "shuffles", "direct_sweep", "warm_budget", "mounts",
                   "metrics_overhead", "engine_settings", "read_footprint", "direct_cache"):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", f"{script}.py"), "--help"],
                           capture_output=True, text=True, cwd=ROOT, timeout=120)
        text = "".join(r.stdout.split())  # argparse wraps long names
        assert r.returncode == 0 and "--save" in text and f"{script}-latest.json" in text, script


@pytest.mark.slow  # subprocesses, one under strace
def test_dataset_start_smoke(tmp_path):
    """benchmarks/dataset_start.py at tiny size: a Dataset's start per shuffle, cold and warm, its RSS, the
    manifest's bytes read and (under strace) the stat calls before the first batch; and the page."""
    out, page = tmp_path / "start.json", tmp_path / "start.md"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "dataset_start.py"), "--smoke", "--json",
                        os.fspath(out), "--markdown", os.fspath(page)], capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["shards"] == 12 and set(doc["results"]) == {"block", "global"}
    for result in doc["results"].values():
        assert all(run["batch"] == 4 and run["start_s"] > 0 and run["max_rss_mb"] > 0 for run in result["cold"])
        if shutil.which("strace"):
            assert 0 < result["strace"]["stat_calls_before_first_batch"] < result["strace"]["stat_calls"]
    assert "| block |" in page.read_text() and "Acceptance" in page.read_text()
