"""Input pipelines: records -> augmented, resumable batches.

Nothing is imported until used, so ``import dlstore.pipeline`` stays cheap: ``from
dlstore.pipeline import Loader`` imports :mod:`dlstore.pipeline.loader` at that moment. Public
names and the submodule that defines each are listed in ``_EXPORTS``.

May import: :mod:`dlstore.sources` (a loader helper makes a Dataset), :mod:`dlstore.io`,
:mod:`dlstore.formats`, :mod:`dlstore.placement`, ``errors``, the C++ core; never a framework (the
adapters do that), never the bench or tools.
"""
from __future__ import annotations

import importlib
from typing import Any, Dict

# name -> submodule defining it
_EXPORTS: Dict[str, str] = {
    "Pipeline": "stages",
    "sample_seeds": "stages",
    "LAST_BATCH_POLICIES": "stages",
    "Loader": "loader",
    "Bert": "bert",
    "bert_loader": "bert",
    "BERT_PRESETS": "bert",
    "ResNet50": "resnet50",
    "resnet50_loader": "resnet50",
    "decode_batch": "decode",
    "native_jpeg_available": "decode",
    "IMAGENET_MEAN": "decode",
    "IMAGENET_STD": "decode",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # imported once
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
