"""``benchmarks/mlperf_vs_dlio.py``: its page from the committed results, its options, and a tiny run
beside DLIO where DLIO's venv is named (``DLSTORE_DLIO_VENV``: the run drops the page cache)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO as ROOT

pytestmark = pytest.mark.slow  # subprocesses
SCRIPT = os.path.join(ROOT, "benchmarks", "mlperf_vs_dlio.py")
RESULTS = os.path.join(ROOT, "benchmarks", "results", "mlperf_vs_dlio.json")


def test_render_of_the_committed_results_has_every_count_and_the_accounting(tmp_path):
    md = tmp_path / "page.md"
    r = subprocess.run([sys.executable, SCRIPT, "--render", RESULTS, "--markdown", os.fspath(md)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    page = md.read_text()
    with open(RESULTS) as f:
        doc = json.load(f)
    assert [row["accelerators"] for row in doc["rows"]] == [1, 2, 3, 4]
    assert all(row["records_equal"] == "yes" for row in doc["rows"])
    for words in ("DLIO AU %", "dlstore AU %", "barrier", "dropped before every run", "io engine", "load average"):
        assert words in page


def test_help_names_save_and_the_results_file():
    r = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    text = "".join(r.stdout.split())
    assert r.returncode == 0 and "--save" in text and "mlperf_vs_dlio-latest.json" in text


@pytest.mark.root
def test_tiny_run_beside_dlio(tmp_path):
    venv = os.environ.get("DLSTORE_DLIO_VENV")
    if not venv:
        pytest.skip("DLSTORE_DLIO_VENV names no venv with DLIO (benchmarks/mlperf_vs_dlio.py --install-dlio VENV)")
    if os.geteuid() != 0 or shutil.which("mpirun") is None or shutil.which("tfrecord2idx") is None:
        pytest.skip("needs root (drop_caches), mpirun and DALI's tfrecord2idx")
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, SCRIPT, "--dlio-venv", venv, "--data", os.fspath(tmp_path / "data"),
                        "--generate-dlio", "--files", "2", "--records-per-file", "1024", "--accelerators", "1,2",
                        "--repeat", "1", "--json", os.fspath(out)], capture_output=True, text=True, cwd=ROOT,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert [row["samples_per_rank"] for row in doc["rows"]] == [[2000], [800, 800]]  # floor(2048/400/n) x 400
    assert all(row["records_equal"] == "yes" and row["dlio_au_pct"] > 0 and row["dlstore_au_pct"] > 0
               for row in doc["rows"])
