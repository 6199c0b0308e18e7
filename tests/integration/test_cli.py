"""The `dlstore` command line, run as a user would (a subprocess)."""
import os
import subprocess
import sys

import numpy as np

from tests.conftest import write_tfrecord

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def dlstore(*args):
    return subprocess.run([sys.executable, "-m", "dlstore", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def test_verify_names_each_corrupt_offset(tmp_path):
    records = [bytes([i]) * 1000 for i in range(100)]
    good = write_tfrecord(tmp_path / "good.tfrecord", records)
    blob = bytearray(open(good, "rb").read())
    blob[30 * 1016 + 500] ^= 0x01  # one flipped byte in record 30's data
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(bytes(blob))
    ok = dlstore("verify", good, "--quiet")
    assert ok.returncode == 0 and "OK" in ok.stdout
    out = dlstore("verify", tmp_path, "--quiet")
    assert out.returncode == 1
    assert f"{bad}: at byte {30 * 1016}: bad data CRC" in out.stdout
    assert "1 corrupt record in 1 file" in out.stdout


def test_verify_reports_unreadable_files(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"definitely not records")
    out = dlstore("verify", junk, "--quiet")
    assert out.returncode == 1 and "cannot tell the record format" in out.stdout


def test_index_writes_offset_size_lines(tmp_path):
    rng = np.random.default_rng(0)
    records = [rng.bytes(int(n)) for n in rng.integers(0, 500, 20)]
    path = write_tfrecord(tmp_path / "a.tfrecord", records)
    out = dlstore("index", path)
    assert out.returncode == 0, out.stderr
    lines = open(path + ".idx").read().splitlines()
    offsets = np.cumsum([0] + [16 + len(r) for r in records])
    assert lines == [f"{o} {16 + len(r)}" for o, r in zip(offsets[:-1].tolist(), records)]


def test_missing_path_is_a_clear_error(tmp_path):
    out = dlstore("verify", tmp_path / "nope")
    assert out.returncode == 2 and "no such file" in out.stderr
