"""``dlstore verify --mounts``: every copy of every shard on replica mounts scrubbed at once; each bad copy
listed with its mount, file and offset and the mounts that hold the record good; exit 1 if any, 0 when
clean, 2 on bad usage."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dlstore.sources.indexing import ensure_index
from dlstore.tools.scrub import scrub_mounts
from tests.helpers import REPO, flip_data_byte, write_tfrecord


def _verify(*args):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "dlstore", "verify", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.fixture
def mounts(tmp_path):
    """Three replicated mounts of 6 shards of 30 records each."""
    rng = np.random.default_rng(5)
    data = [[rng.bytes(int(k)) for k in rng.integers(1, 20_000, 30)] for _ in range(6)]
    roots = []
    for m in range(3):
        root = tmp_path / f"mnt{m}"
        root.mkdir()
        for s, recs in enumerate(data):
            write_tfrecord(root / f"part-{s}.tfrecord", recs)
        roots.append(os.fspath(root))
    return roots


# (mount, shard, record) of each planted bad copy: 7 across the 3 mounts; part-4's record 8 is bad on
# every mount.
PLANTED = [(0, 0, 3), (1, 0, 3), (2, 1, 29), (0, 2, 0), (1, 3, 15), (0, 4, 8), (1, 4, 8), (2, 4, 8)]


def _plant(roots):
    frames = {s: ensure_index(os.path.join(roots[0], f"part-{s}.tfrecord"))[1] for s in range(6)}  # undamaged
    out = {}
    for m, s, r in PLANTED:
        path = os.path.join(roots[m], f"part-{s}.tfrecord")
        out[(m, s, r)] = (path, flip_data_byte(path, r, frames[s]))
    return out


def test_the_scrub_finds_every_planted_bad_copy(mounts):
    planted = _plant(mounts)
    proc = _verify("--mounts", *mounts, "--quiet", "--json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert not report["clean"] and report["copies"] == 18
    found = {(b["path"], b["offset"]): b for b in report["bad"]}
    assert set(found) == set(planted.values())  # every planted one, nothing else
    for (m, s, r), key in planted.items():
        bad = found[key]
        assert bad["mount"] == mounts[m] and "CRC" in bad["what"]
        good = {mounts[o] for o in range(3) if (o, s, r) not in planted}
        assert set(bad["good_on"]) == good  # the mounts that hold that record good
    # Text: one line per bad copy naming mount, file and offset, and the verdict.
    proc = _verify("--mounts", *mounts, "--quiet")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert sum("at byte" in line for line in lines) == len(PLANTED)
    assert any("NO good copy" in line and "part-4" in line for line in lines)
    assert lines[-1].startswith("CORRUPT: 18 copies on 3 mounts")


def test_clean_mounts_exit_0_and_shards_can_be_named(mounts):
    proc = _verify("--mounts", *mounts, "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("OK: 18 copies on 3 mounts, 540 good records")
    report = scrub_mounts(mounts, ["part-1.tfrecord", "part-2*"], progress=False)
    assert report.clean and report.copies == 6 and report.records == 180


def test_bad_usage_exits_2(tmp_path, mounts):
    assert _verify().returncode == 2
    proc = _verify("--mounts", mounts[0], tmp_path / "nowhere", "--quiet")
    assert proc.returncode == 2 and "nowhere" in proc.stderr
    assert _verify("--mounts", *mounts, "no-such-*.tfrecord", "--quiet").returncode == 2
    # Shards named after --mounts are taken as mounts: the error says where they go.
    proc = _verify("--mounts", *mounts, "part-1.tfrecord", "--quiet")
    assert proc.returncode == 2 and proc.stderr == (
        "dlstore verify: mount point part-1.tfrecord is not a directory (shard paths and globs go before --mounts, "
        "which takes every argument after it: dlstore verify SHARDS --mounts M1 M2 ...)\n")
    proc = _verify("--mounts", *mounts, tmp_path / "typo", "--quiet")  # a mount mistyped: no hint about shards
    assert proc.returncode == 2 and "shard paths" not in proc.stderr and "typo" in proc.stderr
    proc = _verify("part-1.tfrecord", "--mounts", *mounts, "--quiet")
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1].startswith("OK: 3 copies on 3 mounts"), proc.stdout


def test_a_torn_copy_is_a_bad_copy(mounts):
    """A copy cut short (another size than its replicas) is listed, not refused as a layout problem."""
    path = os.path.join(mounts[1], "part-5.tfrecord")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)
    report = scrub_mounts(mounts, progress=False)
    assert [(b.mount, b.path) for b in report.bad] == [(mounts[1], path)]
    assert "truncated" in report.bad[0].what and set(report.bad[0].good_on) == {mounts[0], mounts[2]}
    assert _verify("--mounts", *mounts, "--quiet").returncode == 1


def test_a_copy_cut_on_a_record_boundary_or_missing_is_found(mounts):
    """A copy cut between two records reads clean, but is not its replicas' bytes (a Dataset refuses such
    mounts): a bad copy named where it ends. A shard with no copy on a mount is said, not failed (a Dataset
    reads a mixed layout from the mounts holding each shard)."""
    path = os.path.join(mounts[1], "part-0.tfrecord")
    cut = int(ensure_index(os.path.join(mounts[0], "part-0.tfrecord"))[1][20])  # record 20 starts here
    whole = os.path.getsize(path)
    os.truncate(path, cut)
    os.remove(os.path.join(mounts[2], "part-3.tfrecord"))
    report = scrub_mounts(mounts, progress=False)
    assert [(b.mount, b.path, b.offset) for b in report.bad] == [(mounts[1], path, cut)]
    assert report.bad[0].what == (f"the copy holds {cut} bytes where {mounts[0]}, {mounts[2]} hold {whole}: "
                                  "cut short (torn), or another file")
    assert report.bad[0].good_on == [mounts[0], mounts[2]]
    assert report.missing == [("part-3.tfrecord", [mounts[2]])] and report.shards == 6
    proc = _verify("--mounts", *mounts, "--quiet")
    assert proc.returncode == 1
    assert "note: 1 of 6 shards have no copy on some mounts" in proc.stdout
    assert "part-3.tfrecord not on " + mounts[2] in proc.stdout
    os.remove(path)  # now only missing copies: said, and clean
    proc = _verify("--mounts", *mounts, "--quiet")
    assert proc.returncode == 0 and "2 of 6 shards have no copy" in proc.stdout


def test_a_gzip_copy_broken_at_its_trailer_counts_the_records_before_it(tmp_path):
    # As verify does for one file: the 40 records read before zlib found the damage are good ones.
    import gzip

    from tests.helpers import oracle_tfrecord_bytes

    blob = gzip.compress(oracle_tfrecord_bytes([bytes([i]) * 300 for i in range(40)]))
    broken = bytearray(blob)
    broken[-6] ^= 0xFF  # the trailer's CRC-32
    for m, data in (("m0", blob), ("m1", bytes(broken))):
        (tmp_path / m).mkdir()
        (tmp_path / m / "s.tfrecord.gz").write_bytes(data)
    proc = _verify("s.tfrecord.gz", "--mounts", tmp_path / "m0", tmp_path / "m1", "--quiet")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert "incorrect data check" in lines[0] and lines[0].endswith(f"good copy on {tmp_path / 'm0'}")
    assert lines[-1].startswith("CORRUPT: 2 copies on 2 mounts, 80 good records, 1 bad copy")
