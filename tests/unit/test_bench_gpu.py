"""``python -m dlstore.bench storage --io gds``, ``storage --device cuda:0`` and ``resnet50`` / ``bert
--device cuda:0`` where they cannot run: exit 2 with one line naming what is missing, before any data is
generated; and ``storage`` and ``bert --device`` through the GPU stand-ins (the ``gpu_libraries``
fixture): the header's and the JSON's device fields, the loader synchronized at the end of each timed
step, a staging buffer per reader thread, and no kvikio reference read without kvikio."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

# Every scenario's module imported before a test patches storage.dataset_paths: pipeline_bench takes
# its own reference to it when first imported, and would keep the patched one.
from dlstore.bench import pipeline_bench, storage
from dlstore.bench.__main__ import main
from dlstore.bench.steps import run_steps
from dlstore.io import cuda
from dlstore.pipeline.loader import Loader
from tests.helpers import REPO

NO_DRIVER = cuda.CudaFacts(driver_error="no CUDA driver (libcuda.so.1 cannot be loaded)",
                           kvikio_error="kvikio is not installed", cupy_error="cupy is not installed")


@pytest.mark.parametrize("args, line", [
    (["--io", "gds"], "io='gds' cannot run: no CUDA driver"),
    (["--device", "cuda:0"], "device='cuda:0' needs a CUDA GPU and CuPy: no CUDA driver"),
    (["--io", "direct", "--device", "cuda:0"], "device='cuda:0' needs a CUDA GPU and CuPy: no CUDA driver"),
    (["--device", "gpu"], "device must be 'cpu', 'cuda', 'cuda:N' or 'cuda:local'"),
    # cpu asks for host memory: it read into cuda:0
    (["--io", "gds", "--device", "cpu"], "io='gds' reads into GPU memory, but device='cpu' asks for host memory"),
])
def test_gpu_requests_without_a_gpu_exit_2_with_the_reason(monkeypatch, capsys, args, line):
    monkeypatch.setattr(cuda, "cuda_facts", lambda init=False: NO_DRIVER)
    monkeypatch.setattr(storage, "dataset_paths", lambda *a, **k: pytest.fail("data generated before the check"))
    assert main(["storage", "--size", "tiny", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m dlstore.bench storage: {line}") and err.count("\n") == 1


def test_bench_gds_here_exits_2_without_a_traceback():
    verdict = cuda.gds_verdict(cuda.cuda_facts())
    if verdict.runs:
        pytest.skip(f"gds can run on this machine ({verdict.reason})")
    done = subprocess.run([sys.executable, "-m", "dlstore.bench", "storage", "--io", "gds", "--size", "tiny"],
                          capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), timeout=120)
    assert done.returncode == 2
    assert done.stderr == f"python -m dlstore.bench storage: {verdict.missing}\n"
    assert "Traceback" not in done.stderr and done.stdout == ""


# ---- bench resnet50 / bert --device -------------------------------------------------------------------

@pytest.mark.parametrize("scenario", ["resnet50", "bert"])
@pytest.mark.parametrize("facts, device, line", [
    (NO_DRIVER, "cuda:0", "device='cuda:0' needs a CUDA GPU and CuPy: no CUDA driver (libcuda.so.1 cannot be loaded)"),
    (cuda.CudaFacts(driver="13.0", devices=["GPU"], cupy_error="cupy is not installed"), "cuda:0",
     "device='cuda:0' needs a CUDA GPU and CuPy: cupy is not installed"),
    (cuda.CudaFacts(driver="13.0", devices=["GPU"], cupy="13.6"), "cuda:1",
     "device='cuda:1' needs a CUDA GPU and CuPy: no CUDA device 1 (the driver sees 1)"),
    (NO_DRIVER, "gpu", "device must be 'cpu', 'cuda', 'cuda:N' or 'cuda:local', not 'gpu'"),
])
def test_pipeline_bench_device_without_a_gpu_exits_2_before_any_data(monkeypatch, capsys, scenario, facts, device,
                                                                     line):
    monkeypatch.setattr(cuda, "cuda_facts", lambda init=False: facts)
    monkeypatch.setattr(pipeline_bench, "dataset_paths", lambda *a, **k: pytest.fail("data generated before the check"))
    assert main([scenario, "--size", "tiny", "--device", device]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"python -m dlstore.bench {scenario}: {line}\n" and captured.out == ""


def test_bench_bert_device_here_exits_2_without_a_traceback(tmp_path):
    facts = cuda.cuda_facts()
    missing = cuda.device_missing(facts) or (facts.cupy_error if facts.cupy is None else "")
    if not missing:
        pytest.skip("this machine has a CUDA device and CuPy")
    cache = tmp_path / "cache"
    done = subprocess.run([sys.executable, "-m", "dlstore.bench", "bert", "--size", "tiny", "--device", "cuda:0"],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env=dict(os.environ, PYTHONPATH=REPO, DLSTORE_CACHE=os.fspath(cache)))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"python -m dlstore.bench bert: device='cuda:0' needs a CUDA GPU and CuPy: {missing}\n"
    assert not cache.exists()  # no data generated


class Clock:
    """A clock that logs each reading beside the loader's synchronize calls."""

    def __init__(self, log):
        self.log, self.t = log, 0.0

    def __call__(self):
        self.t += 1.0
        self.log.append("clock")
        return self.t


