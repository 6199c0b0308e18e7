"""What the PyTorch examples share: who this process is, and averaging gradients across processes.

dlstore finds the rank itself (``dlstore.placement.world.detect_world``: mpirun, torchrun,
horovodrun, PopRun, srun) and each rank reads its share of the records; the training framework
averages the gradients. These examples do that with whatever the launcher offers, so the same
script runs alone, under ``torchrun`` (torch.distributed, Gloo), under ``mpirun`` (mpi4py) or under
``horovodrun`` (Horovod).
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Iterable

from dlstore.io.system import available_cores
from dlstore.placement.world import World, detect_world

__all__ = ["add_training_args", "data_parallel", "log", "threads_per_rank"]


def add_training_args(parser: argparse.ArgumentParser, *, batch_size: int, steps: int, lr: float) -> None:
    """The options every example has."""
    parser.add_argument("--data", help="record files (glob, directory); default: the tiny synthetic set, "
                                       "generated and cached on first use")
    parser.add_argument("--steps", type=int, default=steps, help="training steps to run (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=batch_size, help="samples per rank per step")
    parser.add_argument("--lr", type=float, default=lr, help="learning rate (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the data order, augmentation and weights")
    parser.add_argument("--dist", choices=["auto", "none", "torch", "mpi", "horovod"], default="auto",
                        help="how gradients are averaged across ranks; auto: torch.distributed under torchrun, "
                             "Horovod under horovodrun, mpi4py under mpirun/srun, nothing for one process")


def log(world: World, message: str) -> None:
    print(f"[rank {world.rank}/{world.size}] {message}", flush=True)


def _method(requested: str, world: World) -> str:
    if requested != "auto":
        return requested
    if world.size == 1:
        return "none"
    if "torchrun" in world.source:
        return "torch"
    if "horovod" in world.source:
        return "horovod"
    return "mpi"


def data_parallel(requested: str = "auto"):
    """This process's world and a function ``average(parameters)`` that averages their gradients
    across ranks in place (a no-op for one process).

    Raises
    ------
    SystemExit
        With a message when several ranks are detected but the means to average are missing.
    """
    import torch

    world = detect_world()
    method = _method(requested, world)
    if method == "none":
        def average(parameters: Iterable[torch.nn.Parameter]) -> None:
            return None
    elif method == "torch":
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo", rank=world.rank, world_size=world.size)

        def average(parameters: Iterable[torch.nn.Parameter]) -> None:
            for p in parameters:
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= world.size
    elif method == "horovod":
        import horovod.torch as hvd

        hvd.init()

        def average(parameters: Iterable[torch.nn.Parameter]) -> None:
            for p in parameters:
                if p.grad is not None:
                    hvd.allreduce_(p.grad, op=hvd.Average)
    else:
        average = _mpi_average(world)
    log(world, f"{world.describe()}; gradients averaged with: {method}")
    return world, average


def _mpi_average(world: World) -> Callable:
    """Averaging through mpi4py: all gradients in one flat buffer, one Allreduce per step."""
    import torch

    try:
        from mpi4py import MPI
    except ImportError:
        sys.exit(f"{world.size} ranks found ({world.source}) but mpi4py is not installed: pip install mpi4py, "
                 f"or pass --dist none to train each rank on its own")
    comm = MPI.COMM_WORLD
    if comm.Get_size() != world.size:
        sys.exit(f"dlstore sees {world.size} ranks ({world.source}) but MPI's COMM_WORLD has {comm.Get_size()}: "
                 f"launch with mpirun, or choose --dist")

    def average(parameters: Iterable[torch.nn.Parameter]) -> None:
        grads = [p.grad for p in parameters if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads]).contiguous()
        comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
        flat /= world.size
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    return average


def threads_per_rank(world: World) -> int:
    """Cores this rank may use when the host's cores are shared by ``local_size`` ranks (at least 1)."""
    cores = available_cores()
    return max(1, cores // world.local_size)
