"""What a training script met when a new user tried dlstore through its docs (issue 22), each as the
script meets it: corrupt shards under on_error="skip", an epoch or a rank with nothing to train on,
features named otherwise, record identity, statistics and sizes in the adapters, a folder of images
passed as records, and convert's progress count."""
import io
import os
import warnings

import numpy as np
import pytest

import dlstore
from dlstore.formats.example import encode_example
from dlstore.pipeline import Bert, Loader, bert_loader, resnet50_loader
from dlstore.placement.world import World
from dlstore.synthetic import generate_bert
from tests.helpers import corrupt_unnoticed, write_tfrecord

SHARDS, PER_SHARD = 3, 24


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert")
    generate_bert(str(d), shards=SHARDS, records_per_shard=PER_SHARD, progress=False)
    return str(d)


def _shards(d):
    return sorted(os.path.join(d, n) for n in os.listdir(d) if not n.startswith("."))


def _damaged_copy(src, dst):
    """A copy of ``src``'s shards with record 5 of the first one failing its CRC and the last one
    truncated in the middle of a record; no manifest."""
    os.makedirs(dst)
    paths = []
    for p in _shards(src):
        with open(p, "rb") as f:
            data = f.read()
        paths.append(os.path.join(dst, os.path.basename(p)))
        with open(paths[-1], "wb") as f:
            f.write(data)
    with open(paths[-1], "r+b") as f:
        f.truncate(os.path.getsize(paths[-1]) - 40)
    return paths


def _samples(loader):
    return sum(len(b["input_ids"]) for b in loader)


# ---- on_error="skip" while the manifest is built, and the counts at the loader -------------------------


def test_skip_is_honoured_while_indexing_and_counted_at_the_loader(bert_dir, tmp_path):
    paths = _damaged_copy(bert_dir, tmp_path / "bad")
    corrupt_unnoticed(paths[0], [5])  # builds a per-file index first: the manifest must still be made
    os.remove(paths[0] + ".idx") if os.path.exists(paths[0] + ".idx") else None
    loader = bert_loader(str(tmp_path / "bad"), batch_size=8, on_error="skip", last_batch="PARTIAL",
                         shuffle="none")
    assert _samples(loader) == SHARDS * PER_SHARD - 2
    stats = loader.stats()
    assert stats["skipped"] == 2 and stats["skipped_source"] == 2 and stats["skipped_pipeline"] == 0
    # the default policy raises when reading, naming the file and the byte
    strict = bert_loader(str(tmp_path / "bad"), batch_size=8, shuffle="none")
    with pytest.raises(dlstore.CorruptRecordError) as e:
        _samples(strict)
    assert e.value.path in paths and e.value.offset is not None


def test_a_shard_damaged_after_its_manifest_is_rebuilt_under_skip(bert_dir, tmp_path):
    paths = _damaged_copy(bert_dir, tmp_path / "bad")[:1]
    os.truncate(tmp_path / "bad" / os.path.basename(_shards(bert_dir)[-1]), 0)  # keep one good shard only
    for p in _shards(str(tmp_path / "bad"))[1:]:
        os.remove(p)
    dlstore.Dataset(str(tmp_path / "bad"))  # the manifest, made on good shards
    with open(paths[0], "r+b") as f:  # rewritten with a bad CRC: size kept, mtime moves
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.warns(UserWarning, match="rebuilt it"):
        ds = dlstore.Dataset(str(tmp_path / "bad"), on_error="skip", shuffle="none", batch_size=8)
    loader = Loader(ds, Bert(), 8, last_batch="PARTIAL")
    assert _samples(loader) == PER_SHARD - 1
    assert loader.stats()["skipped"] == 1


# ---- an epoch with no batch, a rank with an empty one --------------------------------------------------