class SyncedBatches:
    """Batches with a ``synchronize``, as a GPU loader has."""

    def __init__(self, n, log):
        self.n, self.log = n, log

    def __iter__(self):
        for _ in range(self.n):
            self.log.append("batch")
            yield np.zeros(4)

    def synchronize(self):
        self.log.append("synchronize")


def test_run_steps_synchronizes_a_gpu_loader_before_each_step_ends():
    log = []
    out = run_steps(SyncedBatches(5, log), [2, 2, 2], clock=Clock(log), cpu_ticks=lambda: [])
    assert [s["batches"] for s in out["steps"]] == [2, 2, 1]
    # clock (start), then per step: its batches, synchronize, clock (its end)
    assert log == ["clock"] + ["batch", "batch", "synchronize", "clock"] * 2 + ["batch", "synchronize", "clock"]


def test_bench_bert_on_a_stand_in_gpu_reports_the_device_and_synchronizes_each_step(tmp_path, monkeypatch, capsys,
                                                                                    gpu_libraries):
    monkeypatch.setenv("DLSTORE_CACHE", os.fspath(tmp_path / "cache"))
    monkeypatch.setenv("DLSTORE_NO_PROGRESS", "1")
    synced = []
    real_sync = Loader.synchronize

    def counting_sync(self):
        synced.append(self.device)
        real_sync(self)

    monkeypatch.setattr(Loader, "synchronize", counting_sync)
    out = tmp_path / "b.json"
    assert main(["bert", "--size", "tiny", "--tiers", "page-cache", "--steps", "3", "--device", "cuda:0",
                 "--quiet", "--json", os.fspath(out)]) == 0
    stdout = capsys.readouterr().out
    header = [line.split(None, 1)[1] for line in stdout.splitlines() if line.startswith("device ")]
    assert header == ["cuda:0 (stand-in GPU): batches in pinned memory, copied to cuda:0 on a stream; "
                      "host buffers pinned (cuMemHostRegister)"]
    with open(out) as f:
        doc = json.load(f)
    config = doc["config"]
    assert (config["device"], config["device_name"], config["pinned"]) == ("cuda:0", "stand-in GPU", True)
    assert config["device_path"] == "batches in pinned memory, copied to cuda:0 on a stream"
    tier = doc["tiers"][0]
    stats = tier["loader_stats"]
    assert stats["device"] == "cuda:0" and stats["device_copies"] >= tier["batches"] and stats["pinned"]["buffers"]
    assert synced == ["cuda:0"] * len(tier["step_details"]) and len(synced) == 3
    assert any(entry[0] == "event synchronize" for entry in gpu_libraries.cupy.log)
    assert gpu_libraries.driver.registered == {}  # every pinned buffer unregistered when its loader went


