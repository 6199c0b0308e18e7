"""Who this process is: rank, world size, local rank and local size, found from explicit arguments
or from the environment that the launcher left, plus the PyTorch DataLoader worker when there is one.

Launchers are tried in the order of :data:`LAUNCHERS`; the first whose variables are present wins.
The order matters where launchers stack: PopRun starts its instances with Open MPI's ``mpirun``, so
its ``POPDIST_*`` variables are looked at before ``OMPI_*``; an ``mpirun`` inside a SLURM allocation
leaves stale ``SLURM_*`` job variables beside its own, so SLURM comes after every MPI. Nothing here
imports a framework or initialises MPI: PyTorch and mpi4py are consulted only when the program has
already imported them.
"""
from __future__ import annotations

import dataclasses
import os
import re
import sys
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from dlstore.errors import PlacementError

__all__ = ["World", "detect_world", "LAUNCHERS", "parse_tasks_per_node"]


@dataclass(frozen=True)
class World:
    """One process's place among the readers of a dataset.

    Parameters
    ----------
    rank, size : int
        Global rank of this process and the number of processes (``0 <= rank < size``).
    local_rank, local_size : int
        Rank among the processes on this host and their number.
    worker, num_workers : int
        DataLoader worker of this process (0 of 1 when there are none).
    source : str
        The launcher the values came from (a key of :data:`LAUNCHERS`, ``"explicit"``, or
        ``"single"`` when nothing was found).
    variables : tuple of str
        The environment variables actually read, in the order used.
    notes : tuple of str
        Assumptions made where a launcher does not tell everything (e.g. no local size).

    Notes
    -----
    Sharding is over *consumers*: ``consumer = rank * num_workers + worker`` out of
    ``size * num_workers``, so the workers of one rank read neighbouring parts of the epoch.
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    worker: int = 0
    num_workers: int = 1
    source: str = "single"
    variables: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("rank", "size", "local_rank", "local_size", "worker", "num_workers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise PlacementError(f"World.{name} must be an int, not {value!r}{self._from()}")
        checks = [
            (self.size >= 1, f"world size {self.size} is below 1"),
            (0 <= self.rank < self.size, f"rank {self.rank} is outside 0..{self.size - 1}"),
            (self.local_size >= 1, f"local size {self.local_size} is below 1"),
            (0 <= self.local_rank < self.local_size,
             f"local rank {self.local_rank} is outside 0..{self.local_size - 1}"),
            (self.local_size <= self.size, f"local size {self.local_size} exceeds world size {self.size}"),
            (self.num_workers >= 1, f"num_workers {self.num_workers} is below 1"),
            (0 <= self.worker < self.num_workers, f"worker {self.worker} is outside 0..{self.num_workers - 1}"),
        ]
        for ok, what in checks:
            if not ok:
                raise PlacementError(f"inconsistent world: {what}{self._from()}")

    def _from(self) -> str:
        return f" (from {', '.join(self.variables)})" if self.variables else ""

    @property
    def consumer(self) -> int:
        """This process's index among all readers: ``rank * num_workers + worker``."""
        return self.rank * self.num_workers + self.worker

    @property
    def num_consumers(self) -> int:
        """All readers: ``size * num_workers``."""
        return self.size * self.num_workers

    def with_worker(self, worker: int, num_workers: int) -> "World":
        """The same process seen from DataLoader worker ``worker`` of ``num_workers``."""
        return dataclasses.replace(self, worker=worker, num_workers=num_workers)

    def with_torch_worker(self) -> "World":
        """Combines with ``torch.utils.data.get_worker_info()`` when running inside a DataLoader worker.

        PyTorch is consulted only if the program has already imported it; otherwise, and in the
        main process, the world is returned unchanged.
        """
        if "torch" not in sys.modules:
            return self
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is None:
            return self
        return self.with_worker(int(info.id), int(info.num_workers))

    def describe(self) -> str:
        """One line: who this process is and where that came from."""
        text = f"rank {self.rank} of {self.size}, local {self.local_rank} of {self.local_size}"
        if self.num_workers > 1:
            text += f", worker {self.worker} of {self.num_workers} (consumer {self.consumer} of {self.num_consumers})"
        origin = _LABELS.get(self.source, self.source)
        text += f"; from {origin}"
        if self.variables:
            text += f" ({', '.join(self.variables)})"
        if self.notes:
            text += "; " + "; ".join(self.notes)
        return text

    def __repr__(self) -> str:
        return f"World({self.describe()})"


# ---- the launchers --------------------------------------------------------------------------------

