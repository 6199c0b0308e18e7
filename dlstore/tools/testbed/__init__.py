"""``dlstore testbed``: N loop-mounted filesystems on one host, each optionally throttled, to emulate a
multi-mount storage system (the Dell EMC Isilon reference architecture's 16 NFS mounts of one
export) without one. Root only.

Per mount ``i``: a sparse image file ``DIR/images/disk{i}.img``, a loop device attached with direct
I/O (``losetup --find --show --direct-io=on``), a filesystem (ext4 or xfs) mounted with ``noatime`` at
``DIR/mnt{i}``, and optionally a cgroup v1 read-bandwidth rule on the loop device
(``blkio.throttle.read_bps_device``, ``"MAJ:MIN BYTES_PER_SECOND"``). A dataset is then copied onto
every mount (``replicated``) or dealt out (``striped``: shard ``i`` on mount ``i % N``), and evicted
from the page cache, so the first reads are cold.

Every step is recorded in ``DIR/testbed.json`` as soon as it is done, and every path is recorded
before anything is created, so :func:`destroy_testbed` (``dlstore testbed --dir DIR --down``) undoes
a complete or a partial setup. It looks at the system as well as at the record: a loop device
attached just before a crash is found by its backing file, a mount point by ``/proc/self/mountinfo``.

Two choices, measured on the machine this was written on (docs/testbed.md has the figures):

- **Direct I/O on the loop device.** Without it the loop driver reads and writes the image file
  through the host's page cache: every block is cached twice (by the mounted filesystem, and as
  part of the image: 55 % of a 512 MiB image stayed cached after writing 256 MiB to its mount), and
  a mount whose own cache was dropped is still read from the image's cached pages (3.0-4.0 GB/s on
  a quiet machine, 1.4-1.9 GB/s on a busy one, against 0.7-1.4 GB/s from the disk). With it, a cold
  read of a mount really reaches the disk, and the image takes no page cache.
- **Rules in the root blkio cgroup.** cgroup v1's blk-throttle is flat: a rule applies to the
  processes of the cgroup it is written in and not to those of child cgroups (a process moved into
  a child cgroup read straight past a 20 MiB/s root rule at 1.4 GB/s). On a host without systemd
  every process sits in the root blkio cgroup, so a rule there throttles all of them, and all the
  readers of one mount share its bandwidth, as on a real mount (two readers: 10.7 + 10.7 MB/s under
  a 21 MB/s rule). Where processes live in child cgroups (systemd slices), run the readers with
  ``dlstore testbed --dir DIR --exec -- CMD`` or :meth:`Testbed.run`, which move them into the
  testbed's cgroup first; or pass ``cgroup="NAME"`` to keep the rules in a child cgroup of their own
  (created, and removed by the teardown), with the same ``--exec`` to run readers in it.
"""
from __future__ import annotations

import datetime
import errno
import fcntl
import json
import mmap
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from dlstore.errors import DlstoreError
from dlstore.io.system import format_bytes, unescape_mount_field

__all__ = [
    "Testbed",
    "TestbedMount",
    "TestbedError",
    "create_testbed",
    "destroy_testbed",
    "load_testbed",
    "root_refusal",
    "missing_tools",
    "validate_request",
    "layout_files",
    "default_size_bytes",
    "throttle_rule",
    "parse_throttle_rules",
    "blkio_cgroup_of",
    "state_path",
    "BLKIO_ROOT",
    "STATE_FILE",
    "FILESYSTEMS",
    "LAYOUTS",
    "BREAK_MODES",
    "MAX_MOUNTS",
]

MiB = 1 << 20
BLKIO_ROOT = "/sys/fs/cgroup/blkio"
_RULE_FILE = "blkio.throttle.read_bps_device"
STATE_FILE = "testbed.json"
STATE_VERSION = 1
FILESYSTEMS = ("ext4", "xfs")
LAYOUTS = ("replicated", "striped")
BREAK_MODES = ("umount", "eio", "stall", "chmod")
MAX_MOUNTS = 64
# mkfs.xfs refuses filesystems below 300 MB ("Filesystem must be larger than 300MB").
MIN_SIZE_BYTES = {"ext4": 16 * MiB, "xfs": 300 * MiB}
DEFAULT_SIZE_BYTES = 1 << 30  # each image is sparse: only what is written takes disk space
# Inode tables and journal written now, not by a kernel thread after mounting, whose writes would
# disturb the first measurements; -m 0: no blocks reserved for root on a data disk.
_MKFS = {
    "ext4": ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0"],
    "xfs": ["mkfs.xfs", "-q", "-f"],
}
_BASE_TOOLS = ("losetup", "mount", "umount")
# EXT4_IOC_SHUTDOWN and XFS_IOC_GOINGDOWN are the same number: _IOR('X', 125, __u32).
_FS_SHUTDOWN = 0x8004587D
_SHUTDOWN_NOLOGFLUSH = 2  # stop at once; a read-only workload has nothing to flush
_BURST_S = 0.2  # measurements leave out the first 0.2 s: blk-throttle's burst of an idle group
STALL_BPS = 4096  # "stall": reads crawl at one page a second, so a reader's timeout fires
_CGROUP_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class TestbedError(DlstoreError):
    """A testbed step failed. The message names the step and, for a command, the command line, its
    exit status and its stderr.

    Attributes
    ----------
    step : str or None
        What was being done (``"attach mount 1"``, ``"mkfs mount 0"``, ``"throttle mount 2"``).
    command : list of str or None
        The command that failed.
    stderr : str or None
        What it printed on stderr.
    """

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self, message: str, step: Optional[str] = None, command: Optional[Sequence[str]] = None,
                 stderr: Optional[str] = None, path: Optional[str] = None):
        super().__init__(message, path=path)
        self.step = step
        self.command = list(command) if command is not None else None
        self.stderr = stderr


