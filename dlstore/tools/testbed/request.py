"""What a testbed may be asked for, checked before anything is touched: root, the tools on ``PATH``,
the arguments, and which dataset files go on which mount.
"""
from __future__ import annotations

import os
import re
import shutil
from typing import List, Optional, Sequence

from dlstore.tools.testbed.loopdev import BASE_TOOLS
from dlstore.tools.testbed.mkfs import FILESYSTEMS, MIN_SIZE_BYTES, MKFS
from dlstore.tools.testbed.steps import MiB

__all__ = ["root_refusal", "missing_tools", "validate_request", "layout_files", "LAYOUTS", "MAX_MOUNTS"]

LAYOUTS = ("replicated", "striped")
MAX_MOUNTS = 64
_CGROUP_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def root_refusal(euid: Optional[int] = None) -> Optional[str]:
    """``None`` when the effective user is root, else the message that says what is needed."""
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return None
    return (f"the testbed needs root (effective uid 0; this process has {euid}): it creates loop devices "
            f"(losetup), makes filesystems (mkfs), mounts them and writes cgroup blkio rules. "
            f"Run it as root, e.g. `sudo dlstore testbed ...`")


def missing_tools(fs: str = "ext4") -> List[str]:
    """The commands a testbed of filesystem ``fs`` needs that are not on ``PATH``."""
    return [t for t in (*BASE_TOOLS, MKFS[fs][0]) if shutil.which(t) is None]


def validate_request(mounts: int, size_bytes: Optional[int] = None, fs: str = "ext4",
                     throttle_bps: Optional[int] = None, layout: Optional[str] = None,
                     cgroup: Optional[str] = None) -> None:
    """Checks the arguments of :func:`create_testbed` without touching the system.

    Raises
    ------
    ValueError
        Naming the argument and what it may be.
    """
    if isinstance(mounts, bool) or not isinstance(mounts, int) or not 1 <= mounts <= MAX_MOUNTS:
        raise ValueError(f"mounts must be a whole number from 1 to {MAX_MOUNTS}, not {mounts!r}")
    if fs not in FILESYSTEMS:
        raise ValueError(f"fs must be one of {FILESYSTEMS}, not {fs!r}")
    if size_bytes is not None:
        if size_bytes < MIN_SIZE_BYTES[fs]:
            raise ValueError(f"each {fs} image must have at least {MIN_SIZE_BYTES[fs] // MiB} MiB, "
                             f"not {size_bytes / MiB:.1f} MiB")
    if throttle_bps is not None and (isinstance(throttle_bps, bool) or not throttle_bps >= 1):
        raise ValueError(f"throttle_bps must be at least 1 byte per second (None: no throttle), not {throttle_bps!r}")
    if layout is not None and layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    if cgroup is not None and (not _CGROUP_NAME.match(cgroup) or cgroup in (".", "..")):
        raise ValueError(f"cgroup must be one plain name (letters, digits, _ . -), not {cgroup!r}")


def layout_files(names: Sequence[str], mounts: int, layout: str) -> List[List[str]]:
    """Which files go on which mount: all on every mount (``replicated``), or file ``i`` on mount
    ``i % mounts`` (``striped``), in the order given."""
    if layout == "replicated":
        return [list(names) for _ in range(mounts)]
    if layout == "striped":
        return [list(names[m::mounts]) for m in range(mounts)]
    raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
