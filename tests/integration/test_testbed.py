"""``dlstore testbed`` and ``dlstore expand``.

The pure parts (argument checks, naming, layouts, throttle rules, the state file, the refusal when
not root) are tested everywhere. The tests marked ``root`` make real loop-mounted filesystems: they
are skipped, saying why, without root, losetup or mkfs; each tears down what it made, even when it
fails, and checks that nothing of it is left.
"""
import errno
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dlstore import cli
from dlstore.errors import DlstoreError
from dlstore.sources.indexing import build_index, load_index
from dlstore.tools import testbed as tbm
from dlstore.tools.testbed import loopdev, mkfs
from dlstore.tools.expand import copy_name, expand_shards
from dlstore.tools.testbed import (
    Testbed,
    TestbedError,
    TestbedMount,
    create_testbed,
    default_size_bytes,
    destroy_testbed,
    layout_files,
    load_testbed,
    parse_throttle_rules,
    root_refusal,
    throttle_rule,
    validate_request,
)
from tests.helpers import REPO, oracle_read_tfrecord, write_tfrecord

pytestmark = pytest.mark.slow  # loop devices, mkfs and cgroups (the root tests), and subprocesses

MB = 1_000_000


def _why_no_testbed(fs="ext4"):
    refusal = root_refusal()
    if refusal:
        return "not root: " + refusal
    missing = tbm.missing_tools(fs)
    if missing:
        return f"missing {', '.join(missing)}"
    if not os.path.exists("/dev/loop-control"):
        return "no /dev/loop-control: loop devices are not available here"
    return None


_WHY = _why_no_testbed()
root_only = pytest.mark.skipif(_WHY is not None, reason=f"needs a real testbed: {_WHY}")
needs_throttle = pytest.mark.skipif(not os.path.exists(os.path.join(tbm.BLKIO_ROOT, "blkio.throttle.read_bps_device")),
                                    reason="no cgroup v1 blkio controller to throttle with")