# ---- pure parts: checks, naming, layout, rules ----------------------------------------------------

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
    return [t for t in (*_BASE_TOOLS, _MKFS[fs][0]) if shutil.which(t) is None]


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


def default_size_bytes(data_bytes: int, fs: str = "ext4") -> int:
    """An image size that holds ``data_bytes`` of files: 10 % plus 64 MiB for the journal, inode
    tables and allocation slack, rounded up to MiB; at least the filesystem's minimum. Without data,
    :data:`DEFAULT_SIZE_BYTES`."""
    if data_bytes <= 0:
        return max(DEFAULT_SIZE_BYTES, MIN_SIZE_BYTES[fs])
    want = int(data_bytes * 1.1) + 64 * MiB
    return max(-(-want // MiB) * MiB, MIN_SIZE_BYTES[fs])


def throttle_rule(devno: str, bps: Optional[int]) -> str:
    """The line written to ``blkio.throttle.read_bps_device``: ``"7:3 20000000"``; 0 removes the rule."""
    if not re.match(r"^\d+:\d+$", devno):
        raise ValueError(f"a device number is MAJOR:MINOR, not {devno!r}")
    return f"{devno} {int(bps or 0)}"


def parse_throttle_rules(text: str) -> Dict[str, int]:
    """``{"MAJ:MIN": bytes per second}`` from the contents of ``blkio.throttle.read_bps_device``."""
    rules = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and re.match(r"^\d+:\d+$", parts[0]) and parts[1].isdigit():
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


def state_path(directory: str) -> str:
    """Where the state of the testbed in ``directory`` is kept."""
    return os.path.join(os.path.abspath(directory), STATE_FILE)


# ---- the state -----------------------------------------------------------------------------------

@dataclass
class TestbedMount:
    """One mount of a testbed, as recorded (``Testbed.status()`` tells what the system shows).

    Attributes
    ----------
    index : int
    image : str
        The sparse image file.
    mountpoint : str
    device : str or None
        The loop device, once attached (``/dev/loop3``).
    devno : str or None
        Its ``MAJOR:MINOR``, the key of throttle rules.
    direct_io : bool or None
        Whether the loop device really does direct I/O on the image (read back from sysfs).
    formatted, mounted : bool
    throttle_bps : int or None
        The read limit in bytes per second, when one is set.
    broken : str or None
        How :meth:`Testbed.break_mount` broke it (one of :data:`BREAK_MODES`), until restored.
    files : list of str
        The dataset files copied onto it, relative to the mount point.
    """

    __test__ = False

    index: int
    image: str
    mountpoint: str
    device: Optional[str] = None
    devno: Optional[str] = None
    direct_io: Optional[bool] = None
    formatted: bool = False
    mounted: bool = False
    throttle_bps: Optional[int] = None
    broken: Optional[str] = None
    files: List[str] = field(default_factory=list)


@dataclass
class Testbed:
    """A set of loop-mounted filesystems, as recorded in ``DIR/testbed.json``.

    Made by :func:`create_testbed`, reloaded by :func:`load_testbed`, removed by :meth:`destroy`
    (or :func:`destroy_testbed`). A context manager: leaving the ``with`` block destroys it.

    Attributes
    ----------
    dir : str
    fs : str
    size_bytes : int
        Size of each image.
    mounts : list of TestbedMount
    cgroup : str
        The blkio cgroup holding the throttle rules, relative to :data:`BLKIO_ROOT` (``""``: the root).
    cgroup_created : bool
        Whether this testbed created it (and the teardown removes it).
    layout : str or None
        ``"replicated"`` or ``"striped"`` when a dataset was copied.
    source : list of str
        The dataset files copied.
    log : list of dict
        Each step done, with its time and command.
    notes : list of str
        Things the user should know (direct I/O refused by the backing filesystem, ...).
    """

    __test__ = False

    dir: str
    fs: str
    size_bytes: int
    mounts: List[TestbedMount]
    cgroup: str = ""
    cgroup_created: bool = False
    layout: Optional[str] = None
    source: List[str] = field(default_factory=list)
    log: List[Dict[str, Any]] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    version: int = STATE_VERSION
    created: str = ""

    # -- recording --

    @property
    def state_file(self) -> str:
        return state_path(self.dir)

    @property
    def mountpoints(self) -> List[str]:
        """The mount points, in order: what a dlstore dataset takes as ``mounts=[...]``."""
        return [m.mountpoint for m in self.mounts]

    @property
    def cgroup_dir(self) -> str:
        return os.path.join(BLKIO_ROOT, self.cgroup) if self.cgroup else BLKIO_ROOT

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Testbed":
        if d.get("version") != STATE_VERSION:
            raise ValueError(f"testbed state version {d.get('version')!r}, this dlstore reads {STATE_VERSION}")
        known = {f.name for f in fields(TestbedMount)}
        mounts = [TestbedMount(**{k: v for k, v in m.items() if k in known}) for m in d["mounts"]]
        top = {f.name for f in fields(cls)} - {"mounts"}
        return cls(mounts=mounts, **{k: v for k, v in d.items() if k in top})

    def save(self) -> None:
        """Writes the state file (a temporary renamed into place: never half written)."""
        tmp = self.state_file + f".tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_file)

    def _record(self, step: str, command: Optional[Sequence[str]] = None) -> None:
        entry: Dict[str, Any] = {"time": _now(), "step": step}
        if command is not None:
            entry["command"] = shlex.join(command)
        self.log.append(entry)
        self.save()

    # -- throttling --

    def set_throttle(self, bps: Optional[int], mounts: Optional[Iterable[int]] = None) -> None:
        """Sets (or with ``None`` or 0 removes) the read limit of the given mounts (all by default),
        in bytes per second. It takes effect at once, for reads already queued too."""
        if bps is not None and (isinstance(bps, bool) or bps < 0):
            raise ValueError(f"bps must be >= 0 or None, not {bps!r}")
        for i in self._indexes(mounts):
            m = self.mounts[i]
            if m.device is None:
                raise TestbedError(f"mount {i} has no loop device to throttle", step=f"throttle mount {i}")
            self._write_rule(m, bps or None)
            if m.broken == "stall":  # a new limit ends the stall
                m.broken = None
            self.save()

    def _write_rule(self, m: TestbedMount, bps: Optional[int]) -> None:
        step = f"throttle mount {m.index}"
        line = throttle_rule(m.devno or "", bps)
        path = os.path.join(self.cgroup_dir, _RULE_FILE)
        try:
            with open(path, "w") as f:
                f.write(line + "\n")
        except OSError as e:
            raise TestbedError(f"{step} failed: writing {line!r} to {path}: {e.strerror} (errno {e.errno})",
                               step=step, path=path) from e
        m.throttle_bps = bps or None
        self.log.append({"time": _now(), "step": step, "command": f"echo {line} > {path}"})

    def rules(self) -> Dict[str, int]:
        """The read rules now in the testbed's cgroup, for every device (``{}`` without blkio)."""
        try:
            with open(os.path.join(self.cgroup_dir, _RULE_FILE)) as f:
                return parse_throttle_rules(f.read())
        except OSError:
            return {}

    def enter_cgroup(self, pid: int = 0) -> None:
        """Moves process ``pid`` (0: the caller) into the cgroup whose throttle rules apply."""
        procs = os.path.join(self.cgroup_dir, "cgroup.procs")
        if not os.path.exists(procs):
            return  # no blkio hierarchy, so no rule to be subject to
        with open(procs, "w") as f:
            f.write(f"{pid or os.getpid()}\n")

    def run(self, command: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        """Runs ``command`` (``subprocess.run``'s keyword arguments apply) inside the testbed's
        cgroup, so that its reads are throttled wherever the caller's own cgroup is."""
        if kwargs.get("preexec_fn") is not None:
            raise ValueError("run() sets preexec_fn itself")
        return subprocess.run(list(command), preexec_fn=self.enter_cgroup, **kwargs)

    def measure_read_bps(self, mounts: Optional[Iterable[int]] = None, seconds: float = 1.0) -> List[float]:
        """Reads each mount's loop device with O_DIRECT for about ``seconds``, all at once (one thread
        each), and returns bytes per second per mount: what the throttle lets through.

        Requests are 1 MiB, smaller under a low limit, so that one request never takes more than
        an eighth of the time (a stalled mount is measured in 4 KiB reads).
        """
        indexes = self._indexes(mounts)
        results: Dict[int, Union[float, BaseException]] = {}

        def measure(i: int) -> None:
            try:
                results[i] = _direct_read_rate(self.mounts[i], seconds)
            except BaseException as e:  # reported in the caller's thread
                results[i] = e

        threads = [threading.Thread(target=measure, args=(i,), daemon=True) for i in indexes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out = []
        for i in indexes:
            r = results[i]
            if isinstance(r, BaseException):
                raise TestbedError(f"measuring mount {i} ({self.mounts[i].device}): {r}", step=f"measure mount {i}") \
                    from r
            out.append(r)
        return out

    # -- page cache --

    def evict(self, mounts: Optional[Iterable[int]] = None) -> int:
        """Drops the page cache of every file on the given mounts (all by default), so the next reads
        go to the (throttled) device; returns the number of files."""
        from dlstore.bench.cache import evict_files

        paths = []
        for i in self._indexes(mounts):
            for root, _, names in os.walk(self.mounts[i].mountpoint):
                paths.extend(os.path.join(root, n) for n in names)
        evict_files(paths)
        return len(paths)

    # -- failures, for failover tests --

    def break_mount(self, i: int, how: str = "umount") -> None:
        """Makes mount ``i`` fail for readers, until :meth:`restore`.

        Parameters
        ----------
        how : {"umount", "eio", "stall", "chmod"}
            - ``umount``: ``umount -l``. New opens of its files fail with ENOENT (the mount point
              is an empty directory again); files already open keep reading.
            - ``eio``: shuts the filesystem down (``EXT4_IOC_SHUTDOWN`` / ``XFS_IOC_GOINGDOWN``).
              Every read fails with EIO, on files already open too, and cached pages are not served.
              Restoring needs every file on the mount closed first.
            - ``stall``: a read limit of :data:`STALL_BPS` (4 KiB/s) on the device: reads that miss
              the page cache crawl, so a reader's timeout fires. Restoring puts the previous limit back.
            - ``chmod``: mode 000 on the mount point: EACCES for readers that are not root (root
              ignores permission bits, so root's reads are unaffected).
        """
        if how not in BREAK_MODES:
            raise ValueError(f"how must be one of {BREAK_MODES}, not {how!r}")
        m = self.mounts[self._indexes([i])[0]]
        if m.broken:
            raise TestbedError(f"mount {i} is already broken ({m.broken}): restore it first", step=f"break mount {i}")
        step = f"break mount {i} ({how})"
        if how == "umount":
            cmd = ["umount", "-l", m.mountpoint]
            _run(step, cmd)
            m.mounted = False
        elif how == "eio":
            _shutdown_filesystem(m.mountpoint, step)
            cmd = [f"ioctl(FS_IOC_SHUTDOWN, NOLOGFLUSH) on {m.mountpoint}"]
        elif how == "stall":
            saved = m.throttle_bps
            self._write_rule(m, STALL_BPS)
            m.throttle_bps = saved  # what restore() puts back
            cmd = [f"echo {throttle_rule(m.devno or '', STALL_BPS)} > {os.path.join(self.cgroup_dir, _RULE_FILE)}"]
        else:
            os.chmod(m.mountpoint, 0)
            cmd = ["chmod", "000", m.mountpoint]
        m.broken = how
        self._record(step, cmd)

    def restore(self, i: Optional[int] = None) -> None:
        """Undoes :meth:`break_mount` on mount ``i`` (every broken mount by default)."""
        for j in self._indexes(None if i is None else [i]):
            m = self.mounts[j]
            if not m.broken:
                continue
            step = f"restore mount {j} ({m.broken})"
            if m.broken == "umount":
                self._mount(m, step)
            elif m.broken == "eio":
                if _is_mounted(m.mountpoint):
                    _run(step, ["umount", m.mountpoint])  # fails while files are open: the message says so
                m.mounted = False
                self.save()
                self._mount(m, step)
                try:
                    os.listdir(m.mountpoint)
                except OSError as e:
                    raise TestbedError(f"{step}: {m.mountpoint} still fails after mounting it again "
                                       f"({e.strerror}): a file on it was still open", step=step) from e
            elif m.broken == "stall":
                self._write_rule(m, m.throttle_bps)
            else:
                os.chmod(m.mountpoint, 0o755)
            m.broken = None
            self._record(step)

    def _mount(self, m: TestbedMount, step: str) -> None:
        cmd = ["mount", "-t", self.fs, "-o", "noatime", m.device or "", m.mountpoint]
        _run(step, cmd)
        m.mounted = True
        self._record(step, cmd)

    # -- looking and removing --

    def status(self) -> Dict[str, Any]:
        """What the system shows now for each mount (attached, mounted, rule, space used), beside the
        record; plus the cgroup facts that decide who is throttled."""
        mounted = _mountinfo()
        rules = self.rules()
        attached = _loop_backing_files()
        out_mounts = []
        for m in self.mounts:
            devices = sorted(dev for dev, backing in attached.items() if backing == os.path.realpath(m.image))
            entry: Dict[str, Any] = {
                "index": m.index, "mountpoint": m.mountpoint, "image": m.image, "device": m.device,
                "devno": m.devno, "attached": m.device in devices, "direct_io": m.direct_io,
                "mounted": m.mountpoint in mounted, "throttle_bps": rules.get(m.devno or "", None),
                "broken": m.broken, "files": len(m.files),
            }
            if entry["mounted"] and m.broken != "eio":
                try:
                    st = os.statvfs(m.mountpoint)
                    entry["used_bytes"] = (st.f_blocks - st.f_bfree) * st.f_frsize
                    entry["size_bytes"] = st.f_blocks * st.f_frsize
                except OSError:
                    pass
            out_mounts.append(entry)
        me = blkio_cgroup_of()
        rule_cgroup = "/" + self.cgroup
        return {
            "dir": self.dir, "fs": self.fs, "image_bytes": self.size_bytes, "layout": self.layout,
            "files": len(self.source), "cgroup": rule_cgroup, "this_process_cgroup": me,
            "this_process_throttled": me == rule_cgroup if me is not None else None,
            "processes_outside_cgroup": _processes_outside(rule_cgroup), "mounts": out_mounts, "notes": self.notes,
        }

    def destroy(self) -> List[str]:
        """Tears the testbed down (see :func:`destroy_testbed`); returns what was done."""
        return destroy_testbed(self.dir)

    def __enter__(self) -> "Testbed":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def _indexes(self, mounts: Optional[Iterable[int]]) -> List[int]:
        if mounts is None:
            return list(range(len(self.mounts)))
        out = []
        for i in mounts:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self.mounts):
                raise ValueError(f"mount index {i!r} is not in 0..{len(self.mounts) - 1}")
            out.append(i)
        return out


# ---- system helpers ------------------------------------------------------------------------------

def _now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def _run(step: str, cmd: Sequence[str], timeout: float = 300) -> str:
    """Runs one command; its stdout, or a :class:`TestbedError` naming the step, the command, its
    status and its stderr."""
    try:
        p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise TestbedError(f"{step} failed: `{cmd[0]}` is not installed (not on PATH)", step=step, command=cmd) from e
    except subprocess.TimeoutExpired as e:
        raise TestbedError(f"{step} failed: `{shlex.join(cmd)}` did not finish in {timeout:.0f} s",
                           step=step, command=cmd) from e
    if p.returncode != 0:
        err = (p.stderr or p.stdout or "").strip() or "(nothing on stderr)"
        raise TestbedError(f"{step} failed: `{shlex.join(cmd)}` exited with status {p.returncode}: {err}",
                           step=step, command=cmd, stderr=p.stderr)
    return p.stdout


def _mountinfo() -> List[str]:
    """Every mount point of this mount namespace (a path mounted twice appears twice)."""
    with open("/proc/self/mountinfo") as f:
        # Space, tab, newline and backslash come as octal escapes, as in /proc/mounts.
        return [unescape_mount_field(line.split()[4]) for line in f if len(line.split()) > 4]


def _is_mounted(path: str) -> bool:
    return os.path.abspath(path) in _mountinfo()


def _loop_backing_files() -> Dict[str, str]:
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


def _devno(device: str) -> str:
    rdev = os.stat(device).st_rdev
    return f"{os.major(rdev)}:{os.minor(rdev)}"


def _loop_direct_io(device: str) -> Optional[bool]:
    try:
        with open(f"/sys/block/{os.path.basename(device)}/loop/dio") as f:
            return f.read().strip() == "1"
    except OSError:
        return None


def _processes_outside(cgroup: str) -> Optional[int]:
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


def _shutdown_filesystem(mountpoint: str, step: str) -> None:
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, _FS_SHUTDOWN, _SHUTDOWN_NOLOGFLUSH.to_bytes(4, "little"))
    except OSError as e:
        raise TestbedError(f"{step} failed: the shutdown ioctl on {mountpoint}: {e.strerror} (errno {e.errno})",
                           step=step, path=mountpoint) from e
    finally:
        os.close(fd)


def _direct_read_rate(m: TestbedMount, seconds: float) -> float:
    """Bytes per second of sequential O_DIRECT reads of the mount's device for about ``seconds``."""
    if m.device is None:
        raise ValueError("no loop device")
    limit = STALL_BPS if m.broken == "stall" else m.throttle_bps
    block = MiB
    if limit:  # one request at most an eighth of the time, 4 KiB at least, page aligned
        block = max(4096, min(MiB, int(limit * seconds / 8) // 4096 * 4096))
    fd = os.open(m.device, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, block)  # page aligned, as O_DIRECT needs
    try:
        size = os.lseek(fd, 0, os.SEEK_END) // block * block
        pos = done = 0
        begin = time.perf_counter()
        start = None
        while True:
            n = os.preadv(fd, [buf], pos)
            if n <= 0:
                raise OSError(errno.EIO, f"read of {m.device} at {pos} returned {n}")
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


# ---- create --------------------------------------------------------------------------------------

def create_testbed(directory: str, mounts: int, *, size_bytes: Optional[int] = None, fs: str = "ext4",
                   throttle_bps: Optional[int] = None, data: Optional[Union[str, Sequence[str]]] = None,
                   layout: str = "replicated", direct_io: bool = True, cgroup: Optional[str] = None,
                   progress: Optional[bool] = None) -> Testbed:
    """Creates ``mounts`` loop-mounted filesystems under ``directory`` (root only).

    Parameters
    ----------
    directory : str
        Created if missing. Gets ``images/``, ``mnt0`` .. ``mnt{N-1}`` and ``testbed.json``.
    mounts : int
        1 .. :data:`MAX_MOUNTS`.
    size_bytes : int, optional
        Size of each (sparse) image. Default: enough for the data given, else 1 GiB.
    fs : {"ext4", "xfs"}
        xfs needs images of 300 MiB at least.
    throttle_bps : int, optional
        Read limit of each mount in bytes per second (cgroup v1 blkio); none by default.
    data : str or list of str, optional
        Shards to put on the mounts: files, globs or a directory (valid indexes beside them go
        along). Every file keeps its name, at the root of each mount.
    layout : {"replicated", "striped"}
        ``replicated``: every file on every mount; ``striped``: file ``i`` on mount ``i % N``.
    direct_io : bool
        Attach the loop devices with direct I/O (see the module's docstring for why it is the default).
    cgroup : str, optional
        Put the throttle rules in this child of the blkio root (created) instead of the root itself.
    progress : bool, optional
        A progress bar while copying data (by default only on a terminal).

    Returns
    -------
    Testbed

    Raises
    ------
    ValueError
        On a bad argument (nothing is created).
    TestbedError
        When not root, a tool is missing, the directory already holds a testbed, the data does not
        fit, or a step fails; whatever was set up is torn down again before it is raised.
    """
    validate_request(mounts, size_bytes, fs, throttle_bps, layout if data is not None else None, cgroup)
    refusal = root_refusal()
    if refusal:
        raise TestbedError(refusal, step="check")
    missing = missing_tools(fs)
    if missing:
        raise TestbedError(f"dlstore testbed needs {', '.join(missing)} (not on PATH); install "
                           f"{'util-linux, ' if set(missing) & set(_BASE_TOOLS) else ''}"
                           f"{'e2fsprogs' if fs == 'ext4' else 'xfsprogs'}", step="check")
    blkio_rules = os.path.join(BLKIO_ROOT, _RULE_FILE)
    if (throttle_bps or cgroup) and not os.path.exists(blkio_rules):
        raise TestbedError(f"throttling needs the cgroup v1 blkio controller ({blkio_rules} is missing)",
                           step="check", path=blkio_rules)
    directory = os.path.abspath(directory)
    if os.path.exists(state_path(directory)):
        raise TestbedError(f"{directory} already holds a testbed ({state_path(directory)}): remove it first with "
                           f"`dlstore testbed --dir {shlex.quote(directory)} --down`", step="check",
                           path=state_path(directory))

    sources, names, per_mount = _plan_data(data, mounts, layout)
    data_bytes = max((sum(os.path.getsize(sources[n]) for n in files) for files in per_mount), default=0)
    if size_bytes is None:
        size_bytes = default_size_bytes(data_bytes, fs)
    os.makedirs(directory, exist_ok=True)
    need = sum(sum(os.path.getsize(sources[n]) for n in files) for files in per_mount)
    free = shutil.disk_usage(directory).free
    if need * 1.05 > free:
        raise TestbedError(f"{directory}: the copies need {format_bytes(need)} but its filesystem has "
                           f"{format_bytes(free)} free", step="check", path=directory)
    images = os.path.join(directory, "images")
    tb = Testbed(dir=directory, fs=fs, size_bytes=int(size_bytes), cgroup=cgroup or "",
                 layout=layout if data is not None else None, source=[sources[n] for n in names], created=_now(),
                 mounts=[TestbedMount(index=i, image=os.path.join(images, f"disk{i}.img"),
                                      mountpoint=os.path.join(directory, f"mnt{i}")) for i in range(mounts)])
    for m in tb.mounts:
        if os.path.exists(m.image):
            raise TestbedError(f"{m.image} already exists: is another testbed being made here?", step="check",
                               path=m.image)
        if os.path.isdir(m.mountpoint) and (os.listdir(m.mountpoint) or _is_mounted(m.mountpoint)):
            raise TestbedError(f"{m.mountpoint} is not an empty directory", step="check", path=m.mountpoint)
    os.makedirs(images, exist_ok=True)
    tb._record("plan")  # every path recorded before anything is made: a teardown knows them all
    try:
        if cgroup:
            _make_cgroup(tb)
        for m in tb.mounts:
            _set_up_mount(tb, m, direct_io, throttle_bps)
        if data is not None:
            _copy_data(tb, sources, per_mount, progress)
    except BaseException as e:  # Ctrl-C included: leave nothing behind
        try:
            destroy_testbed(directory)
        except Exception as undo:  # say both; the state file still lists what is left
            raise TestbedError(f"{e}; tearing down what was set up failed too: {undo}; see {tb.state_file}",
                               step=getattr(e, "step", None)) from e
        raise
    return tb


def _plan_data(data, mounts: int, layout: str) -> Tuple[Dict[str, str], List[str], List[List[str]]]:
    """``({name: source path}, names in order, names per mount)`` for ``data``."""
    if data is None:
        return {}, [], [[] for _ in range(mounts)]
    from dlstore.reader import expand_paths

    sources: Dict[str, str] = {}
    for p in expand_paths(data):
        name = os.path.basename(p)
        if name in sources and sources[name] != p:
            raise TestbedError(f"{sources[name]} and {p} have the same file name: they would collide on the mounts",
                               step="check", path=p)
        sources[name] = p
    names = list(sources)
    return sources, names, layout_files(names, mounts, layout)


def _make_cgroup(tb: Testbed) -> None:
    path = tb.cgroup_dir
    step = f"create cgroup {path}"
    try:
        os.mkdir(path)
        tb.cgroup_created = True
    except FileExistsError:
        pass  # someone's, or left over: used, and left in place by the teardown
    except OSError as e:
        raise TestbedError(f"{step} failed: {e.strerror} (errno {e.errno})", step=step, path=path) from e
    tb._record(step, ["mkdir", path])


def _set_up_mount(tb: Testbed, m: TestbedMount, direct_io: bool, throttle_bps: Optional[int]) -> None:
    i = m.index
    with open(m.image, "xb"):
        pass
    os.truncate(m.image, tb.size_bytes)  # sparse: blocks are allocated as they are written
    tb._record(f"image {i}", ["truncate", "-s", str(tb.size_bytes), m.image])

    cmd = ["losetup", "--find", "--show"] + (["--direct-io=on"] if direct_io else []) + [m.image]
    m.device = _run(f"attach mount {i}", cmd).strip()
    m.devno = _devno(m.device)
    m.direct_io = _loop_direct_io(m.device)
    if direct_io and m.direct_io is False:
        tb.notes.append(f"{m.device}: direct I/O was asked for but is off (the filesystem holding {m.image} "
                        f"refuses it): blocks are cached twice")
    tb._record(f"attach mount {i}", cmd)

    cmd = _MKFS[tb.fs] + [m.device]
    _run(f"mkfs mount {i}", cmd)
    m.formatted = True
    tb._record(f"mkfs mount {i}", cmd)

    os.makedirs(m.mountpoint, exist_ok=True)
    tb._mount(m, f"mount {i}")
    stale = tb.rules().get(m.devno or "")
    if throttle_bps:
        tb._write_rule(m, int(throttle_bps))
        tb.save()
    elif stale:  # left by an earlier user of this loop device number; the device is ours now
        tb._write_rule(m, None)
        tb.notes.append(f"{m.device}: removed a read limit of {stale} B/s left on {m.devno} by an earlier user")
        tb.save()


def _copy_data(tb: Testbed, sources: Dict[str, str], per_mount: List[List[str]], progress: Optional[bool]) -> None:
    from dlstore._progress import Progress
    from dlstore.bench.cache import evict_files
    from dlstore.indexing import index_path_for
    from dlstore.tools.expand import copy_file, format_of, valid_index

    indexes = {}
    for name, src in sources.items():
        fmt = format_of(src)
        idx, _ = valid_index(src, fmt)
        if idx:
            indexes[name] = (idx, index_path_for(name, fmt, writable=True))
    for m, files in zip(tb.mounts, per_mount):
        need = sum(os.path.getsize(sources[n]) for n in files)
        st = os.statvfs(m.mountpoint)
        if need > st.f_bavail * st.f_frsize:
            raise TestbedError(f"copy to mount {m.index} failed: its files need {need / MiB:.1f} MiB but "
                               f"{m.mountpoint} has {st.f_bavail * st.f_frsize / MiB:.1f} MiB free: make the images "
                               f"larger", step=f"copy to mount {m.index}", path=m.mountpoint)
    total = sum(os.path.getsize(sources[n]) for files in per_mount for n in files)
    with Progress(total, "testbed copy", unit="B", enabled=progress) as bar:
        for m, files in zip(tb.mounts, per_mount):
            written = []
            for name in files:
                dst = os.path.join(m.mountpoint, name)
                try:
                    copy_file(sources[name], dst, bar)
                    written.append(dst)
                    if name in indexes:
                        idx_dst = os.path.join(m.mountpoint, indexes[name][1])
                        shutil.copyfile(indexes[name][0], idx_dst)  # after the data: never older than it
                        written.append(idx_dst)
                except OSError as e:
                    step = f"copy to mount {m.index}"
                    raise TestbedError(f"{step} failed: {sources[name]} -> {dst}: {e.strerror} (errno {e.errno})",
                                       step=step, path=dst) from e
            evict_files(written)  # written back and dropped: the first reads are cold, and throttled
            m.files = list(files)
            tb._record(f"copy {len(files)} files to mount {m.index}")


# ---- load and destroy ----------------------------------------------------------------------------

def load_testbed(directory: str) -> Testbed:
    """The testbed recorded in ``directory``.

    Raises
    ------
    TestbedError
        When there is none, or its state file cannot be read.
    """
    path = state_path(directory)
    try:
        with open(path) as f:
            return Testbed.from_dict(json.load(f))
    except FileNotFoundError as e:
        raise TestbedError(f"{os.path.abspath(directory)} holds no testbed (no {STATE_FILE})", path=path) from e
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TestbedError(f"{path}: cannot read the testbed state: {e}", path=path) from e


def destroy_testbed(directory: str) -> List[str]:
    """Removes the testbed in ``directory``: throttle rules, mounts, loop devices, images, mount
    points, the cgroup it created, and last the state file. Root only.

    Safe to run at any point: after a complete setup, a partial one, a crash, or a teardown that
    already ran (it then does nothing). Each mount is undone from what the system shows: every loop
    device whose backing file is the mount's image is detached, the mount point is unmounted as
    often as it is mounted (lazily when busy, which is reported), and a rule is removed only if it
    is there. Loop devices and mounts of anything else are never touched.

    Returns
    -------
    list of str
        What was done, one line a step (empty when there was nothing to do).

    Raises
    ------
    TestbedError
        When a step fails; the state file then still describes what is left, so the teardown can
        be run again.
    """
    refusal = root_refusal()
    if refusal:
        raise TestbedError(refusal, step="check")
    path = state_path(directory)
    if not os.path.exists(path):
        return []
    tb = load_testbed(directory)
    done: List[str] = []
    failures: List[str] = []
    for m in reversed(tb.mounts):
        try:
            _tear_down_mount(tb, m, done)
        except TestbedError as e:
            failures.append(str(e))
    if tb.cgroup_created:
        try:
            _remove_cgroup(tb, done)
        except TestbedError as e:
            failures.append(str(e))
    if failures:
        tb.save()
        raise TestbedError("teardown incomplete: " + "; ".join(failures) + f" (state kept in {path}: run it again "
                           f"once fixed)", step="teardown", path=path)
    images = os.path.join(tb.dir, "images")
    if os.path.isdir(images) and not os.listdir(images):
        os.rmdir(images)
    os.unlink(path)
    done.append(f"removed {path}")
    return done


def _tear_down_mount(tb: Testbed, m: TestbedMount, done: List[str]) -> None:
    i = m.index
    if m.broken == "chmod" and os.path.isdir(m.mountpoint):
        os.chmod(m.mountpoint, 0o755)
        m.broken = None
    devices = [dev for dev, backing in _loop_backing_files().items() if backing == os.path.realpath(m.image)]
    devnos = {_devno(dev) for dev in devices}
    if m.devno:
        devnos.add(m.devno)
    rules = tb.rules()
    for devno in sorted(devnos):  # before detaching: a device number freed could be another's next
        if rules.get(devno):
            line = throttle_rule(devno, 0)
            try:
                with open(os.path.join(tb.cgroup_dir, _RULE_FILE), "w") as f:
                    f.write(line + "\n")
            except OSError as e:
                raise TestbedError(f"unthrottle mount {i} failed: {e.strerror}", step=f"unthrottle mount {i}") from e
            done.append(f"mount {i}: removed read limit {rules[devno]} B/s of {devno}")
    m.throttle_bps = None
    tb.save()
    while _is_mounted(m.mountpoint):
        try:
            _run(f"unmount mount {i}", ["umount", m.mountpoint])
            done.append(f"mount {i}: umount {m.mountpoint}")
        except TestbedError as e:
            if "busy" not in (e.stderr or "").lower():
                raise
            _run(f"unmount mount {i}", ["umount", "-l", m.mountpoint])
            done.append(f"mount {i}: {m.mountpoint} busy: unmounted lazily (umount -l); its loop device is "
                        f"released when the last file on it is closed")
    m.mounted = False
    m.broken = None
    tb.save()
    for dev in devices:
        _run(f"detach mount {i}", ["losetup", "-d", dev])
        done.append(f"mount {i}: losetup -d {dev}")
    m.device = None
    tb.save()
    if os.path.exists(m.image):
        os.unlink(m.image)
        done.append(f"mount {i}: removed {m.image}")
    if os.path.isdir(m.mountpoint):
        try:
            os.rmdir(m.mountpoint)
        except OSError as e:
            raise TestbedError(f"remove mount point {i} failed: {m.mountpoint}: {e.strerror} (something was "
                               f"written there while it was not mounted)", step=f"remove mount point {i}",
                               path=m.mountpoint) from e


def _remove_cgroup(tb: Testbed, done: List[str]) -> None:
    path = tb.cgroup_dir
    if not os.path.isdir(path):
        tb.cgroup_created = False
        return
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
    tb.cgroup_created = False
    done.append(f"removed cgroup {path}")