class _Found:
    """What one launcher's variables say; ``None`` fields are unknown."""

    def __init__(self, source: str):
        self.source = source
        self.values: Dict[str, Optional[int]] = {"rank": None, "size": None, "local_rank": None, "local_size": None}
        self.variables: List[str] = []
        self.notes: List[str] = []

    def take(self, env: Mapping[str, str], field: str, *names: str) -> bool:
        """Sets ``field`` from the first of ``names`` present in ``env``; says whether one was."""
        for name in names:
            if name in env:
                self.values[field] = _parse_int(env, name)
                self.variables.append(name)
                return True
        return False


def _parse_int(env: Mapping[str, str], name: str) -> int:
    text = env[name].strip()
    try:
        return int(text)
    except ValueError:
        raise PlacementError(f"environment variable {name}={env[name]!r} is not an integer") from None


def _pair(source: str, env: Mapping[str, str], rank: str, size: str, local_rank: str,
          local_size: str) -> Optional[_Found]:
    """The common shape: four variables, the first two required."""
    if rank not in env or size not in env:
        return None
    found = _Found(source)
    found.take(env, "rank", rank)
    found.take(env, "size", size)
    found.take(env, "local_rank", local_rank)
    found.take(env, "local_size", local_size)
    return found


_TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
_HOROVOD = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")


def _torchrun(env: Mapping[str, str]) -> Optional[_Found]:
    return _pair("torchrun", env, *_TORCHRUN)


def _horovod(env: Mapping[str, str]) -> Optional[_Found]:
    return _pair("horovod", env, *_HOROVOD)


def _poprun(env: Mapping[str, str]) -> Optional[_Found]:
    """PopRun runs one *instance* per process with ``mpirun -x POPDIST_...``: the instance is the rank.

    PopDist passes the replica layout (``POPDIST_NUM_TOTAL_REPLICAS``, ``POPDIST_NUM_LOCAL_REPLICAS``,
    ``POPDIST_REPLICA_INDEX_OFFSET``) and ``POPDIST_LOCAL_INSTANCE_INDEX``; the instance index and
    count are Open MPI's rank and size. Without those, they are derived from the replica layout,
    which PopRun divides evenly among instances.
    """
    if "POPDIST_NUM_TOTAL_REPLICAS" not in env:
        return None
    found = _Found("poprun")
    total = _parse_int(env, "POPDIST_NUM_TOTAL_REPLICAS")
    found.variables.append("POPDIST_NUM_TOTAL_REPLICAS")
    local = offset = None
    if "POPDIST_NUM_LOCAL_REPLICAS" in env:
        local = _parse_int(env, "POPDIST_NUM_LOCAL_REPLICAS")
        found.variables.append("POPDIST_NUM_LOCAL_REPLICAS")
    if "POPDIST_REPLICA_INDEX_OFFSET" in env:
        offset = _parse_int(env, "POPDIST_REPLICA_INDEX_OFFSET")
        found.variables.append("POPDIST_REPLICA_INDEX_OFFSET")
    if not found.take(env, "rank", "OMPI_COMM_WORLD_RANK") and local and offset is not None:
        found.values["rank"] = offset // local
    if not found.take(env, "size", "OMPI_COMM_WORLD_SIZE") and local:
        if total % local:
            raise PlacementError(f"POPDIST_NUM_TOTAL_REPLICAS={total} is not a multiple of "
                                 f"POPDIST_NUM_LOCAL_REPLICAS={local}, and OMPI_COMM_WORLD_SIZE is not set: "
                                 f"cannot tell the number of instances")
        found.values["size"] = total // local
    found.take(env, "local_rank", "POPDIST_LOCAL_INSTANCE_INDEX", "OMPI_COMM_WORLD_LOCAL_RANK")
    found.take(env, "local_size", "OMPI_COMM_WORLD_LOCAL_SIZE")
    if local:
        span = f"replicas {offset}..{offset + local - 1}" if offset is not None else f"{local} replicas"
        found.notes.append(f"this instance runs {span} of {total}")
    return found


def _openmpi(env: Mapping[str, str]) -> Optional[_Found]:
    return _pair("openmpi", env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "OMPI_COMM_WORLD_LOCAL_SIZE")


