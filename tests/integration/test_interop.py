"""Files written by TensorFlow, indexes of the `tfrecord` package and DALI: interchangeable with ours.

Each peer runs in its own subprocess: the `tfrecord` package cannot share a process with
TensorFlow (duplicate protobuf symbols), and DALI and TensorFlow are heavy to mix.
"""
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dlstore
from dlstore.sources.indexing import build_index, load_index
from tests.helpers import REPO, ENGINES, write_tfrecord

pytestmark = pytest.mark.slow  # imports TensorFlow, DALI and the tfrecord package


def _has(module):
    return importlib.util.find_spec(module) is not None


def _run(code, *args):
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                         cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.fixture(scope="module")
def tf_files(tmp_path_factory):
    if not _has("tensorflow"):
        pytest.skip("tensorflow is not installed (pip install tensorflow-cpu)")
    d = tmp_path_factory.mktemp("tf")
    rng = np.random.default_rng(11)
    records = [rng.bytes(int(n)) for n in rng.integers(0, 150_000, 80)] + [b""]
    blob = d / "records.npy"
    np.save(blob, np.array(records, dtype=object), allow_pickle=True)
    _run("""
import sys, numpy as np, tensorflow as tf
recs = np.load(sys.argv[1], allow_pickle=True)
for comp, name in [('', 'plain.tfrecord'), ('GZIP', 'g.tfrecord.gz'), ('ZLIB', 'z.tfrecord.zlib')]:
    with tf.io.TFRecordWriter(sys.argv[2] + '/' + name, options=tf.io.TFRecordOptions(compression_type=comp)) as w:
        for r in recs: w.write(bytes(r))
""", blob, d)
    return d, records


@pytest.mark.parametrize("name", ["plain.tfrecord", "g.tfrecord.gz", "z.tfrecord.zlib"])
@pytest.mark.parametrize("engine", ENGINES)
def test_files_written_by_tensorflow(tf_files, name, engine):
    d, records = tf_files
    reader = dlstore.open_records(d / name, io=engine, chunk_size=64 << 10)
    assert [bytes(r) for r in reader] == records


def test_zlib_named_without_extension_is_sniffed(tf_files, tmp_path):
    d, records = tf_files
    shutil.copy(d / "z.tfrecord.zlib", tmp_path / "noext")
    reader = dlstore.open_records(tmp_path / "noext")
    assert reader.compression == ["zlib"] and [bytes(r) for r in reader] == records


def test_tensorflow_reads_our_files(tf_files, tmp_path):
    _, records = tf_files
    for comp in [None, "gzip", "zlib"]:
        path = tmp_path / f"ours-{comp}.tfrecord"
        with dlstore.TFRecordWriter(path, compression=comp) as w:
            for r in records:
                w.write(r)
        out = _run("""
import sys, hashlib, tensorflow as tf
ds = tf.data.TFRecordDataset(sys.argv[1], compression_type=sys.argv[2])
print(hashlib.sha1(b''.join(r.numpy() + b'|' for r in ds)).hexdigest())
""", path, (comp or "").upper())
        import hashlib

        assert out.strip() == hashlib.sha1(b"".join(r + b"|" for r in records)).hexdigest()


@pytest.fixture
def shard(tmp_path):
    rng = np.random.default_rng(5)
    records = [rng.bytes(int(n)) for n in rng.integers(0, 9000, 300)]
    return write_tfrecord(tmp_path / "shard.tfrecord", records), records


@pytest.mark.skipif(not _has("tfrecord"), reason="the tfrecord package is not installed (pip install tfrecord)")
def test_index_equals_tfrecord_package(shard, tmp_path):
    import hashlib

    path, records = shard
    ours, n = build_index(path, out=str(tmp_path / "ours.idx"))
    theirs = tmp_path / "theirs.idx"
    _run("import sys; from tfrecord.tools.tfrecord2idx import create_index; create_index(sys.argv[1], sys.argv[2])",
         path, theirs)
    assert Path(ours).read_text() == theirs.read_text() and n == 300
    # and the package reads the same records through our index. Given an index alone it starts at a
    # random record; split into 3 shards it seeks to the offsets our index gives, in order.
    out = _run("""
import sys, hashlib
from tfrecord.reader import tfrecord_iterator
h = hashlib.sha1()
for k in range(3):
    for r in tfrecord_iterator(sys.argv[1], index_path=sys.argv[2], shard=(k, 3)): h.update(bytes(r) + b"|")
print(h.hexdigest())
""", path, ours)
    assert out.strip() == hashlib.sha1(b"".join(r + b"|" for r in records)).hexdigest()


