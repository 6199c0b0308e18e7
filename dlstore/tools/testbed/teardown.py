"""Removing a testbed: throttle rules, mounts, loop devices, images, mount points, the cgroup it
made, and last its state file, undone from what the system shows as well as from the record.
"""
from __future__ import annotations

import os
from typing import List

from dlstore.tools.testbed.blkio import remove_cgroup, write_rule
from dlstore.tools.testbed.loopdev import devno, is_mounted, loop_backing_files
from dlstore.tools.testbed.request import root_refusal
from dlstore.tools.testbed.state import Testbed, TestbedMount, load_testbed, state_path
from dlstore.tools.testbed.steps import TestbedError, run_step

__all__ = ["destroy_testbed"]


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
            done += remove_cgroup(tb.cgroup_dir)
            tb.cgroup_created = False
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
    devices = [dev for dev, backing in loop_backing_files().items() if backing == os.path.realpath(m.image)]
    devnos = {devno(dev) for dev in devices}
    if m.devno:
        devnos.add(m.devno)
    rules = tb.rules()
    for number in sorted(devnos):  # before detaching: a device number freed could be another's next
        if rules.get(number):
            write_rule(tb.cgroup_dir, number, 0, f"unthrottle mount {i}")
            done.append(f"mount {i}: removed read limit {rules[number]} B/s of {number}")
    m.throttle_bps = None
    tb.save()
    while is_mounted(m.mountpoint):
        try:
            run_step(f"unmount mount {i}", ["umount", m.mountpoint])
            done.append(f"mount {i}: umount {m.mountpoint}")
        except TestbedError as e:
            if "busy" not in (e.stderr or "").lower():
                raise
            run_step(f"unmount mount {i}", ["umount", "-l", m.mountpoint])
            done.append(f"mount {i}: {m.mountpoint} busy: unmounted lazily (umount -l); its loop device is "
                        f"released when the last file on it is closed")
    m.mounted = False
    m.broken = None
    tb.save()
    for dev in devices:
        run_step(f"detach mount {i}", ["losetup", "-d", dev])
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
