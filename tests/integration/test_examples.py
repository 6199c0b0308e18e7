"""Every script in examples/ runs, at tiny size: one or two CPU training steps each, as a user runs them.

The scripts find their default data through ``dlstore.synthetic.cached_dataset``; here the cache is a
temporary directory (``DLSTORE_CACHE``), so the tiny sets are made afresh and nothing of the user's
is touched. Small images (``--image-size``) and batches keep the whole file near a minute.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow  # runs the examples in subprocesses, TensorFlow and torch among them
EXAMPLES = os.path.join(REPO, "examples")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("dlstore-cache")
    out = dict(os.environ, PYTHONPATH=REPO, DLSTORE_CACHE=str(cache), OMP_NUM_THREADS="1",
               TF_CPP_MIN_LOG_LEVEL="2")
    # A launcher's variables around pytest must not make a single-process example think it has ranks.
    launcher = ("OMPI_", "PMI_", "PMIX_", "SLURM_", "HOROVOD_", "POPDIST_", "MV2_")
    for name in list(out):
        if name.startswith(launcher) or name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            del out[name]
    return out


def run(env, *args, timeout=240):
    out = subprocess.run(list(args), cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, (f"exit {out.returncode}\n--- stdout\n{out.stdout[-3000:]}\n"
                                 f"--- stderr\n{out.stderr[-3000:]}")
    return out.stdout


def test_pytorch_resnet50(env):
    pytest.importorskip("torch")
    text = run(env, sys.executable, "examples/pytorch_resnet50.py", "--steps", "2", "--batch-size", "2",
               "--image-size", "32", "--workers", "2")
    assert "split among 2 DataLoader workers" in text
    assert re.search(r"step 2 epoch 0 loss \d+\.\d+ images \(2, 3, 32, 32\)", text), text
    assert "done: 2 steps, 4 images" in text


def test_pytorch_bert(env):
    pytest.importorskip("torch")
    text = run(env, sys.executable, "examples/pytorch_bert.py", "--steps", "2", "--batch-size", "4")
    losses = re.findall(r"step \d+ loss (\d+\.\d+) \(mlm (\d+\.\d+), nsp (\d+\.\d+)\)", text)
    assert len(losses) == 2, text
    assert all(float(mlm) > 0 and float(nsp) > 0 for _, mlm, nsp in losses)
    assert "done: 2 steps, 8 sequences" in text


def test_keras_resnet50(env):
    pytest.importorskip("tensorflow")
    text = run(env, sys.executable, "examples/keras_resnet50.py", "--steps", "2", "--batch-size", "2",
               "--image-size", "64", "--eager")
    assert "TensorSpec(shape=(2, 64, 64, 3), dtype=tf.uint8, name='image')" in text
    assert "done: 2 steps of 2 images" in text


@pytest.mark.mpi
def test_mpirun_four_ranks(env):
    """mpirun -np 4: each rank detects itself from Open MPI's variables, reads its own records, and the
    averaged gradients leave the same weights on every rank."""
    pytest.importorskip("torch")
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun (Open MPI) is not installed")
    pytest.importorskip("mpi4py", reason="mpi4py is not installed")
    text = run(env, mpirun, "-np", "4", "--oversubscribe", "--allow-run-as-root", "-x", "PYTHONPATH", "-x",
               "DLSTORE_CACHE", "-x", "OMP_NUM_THREADS", sys.executable, "examples/pytorch_resnet50.py",
               "--steps", "1", "--batch-size", "2", "--image-size", "32", timeout=300)
    shares = dict(re.findall(r"\[rank (\d)/4\] reads consumer \d of 4: (.*)", text))
    assert sorted(shares) == ["0", "1", "2", "3"] and len(set(shares.values())) == 4, text
    detected = [line for line in text.splitlines() if "gradients averaged with: mpi" in line]
    assert len(detected) == 4 and all("from Open MPI" in line for line in detected), text
    checksums = re.findall(r"\[rank \d/4\] done: .* parameter checksum (\S+)", text)
    assert len(checksums) == 4 and len(set(checksums)) == 1, text


def test_code_is_ruff_clean():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it is in the [test] extra: pip install -e '.[test]')")
    out = subprocess.run([ruff, "check", "dlstore", "tests", "benchmarks", EXAMPLES], cwd=REPO, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_pytorch_resnet50_with_metrics(env):
    pytest.importorskip("torch")
    pytest.importorskip("prometheus_client")
    text = run(env, sys.executable, "examples/pytorch_resnet50.py", "--steps", "2", "--batch-size", "2",
               "--image-size", "32", "--metrics-port", "0")
    assert re.search(r"metrics: serving on http://0\.0\.0\.0:\d+/metrics", text), text
    assert re.search(r"input over the run: waited for data in \d+% of 2 steps: storage \d+%, decode \d+%", text), text


def test_grafana_dashboard_plots_series_the_exporter_serves(tmp_path):
    """Every series the dashboard queries is one a loader exports (checked against a scrape of a live one)."""
    import json

    pytest.importorskip("prometheus_client")
    from dlstore import metrics
    from dlstore.pipeline import bert_loader
    from dlstore.synthetic import generate_bert

    with open(os.path.join(EXAMPLES, "grafana", "dlstore-input.json")) as f:
        board = json.load(f)
    queried = {name for panel in board["panels"] for target in panel["targets"]
               for name in re.findall(r"\bdlstore_\w+", target["expr"])}
    generate_bert(str(tmp_path), shards=1, records_per_shard=8, progress=False)
    loader = bert_loader(str(tmp_path), batch_size=4)
    assert sum(1 for _ in loader) == 2
    served = set(re.findall(r"^(dlstore_\w+)", metrics.exposition(), re.M))
    assert len(queried) >= 9 and queried <= served, sorted(queried - served)
    labels = {label for panel in board["panels"] for target in panel["targets"]
              for label in re.findall(r"by \(([^)]*)\)", target["expr"])}
    assert {name.strip() for group in labels for name in group.split(",")} <= {"rank", "mount", "cause", "stage", "le"}