def test_bench_storage_device_header_shares_the_device_fields(gpu_libraries):
    from dlstore.bench import sysinfo

    host = storage.delivery_fields("direct", 0)
    assert host == {"device": "cuda:0", "device_name": "stand-in GPU", "pinned": True,
                    "device_path": "host batches staged in pinned memory, then copied to the GPU"}
    assert storage.delivery_fields("gds", 0)["pinned"] is False
    assert sysinfo.device_row(host)[1].startswith("cuda:0 (stand-in GPU): host batches staged")
    assert sysinfo.device_fields(None) == {"device": "cpu", "device_name": None,
                                           "device_path": "batches in host memory", "pinned": False}


def test_the_mpi_line_says_where_each_ranks_batches_go():
    from dlstore.bench.pipeline_bench import _ranks_devices

    assert _ranks_devices(None, "cpu") == ""
    assert "each onto the GPU numbered as its local rank (rank 0: cuda:0)" in _ranks_devices("cuda:local", "cuda:0")
    assert _ranks_devices("cuda:1", "cuda:1").startswith(", all onto cuda:1 (--device cuda:local")


def test_storage_device_without_kvikio_runs_and_says_there_is_no_kvikio_reference(tmp_path, monkeypatch, capsys,
                                                                                    gpu_libraries):
    # --io direct --device needs CuPy, not kvikio: it imported kvikio for its reference read and failed.
    from dlstore.io.cuda import CudaFacts
    from tests.helpers import write_tfrecord

    monkeypatch.setitem(__import__("sys").modules, "kvikio", None)  # import kvikio raises ImportError
    facts = CudaFacts(**dict(gpu_libraries.facts.as_dict(), kvikio=None, kvikio_error="kvikio is not installed"))
    monkeypatch.setattr(cuda, "cuda_facts", lambda init=False: facts)
    data = write_tfrecord(tmp_path / "a.tfrecord", [bytes(100)] * 50)
    out = tmp_path / "s.json"
    assert main(["storage", "--data", os.fspath(data), "--io", "buffered", "--device", "cuda:0", "--cache", "warm",
                 "--repeat", "1", "--no-fio", "--quiet", "--json", os.fspath(out)]) == 0
    captured = capsys.readouterr()
    assert "warm  into cuda:0: host batches staged in pinned memory, then copied to the GPU; no kvikio reference " \
           "read (kvikio is not installed)" in captured.out
    assert "note: no kvikio reference read (kvikio is not installed)" in captured.err
    with open(out) as f:
        doc = json.load(f)
    assert doc["kvikio_skipped"] == "kvikio is not installed" and doc["kvikio_gb_per_s"] is None
    assert doc["records"] == 50


def test_pinned_copy_sink_gives_each_reader_thread_its_own_staging_buffer(gpu_libraries):
    import threading

    sink = storage.pinned_copy_sink(0, 4096)
    arrived = threading.Barrier(3)
    batches = [np.full(1000 + i, i, dtype=np.uint8) for i in range(3)]

    def reader(batch):
        arrived.wait()  # all three inside the sink's reach at once
        sink(batch)

    threads = [threading.Thread(target=reader, args=(b,)) for b in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = sink.pool.stats()
    assert stats["in_use"] == 3 and stats["buffers"] == 3  # not one buffer shared by three threads
    sets = [e for e in gpu_libraries.cupy.log if e[0] == "set"]
    assert sorted(e[3] for e in sets) == [1000, 1001, 1002] and len({e[1] for e in sets}) == 3  # own streams


def test_the_dali_install_hint_names_the_cuda_13_package(monkeypatch):
    from dlstore.adapters import dali

    monkeypatch.setitem(__import__("sys").modules, "nvidia.dali", None)
    with pytest.raises(ImportError, match=r"pip install nvidia-dali-cuda130 \(or the build for your CUDA\)"):
        dali.dali_pipeline(["x"], 2)
