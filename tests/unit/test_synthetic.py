"""Synthetic ImageNet-like and BERT sets: keys, layouts, real JPEGs, determinism, the cache marker.

Records are read back with the pure-Python oracles of tests/helpers.py (TFRecord framing and a tiny
protobuf decoder), independent of the C++ core and of TensorFlow.
"""
import io
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from dlstore import synthetic
from dlstore.synthetic import cache as synthetic_cache
from dlstore.synthetic import imagenet as synthetic_imagenet
from dlstore._progress import Progress
from tests.helpers import oracle_example, oracle_masked, oracle_read_recordio, oracle_read_tfrecord

PIL = pytest.importorskip("PIL.Image")

def file_bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def read_examples(paths):
    records = [r for p in paths for r in oracle_read_tfrecord(file_bytes(p))]
    return [oracle_example(r) for r in records]


def values(example, name):
    return example[name][1]


# ---- ImageNet-like --------------------------------------------------------------------------------

IMAGENET_KEYS = {"image/encoded", "image/class/label", "image/height", "image/width", "image/format",
                 "image/filename", "image/class/text"}


@pytest.fixture(scope="module")
def imagenet_tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("imagenet")
    return synthetic.generate_imagenet(out, shards=2, records_per_shard=3, seed=5, progress=False)


def test_imagenet_shards_are_named_like_the_tensorflow_converter(imagenet_tiny):
    assert [os.path.basename(p) for p in imagenet_tiny] == ["train-00000-of-00002", "train-00001-of-00002"]


def test_imagenet_records_hold_real_jpegs_of_the_stated_size(imagenet_tiny):
    examples = read_examples(imagenet_tiny)
    assert len(examples) == 6
    for i, ex in enumerate(examples):
        assert IMAGENET_KEYS <= set(ex)
        assert ex["image/encoded"][0] == "bytes" and ex["image/height"][0] == "int64"
        (jpeg,) = values(ex, "image/encoded")
        (height,), (width,) = values(ex, "image/height"), values(ex, "image/width")
        assert 300 <= height <= 500 and 300 <= width <= 500
        with PIL.open(io.BytesIO(jpeg)) as img:
            assert img.format == "JPEG" and img.mode == "RGB"
            assert img.size == (width, height)
            img.load()  # decodes the whole image: a truncated or broken JPEG fails here
        (label,) = values(ex, "image/class/label")
        assert 1 <= label <= 1000
        assert values(ex, "image/format") == [b"JPEG"]
        assert values(ex, "image/filename") == [b"synthetic_%08d.JPEG" % i]
        assert values(ex, "image/class/text") == [b"synthetic class %d" % label]
        xmin, xmax = values(ex, "image/object/bbox/xmin")[0], values(ex, "image/object/bbox/xmax")[0]
        assert 0.0 <= xmin <= xmax <= 1.0


def test_imagenet_framing_crcs_check(imagenet_tiny):
    blob = file_bytes(imagenet_tiny[0])
    (n,) = struct.unpack_from("<Q", blob, 0)
    assert struct.unpack_from("<I", blob, 8)[0] == oracle_masked(blob[:8])
    assert struct.unpack_from("<I", blob, 12 + n)[0] == oracle_masked(blob[12:12 + n])


def test_images_are_textured_neither_noise_nor_flat(imagenet_tiny):
    (jpeg,) = values(read_examples(imagenet_tiny[:1])[0], "image/encoded")
    pixels = np.asarray(PIL.open(io.BytesIO(jpeg)).convert("L"), dtype=np.float32)
    horizontal = np.abs(np.diff(pixels, axis=1))
    # Neighbours mostly alike (not white noise, whose mean step would be ~85) yet not flat.
    assert 2.0 < horizontal.mean() < 40.0
    assert pixels.std() > 15.0