@pytest.mark.skipif(not _has("nvidia.dali"), reason="DALI is not installed (pip install nvidia-dali-cuda130)")
def test_dali_reads_with_our_index(shard, tmp_path):
    path, records = shard
    idx, _ = build_index(path, out=str(tmp_path / "dali.idx"))
    dali_idx = tmp_path / "dali-own.idx"
    tool = shutil.which("tfrecord2idx")
    if tool:  # DALI's own converter, when its script is on PATH
        subprocess.run([tool, path, str(dali_idx)], check=True, capture_output=True)
        assert dali_idx.read_text() == Path(idx).read_text()
    # DALI parses tf.train.Example records: build an Example shard and read it with our index.
    from dlstore.formats.example import encode_example

    ex_path = tmp_path / "ex.tfrecord"
    payloads = [bytes(r[:100]) for r in records[:120]]
    with dlstore.TFRecordWriter(ex_path) as w:
        for p in payloads:
            w.write(encode_example({"data": [p]}))
    ex_idx, _ = build_index(str(ex_path), out=str(tmp_path / "ex.idx"))
    out = _run("""
import sys, hashlib
from nvidia.dali import pipeline_def, fn
import nvidia.dali.tfrecord as tfrec
@pipeline_def(batch_size=40, num_threads=1, device_id=None)
def pipe():
    return fn.readers.tfrecord(path=sys.argv[1], index_path=sys.argv[2], random_shuffle=False,
                               features={"data": tfrec.FixedLenFeature((), tfrec.string, "")})["data"]
p = pipe(); p.build()
h = hashlib.sha1()
for _ in range(3):
    (b,) = p.run()
    for i in range(len(b)): h.update(b.at(i).tobytes() + b"|")
print(h.hexdigest())
""", ex_path, ex_idx)
    import hashlib

    assert out.strip() == hashlib.sha1(b"".join(p + b"|" for p in payloads)).hexdigest()


def test_index_validation(shard, tmp_path):
    path, _ = shard
    idx, _ = build_index(path, out=str(tmp_path / "v.idx"))
    assert len(load_index(path, idx)) == 300
    lines = Path(idx).read_text().splitlines()
    (tmp_path / "short.idx").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(ValueError, match="last record ends"):
        load_index(path, str(tmp_path / "short.idx"))
    os.utime(path, (os.path.getmtime(idx) + 10,) * 2)
    with pytest.raises(ValueError, match="older than"):
        load_index(path, idx)


