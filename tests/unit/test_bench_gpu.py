"""``python -m dlstore.bench storage --io gds`` and ``--device cuda:0`` where they cannot run: exit 2
with one line naming what is missing, before any data is generated."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dlstore.bench.__main__ import main
from dlstore.io import cuda
from tests.helpers import REPO

NO_DRIVER = cuda.CudaFacts(driver_error="no CUDA driver (libcuda.so.1 cannot be loaded)",
                           kvikio_error="kvikio is not installed", cupy_error="cupy is not installed")


@pytest.mark.parametrize("args, line", [
    (["--io", "gds"], "io='gds' cannot run: no CUDA driver"),
    (["--device", "cuda:0"], "device='cuda:0' needs a CUDA GPU and CuPy: no CUDA driver"),
    (["--io", "direct", "--device", "cuda:0"], "device='cuda:0' needs a CUDA GPU and CuPy: no CUDA driver"),
    (["--device", "gpu"], "device must be 'cpu', 'cuda' or 'cuda:N'"),
])
def test_gpu_requests_without_a_gpu_exit_2_with_the_reason(monkeypatch, capsys, args, line):
    monkeypatch.setattr(cuda, "cuda_facts", lambda: NO_DRIVER)
    import dlstore.bench.storage as storage

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