def test_imagenet_same_seed_same_bytes(tmp_path, imagenet_tiny):
    again = synthetic.generate_imagenet(tmp_path / "a", shards=2, records_per_shard=3, seed=5, progress=False)
    other = synthetic.generate_imagenet(tmp_path / "b", shards=2, records_per_shard=3, seed=6, progress=False)
    for p, q, r in zip(imagenet_tiny, again, other):
        assert file_bytes(p) == file_bytes(q)
        assert file_bytes(p) != file_bytes(r)


def test_record_depends_on_its_number_not_on_the_sharding(tmp_path, imagenet_tiny):
    flat = synthetic.generate_imagenet(tmp_path, shards=1, records_per_shard=6, seed=5, progress=False)
    split = b"".join(file_bytes(p) for p in imagenet_tiny)
    assert file_bytes(flat[0]) == split


@pytest.mark.slow
def test_worker_processes_give_the_same_bytes(tmp_path):
    args = {"shards": 2, "records_per_shard": 20, "progress": False}
    one = synthetic.generate_imagenet(tmp_path / "1", workers=1, **args)
    two = synthetic.generate_imagenet(tmp_path / "2", workers=2, **args)
    for p, q in zip(one, two):
        assert file_bytes(p) == file_bytes(q)


def test_mean_record_size_is_imagenet_like():
    sizes = [len(b) for b in synthetic_imagenet._imagenet_payloads((0, 0, 48, (300, 500), 95, "tfrecord"))]
    # The full calibration (2,000 records) gives 114.8 KB; 48 records stay within a few KB of it.
    assert 100e3 < np.mean(sizes) < 135e3
    assert min(sizes) > 30e3 and max(sizes) < 400e3


def test_imagenet_recordio_holds_irheader_and_jpeg(tmp_path):
    from dlstore.formats import recordio

    paths = synthetic.generate_imagenet(tmp_path, shards=1, records_per_shard=3, seed=2, format="recordio",
                                        progress=False)
    assert paths == [str(tmp_path / "train-00000-of-00001.rec")]
    assert (tmp_path / "train-00000-of-00001.idx").exists()
    tf_paths = synthetic.generate_imagenet(tmp_path / "tf", shards=1, records_per_shard=3, seed=2,
                                           progress=False)
    payloads = oracle_read_recordio(file_bytes(paths[0]))
    for i, (payload, ex) in enumerate(zip(payloads, read_examples(tf_paths))):
        header, jpeg = recordio.unpack(payload)
        assert header.id == i and header.label == values(ex, "image/class/label")[0] - 1
        assert jpeg == values(ex, "image/encoded")[0]


@pytest.mark.parametrize("kwargs, match", [
    ({"shards": 0}, "positive"),
    ({"seed": -1}, "non-negative"),
    ({"quality": 100}, "quality"),
    ({"image_size": (500, 300)}, "image_size"),
    ({"format": "png"}, "format"),
])
def test_imagenet_arguments_are_checked(tmp_path, kwargs, match):
    args = {"shards": 1, "records_per_shard": 1, "progress": False, **kwargs}
    with pytest.raises(ValueError, match=match):
        synthetic.generate_imagenet(tmp_path, **args)
    assert not any(tmp_path.iterdir())


def test_missing_pillow_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match="pip install pillow"):
        synthetic.generate_imagenet(tmp_path, shards=1, records_per_shard=1, progress=False)


# ---- BERT -----------------------------------------------------------------------------------------

BERT_KEYS = {"input_ids": "int64", "input_mask": "int64", "segment_ids": "int64",
             "masked_lm_positions": "int64", "masked_lm_ids": "int64", "masked_lm_weights": "float",
             "next_sentence_labels": "int64"}


