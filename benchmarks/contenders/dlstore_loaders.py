"""dlstore's contenders: ``resnet50_loader`` and ``bert_loader`` over a ``dlstore.Dataset`` with the
row's shuffle."""
from __future__ import annotations

from typing import Dict, Iterator

import dlstore

__all__ = ["resnet50_dlstore", "bert_dlstore"]


def _dlstore_dataset(plan: Dict):
    """The ``dlstore.Dataset`` a dlstore contender reads: every file, one rank, its shuffle, the plan's seed."""
    return dlstore.Dataset(plan["files"], shuffle=plan["dlstore_shuffle"], seed=plan["seed"])


def _dataset_stats(loader, dataset, **extra) -> Dict:
    return dict(loader.stats(), shuffle=dataset.describe_shuffle(), **extra)


def resnet50_dlstore(plan: Dict) -> Iterator[Dict]:
    """dlstore's ``resnet50_loader`` (train) over a ``dlstore.Dataset`` with the row's shuffle, NCHW
    float32 or NHWC uint8, endless; its default thread count, which is one decoding thread per core it
    may use (the pinned cores)."""
    # Imported here, as the frameworks are: a tree whose pipeline is not built yet reports the row as
    # not available (the worker catches the ImportError) instead of failing every contender.
    from dlstore.pipeline import native_jpeg_available, resnet50_loader

    float_out = plan["output"] == "float"
    dataset = _dlstore_dataset(plan)
    loader = resnet50_loader(dataset, batch_size=plan["batch_size"], train=True,
                             layout="NCHW" if float_out else "NHWC", dtype="float32" if float_out else "uint8",
                             seed=plan["seed"], epochs=None)
    native, how = native_jpeg_available()
    plan["_stats"] = lambda: _dataset_stats(loader, dataset, decoder=how if native else f"Python decoder ({how})")
    yield from loader


def bert_dlstore(plan: Dict) -> Iterator[Dict]:
    """dlstore's ``bert_loader`` over a ``dlstore.Dataset`` with the row's shuffle, endless, its default
    thread count (one parsing thread beside the loader's own: at batch 64 a pool costs more in
    hand-offs than it saves), on the pinned cores."""
    from dlstore.pipeline import bert_loader  # here, not at the top: as in resnet50_dlstore

    dataset = _dlstore_dataset(plan)
    loader = bert_loader(dataset, batch_size=plan["batch_size"], seq_len=plan["seq_len"], seed=plan["seed"],
                         epochs=None)
    plan["_stats"] = lambda: _dataset_stats(loader, dataset)
    yield from loader
