"""``dlstore convert``: a class-folder tree of mixed images -> TFRecord read back by tf.data, RecordIO
read back by an independent parser of MXNet's format, and both through dlstore's reader and its
ResNet-50 pipeline."""
import io
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dlstore
from tests.conftest import REPO

Image = pytest.importorskip("PIL.Image")

# Created out of sorted order: the labels must follow the sorted names (apple 1, mango 2, zebra 3).
CLASSES = ["zebra", "apple", "mango"]
BAD = {"apple/notes.txt", "mango/truncated.jpg", "zebra/empty.jpg"}


def _photo(rng, height, width, mode="RGB"):
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x + y) * 127 // (height + width)], -1)
    noise = rng.integers(0, 40, (height, width, 3))
    image = Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))
    return image.convert(mode)


def _encode(image, fmt, **kw):
    out = io.BytesIO()
    image.save(out, fmt, **kw)
    return out.getvalue()


def make_tree(root):
    """3 class folders: JPEGs, a PNG, a grayscale JPEG, a GIF, a BMP, a nested folder, a hidden file and
    3 files that are not decodable images. Returns {relative path: (bytes, height, width, format)} of the good ones."""
    rng = np.random.default_rng(7)
    good = {}

    def put(rel, data, size=None, fmt=None):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        if size is not None:
            good[rel] = (data, size[0], size[1], fmt)

    for c, name in enumerate(CLASSES):
        for i in range(3):
            h, w = 60 + 7 * i + c, 90 - 5 * i
            put(f"{name}/img{i}.JPEG", _encode(_photo(rng, h, w), "JPEG", quality=90), (h, w), "JPEG")
    put("apple/pic.png", _encode(_photo(rng, 70, 50, "RGBA"), "PNG"), (70, 50), "PNG")
    put("mango/gray.jpg", _encode(_photo(rng, 64, 48, "L"), "JPEG"), (64, 48), "JPEG")
    put("zebra/anim.gif", _encode(_photo(rng, 40, 44, "P"), "GIF"), (40, 44), "GIF")
    put("mango/sub/deep.bmp", _encode(_photo(rng, 33, 35), "BMP"), (33, 35), "BMP")
    put("apple/notes.txt", b"not an image\n")
    whole = _encode(_photo(rng, 80, 80), "JPEG")
    put("mango/truncated.jpg", whole[: len(whole) // 2])
    put("zebra/empty.jpg", b"")
    put("zebra/.DS_Store", b"\0\0\0\1Bud1")  # hidden: never read, never reported
    put("README.txt", b"files beside the class folders are not read")
    return good


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree") / "train"
    return str(root), make_tree(str(root))


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "dlstore", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def convert(src, out, *args):
    r = run_cli("convert", src, "--out", out, *args)
    assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def tfrecord_set(tree, tmp_path_factory):
    src, _ = tree
    out = tmp_path_factory.mktemp("tf")
    r = convert(src, out, "--shards", 2, "--seed", 3, "--workers", 2)
    return str(out), r


@pytest.fixture(scope="module")
def recordio_set(tree, tmp_path_factory):
    src, _ = tree
    out = tmp_path_factory.mktemp("rec")
    r = convert(src, out, "--format", "recordio", "--shards", 3, "--seed", 3, "--workers", 2)
    return str(out), r


def label_of(rel):
    return sorted(CLASSES).index(rel.split("/")[0])  # 0-based


# ---- TFRecord, read by TensorFlow ---------------------------------------------------------------------


@pytest.mark.slow  # imports TensorFlow
def test_tfrecord_reads_back_identically_with_tf_data(tree, tfrecord_set):
    tf = pytest.importorskip("tensorflow")
    _, good = tree
    out, r = tfrecord_set
    files = sorted(os.listdir(out))
    assert files == ["train-00000-of-00002", "train-00001-of-00002"]
    spec = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
        "image/class/synset": tf.io.FixedLenFeature([], tf.string),
        "image/height": tf.io.FixedLenFeature([], tf.int64),
        "image/width": tf.io.FixedLenFeature([], tf.int64),
        "image/colorspace": tf.io.FixedLenFeature([], tf.string),
        "image/channels": tf.io.FixedLenFeature([], tf.int64),
        "image/format": tf.io.FixedLenFeature([], tf.string),
        "image/filename": tf.io.FixedLenFeature([], tf.string),
    }
    seen = {}
    for record in tf.data.TFRecordDataset([os.path.join(out, f) for f in files]):
        ex = {k: v.numpy() for k, v in tf.io.parse_single_example(record, spec).items()}
        synset = ex["image/class/synset"].decode()
        # The filename is the base name; the tree's relative path is found from the class and the bytes.
        matches = [rel for rel, (data, *_) in good.items()
                   if rel.startswith(synset + "/") and data == ex["image/encoded"]]
        assert len(matches) == 1, (synset, ex["image/filename"])
        rel = matches[0]
        data, height, width, fmt = good[rel]
        assert ex["image/filename"].decode() == os.path.basename(rel)
        assert ex["image/class/label"] == label_of(rel) + 1  # 1-based, sorted folder order
        assert (ex["image/height"], ex["image/width"]) == (height, width)
        assert ex["image/format"].decode() == fmt
        assert ex["image/colorspace"] == b"RGB" and ex["image/channels"] == 3
        assert rel not in seen
        seen[rel] = True
    assert set(seen) == set(good)  # every good file once, no bad one
    for bad in sorted(BAD):
        assert f"left out {os.path.join(tree[0], bad)}: not a decodable image" in r.stdout
    assert ".DS_Store" not in r.stdout and "README" not in r.stdout
    assert f"wrote {len(good)} images of 3 class folders in 2 shards (tfrecord" in r.stdout
    assert "3 files left out" in r.stdout


def test_tfrecord_labels_and_payloads_through_open_records(tree, tfrecord_set):
    _, good = tree
    out, _ = tfrecord_set
    records = [dlstore.parse_example(bytes(r)) for r in dlstore.open_records(out + "/train-*")]
    assert len(records) == len(good)
    by_name = {(ex["image/class/synset"][0].decode(), ex["image/filename"][0].decode()): ex for ex in records}
    for rel, (data, *_) in good.items():
        ex = by_name[(rel.split("/")[0], os.path.basename(rel))]
        assert ex["image/encoded"][0] == data and int(ex["image/class/label"][0]) == label_of(rel) + 1


# ---- RecordIO, read by an independent parser of MXNet's format ----------------------------------------

MAGIC = 0xCED7230A


def parse_recordio(blob):
    """MXNet's RecordIO, from its description: [magic u32][lrecord u32: cflag << 29 | length][data, padded
    to 4]; a record cut where its data held the magic word comes in parts cflag 1 (first), 2 (middle),
    3 (last), the magic word put back between them. Returns [(offset of the record's first frame, payload)]."""
    out, pos, parts, start = [], 0, None, None
    while pos < len(blob):
        magic, lrecord = struct.unpack_from("<II", blob, pos)
        assert magic == MAGIC, f"no magic at byte {pos}"
        cflag, length = lrecord >> 29, lrecord & ((1 << 29) - 1)
        data = blob[pos + 8:pos + 8 + length]
        if cflag in (0, 1):
            start = pos
        pos += 8 + length + (-length % 4)
        if cflag == 0:
            out.append((start, data))
        elif cflag == 1:
            parts = [data]
        else:
            parts.append(data)
            if cflag == 3:
                out.append((start, struct.pack("<I", MAGIC).join(parts)))
    return out


def test_recordio_reads_back_with_an_independent_parser(tree, recordio_set):
    src, good = tree
    out, r = recordio_set
    names = [f"train-{i:05d}-of-00003" for i in range(3)]
    assert sorted(os.listdir(out)) == sorted(n + ext for n in names for ext in (".rec", ".idx", ".lst"))
    seen, next_id = set(), 0
    for name in names:
        blob = Path(os.path.join(out, name + ".rec")).read_bytes()
        records = parse_recordio(blob)
        idx = [line.split("\t") for line in Path(os.path.join(out, name + ".idx")).read_text().splitlines()]
        lst = [line.split("\t") for line in Path(os.path.join(out, name + ".lst")).read_text().splitlines()]
        assert len(idx) == len(lst) == len(records) > 0
        for (offset, payload), (key, at), (index, label, rel) in zip(records, idx, lst):
            flag, hlabel, rid, id2 = struct.unpack_from("<IfQQ", payload)
            image = payload[24:]
            assert flag == 0 and id2 == 0
            assert rid == int(key) == int(index) == next_id  # ids number the records of the whole set
            assert int(at) == offset  # the .idx offset is where the record's first frame starts
            assert struct.unpack_from("<I", blob, int(at))[0] == MAGIC
            assert hlabel == float(label) == label_of(rel)  # 0-based, as im2rec
            assert image == good[rel][0] == Path(os.path.join(src, rel)).read_bytes()
            seen.add(rel)
            next_id += 1
    assert seen == set(good)
    assert f"wrote {len(good)} images of 3 class folders in 3 shards (recordio" in r.stdout


def test_recordio_through_open_records(tree, recordio_set):
    _, good = tree
    out, _ = recordio_set
    payloads = [bytes(p) for p in dlstore.open_records(out + "/train-*")]
    assert len(payloads) == len(good)
    from dlstore.formats.recordio import unpack

    got = sorted((int(h.label), data) for h, data in map(unpack, payloads))
    want = sorted((label_of(rel), data) for rel, (data, *_) in good.items())
    assert got == want


# ---- order, shards, errors -------------------------------------------------------------------------------


def test_more_shards_than_images_is_refused(tree, tmp_path):
    from dlstore.tools.convert import convert_tree, scan_tree

    src, _ = tree
    n = len(scan_tree(src)[1])
    with pytest.raises(ValueError, match=f"{n + 3} shards of {n} image files would leave 3 of them empty"):
        convert_tree(src, tmp_path / "x", shards=n + 3, progress=False)
    assert not (tmp_path / "x").exists()  # nothing written


def test_the_seed_alone_decides_the_bytes(tree, tmp_path):
    from dlstore.tools.convert import convert_tree

    src, good = tree
    a = convert_tree(src, tmp_path / "a", shards=2, seed=5, workers=1, progress=False)
    b = convert_tree(src, tmp_path / "b", shards=2, seed=5, workers=3, progress=False)
    c = convert_tree(src, tmp_path / "c", shards=2, seed=6, workers=3, progress=False)
    read = [[Path(p).read_bytes() for p in r.outputs] for r in (a, b, c)]
    assert read[0] == read[1]
    assert read[0] != read[2] and sorted(b"".join(read[0])) == sorted(b"".join(read[2]))
    assert a.records == len(good) and len(a.left_out) == len(BAD)
    assert sorted(os.path.relpath(p, src) for p, _ in a.left_out) == sorted(BAD)
    assert [os.path.basename(p) for p in a.outputs] == ["train-00000-of-00002", "train-00001-of-00002"]


def test_shards_cut_the_shuffled_list_evenly(tree, tmp_path):
    from dlstore.tools.convert import convert_tree, scan_tree

    src, _ = tree
    _, files = scan_tree(src)
    r = convert_tree(src, tmp_path, shards=4, seed=1, prefix="validation", progress=False)
    counts = [sum(1 for _ in dlstore.open_records(p)) for p in r.outputs]
    assert [os.path.basename(p) for p in r.outputs] == [f"validation-{i:05d}-of-00004" for i in range(4)]
    # 17 files in 4 runs of 4 or 5; the 3 bad ones make their runs shorter.
    assert sum(counts) == len(files) - len(BAD) and max(counts) <= -(-len(files) // 4)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["missing", "empty", "a file", "no files", "inside", "format", "shards"])
def test_cli_errors_are_one_line_and_exit_2(tree, tmp_path, case):
    src, _ = tree
    (tmp_path / "empty").mkdir()
    (tmp_path / "classes" / "a").mkdir(parents=True)
    (tmp_path / "f").write_bytes(b"x")
    args = {
        "missing": [tmp_path / "nope", "--out", tmp_path / "o"],
        "empty": [tmp_path / "empty", "--out", tmp_path / "o"],
        "a file": [tmp_path / "f", "--out", tmp_path / "o"],
        "no files": [tmp_path / "classes", "--out", tmp_path / "o"],
        "inside": [src, "--out", os.path.join(src, "apple", "out")],
        "format": [src, "--out", tmp_path / "o", "--format", "parquet"],
        "shards": [src, "--out", tmp_path / "o", "--shards", "0"],
    }[case]
    r = run_cli("convert", *args)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("dlstore convert:")
    assert not (tmp_path / "o").exists() and not os.path.exists(os.path.join(src, "apple", "out"))


def test_missing_pillow_is_one_line(tree, tmp_path, monkeypatch, capsys):
    from dlstore import cli

    monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL raises ImportError
    status = cli.main(["convert", tree[0], "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert status == 2 and "pip install 'dlstore[convert]'" in err and len(err.strip().splitlines()) == 1


# ---- the converted set through the ResNet-50 pipeline --------------------------------------------------


@pytest.mark.parametrize("which", ["tfrecord", "recordio"])
def test_converted_mixed_set_goes_through_resnet50(tree, tfrecord_set, recordio_set, which):
    from dlstore.pipeline.resnet50 import resnet50_loader

    _, good = tree
    out, _ = tfrecord_set if which == "tfrecord" else recordio_set
    loader = resnet50_loader(out + "/train-*", batch_size=4, train=True, last_batch="PARTIAL", threads=2,
                             label_offset=-1 if which == "tfrecord" else 0)
    labels = []
    for batch in loader:
        assert batch["image"].shape[1:] == (224, 224, 3)
        assert batch["image"].reshape(len(batch["label"]), -1).any(axis=1).all()  # no zero-filled slot
        labels += batch["label"].tolist()
    assert sorted(labels) == sorted(label_of(rel) for rel in good)
    stats = loader.stats()
    assert stats["fallback_decodes"] == sum(fmt != "JPEG" for *_, fmt in good.values()) == 3
    assert stats["skipped"] == 0


def test_convert_into_a_directory_of_another_set_is_refused(tree, tmp_path):
    """Two converts into one directory (3 shards, then 2) left both sets there: every image read twice."""
    from dlstore.tools.convert import convert_tree

    src, _ = tree
    out = tmp_path / "o"
    convert_tree(src, out, shards=3, progress=False)
    convert_tree(src, out, shards=3, seed=2, progress=False)  # the same set's names: rewritten
    with pytest.raises(dlstore.DlstoreError, match=f"{out} already holds 3 record files this run would not "
                                                   f"overwrite \\(e.g. train-00000-of-00003\\)"):
        convert_tree(src, out, shards=2, progress=False)
    assert sorted(os.listdir(out)) == [f"train-0000{i}-of-00003" for i in range(3)]  # nothing written
    r = run_cli("convert", src, "--out", out, "--shards", "2", "--format", "recordio")
    assert r.returncode == 2 and "already holds 3 record files" in r.stderr and len(r.stderr.splitlines()) == 1


@pytest.mark.parametrize("fmt", ["tfrecord", "recordio"])
def test_a_file_name_that_is_not_utf8_is_converted_and_an_error_leaves_no_half_set(tree, tmp_path, fmt):
    """A name with a byte that is not UTF-8 stopped convert with "'utf-8' codec can't encode character '\\udcff'",
    naming no file, and left the shards written so far, which verify then called OK."""
    import shutil

    from dlstore.tools.convert import convert_tree

    src = tmp_path / "src"
    shutil.copytree(tree[0], src)
    odd = os.path.join(os.fsencode(src / "apple"), b"caf\xff.jpg")
    with open(odd, "wb") as f:
        f.write((src / "apple" / "img0.JPEG").read_bytes())
    r = convert_tree(src, tmp_path / "o", shards=2, format=fmt, progress=False)
    names = [bytes(rec) for p in r.outputs for rec in dlstore.open_records(p)]
    assert r.records == len(tree[1]) + 1 and len(names) == r.records
    if fmt == "tfrecord":
        from dlstore.formats.example import parse_example

        assert b"caf\xff.jpg" in [bytes(parse_example(n)["image/filename"][0]) for n in names]
    else:
        lists = b"".join(Path(p[:-4] + ".lst").read_bytes() for p in r.outputs)
        assert b"apple/caf\xff.jpg" in lists

    def stop(path, why):
        raise RuntimeError("stopped")

    with pytest.raises(RuntimeError, match="stopped"):  # any error part-way: no shard of this run stays
        convert_tree(src, tmp_path / "p", shards=2, format=fmt, progress=False, on_left_out=stop)
    assert os.listdir(tmp_path / "p") == []


@pytest.mark.parametrize("fmt", ["tfrecord", "recordio"])
def test_a_shard_of_left_out_files_only_is_not_written(tree, tmp_path, fmt):
    # One shard per file: the 3 files that are not images would each leave a 0-byte shard, read as a
    # part of the set. The set is the 14 shards that hold images, named for that count.
    from dlstore.tools.convert import convert_tree, scan_tree

    src, good = tree
    _, files = scan_tree(src)
    out = tmp_path / fmt
    r = convert_tree(src, out, shards=len(files), format=fmt, progress=False)
    n = len(good)
    assert (r.shards_asked, len(r.outputs), r.records) == (len(files), n, n)
    suffix = "" if fmt == "tfrecord" else ".rec"
    assert [os.path.basename(p) for p in r.outputs] == [f"train-{i:05d}-of-{n:05d}{suffix}" for i in range(n)]
    assert sorted(os.listdir(out)) == sorted(os.path.basename(p) for p in r.outputs + r.companions)
    assert all(sum(1 for _ in dlstore.open_records(p)) == 1 for p in r.outputs)
    if fmt == "recordio":  # the .lst keeps every image's record id, one line per shard
        ids = [int(Path(p[:-4] + ".lst").read_text().split("\t")[0]) for p in r.outputs]
        assert ids == list(range(n))


def test_a_tree_of_no_images_writes_nothing(tmp_path):
    from dlstore.errors import DlstoreError
    from dlstore.tools.convert import convert_tree

    src = tmp_path / "train" / "cat"
    src.mkdir(parents=True)
    (src / "a.jpg").write_bytes(b"not a jpeg")
    (src / "b.jpg").write_bytes(b"")
    with pytest.raises(DlstoreError, match="none of its 2 image files is a decodable image"):
        convert_tree(tmp_path / "train", tmp_path / "out", shards=1, progress=False)
    assert os.listdir(tmp_path / "out") == []


def test_a_rerun_into_its_own_output_removes_the_stale_indexes_of_its_shards(tree, tmp_path):
    src, _ = tree
    out = tmp_path / "again"
    convert(src, out, "--shards", 2, "--seed", 3, "--quiet")
    assert run_cli("index", out).returncode == 0
    shards = sorted(p for p in os.listdir(out) if p.startswith("train-") and not p.endswith(".idx"))
    assert all((out / (s + ".idx")).exists() for s in shards)
    convert(src, out, "--shards", 2, "--seed", 4, "--quiet")  # the same names, other contents
    assert not any(p.endswith(".idx") for p in os.listdir(out))  # DALI would take an old one for the new shard