def test_ensure_index_uses_cache_dir_for_read_only_data(shard, tmp_path, monkeypatch):
    from dlstore.sources import indexing

    path, _ = shard
    monkeypatch.setenv("DLSTORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(indexing.os, "access", lambda p, mode: False)
    dest, offsets = indexing.ensure_index(path)
    assert dest.startswith(str(tmp_path / "cache")) and len(offsets) == 300
    dest2, _ = indexing.ensure_index(path)  # second call loads it
    assert dest2 == dest
    assert offsets[0] == 0 and offsets[1] > 16


def test_build_index_refuses_more_than_one_file(tmp_path):
    for k in range(2):
        write_tfrecord(tmp_path / f"part-{k}.tfrecord", [b"x"])
    for spec in (str(tmp_path / "part-*.tfrecord"), str(tmp_path), [str(tmp_path / "part-0.tfrecord")] * 2):
        with pytest.raises(ValueError, match="names 2 files.*one file"):
            build_index(spec)
    assert not list(tmp_path.glob("*.idx"))
    dest, n = build_index(str(tmp_path / "part-1*"))  # a glob naming one file is that file
    assert dest == str(tmp_path / "part-1.tfrecord.idx") and n == 1


def test_index_must_start_at_byte_zero(shard, tmp_path):
    path, records = shard
    # Every entry after the first: contiguous, ending where the file ends, but not from byte 0.
    lines = Path(build_index(path, out=str(tmp_path / "v.idx"))[0]).read_text().splitlines()
    (tmp_path / "tail.idx").write_text("\n".join(lines[1:]) + "\n")
    with pytest.raises(ValueError, match=f"first record starts at byte {16 + len(records[0])}, not 0"):
        load_index(path, str(tmp_path / "tail.idx"))


@pytest.mark.parametrize("damage", ["huge number", "binary", "not offset size", "zero-size frames"])
def test_ensure_index_rebuilds_a_damaged_index(shard, damage):
    from dlstore.sources import indexing

    path, _ = shard
    beside = indexing.index_path_for(path)
    with open(beside, "wb") as f:
        f.write({"huge number": b"0 " + b"9" * 30 + b"\n",
                 "binary": b"\xff\xfe\x00\x01",
                 "not offset size": b"0 16 32\n",
                 "zero-size frames": b"0 0\n" * 3}[damage])
    with pytest.raises(ValueError):
        load_index(path, beside)
    dest, offsets = indexing.ensure_index(path)
    assert dest == beside and len(offsets) == 300 and offsets[0] == 0


def _recordio_with_idx(directory, lines_of):
    """A RecordIO file of 8 records and an MXNet-style .idx (``key<TAB>offset``) of ``lines_of(offsets)``."""
    rec = os.path.join(directory, "train.rec")
    payloads = [b"record %d " % i + b"x" * (i * 37 % 50) for i in range(8)]
    with dlstore.RecordIOWriter(rec) as w:
        for p in payloads:
            w.write(p)
    offsets = _recordio_offsets(rec)
    with open(rec[:-4] + ".idx", "w") as f:
        f.writelines(f"{k}\t{o}\n" for k, o in lines_of(offsets))
    os.utime(rec[:-4] + ".idx")  # newer than the data, as an index written after it is
    return rec, payloads


def _recordio_offsets(path):
    with open(path, "rb") as f:
        data = f.read()
    out, at = [], 0
    while at < len(data):
        out.append(at)
        n = int.from_bytes(data[at + 4:at + 8], "little") & ((1 << 29) - 1)
        at += 8 + (n + 3) // 4 * 4
    return out


@pytest.mark.parametrize("shuffle", ["none", "block", "global"])
def test_an_mxnet_idx_in_key_order_is_read_in_file_order(tmp_path, shuffle):
    """MXNet's im2rec writes its .idx in its list's order (by key), not the file's; a Dataset over one out of
    offset order crashed (a segfault under global, std::bad_alloc under block, a bogus bad magic under none)."""
    import random

    keys = list(range(8))
    random.Random(0).shuffle(keys)
    rec, payloads = _recordio_with_idx(tmp_path, lambda offsets: sorted(zip(keys, offsets)))
    ds = dlstore.Dataset(rec, shuffle=shuffle, batch_size=3, remainder="uneven")
    got = [bytes(memoryview(b)[o:o + n]) for b in ds.batches() for o, n in zip(b.offsets.tolist(),
                                                                                 b.lengths.tolist())]
    assert sorted(got) == sorted(payloads)


def test_an_idx_listing_fewer_records_than_the_file_holds_is_refused(tmp_path):
    """A RecordIO .idx listing only some records: the others were skipped without a word (open_records and
    verify read all 8). Missing the first: refused at load; missing later ones: the read says so."""
    rec, _ = _recordio_with_idx(tmp_path, lambda offsets: enumerate(offsets[1:]))
    assert "not 0" in dlstore.sources.indexing.find_index(rec, "recordio")[2]
    rec, _ = _recordio_with_idx(tmp_path, lambda offsets: enumerate(offsets[:5]))
    with pytest.raises(dlstore.CorruptRecordError, match="index lists fewer records than the file holds"):
        list(dlstore.Dataset(rec, shuffle="none", batch_size=3, remainder="uneven").batches())