@pytest.mark.parametrize("seq_len, max_predictions", [(128, 20), (384, 56)])
def test_bert_records_have_the_pretraining_layout(tmp_path, seq_len, max_predictions):
    paths = synthetic.generate_bert(tmp_path, shards=2, records_per_shard=40, seq_len=seq_len,
                                    max_predictions=max_predictions, progress=False)
    assert [os.path.basename(p) for p in paths] == ["part-00000-of-00002", "part-00001-of-00002"]
    examples = read_examples(paths)
    assert len(examples) == 80
    nsp = set()
    for ex in examples:
        assert {k: v[0] for k, v in ex.items()} == BERT_KEYS
        ids, mask, seg = (np.array(values(ex, k)) for k in ("input_ids", "input_mask", "segment_ids"))
        pos, lm_ids = np.array(values(ex, "masked_lm_positions")), np.array(values(ex, "masked_lm_ids"))
        weights = np.array(values(ex, "masked_lm_weights"))
        assert ids.shape == mask.shape == seg.shape == (seq_len,)
        assert pos.shape == lm_ids.shape == weights.shape == (max_predictions,)
        length = int(mask.sum())
        assert 5 <= length <= seq_len and (mask[:length] == 1).all()
        assert (ids[length:] == 0).all() and (seg[length:] == 0).all()  # zero padding
        assert ids[0] == synthetic.CLS_ID and ids[length - 1] == synthetic.SEP_ID
        seps = np.flatnonzero(ids == synthetic.SEP_ID)
        assert len(seps) == 2  # [CLS] A [SEP] B [SEP]
        assert (seg[:seps[0] + 1] == 0).all() and (seg[seps[0] + 1:length] == 1).all()
        assert ((ids[:length] >= 999) | np.isin(ids[:length], [101, 102, 103])).all() and ids.max() < 30522
        n = int(weights.sum())
        assert n == min(max_predictions, max(1, round((length - 3) * 0.15)))
        assert (weights[:n] == 1.0).all() and (weights[n:] == 0.0).all()
        assert (pos[n:] == 0).all() and (lm_ids[n:] == 0).all()
        used = pos[:n]
        assert (np.diff(used) > 0).all() and used.min() >= 1 and used.max() < length - 1
        assert not np.isin(used, seps).any()
        assert ((lm_ids[:n] >= 999) & (lm_ids[:n] < 30522)).all()
        # A masked position shows [MASK], a random token or the original one.
        assert (ids[used] >= 999).sum() + (ids[used] == synthetic.MASK_ID).sum() == n
        nsp.add(values(ex, "next_sentence_labels")[0])
    assert nsp == {0, 1}


def test_bert_masks_about_eighty_percent_with_mask_token(tmp_path):
    paths = synthetic.generate_bert(tmp_path, shards=1, records_per_shard=100, seed=3, progress=False)
    masked = total = 0
    for ex in read_examples(paths):
        n = int(sum(values(ex, "masked_lm_weights")))
        ids = np.array(values(ex, "input_ids"))
        masked += int((ids[values(ex, "masked_lm_positions")[:n]] == synthetic.MASK_ID).sum())
        total += n
    assert 0.75 < masked / total < 0.85


def test_bert_same_seed_same_bytes(tmp_path):
    a = synthetic.generate_bert(tmp_path / "a", shards=1, records_per_shard=10, seed=1, progress=False)
    b = synthetic.generate_bert(tmp_path / "b", shards=1, records_per_shard=10, seed=1, progress=False)
    c = synthetic.generate_bert(tmp_path / "c", shards=1, records_per_shard=10, seed=2, progress=False)
    assert file_bytes(a[0]) == file_bytes(b[0]) != file_bytes(c[0])


def test_bert_reads_back_through_dlstore_into_fixed_shape_batches(tmp_path):
    import dlstore
    from dlstore.formats.example import parse_batch

    paths = synthetic.generate_bert(tmp_path, shards=2, records_per_shard=16, progress=False)
    spec = {"input_ids": (np.int64, 128), "masked_lm_weights": (np.float32, 20),
            "next_sentence_labels": (np.int64, 1)}
    rows = [parse_batch(batch, spec) for batch in dlstore.open_records(paths).batches()]
    ids = np.concatenate([r["input_ids"] for r in rows])
    assert ids.shape == (32, 128) and (ids[:, 0] == synthetic.CLS_ID).all()
    expected = [values(ex, "input_ids") for ex in read_examples(paths)]
    assert ids.tolist() == expected