def test_an_epoch_that_would_yield_no_batch_raises(bert_dir):
    loader = bert_loader(bert_dir, batch_size=SHARDS * PER_SHARD + 1)  # last_batch DROP by default
    with pytest.raises(dlstore.DlstoreError, match=r"yields no batch .* 72 samples, fewer than batch_size 73.*"
                                                   r"last_batch='DROP'"):
        next(iter(loader))


def test_a_rank_whose_share_ran_out_warns_of_its_empty_batch(bert_dir):
    # 72 records over 5 ranks, unevenly: 14 or 15 each; in batches of 7, 15 take 3 batches (the count all
    # agree on) and 14 take 2, then an empty one.
    ds = dlstore.Dataset(bert_dir, world=World(rank=0, size=5), remainder="uneven", shuffle="none")
    assert len(ds) == 14
    loader = Loader(ds, Bert(), 7, last_batch="PARTIAL")
    with pytest.warns(RuntimeWarning, match="yields an empty batch .* loss over 0 samples"):
        sizes = [len(b["input_ids"]) for b in loader]
    assert sizes == [7, 7, 0] and loader.stats()["empty_batches"] == 1


# ---- feature names ---------------------------------------------------------------------------------


def _jpeg(rng, h=40, w=48):
    Image = pytest.importorskip("PIL.Image")
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(out, "JPEG")
    return out.getvalue()


@pytest.fixture(scope="module")
def plain_names(tmp_path_factory):
    """Images under features named ``image`` and ``label``, with an ``id``."""
    rng = np.random.default_rng(1)
    d = tmp_path_factory.mktemp("plain")
    write_tfrecord(d / "a.tfrecord", [encode_example({"image": _jpeg(rng), "label": i % 5, "id": 1000 + i})
                                      for i in range(10)])
    return str(d)


def test_resnet50_reads_features_named_otherwise(plain_names):
    loader = resnet50_loader(plain_names, batch_size=5, image_feature="image", label_feature="label", size=32,
                             shuffle="none")
    labels = np.concatenate([b["label"] for b in loader])
    assert labels.tolist() == [i % 5 for i in range(10)]


def test_every_missing_feature_is_named(plain_names):
    with pytest.raises(dlstore.DlstoreError, match=r"lacks 2 of the features .*image_feature='image/encoded', "
                                                   r"label_feature='image/class/label'; it has \['id', 'image', "
                                                   r"'label'\]"):
        next(iter(resnet50_loader(plain_names, batch_size=5, size=32)))
    with pytest.raises(dlstore.DlstoreError, match=r"lacks 7 of the features .*input_ids.*next_sentence_labels"):
        next(iter(bert_loader(plain_names, batch_size=5)))


def test_bert_features_named_otherwise(bert_dir, tmp_path):
    from dlstore.formats.example import parse_example

    renamed = []
    for record in dlstore.open_records(_shards(bert_dir)[0]):
        f = parse_example(record)
        f["nsp"] = f.pop("next_sentence_labels")
        renamed.append(encode_example(f))
    write_tfrecord(tmp_path / "r.tfrecord", renamed)
    got = next(iter(bert_loader(str(tmp_path), batch_size=4, shuffle="none", features={"next_sentence_labels": "nsp"})))
    want = [parse_example(r)["nsp"][0] for r in renamed[:4]]
    assert got["next_sentence_labels"][:, 0].tolist() == want


# ---- record keys -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", ["block", "global"])
def test_record_keys_name_each_sample_exactly_once_under_a_shuffle(bert_dir, shuffle):
    from dlstore.formats.example import parse_example

    truth = {(s, r): parse_example(rec)["input_ids"]
             for s, path in enumerate(_shards(bert_dir)) for r, rec in enumerate(dlstore.open_records(path))}
    ds = dlstore.Dataset(bert_dir, shuffle=shuffle, buffer_size=5, seed=2, remainder="uneven")
    loader = Loader(ds, Bert(), 8, last_batch="PARTIAL", record_key="index", epochs=2)
    seen = []
    for batch in loader:
        for s, r, ids in zip(batch["shard"].tolist(), batch["record"].tolist(), batch["input_ids"]):
            assert (ids == truth[(s, r)]).all()
            seen.append((s, r))
    assert sorted(seen) == sorted(list(truth) * 2)
    assert seen[:PER_SHARD] != sorted(seen[:PER_SHARD])  # shuffled indeed


