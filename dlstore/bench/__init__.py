"""``python -m dlstore.bench <scenario>``: benchmarks of your storage, as storage reference architectures measure it.

Scenarios are registered by name in :data:`SCENARIOS`. Each names the module that implements it;
that module provides ``add_arguments(parser)`` and ``run(args) -> int`` (the exit status).

To add one: write ``dlstore/bench/<name>.py`` with those two functions and add its entry below.

May import anything in dlstore below the command line (sources, pipeline, io, placement, synthetic,
settings); optional packages (mpi4py, prometheus_client, matplotlib, kvikio) only where used.
Nothing in dlstore imports the bench.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Dict

__all__ = ["Scenario", "SCENARIOS", "load_scenario"]


@dataclass(frozen=True)
class Scenario:
    """A benchmark scenario: its name, a one-line summary, and the module that runs it."""

    name: str
    summary: str
    module: str


SCENARIOS: Dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("storage", "read-only storage benchmark: records through an I/O engine, cold or warm, "
                            "beside fio reading the same files with O_DIRECT", "dlstore.bench.storage"),
        Scenario("resnet50", "ResNet-50 input pipeline: images/s per step in page-cache, local-cold and target "
                             "tiers, jobs 1..N, accelerator utilisation", "dlstore.bench.resnet50"),
        Scenario("bert", "BERT pretraining input pipeline: samples/s per step at seq 128 or 384 in the same "
                         "tiers, jobs 1..N, accelerator utilisation", "dlstore.bench.bert"),
        Scenario("mlperf", "MLPerf Storage's question: the most emulated accelerators (resnet50, cosmoflow on a100, "
                           "h100) this storage feeds at the workload's AU, on DLIO's TFRecord layout, cold and warm",
                 "dlstore.bench.mlperf"),
        Scenario("gpu-check", "the GPU path end to end on a GPU machine: build, gpu tests, gds batches against the "
                              "host engines', compute-sanitizer, GB/s against kvikio", "dlstore.bench.gpu_check"),
    ]
}


def load_scenario(name: str) -> ModuleType:
    """The module implementing scenario ``name``.

    Raises
    ------
    KeyError
        When no scenario has that name.
    """
    return importlib.import_module(SCENARIOS[name].module)
