"""dlstore.io.system: the one reading of /proc/mounts and /proc/meminfo that the engine choice and the
benchmark header share."""
import os

from dlstore.bench import sysinfo
from dlstore.io import pagecache as cache
from dlstore.io import select, system

MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
tmpfs /data tmpfs rw 0 0
/dev/nvme0n1 /data xfs rw 0 0
server:/export /data/my\\040set nfs4 rw 0 0
/dev/odd\\134dev /data/tab\\011and\\012newline ext4 rw 0 0
/dev/vdb /database ext4 rw 0 0
"""


def _table(tmp_path):
    path = tmp_path / "mounts"
    path.write_text(MOUNTS)
    return str(path)


def test_the_last_longest_mount_wins(tmp_path):
    table = _table(tmp_path)
    # Two mounts on /data: the later one shadows the earlier.
    assert system.filesystem_of("/data/train/x.tfrecord", table) == {
        "mount": "/data", "fstype": "xfs", "device": "/dev/nvme0n1"}
    assert system.filesystem_of("/data", table)["fstype"] == "xfs"
    # /database is not inside /data, nor /data inside /database.
    assert system.filesystem_of("/database/x", table)["device"] == "/dev/vdb"
    assert system.filesystem_of("/elsewhere", table)["mount"] == "/"


def test_octal_escapes_are_undone(tmp_path):
    table = _table(tmp_path)
    assert system.filesystem_of("/data/my set/x", table) == {
        "mount": "/data/my set", "fstype": "nfs4", "device": "server:/export"}
    assert system.filesystem_of("/data/tab\tand\nnewline/x", table) == {
        "mount": "/data/tab\tand\nnewline", "fstype": "ext4", "device": "/dev/odd\\dev"}
    # Unescaped text that merely looks like an escape in a path is not a match.
    assert system.filesystem_of("/data/my\\040set/x", table)["mount"] == "/data"


def test_unreadable_table_says_unknown(tmp_path):
    assert system.filesystem_of("/x", str(tmp_path / "missing")) == {
        "mount": "", "fstype": "unknown", "device": "unknown"}


def test_meminfo_in_bytes(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text("MemTotal:       16384 kB\nMemAvailable:    8192 kB\nHugePages_Total:       4\n")
    assert system.meminfo(str(path)) == {"MemTotal": 16 << 20, "MemAvailable": 8 << 20, "HugePages_Total": 4}
    assert system.meminfo(str(tmp_path / "missing")) == {}


def test_one_implementation_serves_every_caller():
    assert sysinfo.filesystem_of is system.filesystem_of
    assert cache.meminfo is system.meminfo
    assert select.filesystem_of is system.filesystem_of
    if os.path.exists("/proc/meminfo"):
        assert 0 < system.available_page_cache_bytes() <= system.meminfo()["MemTotal"]
    from dlstore.bench import report

    assert report.fmt_bytes is system.format_bytes
    sizes = {3.14e9: "3.14 GB", 24.9e9: "24.9 GB", 46.1e6: "46.1 MB", 999.7e6: "1.00 GB", 512: "512 B",
             1.5e3: "1.50 kB", 2.5e12: "2.50 TB", 0: "0 B"}
    assert {n: system.format_bytes(n) for n in sizes} == sizes
