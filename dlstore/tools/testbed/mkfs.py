"""The filesystems a testbed mount can have: their commands, their minimum sizes, and making one.

ext4 is made with its inode tables and journal written at once, not by a kernel thread after
mounting (whose writes would disturb the first measurements), and with no blocks reserved for root
on a data disk; xfs with its defaults.
"""
from __future__ import annotations

from typing import List

from dlstore.tools.testbed.steps import MiB, run_step

__all__ = ["FILESYSTEMS", "MIN_SIZE_BYTES", "DEFAULT_SIZE_BYTES", "MKFS", "default_size_bytes", "make_filesystem"]

FILESYSTEMS = ("ext4", "xfs")
# mkfs.xfs refuses filesystems below 300 MB ("Filesystem must be larger than 300MB").
MIN_SIZE_BYTES = {"ext4": 16 * MiB, "xfs": 300 * MiB}
DEFAULT_SIZE_BYTES = 1 << 30  # each image is sparse: only what is written takes disk space
# Inode tables and journal written now, not by a kernel thread after mounting, whose writes would
# disturb the first measurements; -m 0: no blocks reserved for root on a data disk.
MKFS = {
    "ext4": ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0"],
    "xfs": ["mkfs.xfs", "-q", "-f"],
}


def default_size_bytes(data_bytes: int, fs: str = "ext4") -> int:
    """An image size that holds ``data_bytes`` of files: 10 % plus 64 MiB for the journal, inode
    tables and allocation slack, rounded up to MiB; at least the filesystem's minimum. Without data,
    :data:`DEFAULT_SIZE_BYTES`."""
    if data_bytes <= 0:
        return max(DEFAULT_SIZE_BYTES, MIN_SIZE_BYTES[fs])
    want = int(data_bytes * 1.1) + 64 * MiB
    return max(-(-want // MiB) * MiB, MIN_SIZE_BYTES[fs])


def make_filesystem(step: str, fs: str, device: str) -> List[str]:
    """Makes a ``fs`` filesystem on ``device``; returns the command, for the log."""
    cmd = MKFS[fs] + [device]
    run_step(step, cmd)
    return cmd
