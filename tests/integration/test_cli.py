"""The `dlstore` command line, run as a user would (a subprocess)."""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import REPO, oracle_tfrecord_bytes, write_tfrecord

def dlstore(*args):
    return subprocess.run([sys.executable, "-m", "dlstore", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def test_verify_names_each_corrupt_offset(tmp_path):
    records = [bytes([i]) * 1000 for i in range(100)]
    good = write_tfrecord(tmp_path / "good.tfrecord", records)
    blob = bytearray(Path(good).read_bytes())
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
    lines = Path(path + ".idx").read_text().splitlines()
    offsets = np.cumsum([0] + [16 + len(r) for r in records])
    assert lines == [f"{o} {16 + len(r)}" for o, r in zip(offsets[:-1].tolist(), records)]


def test_index_of_a_directory_indexes_every_good_shard_and_names_each_bad_one(tmp_path):
    # It stopped at the first corrupt shard, leaving the shards after it without an index or manifest.
    write_tfrecord(tmp_path / "a.tfrecord", [b"a" * 100] * 10)
    bad = write_tfrecord(tmp_path / "b.tfrecord", [b"b" * 100] * 10)
    write_tfrecord(tmp_path / "c.tfrecord", [b"c" * 100] * 10)
    blob = bytearray(Path(bad).read_bytes())
    blob[116 + 14] ^= 0xFF  # the data of the second record
    Path(bad).write_bytes(bytes(blob))
    out = dlstore("index", tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"dlstore index: {bad}: at byte 116: bad data CRC in a record of 100 bytes")
    assert lines[1] == "dlstore index: 1 file of 3 not indexed (above); `dlstore verify` lists every problem"
    assert (tmp_path / "a.tfrecord.idx").exists() and (tmp_path / "c.tfrecord.idx").exists()
    assert not (tmp_path / "b.tfrecord.idx").exists()
    assert f"manifest: {tmp_path / '.dlstore-manifest'}" in out.stdout


def test_index_of_a_file_named_twice_indexes_it_once(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", [b"a"] * 3)
    out = dlstore("index", path, tmp_path / "*.tfrecord", tmp_path / "." / "a.tfrecord")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(" records -> ") == 1
    out = dlstore("verify", path, tmp_path / "." / "a.tfrecord", "--quiet")
    assert out.stdout.splitlines()[-1].startswith("OK: 1 file, 3 good records")


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
    assert lines[-1] == "UNREADABLE: 3 files, 5 good records, 0 corrupt records in 0 files, 1 unreadable file"


def test_verify_reports_a_file_that_does_not_answer_and_goes_on(tmp_path, monkeypatch, capsys):
    """A file whose first bytes never come (a stalled mount) is reported after read_timeout; the others are
    checked. Before, verify waited for as long as the mount stalled."""
    import builtins
    import threading

    from dlstore import cli

    write_tfrecord(tmp_path / "a.tfrecord", [b"a"] * 3)
    hung = write_tfrecord(tmp_path / "b.tfrecord", [b"b"])
    gate, real = threading.Event(), builtins.open

    def stalled(path, *args, **kwargs):
        if os.fspath(path) == hung:
            gate.wait(60)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", stalled)
    monkeypatch.setenv("DLSTORE_READ_TIMEOUT", "0.5")
    try:
        assert cli.main(["verify", str(tmp_path), "--quiet"]) == 1
    finally:
        gate.set()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{hung}: no answer to a read in ") and "`dlstore verify`" in lines[0]
    assert lines[-1] == "UNREADABLE: 2 files, 3 good records, 0 corrupt records in 0 files, 1 unreadable file"


def test_verify_counts_the_good_records_before_a_broken_gzip_stream(tmp_path):
    # A gzip shard whose trailer CRC is wrong: its 40 records were read and checked before zlib found
    # it. They count, the file is called damaged (not unreadable), and the message says where zlib
    # stopped in the compressed file (it said "compressed byte 0": where the last inflate call began).
    import gzip

    blob = gzip.compress(oracle_tfrecord_bytes([bytes([i]) * 300 for i in range(40)]))
    broken = bytearray(blob)
    broken[-6] ^= 0xFF  # in the CRC-32 of the trailer (CRC-32, then the length, 4 bytes each)
    path = tmp_path / "cut.tfrecord.gz"
    path.write_bytes(bytes(broken))
    write_tfrecord(tmp_path / "ok.tfrecord", [b"x"] * 3)
    out = dlstore("verify", tmp_path, "--quiet")
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert lines[0] == (f"{path}: at byte {40 * 316}: corrupt compressed data, found at compressed byte "
                        f"{len(blob) - 4} of the file: incorrect data check; the rest of the file cannot be read")
    assert lines[-1] == "CORRUPT: 2 files, 43 good records, 0 corrupt records in 0 files, 1 file unreadable past damage"


def test_verify_names_offset_zero(tmp_path):
    # A corrupt first record sits at byte 0, and the message's own digits must not hide it.
    records = [bytes([7]) * 5000, b"next"]
    path = write_tfrecord(tmp_path / "first.tfrecord", records)
    blob = bytearray(Path(path).read_bytes())
    blob[100] ^= 0x20
    Path(path).write_bytes(bytes(blob))
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


# ---- mistakes are one line, exit 2, never a traceback ---------------------------------------------

def _one_line_error(out, status=2):
    assert out.returncode == status, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    assert len(out.stderr.splitlines()) == 1, out.stderr
    return out.stderr


def _bench_plot(*args):
    return subprocess.run([sys.executable, "-m", "dlstore.bench.plot", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, timeout=300)


def test_gen_bert_at_seq_384_is_read_by_the_bert_pipeline_at_384(tmp_path):
    # gen wrote 20 masked-LM slots whatever --seq-len, and the pipeline at 384 expects 60 (its preset):
    # a set made by `gen bert --seq-len 384` could not be read at 384.
    from dlstore.pipeline import bert_loader

    out = tmp_path / "b384"
    assert dlstore("gen", "bert", "--out", out, "--shards", 1, "--records-per-shard", 8, "--seq-len", 384,
                   "--quiet").returncode == 0
    batches = list(bert_loader(os.fspath(out), batch_size=4, seq_len=384))
    assert len(batches) == 2 and batches[0]["masked_lm_positions"].shape == (4, 60)
    out = tmp_path / "b384x"
    assert dlstore("gen", "bert", "--out", out, "--shards", 1, "--records-per-shard", 4, "--seq-len", 384,
                   "--max-predictions", 7, "--quiet").returncode == 0
    assert next(iter(bert_loader(os.fspath(out), batch_size=4, seq_len=384, max_predictions=7)))[
        "masked_lm_ids"].shape == (4, 7)


@pytest.mark.slow
def test_gen_refuses_bad_counts_in_one_line(tmp_path):
    for flag in ("--shards", "--records-per-shard"):
        err = _one_line_error(dlstore("gen", "bert", "--out", tmp_path / "x", flag, "-1"))
        assert f"argument {flag}: expected a positive integer, not -1" in err
    assert not (tmp_path / "x").exists()


def test_gen_of_a_set_that_cannot_fit_is_one_line(tmp_path):
    """--records-per-shard 99999999999999 planned its tasks until memory ran out: a 25-line MemoryError."""
    err = _one_line_error(dlstore("gen", "bert", "--out", tmp_path / "g", "--shards", 1, "--records-per-shard",
                                  99999999999999, "--quiet"))
    assert "99,999,999,999,999 records of about 850 B are about" in err and "free: give fewer" in err
    assert not (tmp_path / "g").exists()


def test_gen_into_a_place_that_cannot_hold_a_directory(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    err = _one_line_error(dlstore("gen", "bert", "--out", blocker / "out", "--shards", 1, "--records-per-shard", 1,
                                  "--quiet"))
    assert str(blocker) in err


def test_gen_into_a_directory_of_another_set_is_refused(tmp_path):
    out = tmp_path / "set"
    small = ("--records-per-shard", 2, "--quiet")
    assert dlstore("gen", "bert", "--out", out, "--shards", 2, *small).returncode == 0
    assert dlstore("gen", "bert", "--out", out, "--shards", 2, *small).returncode == 0  # the same set: rewritten
    err = _one_line_error(dlstore("gen", "imagenet", "--out", out, "--shards", 1, *small))
    assert f"{out} already holds 2 record files this run would not overwrite (e.g. part-00000-of-00002)" in err
    assert sorted(os.listdir(out)) == ["part-00000-of-00002", "part-00001-of-00002"]  # nothing written


def test_verify_counts_a_file_named_twice_once(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", [b"a"] * 3)
    out = dlstore("verify", path, path, tmp_path, "--quiet")
    assert out.returncode == 0 and "OK: 1 file, 3 good records" in out.stdout


def test_a_format_the_files_are_not_is_a_usage_error_not_corrupt_files(tmp_path):
    """--format recordio over TFRecord files (and the reverse) called every file CORRUPT, exit 1."""
    from dlstore import RecordIOWriter

    tf = write_tfrecord(tmp_path / "a.tfrecord", [b"a"] * 3)
    rec = os.fspath(tmp_path / "b.rec")
    with RecordIOWriter(rec, idx_path=os.fspath(tmp_path / "b.idx")) as w:
        w.write(b"b")
    for path, given, title in ((tf, "recordio", "TFRecord"), (rec, "tfrecord", "RecordIO")):
        out = dlstore("verify", "--format", given, path, "--quiet")
        assert "CORRUPT" not in out.stdout
        assert _one_line_error(out) == (f"dlstore verify: {path}: at byte 0: format {given!r} was given, but the file "
                                        f"starts as {title} files do; pass format={title.lower()!r} or 'auto'\n")
        assert "at byte 0: format" in _one_line_error(dlstore("index", "--format", given, path))


def test_index_of_a_non_record_file_is_one_line(tmp_path):
    notes = tmp_path / "notes.bin"
    notes.write_bytes(b"these are notes, not records")
    err = _one_line_error(dlstore("index", notes))
    assert f"{notes}: does not look like TFRecord or RecordIO" in err and "format=" not in err


@pytest.mark.slow
def test_settings_mistakes_are_usage_errors_not_corrupt_files(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", [b"a"] * 3)
    err = _one_line_error(dlstore("verify", "--io", "foo", path))
    assert "io='foo'" in err and "CORRUPT" not in err
    env = dict(os.environ, DLSTORE_IO="foo")
    out = subprocess.run([sys.executable, "-m", "dlstore", "verify", path], capture_output=True, text=True,
                         cwd=REPO, timeout=300, env=env)
    assert "DLSTORE_IO" in _one_line_error(out) and "CORRUPT" not in out.stdout


@pytest.mark.slow
def test_unknown_command_and_bad_option_values_are_one_line():
    assert "invalid choice" in _one_line_error(dlstore("frobnicate"))
    assert "--world-size" in _one_line_error(dlstore("plan", "--mounts", REPO, "--world-size", "many"))
    for option in ("--world-size", "--local-size", "--record-bytes"):  # 0 divided by, or ignored
        args = ["--world-size", "2", option, "0"] if option != "--world-size" else ["--world-size", "0"]
        err = _one_line_error(dlstore("plan", "--simulate", "10:10", *args))
        assert f"argument {option}: expected a positive integer, not 0" in err


@pytest.mark.parametrize("where", ["simulate", "mounts"])
def test_a_throughput_that_is_not_numbers_is_a_usage_error_naming_the_option(tmp_path, where, capsys):
    # It was "could not convert string to float: 'abc'", naming no option.
    from dlstore.cli import main

    write_tfrecord(tmp_path / "a.tfrecord", [b"a"] * 3)
    data = ["--simulate", "10:10", "--mounts-count", "2"] if where == "simulate" else ["--mounts", str(tmp_path)]
    with pytest.raises(SystemExit) as e:
        main(["plan", *data, "--world-size", "2", "--policy", "weighted", "--throughput", "1.5,abc"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert "argument --throughput: expected numbers separated by commas (one per mount), not '1.5,abc'" in err


def test_an_engine_that_cannot_run_here_is_a_usage_error_not_corrupt_files(tmp_path):
    from dlstore.io import cuda

    missing = cuda.gds_verdict(cuda.cuda_facts(), 0).missing
    if not missing:
        pytest.skip("gds can run here")
    path = write_tfrecord(tmp_path / "a.tfrecord", [b"a"] * 3)
    out = dlstore("verify", "--io", "gds", path)
    assert out.returncode == 2 and "CORRUPT" not in out.stdout
    assert _one_line_error(out) == f"dlstore verify: {missing}\n"


def test_a_warning_is_one_line_of_the_command(tmp_path):
    (tmp_path / "full").mkdir()
    write_tfrecord(tmp_path / "full" / "a.tfrecord", [b"a"] * 3)
    (tmp_path / "empty").mkdir()  # a mount point with nothing mounted on it
    out = dlstore("plan", "--mounts", tmp_path / "full", tmp_path / "empty", "--world-size", 2)
    assert out.returncode == 0, out.stderr
    assert out.stderr.startswith("dlstore plan: warning: mount ") and "holds no record files" in out.stderr
    assert len(out.stderr.splitlines()) == 1, out.stderr  # not Python's warning with its source line


def test_index_mends_a_manifest_whose_shards_changed(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", [b"a"] * 3)
    assert dlstore("index", tmp_path).returncode == 0
    write_tfrecord(path, [b"b"] * 5)
    out = dlstore("index", tmp_path)
    assert out.returncode == 0 and out.stderr == "" and "5 records" in out.stdout
    import dlstore as ds

    assert sum(b.num_records for b in ds.Dataset(tmp_path).batches()) == 5


def test_version():
    import dlstore as ds

    out = dlstore("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"dlstore {ds.__version__}"


@pytest.mark.slow
def test_plot_refuses_what_is_not_a_bench_result(tmp_path):
    other = tmp_path / "other.json"
    other.write_text('{"benchmark": "storage", "gb_per_s": 1.5}')
    assert "not a result of" in _one_line_error(_bench_plot(other, tmp_path / "o.png"))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert "not JSON" in _one_line_error(_bench_plot(broken, tmp_path / "o.png"))
    assert "No such file" in _one_line_error(_bench_plot(tmp_path / "missing.json", tmp_path / "o.png"))
    assert not (tmp_path / "o.png").exists()


def test_plot_help_exits_0_and_a_wrong_call_is_one_line_exit_2(capsys):
    # --help printed the usage on stderr and exited 2, as a mistake does.
    from dlstore.bench.plot import main

    def status(argv):
        try:
            return main(argv)
        except SystemExit as e:
            return e.code

    assert status(["--help"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("usage: python -m dlstore.bench.plot") and "RESULTS.json" in out.out and out.err == ""
    for wrong in ([], ["r.json"], ["r.json", "o.png", "more"]):
        assert status(wrong) == 2
        err = capsys.readouterr().err
        assert err.startswith("python -m dlstore.bench.plot: ") and err.count("\n") == 1, err


def test_a_closed_pipe_ends_plan_quietly(tmp_path):
    (tmp_path / "m").mkdir()
    for i in range(2):
        write_tfrecord(tmp_path / "m" / f"s{i}.tfrecord", [b"r"] * 50)
    proc = subprocess.Popen([sys.executable, "-m", "dlstore", "plan", "--mounts", tmp_path / "m", "--world-size", "4",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    proc.stdout.close()  # as `| head` does, before the plan is printed
    _, err = proc.communicate(timeout=300)
    assert err == b"" and proc.returncode == 141


def test_help_speaks_to_users():
    from dlstore.bench.__main__ import build_parser as bench_parser
    from dlstore.cli import build_parser

    for parser in (build_parser(), bench_parser()):
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        texts = [parser.format_help()] + [p.format_help() for p in subparsers.choices.values()]
        for text in texts:
            for jargon in ("``", "seeds'", "the seeds", "SPEC", "the paper"):
                assert jargon not in text, (jargon, text[:200])


def test_index_of_a_directory_with_a_compressed_shard_indexes_the_others(tmp_path):
    import gzip

    for s in range(3):
        write_tfrecord(tmp_path / f"d-{s}.tfrecord", [b"x" * 100] * 5)
    (tmp_path / "d-0.tfrecord.gz").write_bytes(gzip.compress((tmp_path / "d-0.tfrecord").read_bytes()))
    out = dlstore("index", tmp_path)
    assert out.returncode == 2 and "d-0.tfrecord.gz: compressed files cannot be indexed" in out.stderr
    assert "1 file of 4 not indexed" in out.stderr
    assert all((tmp_path / f"d-{s}.tfrecord.idx").exists() for s in range(3))
    assert (tmp_path / ".dlstore-manifest").exists()


def test_index_of_a_directory_mixing_formats_writes_no_manifest(tmp_path):
    import dlstore as ds

    write_tfrecord(tmp_path / "b.tfrecord", [b"x" * 100] * 5)
    with ds.RecordIOWriter(str(tmp_path / "a.rec")) as w:
        w.write(b"y" * 50)
    out = dlstore("index", tmp_path)
    assert out.returncode == 2 and "mix formats (1 recordio, 1 tfrecord): no manifest written" in out.stderr
    assert not (tmp_path / ".dlstore-manifest").exists()
    assert (tmp_path / "b.tfrecord.idx").exists()
    plan = dlstore("plan", "--mounts", tmp_path, "--world-size", "1")
    assert "the files mix formats" in _one_line_error(plan)


def test_index_keeps_an_mxnet_idx_that_lists_every_record_under_its_own_keys(tmp_path):
    """An MXNet .idx keys its records by image id (im2rec); `dlstore index` replaced a valid one with keys
    0..n-1, losing the ids MXNet users look records up by. One that lists other offsets is still rewritten."""
    import dlstore as ds

    rec = tmp_path / "train.rec"
    with ds.RecordIOWriter(str(rec), idx_path=str(tmp_path / "train.idx")) as w:
        for i in range(6):
            w.write(b"image %d " % i + b"z" * (i * 13))
    offsets = [line.split("\t")[1] for line in (tmp_path / "train.idx").read_text().splitlines()]
    keys = [1042, 7, 333, 90001, 12, 5]
    mine = "".join(f"{k}\t{o}\n" for k, o in sorted(zip(keys, offsets)))  # by key, as MXNet may list them
    (tmp_path / "train.idx").write_text(mine)
    out = dlstore("index", tmp_path)
    assert out.returncode == 0 and "train.idx kept" in out.stdout, out.stdout + out.stderr
    assert (tmp_path / "train.idx").read_text() == mine
    (tmp_path / "train.idx").write_text("".join(f"{k}\t{o}\n" for k, o in zip(keys, offsets[:4])))
    out = dlstore("index", tmp_path)
    assert out.returncode == 0 and "6 records -> " in out.stdout
    assert len((tmp_path / "train.idx").read_text().splitlines()) == 6


def test_index_out_dir_refuses_two_files_of_one_name(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write_tfrecord(tmp_path / "a" / "x.tfrecord", [b"a"] * 3)
    b = write_tfrecord(tmp_path / "b" / "x.tfrecord", [b"b"] * 5)
    err = _one_line_error(dlstore("index", a, b, "--out-dir", tmp_path / "ix"))
    assert "would both have their index at" in err and a in err and b in err
    assert not (tmp_path / "ix" / "x.tfrecord.idx").exists()


def test_verify_of_a_gzip_shard_cut_short_names_where_the_file_ends(tmp_path):
    import gzip

    data = gzip.compress(oracle_tfrecord_bytes([bytes([i % 251]) * 300 for i in range(200)]))
    cut = tmp_path / "cut.tfrecord.gz"
    cut.write_bytes(data[:len(data) // 2])
    out = dlstore("verify", "--quiet", cut)
    assert out.returncode == 1, out.stderr
    assert f"the file ends at compressed byte {len(data) // 2}, before the end of its deflate data (uncompressed " \
           f"byte " in out.stdout + out.stderr


def test_verify_lists_a_dangling_link_among_the_shards_and_checks_the_rest(tmp_path):
    write_tfrecord(tmp_path / "a.tfrecord", [b"a"] * 3)
    os.symlink(tmp_path / "gone" / "b.tfrecord", tmp_path / "b.tfrecord")
    out = dlstore("verify", "--quiet", tmp_path)
    assert out.returncode == 1, out.stderr
    assert "b.tfrecord: named as a shard but a symbolic link" in out.stdout
    assert "UNREADABLE: 2 files, 3 good records" in out.stdout and "1 unreadable file" in out.stdout


def test_verify_json_without_mounts_is_a_usage_error_not_ignored(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", [b"a"])
    assert "--json reports the scrub of replica mounts" in _one_line_error(dlstore("verify", "--json", path))


def test_verify_says_a_glob_matches_nothing_beside_a_dangling_link_elsewhere(tmp_path):
    write_tfrecord(tmp_path / "a.tfrecord", [b"a"])
    os.symlink(tmp_path / "gone", tmp_path / "b.tfrecord")
    (tmp_path / "sub").mkdir()
    out = dlstore("verify", "--quiet", tmp_path, tmp_path / "sub" / "nomatch*.tfrecord")
    assert out.returncode == 2 and "no record file matches" in out.stderr
