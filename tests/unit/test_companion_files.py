"""Which files beside the data are dlstore's own (indexes, manifests, locks): told by name alone."""
import pytest

from dlstore.formats.index import is_companion_file


@pytest.mark.parametrize("name", [
    "train-00000-of-00004.idx", "/data/set/train.rec.IDX", "train-00000-of-00004.idx.tmp4242",
    "imagenet.dlstore-manifest", ".dlstore-manifest", "/d/.dlstore-lock", ".dlstore", ".dlstore.lock.7",
])
def test_companions_are_recognised(name):
    assert is_companion_file(name)


@pytest.mark.parametrize("name", [
    "train-00000-of-00004", "train.rec", "part-00001.tfrecord", "idx", "train.idx.d/shard", "my.dlstore",
    "train.tmp1", "x.dlstore-manifest.bak", "/data/.dlstore/train-0",
])
def test_record_files_are_not_companions(name):
    assert not is_companion_file(name)


def test_nothing_is_opened(tmp_path):
    # A name that does not exist is judged all the same.
    assert is_companion_file(tmp_path / "missing.idx") and not is_companion_file(tmp_path / "missing")
