"""Making a testbed: the images, loop devices, filesystems, mounts and throttle rules, then the
dataset copied onto the mounts and evicted from the page cache, each step recorded as it is done.
A failed or interrupted setup is torn down again before the error is raised.
"""
from __future__ import annotations

import os
import shlex
import shutil
from typing import Dict, List, Optional, Sequence, Tuple, Union

from dlstore._progress import Progress
from dlstore.io.pagecache import evict_files
from dlstore.sources.indexing import index_path_for
from dlstore.io.system import format_bytes
from dlstore.sources.reader import expand_paths
from dlstore.tools.expand import copy_file, format_of, valid_index
from dlstore.tools.testbed.blkio import BLKIO_ROOT, RULE_FILE, make_cgroup
from dlstore.tools.testbed.loopdev import BASE_TOOLS, attach_loop, devno, is_mounted, loop_direct_io
from dlstore.tools.testbed.mkfs import default_size_bytes, make_filesystem
from dlstore.tools.testbed.request import layout_files, missing_tools, root_refusal, validate_request
from dlstore.tools.testbed.state import Testbed, TestbedMount, state_path
from dlstore.tools.testbed.steps import MiB, TestbedError, now
from dlstore.tools.testbed.teardown import destroy_testbed

__all__ = ["create_testbed"]


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
                           f"{'util-linux, ' if set(missing) & set(BASE_TOOLS) else ''}"
                           f"{'e2fsprogs' if fs == 'ext4' else 'xfsprogs'}", step="check")
    blkio_rules = os.path.join(BLKIO_ROOT, RULE_FILE)
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
                 layout=layout if data is not None else None, source=[sources[n] for n in names], created=now(),
                 mounts=[TestbedMount(index=i, image=os.path.join(images, f"disk{i}.img"),
                                      mountpoint=os.path.join(directory, f"mnt{i}")) for i in range(mounts)])
    for m in tb.mounts:
        if os.path.exists(m.image):
            raise TestbedError(f"{m.image} already exists: is another testbed being made here?", step="check",
                               path=m.image)
        if os.path.isdir(m.mountpoint) and (os.listdir(m.mountpoint) or is_mounted(m.mountpoint)):
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
    if make_cgroup(path, step):
        tb.cgroup_created = True
    tb._record(step, ["mkdir", path])


def _set_up_mount(tb: Testbed, m: TestbedMount, direct_io: bool, throttle_bps: Optional[int]) -> None:
    i = m.index
    with open(m.image, "xb"):
        pass
    os.truncate(m.image, tb.size_bytes)  # sparse: blocks are allocated as they are written
    tb._record(f"image {i}", ["truncate", "-s", str(tb.size_bytes), m.image])

    m.device, cmd = attach_loop(f"attach mount {i}", m.image, direct_io)
    m.devno = devno(m.device)
    m.direct_io = loop_direct_io(m.device)
    if direct_io and m.direct_io is False:
        tb.notes.append(f"{m.device}: direct I/O was asked for but is off (the filesystem holding {m.image} "
                        f"refuses it): blocks are cached twice")
    tb._record(f"attach mount {i}", cmd)

    cmd = make_filesystem(f"mkfs mount {i}", tb.fs, m.device)
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