def dlstore(*args):
    env = dict(os.environ, PYTHONPATH=REPO, DLSTORE_NO_PROGRESS="1")
    return subprocess.run([sys.executable, "-m", "dlstore", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=120)


def _dataset(directory, shards=3, records=20, seed=0, index=True):
    """Shards of known random records; their indexes beside them."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for s in range(shards):
        recs = [rng.bytes(int(n)) for n in rng.integers(100, 30_000, records)]
        p = write_tfrecord(os.path.join(directory, f"shard-{s:05d}.tfrecord"), recs)
        if index:
            build_index(p, "tfrecord")
        paths.append(p)
    return paths


# ---- pure parts ------------------------------------------------------------------------------------

def test_copy_names_keep_the_suffix_and_sort():
    assert copy_name("shard-00001.tfrecord", 3, 150) == "shard-00001.copy003.tfrecord"
    assert copy_name("train-00000-of-01024", 0, 150) == "train-00000-of-01024.copy000"
    assert copy_name("part.tfrecord.gz", 7, 10) == "part.copy007.tfrecord.gz"
    assert copy_name("data.rec", 12, 2000) == "data.copy0012.rec"
    assert copy_name(".hidden", 1, 2) == ".hidden.copy001"
    names = [copy_name("x.tfrecord", k, 1500) for k in range(1500)]
    assert names == sorted(names) and len(set(names)) == 1500
    for bad in [(3, 3), (-1, 5), (0, 0)]:
        with pytest.raises(ValueError):
            copy_name("x.tfrecord", *bad)


@pytest.mark.parametrize("mounts", [1, 2, 3, 7])
def test_layouts_place_every_file(mounts):
    names = [f"s{i}" for i in range(10)]
    rep = layout_files(names, mounts, "replicated")
    assert rep == [names] * mounts
    striped = layout_files(names, mounts, "striped")
    assert sorted(n for files in striped for n in files) == sorted(names)  # each exactly once
    for m, files in enumerate(striped):
        assert all(int(n[1:]) % mounts == m for n in files)
    with pytest.raises(ValueError, match="layout"):
        layout_files(names, 2, "mirrored")


@pytest.mark.parametrize("kwargs, message", [
    (dict(mounts=0), "mounts"), (dict(mounts=tbm.MAX_MOUNTS + 1), "mounts"), (dict(mounts=True), "mounts"),
    (dict(mounts=2, fs="btrfs"), "fs"), (dict(mounts=2, size_bytes=8 << 20), "at least 16 MiB"),
    (dict(mounts=2, fs="xfs", size_bytes=256 << 20), "at least 300 MiB"),
    (dict(mounts=2, throttle_bps=0), "throttle_bps"), (dict(mounts=2, layout="mirrored"), "layout"),
    (dict(mounts=2, cgroup="../escape"), "cgroup"), (dict(mounts=2, cgroup=".."), "cgroup"),
])
def test_bad_requests_are_refused_before_anything_is_made(kwargs, message):
    with pytest.raises(ValueError, match=message):
        validate_request(**kwargs)


def test_good_requests_pass():
    validate_request(4, 64 << 20, "ext4", 50 * MB, "striped", "dlstore-testbed")
    validate_request(1, 320 << 20, "xfs")


def test_default_size_fits_the_data():
    assert default_size_bytes(0) == tbm.DEFAULT_SIZE_BYTES
    assert default_size_bytes(1000, "xfs") == tbm.MIN_SIZE_BYTES["xfs"]
    size = default_size_bytes(5 << 30)
    assert size >= 5.5 * (1 << 30) and size % (1 << 20) == 0


def test_throttle_rules_round_trip():
    assert throttle_rule("7:3", 20 * MB) == "7:3 20000000"
    assert throttle_rule("7:3", None) == "7:3 0"
    text = "7:3 20000000\n7:12 1048576\n254:0 5\n"
    assert parse_throttle_rules(text) == {"7:3": 20 * MB, "7:12": 1 << 20, "254:0": 5}
    assert parse_throttle_rules("") == {}
    with pytest.raises(ValueError):
        throttle_rule("/dev/loop3", 1)


def test_non_root_is_refused_with_what_is_needed(monkeypatch, tmp_path, capsys):
    assert root_refusal(0) is None
    message = root_refusal(1000)
    assert "needs root" in message and "1000" in message and "losetup" in message and "sudo" in message
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    target = tmp_path / "tb"
    with pytest.raises(TestbedError, match="needs root") as e:
        create_testbed(target, 2, size_bytes=64 << 20)
    assert e.value.step == "check"
    assert not target.exists()  # refused before anything was made
    assert cli.main(["testbed", "--dir", str(target), "--mounts", "2"]) == 2
    assert "needs root" in capsys.readouterr().err
    assert cli.main(["testbed", "--dir", str(target), "--down"]) == 2
    assert "needs root" in capsys.readouterr().err


def test_state_file_round_trip(tmp_path):
    tb = Testbed(dir=str(tmp_path), fs="ext4", size_bytes=64 << 20, layout="striped", source=["/a", "/b"],
                 mounts=[TestbedMount(index=i, image=f"{tmp_path}/images/disk{i}.img", mountpoint=f"{tmp_path}/mnt{i}",
                                      device=f"/dev/loop{i}", devno=f"7:{i}", direct_io=True, formatted=True,
                                      mounted=True, throttle_bps=20 * MB, files=[["/a", "/b"][i]])
                         for i in range(2)])
    tb._record("plan", ["echo", "a b"])
    again = load_testbed(tmp_path)
    assert again == tb
    assert again.mountpoints == [f"{tmp_path}/mnt0", f"{tmp_path}/mnt1"]
    assert again.log[-1]["command"] == "echo 'a b'"
    state = json.loads((tmp_path / tbm.STATE_FILE).read_text())
    state["version"] = 99
    (tmp_path / tbm.STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(TestbedError, match="version 99"):
        load_testbed(tmp_path)
    with pytest.raises(TestbedError, match="holds no testbed"):
        load_testbed(tmp_path / "elsewhere")


def test_teardown_without_a_testbed_does_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert destroy_testbed(tmp_path) == []


def test_exec_takes_the_command_after_the_double_dash():
    args = cli.build_parser().parse_args(["testbed", "--dir", "D", "--exec", "--", "dd", "--help", "-x"])
    assert args.exec_command and args.exec_args == ["--", "dd", "--help", "-x"]
    assert args.command == "testbed"


# ---- expand --------------------------------------------------------------------------------------

def test_expand_copies_shards_and_their_indexes(tmp_path):
    src = _dataset(tmp_path / "src")
    out = tmp_path / "out"
    r = expand_shards(str(tmp_path / "src"), str(out), 3, progress=False)
    assert len(r.outputs) == 9 and r.skipped == 0 and r.indexes == 9
    assert r.written_bytes == 3 * sum(os.path.getsize(p) for p in src)
    for p in src:
        for k in range(3):
            copy = out / copy_name(os.path.basename(p), k, 3)
            assert copy.read_bytes() == Path(p).read_bytes()
            assert os.stat(copy).st_ino != os.stat(p).st_ino
            offsets = load_index(str(copy), str(copy) + ".idx")  # valid for the copy, and not older than it
            assert len(offsets) == 20
    assert not [n for n in os.listdir(out) if ".tmp" in n]
    again = expand_shards(str(tmp_path / "src"), str(out), 3, progress=False)
    assert again.skipped == 9 and again.written_bytes == 0  # an interrupted run resumes
    forced = expand_shards(str(tmp_path / "src"), str(out), 3, overwrite=True, progress=False)
    assert forced.skipped == 0 and forced.written_bytes == r.written_bytes


def test_expand_hardlinks_share_the_inode(tmp_path):
    src = _dataset(tmp_path / "src", shards=1)
    r = expand_shards(src, str(tmp_path / "out"), 2, mode="hardlink", progress=False)
    assert r.written_bytes == 0
    for out in r.outputs:
        assert os.path.samefile(out, src[0])  # one inode: one page cache, so caches are NOT defeated


def test_expand_reflink_needs_a_filesystem_that_has_them(tmp_path):
    src = _dataset(tmp_path / "src", shards=1, index=False)
    try:
        r = expand_shards(src, str(tmp_path / "out"), 1, mode="reflink", progress=False)
    except Exception as e:
        assert "cannot reflink" in str(e) and "--mode copy" in str(e)
        assert not os.listdir(tmp_path / "out")  # no temporary left behind
    else:  # tmp is on xfs or btrfs: a reflink is a full copy to the reader
        assert Path(r.outputs[0]).read_bytes() == Path(src[0]).read_bytes()


def test_expand_leaves_a_stale_index_out_unless_asked_to_rebuild(tmp_path):
    src = _dataset(tmp_path / "src", shards=1)
    earlier = os.path.getmtime(src[0]) - 10
    os.utime(src[0] + ".idx", (earlier, earlier))  # the index is now older than its data
    r = expand_shards(src, str(tmp_path / "out"), 2, progress=False)
    assert r.indexes == 0 and "not copied" in r.notes[0]
    assert not [n for n in os.listdir(tmp_path / "out") if n.endswith(".idx")]
    r = expand_shards(src, str(tmp_path / "out"), 2, index=True, overwrite=True, progress=False)
    assert r.indexes == 2 and not r.notes
    for out in r.outputs:
        assert len(load_index(out, out + ".idx")) == 20


def test_expand_refuses_bad_requests(tmp_path):
    src = _dataset(tmp_path / "src", shards=1, index=False)
    with pytest.raises(ValueError, match="holds the source"):
        expand_shards(src, str(tmp_path / "src"), 2, progress=False)
    with pytest.raises(ValueError, match="copies"):
        expand_shards(src, str(tmp_path / "out"), 0, progress=False)
    with pytest.raises(ValueError, match="mode"):
        expand_shards(src, str(tmp_path / "out"), 1, mode="symlink", progress=False)
    os.makedirs(tmp_path / "other")
    twin = shutil.copy(src[0], tmp_path / "other")
    with pytest.raises(ValueError, match="same file name"):
        expand_shards([src[0], twin], str(tmp_path / "out"), 1, progress=False)


def test_expand_command(tmp_path):
    _dataset(tmp_path / "src", shards=2)
    out = dlstore("expand", "--copies", 3, tmp_path / "src", "--out", tmp_path / "out", "--quiet")
    assert out.returncode == 0, out.stderr
    assert "6 of 6 copies made (2 shards x 3)" in out.stdout and "6 indexes placed" in out.stdout
    made = os.listdir(tmp_path / "out")
    assert len([n for n in made if not n.startswith(".dlstore")]) == 12  # 6 copies and 6 indexes
    assert ".dlstore-manifest" in made and "manifest: " in out.stdout
    from dlstore.sources.indexing import read_manifest

    _, manifest, _ = read_manifest(str(tmp_path / "out"))
    assert len(manifest.names) == 6 and all(".copy" in n for n in manifest.names)
    out = dlstore("expand", "--copies", 2, tmp_path / "src", "--out", tmp_path / "h", "--mode", "hardlink")
    assert out.returncode == 0 and "do NOT defeat caches" in out.stdout


# ---- real loop-mounted filesystems (root) ----------------------------------------------------------

def _ours_left(base):
    """Loop devices, mounts and state of a testbed under ``base`` that are still there."""
    base = os.path.realpath(base)
    loops = [d for d, f in loopdev.loop_backing_files().items() if f.startswith(base + os.sep)]
    mounts = [m for m in loopdev.mountinfo() if m.startswith(base + os.sep)]
    return loops + mounts + ([tbm.state_path(base)] if os.path.exists(tbm.state_path(base)) else [])


@pytest.fixture
def testbed_dir(tmp_path):
    """A directory for one testbed; whatever the test leaves there is torn down, then checked gone."""
    base = tmp_path / "tb"
    yield base
    try:
        destroy_testbed(base)
    finally:
        assert _ours_left(tmp_path) == []


def _read_direct(path, nbytes=None, block=1 << 20, untimed=0):
    """Bytes per second of an O_DIRECT read of ``path`` (as ``dd iflag=direct``), leaving the first
    ``untimed`` bytes out of the timing (blk-throttle lets an idle device start with a burst)."""
    import mmap

    buf = mmap.mmap(-1, block)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        size = nbytes or os.fstat(fd).st_size
        done = 0
        while done < untimed:
            done += os.preadv(fd, [buf], done)
        start = time.perf_counter()
        while done < size:
            n = os.preadv(fd, [buf], done)
            if n <= 0:
                break
            done += n
        return (done - untimed) / (time.perf_counter() - start)
    finally:
        os.close(fd)
        buf.close()


@pytest.mark.slow
@needs_throttle
@pytest.mark.root
@root_only
def test_replicated_testbed_is_throttled_and_torn_down(tmp_path, testbed_dir):
    src = _dataset(tmp_path / "src")
    big = os.path.join(tmp_path / "src", "big.bin")  # 10 MiB to time a direct read with
    with open(big, "wb") as f:
        f.write(os.urandom(10 << 20))
    limit = 10 * MB
    tb = create_testbed(testbed_dir, 2, size_bytes=64 << 20, throttle_bps=limit, data=[str(tmp_path / "src")] + [big],
                        layout="replicated", progress=False)
    mounted = loopdev.mountinfo()
    rules = parse_throttle_rules(Path(os.path.join(tbm.BLKIO_ROOT, "blkio.throttle.read_bps_device")).read_text())
    for m in tb.mounts:
        assert m.mountpoint in mounted and m.direct_io is True
        assert rules[m.devno] == limit
        for p in src + [big]:
            copy = os.path.join(m.mountpoint, os.path.basename(p))
            assert Path(copy).read_bytes() == Path(p).read_bytes()
        for p in src:  # indexes went along, valid
            copy = os.path.join(m.mountpoint, os.path.basename(p))
            assert len(load_index(copy, copy + ".idx")) == 20
    assert load_testbed(testbed_dir) == tb

    # The throttle limits reads: 8 MiB through the filesystem with O_DIRECT (after the 2 MiB that an
    # idle device may let through at once), and the device itself.
    rate = _read_direct(os.path.join(tb.mountpoints[0], "big.bin"), untimed=2 << 20)
    assert 0.5 * limit < rate < 1.5 * limit, f"{rate / MB:.1f} MB/s under a {limit / MB:.0f} MB/s limit"
    measured = tb.measure_read_bps(seconds=0.5)
    assert all(0.8 * limit < r < 1.2 * limit for r in measured), measured
    tb.set_throttle(None)  # and without the rule the same read is far faster
    assert not {m.devno for m in tb.mounts} & set(tb.rules())
    tb.evict()
    assert _read_direct(os.path.join(tb.mountpoints[1], "big.bin")) > 3 * limit

    done = destroy_testbed(testbed_dir)
    assert any("losetup -d" in line for line in done) and any("umount" in line for line in done)
    assert _ours_left(tmp_path) == [] and not os.listdir(testbed_dir)
    assert destroy_testbed(testbed_dir) == []  # idempotent


@pytest.mark.slow
@pytest.mark.root
@root_only
def test_striped_testbed_from_the_command_line(tmp_path, testbed_dir):
    _dataset(tmp_path / "src", shards=5, records=5)
    out = dlstore("testbed", "--dir", testbed_dir, "--mounts", 2, "--size-gb", 0.0625, "--data", tmp_path / "src",
                  "--layout", "striped", "--quiet")
    assert out.returncode == 0, out.stderr
    assert "data: 5 files, striped" in out.stdout and f"--dir {testbed_dir} --down" in out.stdout
    status = json.loads(dlstore("testbed", "--dir", testbed_dir, "--status", "--json").stdout)
    assert [m["files"] for m in status["mounts"]] == [3, 2]
    assert all(m["attached"] and m["mounted"] and m["direct_io"] for m in status["mounts"])
    on = [sorted(n for n in os.listdir(m["mountpoint"]) if n.endswith(".tfrecord")) for m in status["mounts"]]
    assert on == [[f"shard-0000{i}.tfrecord" for i in (0, 2, 4)], [f"shard-0000{i}.tfrecord" for i in (1, 3)]]
    again = dlstore("testbed", "--dir", testbed_dir, "--mounts", 2)
    assert again.returncode == 2 and "already holds a testbed" in again.stderr
    down = dlstore("testbed", "--dir", testbed_dir, "--down")
    assert down.returncode == 0 and "removed" in down.stdout
    assert _ours_left(tmp_path) == []
    down = dlstore("testbed", "--dir", testbed_dir, "--down")
    assert down.returncode == 0 and "nothing to do" in down.stdout


@pytest.mark.root
@root_only
def test_a_failed_step_is_named_and_rolled_back(tmp_path, testbed_dir, monkeypatch):
    real_run = mkfs.run_step

    def failing_mkfs(step, cmd, timeout=300):
        if step == "mkfs mount 1":
            cmd = ["mkfs.ext4", "-q", "-b", "999", cmd[-1]]  # a block size mkfs refuses
        return real_run(step, cmd, timeout)

    monkeypatch.setattr(mkfs, "run_step", failing_mkfs)
    with pytest.raises(TestbedError) as e:
        create_testbed(testbed_dir, 2, size_bytes=32 << 20)
    assert e.value.step == "mkfs mount 1" and e.value.command[0] == "mkfs.ext4"
    assert "mkfs mount 1 failed: `mkfs.ext4 -q -b 999" in str(e.value) and "exited with status" in str(e.value)
    assert e.value.stderr  # mkfs's own words
    assert _ours_left(tmp_path) == []  # mount 0 (complete) and mount 1 (attached) both undone


@pytest.mark.root
@root_only
def test_teardown_after_a_crash_and_after_a_partial_teardown(tmp_path, testbed_dir):
    create_testbed(testbed_dir, 2, size_bytes=32 << 20)
    state = json.loads(Path(tbm.state_path(testbed_dir)).read_text())
    # As if the process died right after `losetup` attached mount 1's device and before recording it.
    state["mounts"][1].update(device=None, devno=None, formatted=False, mounted=False)
    with open(tbm.state_path(testbed_dir), "w") as f:
        json.dump(state, f)
    # And mount 0 already half torn down by hand.
    m0 = state["mounts"][0]
    subprocess.run(["umount", m0["mountpoint"]], check=True)
    subprocess.run(["losetup", "-d", m0["device"]], check=True)
    destroy_testbed(testbed_dir)
    assert _ours_left(tmp_path) == []


@pytest.mark.root
@root_only
def test_break_and_restore_each_way(tmp_path, testbed_dir):
    _dataset(tmp_path / "src", shards=1, records=30)
    tb = create_testbed(testbed_dir, 2, size_bytes=32 << 20, data=str(tmp_path / "src"), progress=False)
    name = "shard-00000.tfrecord"
    path = os.path.join(tb.mountpoints[0], name)
    expected = Path(tmp_path / "src" / name).read_bytes()

    with open(path, "rb") as held:  # umount -l: new opens ENOENT, open files keep reading
        tb.break_mount(0, "umount")
        with pytest.raises(FileNotFoundError):
            open(path, "rb")
        assert held.read() == expected
        assert Path(os.path.join(tb.mountpoints[1], name)).read_bytes() == expected  # the replica
    tb.restore(0)
    assert Path(path).read_bytes() == expected

    tb.evict()
    with open(path, "rb", buffering=0) as held:  # eio: even an open file fails
        tb.break_mount(0, "eio")
        with pytest.raises(OSError) as e:
            held.read(100)
        assert e.value.errno == errno.EIO
    tb.restore(0)  # the file is closed: the filesystem mounts again
    assert Path(path).read_bytes() == expected
    assert oracle_read_tfrecord(expected)

    tb.evict()
    done = threading.Event()
    reader = threading.Thread(target=lambda: (_read_direct(path, 64 << 10, block=64 << 10), done.set()), daemon=True)
    tb.break_mount(0, "stall")  # 4 KiB/s: 64 KiB would take 16 s
    reader.start()
    assert not done.wait(0.7)
    tb.restore(0)
    assert done.wait(10), "the read did not finish once the stall was lifted"
    assert tb.mounts[0].throttle_bps is None and tb.mounts[0].devno not in tb.rules()

    tb.break_mount(0, "chmod")
    assert os.stat(tb.mountpoints[0]).st_mode & 0o777 == 0
    with pytest.raises(TestbedError, match="already broken"):
        tb.break_mount(0, "umount")
    tb.restore()
    assert os.stat(tb.mountpoints[0]).st_mode & 0o777 == 0o755
    assert all(m.broken is None for m in load_testbed(testbed_dir).mounts)


@needs_throttle
@pytest.mark.root
@root_only
def test_rules_in_a_child_cgroup_throttle_only_its_members(tmp_path, testbed_dir):
    # cgroup v1 throttling is flat: the rule binds the processes of its own cgroup, no one else.
    src = tmp_path / "src"
    os.makedirs(src)
    (src / "big.bin").write_bytes(os.urandom(4 << 20))
    name = f"dlstore-testbed-test{os.getpid()}"
    limit = 5 * MB
    tb = create_testbed(testbed_dir, 1, size_bytes=32 << 20, throttle_bps=limit, data=str(src / "big.bin"),
                        cgroup=name, progress=False)
    assert tb.cgroup_created and os.path.isdir(tb.cgroup_dir)
    path = os.path.join(tb.mountpoints[0], "big.bin")
    assert tbm.blkio_cgroup_of() != "/" + name
    assert _read_direct(path) > 3 * limit  # this process is outside the rule's cgroup
    tb.evict()
    out = tb.run(["dd", f"if={path}", "of=/dev/null", "bs=1M", "iflag=direct"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rate, unit = re.search(r"([\d.]+) (\w+)/s$", out.stderr.strip()).groups()  # "..., 5.0 MB/s"
    assert unit in ("kB", "MB") and float(rate) * {"kB": 1e3, "MB": 1e6}[unit] < 1.5 * limit, out.stderr
    destroy_testbed(testbed_dir)
    assert not os.path.exists(tb.cgroup_dir)


@pytest.mark.root
@pytest.mark.skipif(_why_no_testbed("xfs") is not None, reason=f"needs an xfs testbed: {_why_no_testbed('xfs')}")
def test_xfs_testbed_and_reflinked_copies(tmp_path, testbed_dir):
    tb = create_testbed(testbed_dir, 1, size_bytes=320 << 20, fs="xfs")
    src_dir = os.path.join(tb.mountpoints[0], "src")
    src = _dataset(src_dir, shards=1, records=10)
    r = expand_shards(src, os.path.join(tb.mountpoints[0], "x"), 3, mode="reflink", progress=False)
    assert r.indexes == 3
    for out in r.outputs:
        assert Path(out).read_bytes() == Path(src[0]).read_bytes()
        assert os.stat(out).st_ino != os.stat(src[0]).st_ino
    assert tb.status()["mounts"][0]["mounted"]


def test_expand_refuses_another_set_or_a_place_inside_a_source_directory(tmp_path):
    src = _dataset(tmp_path / "src", shards=2, index=False)
    other = _dataset(tmp_path / "other", shards=1, index=False)
    before = sorted(os.listdir(tmp_path / "other"))
    with pytest.raises(DlstoreError, match="already holds 1 record file"):
        expand_shards(src, str(tmp_path / "other"), 2, progress=False)
    assert sorted(os.listdir(tmp_path / "other")) == before and other
    with pytest.raises(ValueError, match="is inside .*src, which holds the source"):
        expand_shards(str(tmp_path / "src"), str(tmp_path / "src" / "more"), 2, progress=False)
    assert not (tmp_path / "src" / "more").exists()
    # An interrupted run of the same expansion resumes into its own copies.
    first = expand_shards(src, str(tmp_path / "out"), 2, progress=False)
    assert len(expand_shards(src, str(tmp_path / "out"), 2, progress=False).outputs) == len(first.outputs)


def test_expand_copies_a_source_named_twice_once(tmp_path):
    src = _dataset(tmp_path / "src", shards=1, index=False)
    r = expand_shards([src[0], src[0], os.path.join(str(tmp_path), "src", ".", os.path.basename(src[0]))],
                      str(tmp_path / "out"), 2, progress=False)
    assert len(r.outputs) == 2 and len(os.listdir(tmp_path / "out")) >= 2
