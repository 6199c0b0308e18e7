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

Two choices (docs/testbed.md has the measurements behind them):

- **Direct I/O on the loop device.** Without it the loop driver reads and writes the image file
  through the host's page cache: every block is cached twice (by the mounted filesystem, and as
  part of the image), and a mount whose own cache was dropped is still read from the image's cached
  pages, faster than its disk. With it, a cold read of a mount really reaches the disk, and the
  image takes no page cache.
- **Rules in the root blkio cgroup.** cgroup v1's blk-throttle is flat: a rule applies to the
  processes of the cgroup it is written in and not to those of child cgroups (a process moved into
  a child cgroup reads straight past a root rule). On a host without systemd every process sits in
  the root blkio cgroup, so a rule there throttles all of them, and all the readers of one mount
  share its bandwidth, as on a real mount. Where processes live in child cgroups (systemd slices),
  run the readers with ``dlstore testbed --dir DIR --exec -- CMD`` or :meth:`Testbed.run`, which move
  them into the testbed's cgroup first; or pass ``cgroup="NAME"`` to keep the rules in a child cgroup
  of their own (created, and removed by the teardown), with the same ``--exec`` to run readers in it.

What lives here, one module a job (each imports only those before it in this list, but for
:meth:`Testbed.destroy`, which calls the teardown):

- :mod:`.steps`: :class:`TestbedError` and running one named step's command;
- :mod:`.mkfs`: the filesystems, their sizes and ``mkfs``;
- :mod:`.loopdev`: loop devices and mounts, attached, mounted and found again;
- :mod:`.request`: the checks made before anything is touched, and the layout of files on mounts;
- :mod:`.blkio`: throttle rules, the cgroup holding them, and measuring what they let through;
- :mod:`.faults`: breaking and restoring a mount, for failover tests;
- :mod:`.state`: ``testbed.json`` and the :class:`Testbed` object;
- :mod:`.teardown` and :mod:`.create`: removing and making a testbed.
"""
from dlstore.tools.testbed.blkio import BLKIO_ROOT, blkio_cgroup_of, parse_throttle_rules, throttle_rule
from dlstore.tools.testbed.create import create_testbed
from dlstore.tools.testbed.faults import BREAK_MODES, STALL_BPS
from dlstore.tools.testbed.mkfs import DEFAULT_SIZE_BYTES, FILESYSTEMS, MIN_SIZE_BYTES, default_size_bytes
from dlstore.tools.testbed.request import (
    LAYOUTS,
    MAX_MOUNTS,
    layout_files,
    missing_tools,
    root_refusal,
    validate_request,
)
from dlstore.tools.testbed.state import STATE_FILE, Testbed, TestbedMount, load_testbed, state_path
from dlstore.tools.testbed.steps import TestbedError
from dlstore.tools.testbed.teardown import destroy_testbed

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
    "DEFAULT_SIZE_BYTES",
    "MIN_SIZE_BYTES",
    "STALL_BPS",
]
