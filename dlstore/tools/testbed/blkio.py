"""cgroup v1 blkio: read-bandwidth rules on devices, the cgroup that holds them, and measuring what a
rule lets through.

A rule is a line ``"MAJ:MIN BYTES_PER_SECOND"`` in ``blkio.throttle.read_bps_device`` (0 removes it).
cgroup v1's blk-throttle is flat: a rule binds the processes of the cgroup it is written in, not
those of its children, and binds them together (docs/testbed.md has the measurements).
"""
from __future__ import annotations

import errno
import mmap
import os
import re
import time
from typing import Dict, List, Optional, Union

from dlstore.tools.testbed.steps import MiB, TestbedError

__all__ = ["BLKIO_ROOT", "RULE_FILE", "throttle_rule", "parse_throttle_rules", "blkio_cgroup_of", "read_rules",
           "write_rule", "make_cgroup", "remove_cgroup", "enter_cgroup", "processes_outside", "direct_read_rate"]

BLKIO_ROOT = "/sys/fs/cgroup/blkio"
RULE_FILE = "blkio.throttle.read_bps_device"
_BURST_S = 0.2  # measurements leave out the first 0.2 s: blk-throttle's burst of an idle group
_DEVNO = re.compile(r"^\d+:\d+$")


def throttle_rule(devno: str, bps: Optional[int]) -> str:
    """The line written to ``blkio.throttle.read_bps_device``: ``"7:3 20000000"``; 0 removes the rule."""
    if not _DEVNO.match(devno):
        raise ValueError(f"a device number is MAJOR:MINOR, not {devno!r}")
    return f"{devno} {int(bps or 0)}"


def parse_throttle_rules(text: str) -> Dict[str, int]:
    """``{"MAJ:MIN": bytes per second}`` from the contents of ``blkio.throttle.read_bps_device``."""
    rules = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and _DEVNO.match(parts[0]) and parts[1].isdigit():
            rules[parts[0]] = int(parts[1])
    return rules


def blkio_cgroup_of(pid: Union[int, str] = "self") -> Optional[str]:
    """The blkio cgroup (``"/"`` for the root) of a process under cgroup v1, or ``None`` when there is
    no v1 blkio hierarchy or the process is gone."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if "blkio" in controllers.split(","):
                    return path
    except (OSError, ValueError):
        return None
    return None


def read_rules(cgroup_dir: str) -> Dict[str, int]:
    """The read rules now in the cgroup directory ``cgroup_dir``, for every device (``{}`` without blkio)."""
    try:
        with open(os.path.join(cgroup_dir, RULE_FILE)) as f:
            return parse_throttle_rules(f.read())
    except OSError:
        return {}


def write_rule(cgroup_dir: str, devno: str, bps: Optional[int], step: str) -> str:
    """Sets (``None`` or 0: removes) the read limit of device ``devno`` in ``cgroup_dir``; returns the
    command it amounts to, for the log. A :class:`TestbedError` naming ``step`` when it fails."""
    line = throttle_rule(devno, bps)
    path = os.path.join(cgroup_dir, RULE_FILE)
    try:
        with open(path, "w") as f:
            f.write(line + "\n")
    except OSError as e:
        raise TestbedError(f"{step} failed: writing {line!r} to {path}: {e.strerror} (errno {e.errno})",
                           step=step, path=path) from e
    return f"echo {line} > {path}"


def make_cgroup(path: str, step: str) -> bool:
    """Creates the blkio cgroup ``path``; True when it was made here, False when it was there already
    (someone's, or left over: used, and left in place by the teardown)."""
    try:
        os.mkdir(path)
    except FileExistsError:
        return False
    except OSError as e:
        raise TestbedError(f"{step} failed: {e.strerror} (errno {e.errno})", step=step, path=path) from e
    return True


def remove_cgroup(path: str) -> List[str]:
    """Removes the blkio cgroup ``path``, moving the processes still in it back to the root first
    (``rmdir`` fails otherwise); returns what was done."""
    if not os.path.isdir(path):
        return []
    done = []
    # Processes started in it with --exec and still running go back to the root, or rmdir fails.
    with open(os.path.join(path, "cgroup.procs")) as f:
        pids = [p for p in f.read().split() if p]
    for pid in pids:
        try:
            with open(os.path.join(BLKIO_ROOT, "cgroup.procs"), "w") as f:
                f.write(pid + "\n")
        except OSError:
            pass  # exited meanwhile
    if pids:
        done.append(f"moved {len(pids)} processes from {path} back to {BLKIO_ROOT}")
    try:
        os.rmdir(path)
    except OSError as e:
        raise TestbedError(f"remove cgroup failed: rmdir {path}: {e.strerror} (errno {e.errno})",
                           step="remove cgroup", path=path) from e
    done.append(f"removed cgroup {path}")
    return done


def enter_cgroup(cgroup_dir: str, pid: int = 0) -> None:
    """Moves process ``pid`` (0: the caller) into the cgroup directory ``cgroup_dir``."""
    procs = os.path.join(cgroup_dir, "cgroup.procs")
    if not os.path.exists(procs):
        return  # no blkio hierarchy, so no rule to be subject to
    with open(procs, "w") as f:
        f.write(f"{pid or os.getpid()}\n")


def processes_outside(cgroup: str) -> Optional[int]:
    """How many processes are in another blkio cgroup than ``cgroup`` (their reads escape its rules
    under cgroup v1's flat throttling); ``None`` without a v1 blkio hierarchy."""
    if not os.path.isdir(BLKIO_ROOT):
        return None
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            where = blkio_cgroup_of(pid)
            if where is not None and where != cgroup:
                n += 1
    return n


def direct_read_rate(device: str, limit: Optional[int], seconds: float) -> float:
    """Bytes per second of sequential O_DIRECT reads of ``device`` for about ``seconds``; ``limit``,
    the rule expected on it, sizes the requests."""
    block = MiB
    if limit:  # one request at most an eighth of the time, 4 KiB at least, page aligned
        block = max(4096, min(MiB, int(limit * seconds / 8) // 4096 * 4096))
    fd = os.open(device, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, block)  # page aligned, as O_DIRECT needs
    try:
        size = os.lseek(fd, 0, os.SEEK_END) // block * block
        pos = done = 0
        begin = time.perf_counter()
        start = None
        while True:
            n = os.preadv(fd, [buf], pos)
            if n <= 0:
                raise OSError(errno.EIO, f"read of {device} at {pos} returned {n}")
            pos = (pos + n) % size
            now = time.perf_counter()
            if start is None:
                # blk-throttle lets an idle group start with a slice's worth of bytes at once
                # (100 ms of the limit): that burst is read first and left out of the rate.
                if now - begin >= _BURST_S:
                    start = now
                continue
            done += n
            if now - start >= seconds:
                return done / (now - start)
    finally:
        buf.close()
        os.close(fd)
