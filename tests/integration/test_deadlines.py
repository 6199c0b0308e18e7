"""A mount that stops answering while a Dataset is made: the constructor raises within ``read_timeout``,
naming the path and the call that hung, where before it waited for as long as the mount stalled.

The stall is a stand-in: ``os.stat`` or ``os.listdir`` of one path waits on an event (released at the
end), as a call into a hung NFS mount waits. The real stall, a throttled loop device, is in
test_testbed_failover.py; its metadata reads finish in under a second, too fast to hang a constructor.
"""
import os
import threading
import time

import pytest

import dlstore
from dlstore.placement.world import World
from tests.helpers import replicate, write_tfrecord


@pytest.fixture
def shards(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for s in range(4):
        write_tfrecord(src / f"part-{s}.tfrecord", [f"{s}/{i}".encode() * 50 for i in range(20)])
    return src


@pytest.fixture
def stall(monkeypatch):
    """``stall(name, test)``: ``os.<name>`` of a path for which ``test(path)`` holds waits until the test ends."""
    gate = threading.Event()

    def install(name, test):
        real = getattr(os, name)

        def hung(path, *args, **kwargs):
            if test(os.fsdecode(path)):
                gate.wait(60)
            return real(path, *args, **kwargs)

        monkeypatch.setattr(os, name, hung)

    yield install
    gate.set()


def _made_with_deadline(*args, **kwargs):
    t0 = time.monotonic()
    with pytest.raises(dlstore.DlstoreIOError) as e:
        dlstore.Dataset(*args, world=World(rank=0, size=1), read_timeout=0.5, **kwargs)
    assert time.monotonic() - t0 < 10  # 0.5 s, and a poll
    return e.value


def test_a_stalled_mount_point_raises_naming_it(shards, tmp_path, stall):
    mounts = replicate(shards, tmp_path / "m", 2)
    stall("stat", lambda p: p == mounts[1])
    error = _made_with_deadline("*.tfrecord", mounts=mounts)
    assert str(error).startswith(f"{mounts[1]}: no answer to a stat of the mount point in ")
    assert "read_timeout (0.5 s" in str(error) and error.path == mounts[1]


def test_a_stalled_listing_of_a_replica_raises_naming_it(shards, tmp_path, stall):
    mounts = replicate(shards, tmp_path / "m", 2)  # listed side by side in a pool's threads
    stall("listdir", lambda p: p.rstrip(os.sep) == mounts[1])
    error = _made_with_deadline("*.tfrecord", mounts=mounts)
    assert str(error).startswith(f"{mounts[1]}: no answer to a listing in ")


def test_a_stalled_shard_raises_naming_it(shards, stall):
    dlstore.Dataset(os.fspath(shards / "*.tfrecord"), world=World(rank=0, size=1))  # the manifest, built
    stall("stat", lambda p: p.endswith("part-2.tfrecord"))  # checked against the manifest as the Dataset is made
    error = _made_with_deadline(os.fspath(shards / "*.tfrecord"))
    assert str(error).startswith(f"{shards / 'part-2.tfrecord'}: no answer to a stat in ")


def test_without_a_deadline_the_constructor_waits(shards, tmp_path):
    """read_timeout=0 waits forever, as it does for reads; a call that returns late is no error then."""
    mounts = replicate(shards, tmp_path / "m", 2)
    real, calls = os.stat, []

    def slow(path, *args, **kwargs):
        if os.fsdecode(path) == mounts[1] and not calls:
            calls.append(path)
            time.sleep(0.6)
        return real(path, *args, **kwargs)

    os.stat = slow
    try:
        ds = dlstore.Dataset("*.tfrecord", mounts=mounts, world=World(rank=0, size=1), read_timeout=0)
    finally:
        os.stat = real
    assert calls and len(ds) == 80
