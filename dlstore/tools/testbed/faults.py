"""Fault injection for failover tests: breaking a testbed mount in one of four ways, and restoring it.

:meth:`Testbed.break_mount` and :meth:`Testbed.restore` call these; what each mode does to readers
is told there.
"""
from __future__ import annotations

import fcntl
import os
from typing import TYPE_CHECKING, List, Optional

from dlstore.tools.testbed.blkio import RULE_FILE, throttle_rule
from dlstore.tools.testbed.loopdev import is_mounted
from dlstore.tools.testbed.steps import TestbedError, run_step

if TYPE_CHECKING:  # annotations only: the state module imports this one
    from dlstore.tools.testbed.state import Testbed

__all__ = ["BREAK_MODES", "STALL_BPS", "break_mount", "restore_mount", "shutdown_filesystem"]

BREAK_MODES = ("umount", "eio", "stall", "chmod")
STALL_BPS = 4096  # "stall": reads crawl at one page a second, so a reader's timeout fires
# EXT4_IOC_SHUTDOWN and XFS_IOC_GOINGDOWN are the same number: _IOR('X', 125, __u32).
_FS_SHUTDOWN = 0x8004587D
_SHUTDOWN_NOLOGFLUSH = 2  # stop at once; a read-only workload has nothing to flush


def shutdown_filesystem(mountpoint: str, step: str) -> None:
    """Shuts the filesystem mounted at ``mountpoint`` down: every read of it fails with EIO."""
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, _FS_SHUTDOWN, _SHUTDOWN_NOLOGFLUSH.to_bytes(4, "little"))
    except OSError as e:
        raise TestbedError(f"{step} failed: the shutdown ioctl on {mountpoint}: {e.strerror} (errno {e.errno})",
                           step=step, path=mountpoint) from e
    finally:
        os.close(fd)


def break_mount(tb: "Testbed", i: int, how: str) -> None:
    """Breaks mount ``i`` of ``tb`` in the way ``how`` (one of :data:`BREAK_MODES`) and records it."""
    if how not in BREAK_MODES:
        raise ValueError(f"how must be one of {BREAK_MODES}, not {how!r}")
    m = tb.mounts[tb._indexes([i])[0]]
    if m.broken:
        raise TestbedError(f"mount {i} is already broken ({m.broken}): restore it first", step=f"break mount {i}")
    step = f"break mount {i} ({how})"
    cmd: List[str]
    if how == "umount":
        cmd = ["umount", "-l", m.mountpoint]
        run_step(step, cmd)
        m.mounted = False
    elif how == "eio":
        shutdown_filesystem(m.mountpoint, step)
        cmd = [f"ioctl(FS_IOC_SHUTDOWN, NOLOGFLUSH) on {m.mountpoint}"]
    elif how == "stall":
        saved = m.throttle_bps
        tb._write_rule(m, STALL_BPS)
        m.throttle_bps = saved  # what restore() puts back
        cmd = [f"echo {throttle_rule(m.devno or '', STALL_BPS)} > {os.path.join(tb.cgroup_dir, RULE_FILE)}"]
    else:
        os.chmod(m.mountpoint, 0)
        cmd = ["chmod", "000", m.mountpoint]
    m.broken = how
    tb._record(step, cmd)


def restore_mount(tb: "Testbed", i: Optional[int] = None) -> None:
    """Undoes :func:`break_mount` on mount ``i`` of ``tb`` (every broken mount by default)."""
    for j in tb._indexes(None if i is None else [i]):
        m = tb.mounts[j]
        if not m.broken:
            continue
        step = f"restore mount {j} ({m.broken})"
        if m.broken == "umount":
            tb._mount(m, step)
        elif m.broken == "eio":
            if is_mounted(m.mountpoint):
                run_step(step, ["umount", m.mountpoint])  # fails while files are open: the message says so
            m.mounted = False
            tb.save()
            tb._mount(m, step)
            try:
                os.listdir(m.mountpoint)
            except OSError as e:
                raise TestbedError(f"{step}: {m.mountpoint} still fails after mounting it again "
                                   f"({e.strerror}): a file on it was still open", step=step) from e
        elif m.broken == "stall":
            tb._write_rule(m, m.throttle_bps)
        else:
            os.chmod(m.mountpoint, 0o755)
        m.broken = None
        tb._record(step)
