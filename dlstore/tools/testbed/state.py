"""The state of a testbed: what ``DIR/testbed.json`` records, and the :class:`Testbed` object that
reads, changes and saves it.

Every step is recorded as soon as it is done (the file is written to a temporary and renamed into
place, so it is never half written), so a teardown knows what a complete or a partial setup made.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from dlstore.io.pagecache import evict_files
from dlstore.tools.testbed.blkio import (
    BLKIO_ROOT,
    blkio_cgroup_of,
    direct_read_rate,
    enter_cgroup,
    processes_outside,
    read_rules,
    write_rule,
)
from dlstore.tools.testbed.faults import STALL_BPS, break_mount, restore_mount
from dlstore.tools.testbed.loopdev import loop_backing_files, mount_filesystem, mountinfo
from dlstore.tools.testbed.steps import TestbedError, now

__all__ = ["Testbed", "TestbedMount", "load_testbed", "state_path", "STATE_FILE", "STATE_VERSION"]

STATE_FILE = "testbed.json"
STATE_VERSION = 1


def state_path(directory: str) -> str:
    """Where the state of the testbed in ``directory`` is kept."""
    return os.path.join(os.path.abspath(directory), STATE_FILE)


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
        entry: Dict[str, Any] = {"time": now(), "step": step}
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
        command = write_rule(self.cgroup_dir, m.devno or "", bps, step)
        m.throttle_bps = bps or None
        self.log.append({"time": now(), "step": step, "command": command})

    def rules(self) -> Dict[str, int]:
        """The read rules now in the testbed's cgroup, for every device (``{}`` without blkio)."""
        return read_rules(self.cgroup_dir)

    def enter_cgroup(self, pid: int = 0) -> None:
        """Moves process ``pid`` (0: the caller) into the cgroup whose throttle rules apply."""
        enter_cgroup(self.cgroup_dir, pid)

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
                results[i] = self._read_rate(i, seconds)
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

    def _read_rate(self, i: int, seconds: float) -> float:
        m = self.mounts[i]
        if m.device is None:
            raise ValueError("no loop device")
        return direct_read_rate(m.device, STALL_BPS if m.broken == "stall" else m.throttle_bps, seconds)

    # -- page cache --

    def evict(self, mounts: Optional[Iterable[int]] = None) -> int:
        """Drops the page cache of every file on the given mounts (all by default), so the next reads
        go to the (throttled) device; returns the number of files."""
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
        break_mount(self, i, how)

    def restore(self, i: Optional[int] = None) -> None:
        """Undoes :meth:`break_mount` on mount ``i`` (every broken mount by default)."""
        restore_mount(self, i)

    def _mount(self, m: TestbedMount, step: str) -> None:
        cmd = mount_filesystem(step, self.fs, m.device or "", m.mountpoint)
        m.mounted = True
        self._record(step, cmd)

    # -- looking and removing --

    def status(self) -> Dict[str, Any]:
        """What the system shows now for each mount (attached, mounted, rule, space used), beside the
        record; plus the cgroup facts that decide who is throttled."""
        mounted = mountinfo()
        rules = self.rules()
        attached = loop_backing_files()
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
            "processes_outside_cgroup": processes_outside(rule_cgroup), "mounts": out_mounts, "notes": self.notes,
        }

    def destroy(self) -> List[str]:
        """Tears the testbed down (see :func:`destroy_testbed`); returns what was done."""
        # Imported here: the teardown module loads a Testbed from this one.
        from dlstore.tools.testbed.teardown import destroy_testbed

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
