"""The `dlstore` command line, run as a user would (a subprocess)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, oracle_tfrecord_bytes, write_tfrecord

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
    assert out.returncode == 1 and "does not look like TFRecord or RecordIO" in out.stdout


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


def test_verify_never_calls_unreported_corruption_ok(tmp_path):
    # More corrupt records than the core keeps reports of (10000): the rest are still counted.
    n = 10_050
    blob = bytearray(oracle_tfrecord_bytes([b"z"] * n))
    for i in range(n):
        blob[i * 17 + 13] ^= 0xFF  # each record's data CRC
    path = tmp_path / "many.tfrecord"
    path.write_bytes(bytes(blob))
    out = dlstore("verify", path, "--quiet")
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    reported = sum(": bad data CRC" in line for line in lines)
    assert 0 < reported < n
    assert f"{path}: {n - reported} more corrupt records were skipped without a detailed report" in lines
    assert lines[-1] == f"CORRUPT: 1 file, 0 good records, {n} corrupt records in 1 file"


def test_verify_reports_an_unreadable_file_and_goes_on(tmp_path, make_unreadable, capsys):
    from dlstore import cli

    write_tfrecord(tmp_path / "a.tfrecord", [b"a"] * 3)
    locked = write_tfrecord(tmp_path / "b.tfrecord", [b"b"])
    write_tfrecord(tmp_path / "c.tfrecord", [b"c"] * 2)
    make_unreadable(locked)
    assert cli.main(["verify", str(tmp_path), "--quiet"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{locked}: cannot read: Permission denied")
    assert lines[-1] == "CORRUPT: 3 files, 5 good records, 0 corrupt records in 0 files, 1 unreadable file"


def test_verify_names_offset_zero(tmp_path):
    # A corrupt first record sits at byte 0, and the message's own digits must not hide it.
    records = [bytes([7]) * 5000, b"next"]
    path = write_tfrecord(tmp_path / "first.tfrecord", records)
    blob = bytearray(open(path, "rb").read())
    blob[100] ^= 0x20
    open(path, "wb").write(bytes(blob))
    out = dlstore("verify", path, "--quiet")
    assert out.returncode == 1
    assert f"{path}: at byte 0: bad data CRC in a record of 5000 bytes" in out.stdout


# ---- a set made and indexed by the CLI, read through the glob the docs show ----------------------

SHARDS, PER_SHARD = 3, 5


@pytest.fixture(scope="module")
def indexed_set(tmp_path_factory):
    pytest.importorskip("PIL", reason="dlstore gen imagenet draws its JPEGs with Pillow")
    out = tmp_path_factory.mktemp("indexed")
    made = dlstore("gen", "imagenet", "--out", out, "--shards", SHARDS, "--records-per-shard", PER_SHARD, "--quiet")
    assert made.returncode == 0, made.stderr
    indexed = dlstore("index", out)
    assert indexed.returncode == 0, indexed.stderr
    assert len(list(out.glob("train-*.idx"))) == SHARDS
    # What else dlstore keeps beside a set: a manifest and a lock file.
    (out / "train.dlstore-manifest").write_text('{"shards": 3}\n')
    (out / ".dlstore-lock").write_text("")
    return out


def test_glob_reads_only_the_shards_of_an_indexed_set(indexed_set):
    import dlstore as ds

    pattern = str(indexed_set / "train-*")
    reader = ds.open_records(pattern)
    assert [os.path.basename(p) for p in reader.paths] == [f"train-{i:05d}-of-{SHARDS:05d}" for i in range(SHARDS)]
    assert reader.count()["records"] == SHARDS * PER_SHARD
    for shuffle in ("global", "block"):  # the first Dataset may write indexes; the second globs beside them
        dataset = ds.Dataset(pattern, shuffle=shuffle, batch_size=1)
        assert len(dataset.shards) == SHARDS
        assert sum(b.num_records for b in dataset.batches()) == SHARDS * PER_SHARD


def test_bench_storage_reads_a_glob_over_an_indexed_set(indexed_set, tmp_path):
    result = tmp_path / "storage.json"
    out = subprocess.run([sys.executable, "-m", "dlstore.bench", "storage", "--data", str(indexed_set / "train-*"),
                          "--cache", "warm", "--repeat", "1", "--no-fio", "--quiet", "--json", str(result)],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(result.read_text())["records"] == SHARDS * PER_SHARD


def test_a_glob_matching_only_indexes_says_so(indexed_set):
    import dlstore as ds

    with pytest.raises(ds.DlstoreError, match=r"no record file matches .*3 index, metadata or temporary files"):
        ds.open_records(str(indexed_set / "*.idx"))


def test_an_index_named_explicitly_is_not_advised_a_format(indexed_set):
    out = dlstore("verify", indexed_set / f"train-00000-of-{SHARDS:05d}.idx", "--quiet")
    assert out.returncode == 1
    assert "does not look like TFRecord or RecordIO" in out.stdout and "format=" not in out.stdout