# ---- cache ----------------------------------------------------------------------------------------

@pytest.fixture
def counted_generators(monkeypatch):
    """Counts calls to the generators that cached_dataset dispatches to."""
    calls = []
    real = dict(synthetic_cache._GENERATORS)

    def wrap(kind):
        def generate(out_dir, **kwargs):
            calls.append(kind)
            return real[kind](out_dir, **kwargs)
        return generate

    monkeypatch.setattr(synthetic_cache, "_GENERATORS", {k: wrap(k) for k in real})
    return calls


def test_cached_dataset_generates_once(tmp_path, counted_generators):
    first = synthetic.cached_dataset("bert", "tiny", cache_dir=tmp_path, progress=False)
    again = synthetic.cached_dataset("bert", "tiny", cache_dir=tmp_path, progress=False)
    assert first == again and counted_generators == ["bert"]
    assert len(first) == 2 and all(os.path.isfile(p) for p in first)
    directory = os.path.dirname(first[0])
    assert os.path.basename(directory).startswith("bert-tiny-")
    marker = json.loads(file_bytes(os.path.join(directory, synthetic_cache._MARKER)))
    assert marker["params"] == {"shards": 2, "records_per_shard": 32}
    assert sorted(marker["shards"]) == [os.path.basename(p) for p in first]


def test_interrupted_generation_is_redone(tmp_path, counted_generators):
    paths = synthetic.cached_dataset("imagenet", "tiny", cache_dir=tmp_path, progress=False)
    before = [file_bytes(p) for p in paths]
    os.remove(os.path.join(os.path.dirname(paths[0]), synthetic_cache._MARKER))  # as if killed before the marker
    with open(paths[1], "r+b") as f:
        f.truncate(100)
    redone = synthetic.cached_dataset("imagenet", "tiny", cache_dir=tmp_path, progress=False)
    assert redone == paths and counted_generators == ["imagenet", "imagenet"]
    assert [file_bytes(p) for p in redone] == before


@pytest.mark.slow
def test_shard_changed_after_the_marker_is_redone(tmp_path, counted_generators):
    paths = synthetic.cached_dataset("bert", "tiny", cache_dir=tmp_path, progress=False)
    with open(paths[0], "ab") as f:
        f.write(b"junk")
    synthetic.cached_dataset("bert", "tiny", cache_dir=tmp_path, progress=False)
    assert counted_generators == ["bert", "bert"]


@pytest.mark.slow
def test_each_parameter_set_has_its_own_directory(tmp_path, counted_generators):
    a = synthetic.cached_dataset("bert", "tiny", cache_dir=tmp_path, progress=False)
    b = synthetic.cached_dataset("bert", "tiny", cache_dir=tmp_path, progress=False, seq_len=384,
                                 max_predictions=56)
    assert os.path.dirname(a[0]) != os.path.dirname(b[0])
    assert synthetic.cached_dataset("bert", "tiny", cache_dir=tmp_path, progress=False) == a
    assert counted_generators == ["bert", "bert"]


def test_default_cache_dir_follows_dlstore_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DLSTORE_CACHE", str(tmp_path))
    paths = synthetic.cached_dataset("bert", "tiny", progress=False)
    assert os.path.dirname(os.path.dirname(paths[0])) == str(tmp_path / "synthetic")


def test_unknown_kind_or_size_is_refused(tmp_path):
    with pytest.raises(ValueError, match="kind"):
        synthetic.cached_dataset("audio", "tiny", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="tiny"):
        synthetic.cached_dataset("imagenet", "huge", cache_dir=tmp_path)


# ---- progress bar ---------------------------------------------------------------------------------

