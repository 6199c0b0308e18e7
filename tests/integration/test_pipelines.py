"""The BERT and ResNet-50 pipelines end to end: output equal to TensorFlow's parse, samples independent
of batching and resumption, and memory that does not grow over epochs.

TensorFlow runs in a subprocess (it must not share a process with the `tfrecord` package that other
tests import, and it is slow to import).
"""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import dlstore
from dlstore.pipeline.bert import Bert, bert_loader
from dlstore.pipeline.loader import Loader
from dlstore.synthetic import generate_bert, generate_imagenet

from tests.helpers import REPO
from tests.resume import assert_resumes_exactly, loader_rows

pytestmark = pytest.mark.slow  # compares with TensorFlow's parsing and decoding

_TF_PARSE = r"""
import json, sys
import numpy as np, tensorflow as tf
files, batch, spec, out = json.loads(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
features = {name: tf.io.FixedLenFeature([length] if length else [], getattr(tf, dtype))
            for name, (dtype, length) in spec.items()}
parts = {name: [] for name in spec}
for serialized in tf.data.TFRecordDataset(files).batch(batch):
    parsed = tf.io.parse_example(serialized, features)
    for name in spec:
        parts[name].append(parsed[name].numpy())
np.savez(out, **{name: np.concatenate(v) for name, v in parts.items()})
"""


