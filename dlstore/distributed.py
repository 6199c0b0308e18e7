"""Results gathered across ranks with mpi4py, when the job runs under MPI; a no-op on one process.

dlstore never starts a distributed runtime (MPI, Horovod and torch.distributed do that): it only uses
MPI's world communicator, when mpi4py is installed and the launcher started more than one rank, to
bring per-rank results to rank 0.
"""
from __future__ import annotations

from typing import Any, List, Optional

from dlstore.errors import PlacementError
from dlstore.placement.world import detect_world

__all__ = ["mpi_comm", "gather", "allgather"]


def mpi_comm(world=None) -> Optional[Any]:
    """MPI's world communicator when a launcher started more than one rank and mpi4py imports, else None.

    ``world`` (a :class:`~dlstore.placement.world.World`) defaults to the one the launcher's
    variables describe. mpi4py is imported only for more than one rank: importing it initialises
    MPI, which a plain ``python`` run must not pay for (or fail on).
    """
    if world is None:

        try:
            world = detect_world()
        except PlacementError:
            return None
    if world.size <= 1:
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    comm = MPI.COMM_WORLD
    return comm if comm.Get_size() > 1 else None


def gather(value: Any, world=None, root: int = 0) -> Optional[List[Any]]:
    """Every rank's ``value`` as a list on ``root`` (None on the other ranks); ``[value]`` without MPI."""
    comm = mpi_comm(world)
    if comm is None:
        return [value]
    return comm.gather(value, root=root)


def allgather(value: Any, world=None) -> List[Any]:
    """Every rank's ``value`` as a list on every rank; ``[value]`` without MPI."""
    comm = mpi_comm(world)
    if comm is None:
        return [value]
    return comm.allgather(value)
