"""Rank detection: every launcher's environment, explicit arguments, stacking order, errors."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import dlstore
from dlstore.errors import PlacementError
from dlstore.placement.world import _LABELS, LAUNCHERS, World, detect_world, parse_tasks_per_node

from tests.helpers import REPO

# name, environment, expected (rank, size, local_rank, local_size, source)
ENVIRONMENTS = [
    ("nothing", {"HOME": "/root"}, (0, 1, 0, 1, "single")),
    ("torchrun", {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                  "MASTER_ADDR": "h0", "MASTER_PORT": "29500"}, (3, 8, 1, 2, "torchrun")),
    ("horovod-gloo", {"HOROVOD_RANK": "5", "HOROVOD_SIZE": "6", "HOROVOD_LOCAL_RANK": "2",
                      "HOROVOD_LOCAL_SIZE": "3", "HOROVOD_CROSS_RANK": "1"}, (5, 6, 2, 3, "horovod")),
    # PopRun passes the replica layout with mpirun -x; the instance is Open MPI's rank.
    ("poprun", {"POPDIST_NUM_TOTAL_REPLICAS": "16", "POPDIST_NUM_IPUS_PER_REPLICA": "4",
                "POPDIST_NUM_LOCAL_REPLICAS": "4", "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE": "1",
                "POPDIST_REPLICA_INDEX_OFFSET": "8", "POPDIST_LOCAL_INSTANCE_INDEX": "0",
                "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_RANK": "2"}, (2, 4, 0, 2, "poprun")),
    ("poprun-without-mpi-vars", {"POPDIST_NUM_TOTAL_REPLICAS": "8", "POPDIST_NUM_LOCAL_REPLICAS": "2",
                                 "POPDIST_REPLICA_INDEX_OFFSET": "6", "POPDIST_LOCAL_INSTANCE_INDEX": "1"},
     (3, 4, 1, 4, "poprun")),
    ("openmpi", {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                 "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_NODE_RANK": "1", "PMIX_RANK": "1",
                 "PMIX_NAMESPACE": "prterun-vm-1@1"}, (1, 4, 1, 4, "openmpi")),
    ("mpich-hydra", {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1",
                     "PMI_FD": "7"}, (2, 3, 0, 1, "mpich")),
    ("intel-mpi", {"PMI_RANK": "7", "PMI_SIZE": "8", "MPI_LOCALRANKID": "3", "MPI_LOCALNRANKS": "4",
                   "I_MPI_ROOT": "/opt/intel/mpi"}, (7, 8, 3, 4, "mpich")),
    ("pmix-srun", {"PMIX_RANK": "5", "PMIX_NAMESPACE": "slurm.pmix.12.0", "SLURM_STEP_NUM_TASKS": "8",
                   "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
                   "SLURM_PROCID": "5", "SLURM_STEP_ID": "0"}, (5, 8, 1, 4, "pmix")),
    ("mvapich2", {"MV2_COMM_WORLD_RANK": "4", "MV2_COMM_WORLD_SIZE": "5", "MV2_COMM_WORLD_LOCAL_RANK": "0",
                  "MV2_COMM_WORLD_LOCAL_SIZE": "1"}, (4, 5, 0, 1, "mvapich2")),
    ("slurm-srun", {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_ID": "0",
                    "SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_NODEID": "1",
                    "SLURM_JOB_ID": "99"}, (3, 4, 1, 2, "slurm")),
    ("slurm-uneven-nodes", {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEPID": "2",
                            "SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_NODEID": "1"},
     (3, 4, 0, 1, "slurm")),
    ("slurm-ntasks-per-node", {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_STEP_ID": "0",
                               "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4"}, (5, 8, 1, 4, "slurm")),
    # A batch script is one process even though the allocation has 4 tasks: no job step.
    ("slurm-batch-script", {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0",
                            "SLURM_TASKS_PER_NODE": "4", "SLURM_JOB_ID": "99"}, (0, 1, 0, 1, "single")),
    # mpirun inside an sbatch allocation: MPI's variables, not the batch step's SLURM ones.
    ("openmpi-in-slurm", {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0",
                          "SLURM_STEP_NUM_TASKS": "1", "OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "8",
                          "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
     (6, 8, 2, 4, "openmpi")),
    ("mpich-in-slurm", {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "PMI_RANK": "1",
                        "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, (1, 2, 1, 2, "mpich")),
    # torchrun started by srun: torchrun's own variables describe the training processes.
    ("torchrun-in-slurm", {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "RANK": "5",
                           "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, (5, 8, 1, 4, "torchrun")),
]


@pytest.mark.parametrize("name,env,expected", ENVIRONMENTS, ids=[e[0] for e in ENVIRONMENTS])
def test_every_launcher(name, env, expected):
    w = detect_world(environ=env)
    assert (w.rank, w.size, w.local_rank, w.local_size, w.source) == expected
    assert (w.worker, w.num_workers) == (0, 1)
    for var in w.variables:  # it says which variables it used, and they were there
        assert var in env
    assert _LABELS[w.source] in repr(w)
    assert bool(w.variables) == (w.source != "single")


def test_every_registered_launcher_has_a_table_entry():
    assert set(LAUNCHERS) <= {e[2][4] for e in ENVIRONMENTS}


def test_repr_says_what_and_where_from():
    w = detect_world(environ=dict(ENVIRONMENTS[5][1]))
    text = repr(w)
    assert "rank 1 of 4" in text and "Open MPI" in text and "OMPI_COMM_WORLD_RANK" in text


def test_explicit_arguments_win():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    w = detect_world(rank=1, environ=env)
    assert (w.rank, w.size, w.local_rank, w.local_size) == (1, 8, 1, 2)
    assert w.source == "explicit+torchrun" and "explicit rank" in repr(w)
    w = detect_world(rank=0, size=2, local_rank=0, local_size=1, environ=env)
    assert (w.rank, w.size, w.local_rank, w.local_size, w.source, w.variables) == (0, 2, 0, 1, "explicit", ())


def test_explicit_without_environment():
    w = detect_world(rank=2, size=4, environ={})
    assert (w.rank, w.size, w.local_rank, w.local_size, w.source) == (2, 4, 2, 4, "explicit")
    assert any("one host" in n for n in w.notes)
    with pytest.raises(PlacementError, match="world size"):
        detect_world(rank=2, environ={})
    with pytest.raises(PlacementError, match="rank"):
        detect_world(size=4, environ={})


def test_missing_local_variables_are_assumed_and_noted():
    w = detect_world(environ={"PMI_RANK": "1", "PMI_SIZE": "4"})
    assert (w.local_rank, w.local_size) == (1, 4) and w.notes
    w = detect_world(environ={"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"})  # old torch.distributed.launch
    assert (w.local_rank, w.local_size) == (1, 8)


@pytest.mark.parametrize("env, said", [({"RANK": "3"}, "RANK=3 is set but WORLD_SIZE is not"),
                                       ({"WORLD_SIZE": "4"}, "WORLD_SIZE=4 is set but RANK is not"),
                                       ({"HOROVOD_RANK": "1"}, "HOROVOD_RANK=1 is set but HOROVOD_SIZE is not")])
def test_half_a_launchers_pair_is_warned(env, said):
    """RANK without WORLD_SIZE (a launch script's slip) was read as a single process in silence: every process
    so launched read every record."""
    with pytest.warns(RuntimeWarning, match=f"{said}: read as a single process"):
        world = detect_world(environ=env)
    assert (world.rank, world.size) == (0, 1) and said in world.notes
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert detect_world(environ={}).size == 1 and detect_world(environ={"RANK": "1", "WORLD_SIZE": "2"}).rank == 1
        assert detect_world(rank=0, size=1, environ=env).size == 1  # explicit values: nothing is guessed


def test_a_stale_torchrun_pair_under_a_larger_mpirun_is_warned():
    """RANK=0 WORLD_SIZE=1 left in the environment of an mpirun -np 2: both ranks read as rank 0 of 1, in silence."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    with pytest.warns(RuntimeWarning, match=r"RANK, WORLD_SIZE say rank 0 of 1 \(torchrun\), but Open MPI runs 2 "
                                            r"processes \(OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE\): stale"):
        assert detect_world(environ=env).size == 1  # the order of the launchers stands; the warning says why
    import warnings

    with warnings.catch_warnings():  # a torchrun under mpirun: more training processes than MPI ones, as it should be
        warnings.simplefilter("error")
        env = {"RANK": "3", "WORLD_SIZE": "8", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
        assert detect_world(environ=env).size == 8


def test_a_stale_torchrun_pair_of_the_same_size_under_mpirun_is_warned():
    """RANK=0 WORLD_SIZE=2 left in an mpirun -np 2's environment: every process took rank 0, half the data read
    twice and half never, in silence. A wrapper that sets RANK from Open MPI's own rank is not warned."""
    import warnings

    env = {"RANK": "0", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    with pytest.warns(RuntimeWarning, match=r"say rank 0 of 2 \(torchrun\), but Open MPI says this process is "
                                            r"rank 1 of 2"):
        detect_world(environ=env)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert detect_world(environ=dict(env, RANK="1")).rank == 1


def test_pmix_without_a_size_is_an_error_unless_given():
    env = {"PMIX_RANK": "3", "PMIX_NAMESPACE": "prterun-x@1"}
    if "mpi4py.MPI" in sys.modules:
        pytest.skip("mpi4py is imported in this process, so PMIx's size comes from COMM_WORLD")
    with pytest.raises(PlacementError, match="PMIX_RANK"):
        detect_world(environ=env)
    w = detect_world(size=4, environ=env)
    assert (w.rank, w.size, w.source) == (3, 4, "explicit+pmix")


def test_pmix_from_a_batch_script_takes_no_size_from_the_allocation():
    """prterun/mpirun -np 2 started from an sbatch -n 8 script: SLURM_NTASKS (8) is the allocation's, not the
    job's, as the SLURM detector already holds; PMIx took it, and each rank read 1/8 of the data."""
    env = {"PMIX_RANK": "1", "PMIX_NAMESPACE": "prterun-x@1", "SLURM_JOB_ID": "77", "SLURM_NTASKS": "8",
           "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    if "mpi4py.MPI" in sys.modules:
        pytest.skip("mpi4py is imported in this process, so PMIx's size comes from COMM_WORLD")
    with pytest.raises(PlacementError, match="PMIX_RANK"):
        detect_world(environ=env)
    w = detect_world(size=2, environ=env)
    assert (w.rank, w.size) == (1, 2)


@pytest.mark.parametrize("env,message", [
    ({"RANK": "three", "WORLD_SIZE": "4"}, "RANK='three' is not an integer"),
    ({"RANK": "4", "WORLD_SIZE": "4"}, "rank 4 is outside 0..3"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "0"}, "world size 0"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "local rank 2"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "3"}, "local size 3 exceeds"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "2x"}, "tasks per node"),
    ({"POPDIST_NUM_TOTAL_REPLICAS": "6", "POPDIST_NUM_LOCAL_REPLICAS": "4", "POPDIST_REPLICA_INDEX_OFFSET": "0"},
     "not a multiple"),
])
def test_bad_environments_are_clear_errors(env, message):
    with pytest.raises(PlacementError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        detect_world(environ=env)
    if "outside" in message or "exceeds" in message:
        assert "RANK" in str(info.value)  # names the variables it came from


def test_parse_tasks_per_node():
    assert parse_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert parse_tasks_per_node("4") == [4]
    with pytest.raises(PlacementError):
        parse_tasks_per_node("a")


def test_world_consumers_and_workers():
    w = World(rank=2, size=3, local_rank=0, local_size=1)
    assert (w.consumer, w.num_consumers) == (2, 3)
    v = w.with_worker(1, 4)
    assert (v.consumer, v.num_consumers) == (9, 12)
    consumers = sorted(World(rank=r, size=3, local_rank=0, local_size=1).with_worker(k, 4).consumer
                       for r in range(3) for k in range(4))
    assert consumers == list(range(12))
    with pytest.raises(PlacementError, match="worker 4"):
        w.with_worker(4, 4)
    with pytest.raises(PlacementError, match="must be an int"):
        World(rank=True)


def test_world_does_not_import_torch():
    code = "import sys, dlstore; w = dlstore.world(); print('torch' in sys.modules, w.size)"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split()[0] == "False"


class _Workers:
    """An IterableDataset that reports the world each DataLoader worker sees."""

    def __iter__(self):
        w = dlstore.world(rank=1, size=2, local_rank=1, local_size=2)
        yield (w.worker, w.num_workers, w.consumer, w.num_consumers)


@pytest.mark.slow
def test_torch_dataloader_workers_are_consumers():
    pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0) for real DataLoader workers")
    from torch.utils.data import DataLoader, IterableDataset

    class Dataset(_Workers, IterableDataset):
        pass

    assert dlstore.world(rank=1, size=2, local_rank=1, local_size=2).num_workers == 1  # main process
    got = sorted(tuple(int(x) for x in t) for t in DataLoader(Dataset(), num_workers=2, batch_size=None))
    assert got == [(0, 2, 2, 4), (1, 2, 3, 4)]
