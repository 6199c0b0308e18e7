"""``python -m dlstore.bench <scenario>``: benchmarks of your storage, as storage reference architectures measure it.

Scenarios are registered by name in :data:`SCENARIOS`. Each names the module that implements it;
that module provides ``add_arguments(parser)`` and ``run(args) -> int`` (the exit status). A
scenario without a module is planned: the command line lists it and says so (exit 2).

To add one: write ``dlstore/bench/<name>.py`` with those two functions and set ``module`` in its
entry below.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Dict, Optional

__all__ = ["Scenario", "SCENARIOS", "load_scenario"]


@dataclass(frozen=True)
class Scenario:
    """A benchmark scenario: its name, a one-line summary, and the module that runs it (None: planned)."""

    name: str
    summary: str
    module: Optional[str] = None

    @property
    def implemented(self) -> bool:
        return self.module is not None


SCENARIOS: Dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("storage", "read-only storage benchmark: records through an I/O engine, cold or warm, "
                            "beside fio reading the same files with O_DIRECT", "dlstore.bench.storage"),
        Scenario("resnet50", "ResNet-50 input pipeline: images/s per step in page-cache, local-cold and target "
                             "tiers, jobs 1..N, accelerator utilisation", "dlstore.bench.resnet50"),
        Scenario("bert", "BERT pretraining input pipeline: samples/s per step at seq 128 or 384 in the same "
                         "tiers, jobs 1..N, accelerator utilisation", "dlstore.bench.bert"),
    ]
}


def load_scenario(name: str) -> ModuleType:
    """The module implementing scenario ``name``.

    Raises
    ------
    KeyError
        When no scenario has that name.
    NotImplementedError
        When the scenario is planned but not implemented yet.
    """
    scenario = SCENARIOS[name]
    if scenario.module is None:
        raise NotImplementedError(f"'{name}' is not implemented yet; implemented: "
                                  + ", ".join(n for n, s in SCENARIOS.items() if s.implemented))
    return importlib.import_module(scenario.module)
