"""Loop devices and mounts: attaching an image, mounting it, and what the system shows of both.

The system is asked, not the record: a loop device is found by its backing file
(``/sys/block/loopN/loop/backing_file``), a mount point by ``/proc/self/mountinfo``, so a device
attached or a filesystem mounted just before a crash is found too.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

from dlstore.io.system import unescape_mount_field
from dlstore.tools.testbed.steps import run_step

__all__ = ["BASE_TOOLS", "attach_loop", "mount_filesystem", "mountinfo", "is_mounted", "loop_backing_files",
           "devno", "loop_direct_io"]

BASE_TOOLS = ("losetup", "mount", "umount")


def attach_loop(step: str, image: str, direct_io: bool) -> Tuple[str, List[str]]:
    """Attaches ``image`` to a free loop device, with direct I/O when asked; ``(device, command)``."""
    cmd = ["losetup", "--find", "--show"] + (["--direct-io=on"] if direct_io else []) + [image]
    return run_step(step, cmd).strip(), cmd


def mount_filesystem(step: str, fs: str, device: str, mountpoint: str) -> List[str]:
    """Mounts ``device`` at ``mountpoint`` with ``noatime`` (reads write nothing); returns the command."""
    cmd = ["mount", "-t", fs, "-o", "noatime", device, mountpoint]
    run_step(step, cmd)
    return cmd


def mountinfo() -> List[str]:
    """Every mount point of this mount namespace (a path mounted twice appears twice)."""
    with open("/proc/self/mountinfo") as f:
        # Space, tab, newline and backslash come as octal escapes, as in /proc/mounts.
        return [unescape_mount_field(line.split()[4]) for line in f if len(line.split()) > 4]


def is_mounted(path: str) -> bool:
    return os.path.abspath(path) in mountinfo()


def loop_backing_files() -> Dict[str, str]:
    """``{"/dev/loopN": backing file}`` for every attached loop device."""
    out = {}
    try:
        names = os.listdir("/sys/block")
    except OSError:
        return out
    for name in names:
        if not name.startswith("loop"):
            continue
        try:
            with open(f"/sys/block/{name}/loop/backing_file") as f:
                backing = f.read().rstrip("\n")
        except OSError:
            continue  # not attached
        if backing.endswith(" (deleted)"):
            backing = backing[: -len(" (deleted)")]
        out[f"/dev/{name}"] = backing
    return out


def devno(device: str) -> str:
    """The ``MAJOR:MINOR`` of a device node."""
    rdev = os.stat(device).st_rdev
    return f"{os.major(rdev)}:{os.minor(rdev)}"


def loop_direct_io(device: str) -> Optional[bool]:
    """Whether the loop device really does direct I/O on its backing file (``None``: unknown)."""
    try:
        with open(f"/sys/block/{os.path.basename(device)}/loop/dio") as f:
            return f.read().strip() == "1"
    except OSError:
        return None
