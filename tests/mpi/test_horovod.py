"""Horovod for real: ``horovodrun --gloo -np 2`` over dlstore, every record read exactly once across the
two ranks, and the Horovod example at tiny size. Skipped, saying why, when Horovod is not built
(``bash examples/install_horovod.sh`` builds it from source; see examples/README.md)."""
from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.mpi.test_mpi import _write

pytestmark = [pytest.mark.mpi, pytest.mark.slow]  # slow: launches horovodrun
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def _horovodrun() -> str:
    try:
        import horovod.torch  # noqa: F401
    except ImportError as e:
        pytest.skip(f"horovod.torch does not import ({e}); build it with bash examples/install_horovod.sh")
    exe = shutil.which("horovodrun") or os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if not os.path.exists(exe):
        pytest.skip("horovod imports but its launcher horovodrun is not on PATH")
    return exe


def _launch(np_: int, *command, tmp_path, timeout=300) -> str:
    # Gloo rendezvous: Open MPI 5 is not a launcher horovodrun can drive (its --mpi checks the
    # version string), and Gloo needs nothing but the processes.
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               DLSTORE_CACHE=os.fspath(tmp_path / "cache"), OMP_NUM_THREADS="1")
    for name in list(env):  # a launcher around pytest must not leak into the ranks
        if name.startswith(("OMPI_", "PMI_", "PMIX_", "HOROVOD_")):
            del env[name]
    cmd = [_horovodrun(), "--gloo", "-np", str(np_), "-H", f"localhost:{np_}", sys.executable, *command]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_two_horovod_ranks_read_every_record_exactly_once(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "out").mkdir()
    everything = _write(tmp_path / "data")
    _launch(2, os.path.join(HERE, "horovod_exactly_once.py"), os.fspath(tmp_path / "data"),
            os.fspath(tmp_path / "out"), tmp_path=tmp_path)
    ranks = []
    for r in range(2):
        with open(tmp_path / "out" / f"rank-{r}.json") as f:
            ranks.append(json.load(f))
    assert [x["rank"] for x in ranks] == [0, 1] and all(x["size"] == 2 for x in ranks)
    # dlstore alone finds the same world in Horovod's Gloo launcher's variables.
    assert [x["launcher"] for x in ranks] == [[0, 2, "horovod"], [1, 2, "horovod"]]
    assert len(ranks[0]["seen"]) == 8  # 4 shuffles x 2 epochs
    for key in ranks[0]["seen"]:
        mine, theirs = ranks[0]["seen"][key], ranks[1]["seen"][key]
        assert mine and theirs, key  # both ranks read something
        assert collections.Counter(mine + theirs) == collections.Counter(everything), key
        assert not set(mine) & set(theirs), key


def test_horovod_example_trains_two_ranks(tmp_path):
    pytest.importorskip("torch")
    text = _launch(2, "examples/horovod_resnet50.py", "--steps", "2", "--batch-size", "2", "--image-size", "32",
                   tmp_path=tmp_path)
    shares = dict(re.findall(r"\[rank (\d)/2\] Horovod rank \d of 2 \(local \d of 2\); reads (consumer \d of 2.*)",
                             text))
    assert sorted(shares) == ["0", "1"] and shares["0"] != shares["1"], text
    sums = re.findall(r"\[rank \d/2\] done: 2 steps, 4 images .* parameter checksum (-?\d+\.\d+)", text)
    assert len(sums) == 2 and sums[0] == sums[1], text  # the averaged steps leave the same weights