def _mpich(env: Mapping[str, str]) -> Optional[_Found]:
    return _pair("mpich", env, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")


def _pmix(env: Mapping[str, str]) -> Optional[_Found]:
    """PMIx exports only ``PMIX_RANK`` (and ``PMIX_NAMESPACE``): the job size is an attribute
    (``PMIX_JOB_SIZE``) read with ``PMIx_Get``, not a variable. It is taken from the resource
    manager inside a job step (``srun --mpi=pmix``: ``SLURM_STEP_NUM_TASKS``/``SLURM_NTASKS``, by
    :func:`_slurm`'s rule: a batch script's ``SLURM_NTASKS`` is the allocation's, not the size of an
    ``mpirun``/``prterun`` started from it) or from mpi4py when the program has already imported it."""
    if "PMIX_RANK" not in env:
        return None
    found = _Found("pmix")
    found.take(env, "rank", "PMIX_RANK")
    in_step = _in_slurm_step(env)
    if not (in_step and found.take(env, "size", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")):
        size = _mpi4py_size()
        if size is not None:
            found.values["size"] = size
            found.variables.append("mpi4py COMM_WORLD.Get_size()")
    if in_step:
        found.take(env, "local_rank", "SLURM_LOCALID")
        _slurm_local_size(env, found)
    return found


def _mvapich2(env: Mapping[str, str]) -> Optional[_Found]:
    return _pair("mvapich2", env, "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
                 "MV2_COMM_WORLD_LOCAL_SIZE")


def _in_slurm_step(env: Mapping[str, str]) -> bool:
    """Whether this process is a task of an ``srun`` job step (only a step sets these)."""
    return any(name in env for name in ("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_TASKS"))


def _slurm(env: Mapping[str, str]) -> Optional[_Found]:
    """A task of an ``srun`` job step. A batch script itself also has ``SLURM_PROCID=0`` and the
    allocation's ``SLURM_NTASKS`` but is a single process; only a step sets ``SLURM_STEP_ID``
    (``SLURM_STEPID``) and ``SLURM_STEP_NUM_TASKS``."""
    if "SLURM_PROCID" not in env or not _in_slurm_step(env):
        return None
    found = _Found("slurm")
    found.take(env, "rank", "SLURM_PROCID")
    found.take(env, "size", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
    found.take(env, "local_rank", "SLURM_LOCALID")
    _slurm_local_size(env, found)
    return found


def parse_tasks_per_node(text: str) -> List[int]:
    """Expands SLURM's compressed tasks-per-node list: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``.

    Raises
    ------
    PlacementError
        When ``text`` is not in that form.
    """
    out: List[int] = []
    for part in text.strip().split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise PlacementError(f"cannot read SLURM tasks per node {text!r} (expected e.g. '2(x3),1')")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def _slurm_local_size(env: Mapping[str, str], found: _Found) -> None:
    """Local size from the step's (else the job's) tasks-per-node list, else ``SLURM_NTASKS_PER_NODE``."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if name not in env:
            continue
        counts = parse_tasks_per_node(env[name])
        if len(set(counts)) == 1:
            found.values["local_size"] = counts[0]
            found.variables.append(name)
            return
        if "SLURM_NODEID" in env:
            node = _parse_int(env, "SLURM_NODEID")
            if 0 <= node < len(counts):
                found.values["local_size"] = counts[node]
                found.variables.extend([name, "SLURM_NODEID"])
                return
    found.take(env, "local_size", "SLURM_NTASKS_PER_NODE")


#: Launchers' (rank, size) variable pairs, of which one alone is most likely a launch script's mistake (the
#: ones a launch script sets by hand; MPI launchers set both or neither).
_PAIRS = (_TORCHRUN[:2], _HOROVOD[:2])


def _half_pair(env: Mapping[str, str]) -> str:
    """``"RANK=3 is set but WORLD_SIZE is not"`` where only one of a pair is set, else ``""``."""
    for rank, size in _PAIRS:
        if (rank in env) != (size in env):
            present, absent = (rank, size) if rank in env else (size, rank)
            return f"{present}={env[present]} is set but {absent} is not"
    return ""


def _warn_if_another_launcher_says_more(found: _Found, env: Mapping[str, str]) -> None:
    """A launcher tried first that counts fewer processes than one tried later (``RANK=0 WORLD_SIZE=1`` left in
    the environment of an ``mpirun -np 2``) is stale: a torchrun under mpirun or srun has at least as many
    processes as they do. Each process would read as if alone; say so. So is one that counts as many but gives
    this process another rank (``RANK=0 WORLD_SIZE=2`` under an ``mpirun -np 2``)."""
    for name, detect in LAUNCHERS.items():
        if name == found.source:
            continue
        try:
            other = detect(env)
        except PlacementError:
            continue
        if other is None:
            continue
        size, rank = other.values.get("size"), other.values.get("rank")
        hand_set = found.source in ("torchrun", "horovod") and name != "slurm"  # SLURM's stay beside any MPI's
        if size is not None and size > found.values["size"]:
            says = f"runs {size} processes"
        elif hand_set and size == found.values["size"] and rank is not None and rank != found.values.get("rank"):
            # As many processes, numbered otherwise (RANK=0 WORLD_SIZE=2 left in an mpirun -np 2's environment):
            # every process takes the stale rank, and half the data is read twice, half never.
            says = f"says this process is rank {rank} of {size}"
        else:
            continue
        warnings.warn(f"{', '.join(found.variables[:2])} say rank {found.values.get('rank')} of "
                      f"{found.values['size']} ({_LABELS[found.source]}), but {_LABELS[name]} {says} "
                      f"({', '.join(other.variables[:2])}): stale variables from another launch? "
                      f"Each process reads as its {found.source} rank; unset them, or pass rank= and size=",
                      RuntimeWarning, stacklevel=3)
        return


def _mpi4py_size() -> Optional[int]:
    """COMM_WORLD's size when the program has already imported (so initialised) mpi4py's MPI."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return None
    try:
        return int(mpi.COMM_WORLD.Get_size())
    except Exception:  # MPI finalised or unusable: the size is simply unknown
        return None


#: Launchers in the order they are tried; each reads its variables from a mapping, or returns None.
LAUNCHERS: Dict[str, Callable[[Mapping[str, str]], Optional[_Found]]] = {
    "torchrun": _torchrun,
    "horovod": _horovod,
    "poprun": _poprun,
    "openmpi": _openmpi,
    "mpich": _mpich,
    "pmix": _pmix,
    "mvapich2": _mvapich2,
    "slurm": _slurm,
}

_LABELS = {
    "torchrun": "torchrun",
    "horovod": "Horovod (Gloo launcher)",
    "poprun": "PopRun/PopDist",
    "openmpi": "Open MPI",
    "mpich": "MPICH/Hydra or Intel MPI",
    "pmix": "PMIx",
    "mvapich2": "MVAPICH2",
    "slurm": "SLURM (srun)",
    "explicit": "explicit arguments",
    "single": "no launcher (single process)",
}


def detect_world(rank: Optional[int] = None, size: Optional[int] = None, local_rank: Optional[int] = None,
                 local_size: Optional[int] = None, environ: Optional[Mapping[str, str]] = None) -> World:
    """Rank, world size, local rank and local size of this process.

    Each explicit argument wins over the environment; the fields not given come from the first
    launcher of :data:`LAUNCHERS` whose variables are set in ``environ`` (``os.environ`` by default);
    with none, this is a single process. A local rank or size that no source gives is taken as
    if all processes ran on one host (``local_rank = rank``, ``local_size = size``), and the
    world's ``notes`` say so.

    Parameters
    ----------
    rank, size, local_rank, local_size : int, optional
        Explicit values.
    environ : mapping, optional
        The environment to read (for tests); ``os.environ`` by default.

    Returns
    -------
    World
        With ``worker=0, num_workers=1``; see :meth:`World.with_torch_worker`.

    Raises
    ------
    PlacementError
        When a variable is not an integer, the values are inconsistent (rank >= size, ...), or a
        rank is known without a world size.
    """
    env = os.environ if environ is None else environ
    explicit = {"rank": rank, "size": size, "local_rank": local_rank, "local_size": local_size}
    found: Optional[_Found] = None
    if any(v is None for v in explicit.values()):
        for detect in LAUNCHERS.values():
            found = detect(env)
            if found is not None:
                break
    if found is not None and found.values.get("size") is not None:
        _warn_if_another_launcher_says_more(found, env)
    values = dict(found.values) if found else {k: None for k in explicit}
    variables = list(found.variables) if found else []
    notes = list(found.notes) if found else []
    for key, value in explicit.items():
        if value is not None:
            values[key] = value
    given = [k for k, v in explicit.items() if v is not None]
    if found and given:
        source = f"explicit+{found.source}"
        notes.insert(0, f"explicit {', '.join(given)}")
    elif found:
        source = found.source
    elif given:
        source = "explicit"
    else:
        source = "single"
        half = _half_pair(env)
        if half:
            # Every process launched so reads every record: say it where it shows, not after an epoch of repeats
            warnings.warn(f"{half}: read as a single process (every record); set both, or pass rank= and size=",
                          RuntimeWarning, stacklevel=2)
            notes.append(half)
    if values["rank"] is None and values["size"] is None:
        values["rank"], values["size"] = 0, 1
    elif values["size"] is None:
        raise PlacementError(f"rank {values['rank']} is known ({', '.join(variables) or 'explicit'}) but not the "
                             f"world size: pass size=, or launch with a launcher that sets one")
    elif values["rank"] is None:
        raise PlacementError(f"world size {values['size']} is known ({', '.join(variables) or 'explicit'}) but "
                             f"not this process's rank: pass rank=")
    if values["local_rank"] is None or values["local_size"] is None:
        if values["local_rank"] is None and values["local_size"] is None:
            values["local_rank"], values["local_size"] = values["rank"], values["size"]
            if values["size"] > 1:
                notes.append("no local rank or size found: all ranks assumed on one host")
        elif values["local_size"] is None:
            values["local_size"] = values["size"]
            notes.append("no local size found: assumed equal to the world size")
        else:
            values["local_rank"] = values["rank"] % values["local_size"]
            notes.append("no local rank found: assumed rank % local size")
    return World(rank=values["rank"], size=values["size"], local_rank=values["local_rank"],
                 local_size=values["local_size"], source=source, variables=tuple(variables), notes=tuple(notes))
