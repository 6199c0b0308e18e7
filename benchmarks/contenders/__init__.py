"""The contenders of ``benchmarks/pipelines.py``, one module a framework, and :data:`PIPELINES`, which
maps each contender's name to the function that yields its batches from a plan.

- :mod:`.spec`: what is compared (augmentation, features, the contenders' table, expected shapes);
- :mod:`.dlstore_loaders`, :mod:`.dali_pipelines`, :mod:`.tfdata_pipelines`,
  :mod:`.torch_dataloader`: the pipelines, each importing its framework only when it runs;
- :mod:`.measure`: what a contender's worker process measures and prints.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterator

from benchmarks.contenders.dali_pipelines import bert_dali, resnet50_dali
from benchmarks.contenders.dlstore_loaders import bert_dlstore, resnet50_dlstore
from benchmarks.contenders.spec import DLSTORE_SHUFFLES
from benchmarks.contenders.tfdata_pipelines import bert_tfdata, resnet50_tfdata
from benchmarks.contenders.torch_dataloader import resnet50_torch

__all__ = ["PIPELINES"]

PIPELINES: Dict[str, Callable[[Dict], Iterator[Dict]]] = {
    **{f"resnet50-dlstore-{s}": resnet50_dlstore for s in DLSTORE_SHUFFLES},
    "resnet50-dali": resnet50_dali,
    "resnet50-tfdata": resnet50_tfdata,
    "resnet50-torch": resnet50_torch,
    **{f"bert-dlstore-{s}": bert_dlstore for s in DLSTORE_SHUFFLES},
    "bert-dali": bert_dali,
    "bert-tfdata": bert_tfdata,
}