def test_record_key_from_a_feature(plain_names):
    batches = list(resnet50_loader(plain_names, batch_size=5, image_feature="image", label_feature="label", size=32,
                                   shuffle="block", record_key="id", copy=True))
    assert sorted(np.concatenate([b["key"] for b in batches]).tolist()) == list(range(1000, 1010))


# ---- stats and sizes in the adapters ---------------------------------------------------------------------


def test_the_torch_dataset_has_stats(bert_dir):
    torch = pytest.importorskip("torch")
    from dlstore.adapters.torch import DlstoreIterableDataset

    ds = DlstoreIterableDataset(bert_dir, Bert(), batch_size=8)
    n = sum(len(b["input_ids"]) for b in torch.utils.data.DataLoader(ds, batch_size=None))
    stats = ds.stats()
    assert n == stats["samples"] == SHARDS * PER_SHARD and stats["passes"] == 1
    assert stats["skipped"] == 0 and stats["dataset"]["engine"] == stats["engine"]
    assert stats["stalls"]["steps"] == stats["batches"]


def test_tf_dataset_knows_its_cardinality(bert_dir):
    tf = pytest.importorskip("tensorflow")
    from dlstore.adapters.tensorflow import as_tf_dataset

    ds = as_tf_dataset(bert_loader(bert_dir, batch_size=8, epochs=2))
    assert int(ds.cardinality()) == 2 * (SHARDS * PER_SHARD // 8)
    assert sum(1 for _ in ds) == int(ds.cardinality())
    skipping = as_tf_dataset(bert_loader(bert_dir, batch_size=8, on_error="skip"))
    assert int(skipping.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)


# ---- a folder that is not records ------------------------------------------------------------------------


def test_a_folder_of_jpegs_is_a_dlstore_error(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(3):
        (tmp_path / f"{i}.jpg").write_bytes(_jpeg(rng))
    with pytest.raises(dlstore.DlstoreError, match=r"0\.jpg: does not look like TFRecord or RecordIO but a JPEG "
                                                   r"image .*dlstore convert") as e:
        dlstore.Dataset(str(tmp_path))
    assert e.value.path.endswith("0.jpg")


def test_an_image_tree_says_subfolders_are_not_searched(tmp_path):
    for c in ("cat", "dog"):
        (tmp_path / c).mkdir()
        (tmp_path / c / "x.jpg").write_bytes(b"\xff\xd8\xff")
    with pytest.raises(dlstore.DlstoreError, match=r"holds no record file but 2 subfolder\(s\), which are not "
                                                   r"searched"):
        dlstore.Dataset(str(tmp_path))


def test_convert_counts_only_the_images_it_writes(tmp_path, capsys, monkeypatch):
    pytest.importorskip("PIL.Image")
    from dlstore.tools.convert import convert_tree

    monkeypatch.delenv("DLSTORE_NO_PROGRESS", raising=False)
    rng = np.random.default_rng(0)
    (tmp_path / "src" / "a").mkdir(parents=True)
    for i in range(4):
        (tmp_path / "src" / "a" / f"{i}.jpg").write_bytes(_jpeg(rng))
    (tmp_path / "src" / "a" / "notes.txt").write_text("not an image")
    with warnings.catch_warnings():
        result = convert_tree(tmp_path / "src", tmp_path / "out", progress=None, workers=1)
    err = capsys.readouterr().err
    assert result.records == 4 and len(result.left_out) == 1
    assert "4/4" in err.splitlines()[-1] and "5/5" not in err