def tf_parse(files, batch, spec, tmp_path):
    """TensorFlow's ``tf.io.parse_example`` of ``files`` in batches: name -> array, all records."""
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed (pip install tensorflow-cpu); the comparison needs it")
    out = tmp_path / "tf.npz"
    run = subprocess.run([sys.executable, "-c", _TF_PARSE, json.dumps([str(f) for f in files]), str(batch),
                          json.dumps(spec), str(out)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    with np.load(out) as z:
        return {name: z[name] for name in spec}


def concat(batches):
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


# ---- BERT ----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seq_len", [128, 384])
def test_bert_batches_equal_tensorflow_parse_example(seq_len, tmp_path):
    pipeline = Bert(seq_len)
    files = generate_bert(tmp_path / "bert", shards=2, records_per_shard=150, seq_len=seq_len,
                          max_predictions=pipeline.max_predictions, progress=False, workers=1)
    # 64 KiB chunks hold ~75 (seq 128) or ~25 (seq 384) records: batches of 24 span chunk boundaries.
    loader = bert_loader(files, batch_size=24, seq_len=seq_len, chunk_size=64 << 10, last_batch="PARTIAL",
                         shuffle="none", shuffle_shards=False)  # in file order, as tf.data reads them
    got = concat([{k: v.copy() for k, v in b.items()} for b in loader])
    spec = {name: ("float32" if dtype == np.float32 else "int64", shape[0])
            for name, (shape, dtype) in pipeline.fields().items()}
    want = tf_parse(files, 24, spec, tmp_path)
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape == (300, spec[name][1])
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc (Linux)")
def test_no_new_buffers_and_flat_rss_over_epochs(tmp_path):
    files = generate_bert(tmp_path / "bert", shards=2, records_per_shard=1500, progress=False, workers=1)
    loader = bert_loader(files, batch_size=64, chunk_size=256 << 10, last_batch="FILL")
    for _ in loader:  # first epoch: the ring is allocated, the reader's buffers too
        pass
    allocated = loader.stats()["buffers_allocated"]
    assert allocated == 7 * (loader.prefetch + 2)
    rss = [_rss_bytes()]
    for _ in range(8):
        for _ in loader:
            pass
        rss.append(_rss_bytes())
    stats = loader.stats()
    assert stats["buffers_allocated"] == allocated
    assert stats["batches"] == 9 * 47 and stats["padding"] == 9 * (47 * 64 - 3000)
    # Generous: the ring is 7 x 4 arrays of ~80 KB; growth per epoch would show as a trend.
    assert max(rss) - rss[0] < 16 << 20, [r >> 20 for r in rss]


# ---- ResNet-50 -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory):
    """The same 24 records in TFRecord and RecordIO (the generator makes identical JPEGs for both)."""
    pytest.importorskip("PIL", reason="the synthetic JPEGs are encoded with Pillow")
    d = tmp_path_factory.mktemp("imagenet")
    kw = dict(shards=2, records_per_shard=12, image_size=(64, 160), progress=False, workers=1)
    tfrecord = generate_imagenet(d / "tfrecord", **kw)
    recordio = generate_imagenet(d / "recordio", format="recordio", **kw)
    return tfrecord, recordio


def _resnet():
    from dlstore.pipeline import decode, resnet50

    return resnet50, decode


def images_of(loader):
    return concat([{k: v.copy() for k, v in b.items()} for b in loader])


@pytest.mark.slow
@pytest.mark.parametrize("train", [True, False])
def test_resnet50_labels_equal_tensorflow_and_samples_do_not_depend_on_batching(imagenet, train, tmp_path):
    resnet50, _ = _resnet()
    tfrecord, _ = imagenet
    in_order = dict(shuffle="none", shuffle_shards=False)  # as tf.data reads them
    a = images_of(resnet50.resnet50_loader(tfrecord, batch_size=5, train=train, last_batch="PARTIAL", seed=3,
                                           threads=2, **in_order))
    b = images_of(resnet50.resnet50_loader(tfrecord, batch_size=8, train=train, last_batch="PARTIAL", seed=3,
                                           threads=1, prefetch=1, **in_order))
    assert a["image"].shape == (24, 224, 224, 3) and a["image"].dtype == np.uint8
    np.testing.assert_array_equal(a["image"], b["image"])
    np.testing.assert_array_equal(a["label"], b["label"])
    want = tf_parse(tfrecord, 8, {"image/class/label": ("int64", 0)}, tmp_path)
    np.testing.assert_array_equal(a["label"], want["image/class/label"])


def test_resnet50_crops_follow_seed_and_epoch(imagenet):
    resnet50, _ = _resnet()
    tfrecord, _ = imagenet
    # Records in the same order every epoch and seed, so that only the crops can differ.
    in_order = dict(shuffle="none", shuffle_shards=False)
    loader = resnet50.resnet50_loader(tfrecord, batch_size=8, seed=1, **in_order)
    epoch0, epoch1 = images_of(loader), images_of(loader)
    again = images_of(resnet50.resnet50_loader(tfrecord, batch_size=8, seed=1, **in_order))
    other_seed = images_of(resnet50.resnet50_loader(tfrecord, batch_size=8, seed=2, **in_order))
    np.testing.assert_array_equal(epoch0["image"], again["image"])
    np.testing.assert_array_equal(epoch0["label"], epoch1["label"])
    for other in (epoch1, other_seed):
        differ = [not np.array_equal(x, y) for x, y in zip(epoch0["image"], other["image"])]
        assert sum(differ) >= 20, differ  # new crops for (nearly) every image


def test_resnet50_trains_at_sizes_above_eval_resize_and_eval_refuses_them_when_made(imagenet):
    """train=True with size=299 failed at its first batch, from the loader's thread, on eval_resize (256), an
    eval setting; evaluating at 299 with eval_resize 256 is refused when the pipeline is made."""
    resnet50, _ = _resnet()
    tfrecord, _ = imagenet
    batch = next(iter(resnet50.resnet50_loader(tfrecord, batch_size=4, size=299)))
    assert batch["image"].shape == (4, 299, 299, 3)
    with pytest.raises(ValueError, match=r"eval_resize \(256\) must be at least the output size \(299\)"):
        resnet50.resnet50_loader(tfrecord, batch_size=4, size=299, train=False)
    evaluated = next(iter(resnet50.resnet50_loader(tfrecord, batch_size=4, size=299, train=False, eval_resize=320)))
    assert evaluated["image"].shape == (4, 299, 299, 3)


def test_resnet50_recordio_gives_the_same_samples_as_tfrecord(imagenet):
    resnet50, _ = _resnet()
    tfrecord, recordio = imagenet
    for train in (True, False):
        # In file order: the block shuffle's blocks are sized in bytes, which differ between the formats.
        t = images_of(resnet50.resnet50_loader(tfrecord, batch_size=8, train=train, seed=4, shuffle="none"))
        r = images_of(resnet50.resnet50_loader(recordio, batch_size=8, train=train, seed=4, shuffle="none"))
        np.testing.assert_array_equal(t["image"], r["image"])
        np.testing.assert_array_equal(t["label"] - 1, r["label"])  # im2rec labels are 0-based


def test_resnet50_float_nchw_is_the_normalised_uint8(imagenet):
    resnet50, _ = _resnet()
    tfrecord, _ = imagenet
    u8 = images_of(resnet50.resnet50_loader(tfrecord, batch_size=8, train=False))
    f32 = images_of(resnet50.resnet50_loader(tfrecord, batch_size=8, train=False, layout="NCHW", dtype="float32"))
    assert f32["image"].shape == (24, 3, 224, 224) and f32["image"].dtype == np.float32
    mean, std = np.array(resnet50.IMAGENET_MEAN), np.array(resnet50.IMAGENET_STD)
    want = (u8["image"].transpose(0, 3, 1, 2) / 255.0 - mean[:, None, None]) / std[:, None, None]
    # The float path resamples in float, the uint8 path rounds: within one uint8 step.
    assert np.abs(f32["image"] - want).max() <= 1.01 / 255 / std.min()


@pytest.mark.parametrize("shuffle", ["block", "global"])
def test_resnet50_resumes_with_the_same_crops(imagenet, shuffle):
    resnet50, _ = _resnet()
    tfrecord, _ = imagenet

    def make():
        return resnet50.resnet50_loader(tfrecord, batch_size=5, last_batch="FILL", seed=9, chunk_size=64 << 10,
                                        shuffle=shuffle, buffer_size=6)

    assert_resumes_exactly(make, stops=[2, 5, 7], run=iter, values=loader_rows)


def test_resnet50_bad_image_is_named_or_skipped(imagenet, tmp_path):
    resnet50, _ = _resnet()
    from dlstore.formats.example import encode_example

    tfrecord, _ = imagenet
    records = [bytes(r) for r in dlstore.open_records(tfrecord[0])]
    bad = dlstore.parse_example(records[4])
    bad["image/encoded"] = [bad["image/encoded"][0][:300]]  # a truncated JPEG
    records[4] = encode_example(bad)
    path = tmp_path / "bad.tfrecord"
    with dlstore.TFRecordWriter(str(path)) as w:
        for r in records:
            w.write(r)
    with pytest.raises(dlstore.CorruptRecordError, match=r"bad.tfrecord: record at byte \d+ \(sample 4 of epoch 0\), "
                       r"resnet50 pipeline: JPEG decode failed: "):
        images_of(resnet50.resnet50_loader(str(path), batch_size=4, shuffle="none"))
    loader = resnet50.resnet50_loader(str(path), batch_size=4, on_error="skip", last_batch="PARTIAL")
    got = images_of(loader)
    assert len(got["label"]) == 11 and loader.stats()["skipped"] == 1


def test_loader_counts_the_source_and_reports_the_engine(tmp_path):
    files = generate_bert(tmp_path / "bert", shards=1, records_per_shard=100, progress=False, workers=1)
    reader = dlstore.open_records(files, io="buffered")
    loader = Loader(reader, Bert(128), 32)
    n = sum(len(b["input_ids"]) for b in loader)
    stats = loader.stats()
    assert n == 96 and stats["records"] == 100 and stats["engine"] == "buffered" and stats["engine_reason"]
    assert stats["bytes"] == sum(os.path.getsize(f) for f in files) - 100 * 16
    assert stats["source"]["records"] == 100


def test_evaluation_over_ranks_reads_every_image_once(imagenet):
    """resnet50_loader(train=False) over 5 ranks: every image once (it padded with repeats, as training does,
    so a validation metric counted some images twice), the ranks agreeing on the batch count."""
    from dlstore.pipeline import resnet50_loader
    from dlstore.placement.world import World

    import warnings

    tfrecord, _ = imagenet
    seen, batches = [], set()
    for rank in range(5):
        loader = resnet50_loader(tfrecord, 4, train=False, last_batch="PARTIAL", record_key="index",
                                 world=World(rank=rank, size=5))
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            got = [b for b in loader]
        # A rank whose share ran out first yields the agreed empty batch, and says so.
        assert all("yields an empty batch" in str(w.message) for w in said)
        assert len(said) == sum(1 for b in got if len(b["shard"]) == 0)
        batches.add(len(got))
        seen += [k for b in got for k in zip(b["shard"].tolist(), b["record"].tolist())]
    assert sorted(seen) == [(s, r) for s in range(2) for r in range(12)]
    assert len(batches) == 1


@pytest.mark.parametrize("shuffle", ["none", "global", "block"])
def test_a_padded_epochs_repeats_are_padding_not_samples(tmp_path, shuffle):
    """Under remainder="pad" the last ranks' records wrap round to the epoch's start; the loader counted those
    repeats as samples, so three ranks reported 120 samples of a 100-record set."""
    files = generate_bert(tmp_path / "bert", shards=2, records_per_shard=50, progress=False, workers=1)
    samples = padding = 0
    fresh = []
    for rank in range(3):
        ds = dlstore.Dataset(files, world=dlstore.world(rank=rank, size=3), shuffle=shuffle, batch_size=8)
        loader = bert_loader(ds, batch_size=8, seq_len=128)
        for batch in loader:
            keep = len(batch["input_ids"]) - loader.padding
            fresh += [row.tobytes() for row in batch["input_ids"][:keep]]
        stats = loader.stats()
        assert stats["records"] == 40 and stats["samples"] + stats["padding"] == 40
        assert stats["padding"] == ds.repeated_records == (20 if rank == 2 else 0)
        samples, padding = samples + stats["samples"], padding + stats["padding"]
    assert (samples, padding) == (100, 20)
    if shuffle != "block":  # none and global give the repeats last: the rows before them are every record once
        assert len(fresh) == len(set(fresh)) == 100