def test_generation_off_a_terminal_shows_plain_lines(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DLSTORE_NO_PROGRESS", raising=False)
    synthetic.generate_bert(tmp_path, shards=1, records_per_shard=4, progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err and "#" not in err  # no bar redrawn in place
    line, = err.splitlines()  # quick work: only the last line
    assert line.startswith("gen bert 100% 4/4 rec") and " in 00:0" in line


def test_progress_off_a_terminal_is_silent_unless_asked_for_lines(monkeypatch):
    monkeypatch.delenv("DLSTORE_NO_PROGRESS", raising=False)
    quiet = io.StringIO()
    bar = Progress(total=10, desc="verify", file=quiet)
    bar.update(10)
    bar.close()
    assert quiet.getvalue() == ""
    out = io.StringIO()
    bar = Progress(total=200, desc="gen", unit="rec", piped="lines", file=out)
    bar.update(10)  # under 10 s in: nothing yet
    assert out.getvalue() == ""
    bar._start -= 11.0
    bar.update(40)
    bar.update(1)  # within 10 s of the last line: not printed
    assert out.getvalue().startswith("gen  25% 50/200 rec") and out.getvalue().count("\n") == 1
    bar.close()
    assert [ln.split(" rec")[0] for ln in out.getvalue().splitlines()] == ["gen  25% 50/200", "gen  26% 51/200"]
    with pytest.raises(ValueError, match="piped"):
        Progress(total=1, piped="bar")


def test_bert_copies_repeat_the_shards_without_encoding_again(tmp_path):
    paths = synthetic.generate_bert(tmp_path, shards=2, records_per_shard=3, copies=3, progress=False)
    assert [os.path.basename(p) for p in paths] == [f"part-{i:05d}-of-00006" for i in range(6)]
    blobs = [Path(p).read_bytes() for p in paths]
    assert blobs[0] != blobs[1] and blobs[0::2] == [blobs[0]] * 3 and blobs[1::2] == [blobs[1]] * 3
    with pytest.raises(ValueError, match="copies"):
        synthetic.generate_bert(tmp_path / "none", shards=1, records_per_shard=1, copies=0)


def test_progress_line_shows_count_rate_and_eta():
    out = io.StringIO()
    bar = Progress(total=200, desc="gen", unit="rec", enabled=True, file=out)
    bar._start -= 2.0  # as if started two seconds ago
    bar.update(50)
    line = out.getvalue()
    assert line.startswith("\rgen  25%") and "50/200 rec" in line
    assert "25.0 rec/s" in line and "ETA 00:06" in line
    bar.update(1)  # within 0.1 s of the last redraw: not drawn
    assert out.getvalue() == line
    bar.close()
    assert out.getvalue().endswith("\n") and "51/200" in out.getvalue()


def test_progress_shows_bytes_with_prefixes():
    bar = Progress(total=3e9, unit="B", enabled=False)
    bar._start -= 2.0
    bar.update(1.5e9)
    assert "1.50 GB/3.00 GB" in bar.render() and "750 MB/s" in bar.render()


# ---- interoperability -----------------------------------------------------------------------------

@pytest.mark.slow
def test_tensorflow_parses_the_records(imagenet_tiny, tmp_path):
    tf = pytest.importorskip("tensorflow")
    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64),
            "image/height": tf.io.FixedLenFeature([], tf.int64),
            "image/width": tf.io.FixedLenFeature([], tf.int64)}
    for raw in tf.data.TFRecordDataset(imagenet_tiny):
        ex = tf.io.parse_single_example(raw, spec)
        image = tf.io.decode_jpeg(ex["image/encoded"], channels=3)
        assert tuple(image.shape) == (int(ex["image/height"]), int(ex["image/width"]), 3)
    bert = synthetic.generate_bert(tmp_path, shards=1, records_per_shard=4, progress=False)
    spec = {k: tf.io.FixedLenFeature([128 if k in ("input_ids", "input_mask", "segment_ids") else
                                      1 if k == "next_sentence_labels" else 20],
                                     tf.float32 if k == "masked_lm_weights" else tf.int64) for k in BERT_KEYS}
    for raw in tf.data.TFRecordDataset(bert):
        ex = tf.io.parse_single_example(raw, spec)
        assert int(ex["input_ids"][0]) == synthetic.CLS_ID
