"""``python -m dlstore.bench bert``: the BERT pretraining input pipeline, samples/s per step.

``tf.train.Example`` records with the seven pretraining features are parsed in C++ into
fixed-shape batches by :class:`dlstore.pipeline.Bert` through :class:`dlstore.pipeline.Loader`,
at sequence length 128 or 384, in the tiers page-cache, local-cold and target; see
:mod:`dlstore.bench.pipeline_bench` for what a step, a job and the accelerator emulation are.
"""
from __future__ import annotations

import argparse

from dlstore.bench import pipeline_bench
from dlstore.bench.tiers import Workload
from dlstore.pipeline.bert import BERT_PRESETS

__all__ = ["WORKLOAD", "MAX_PREDICTIONS", "add_arguments", "run"]

MAX_PREDICTIONS = BERT_PRESETS  # masked-LM slots of each preset (create_pretraining_data.py's usual values)


def _max_predictions(args: argparse.Namespace) -> int:
    return args.max_predictions if args.max_predictions is not None else MAX_PREDICTIONS[args.seq_len]


def _pipeline_kwargs(args: argparse.Namespace) -> dict:
    return {"seq_len": args.seq_len, "max_predictions": _max_predictions(args)}


def _dataset_overrides(args: argparse.Namespace) -> dict:
    # The generator's defaults are seq 128 with 20 predictions; other shapes are their own cached set.
    if args.seq_len == 128 and _max_predictions(args) == 20:
        return {}
    return {"seq_len": args.seq_len, "max_predictions": _max_predictions(args)}


WORKLOAD = Workload(
    name="bert",
    unit="samples",
    dataset_kind="bert",
    pipeline="Bert",
    default_batch_size=64,
    pipeline_kwargs=_pipeline_kwargs,
    dataset_overrides=_dataset_overrides,
    variant=lambda args: args.seq_len,
    describe=lambda args: f"seq {args.seq_len}, {_max_predictions(args)} masked-LM predictions",
    default_size="bench",
    size_help=(": 65,536 distinct records, each in 16 files, 1M records and ~870 MB, so that a tier "
               "lasts seconds"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of the ``bert`` scenario."""
    pipeline_bench.add_common_arguments(p, WORKLOAD)
    p.add_argument("--seq-len", type=int, choices=sorted(MAX_PREDICTIONS), default=128,
                   help="sequence length (default: %(default)s)")
    p.add_argument("--max-predictions", type=int, default=None, metavar="N",
                   help="masked-LM predictions per sequence (default: 20 at seq 128, 60 at 384)")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``python -m dlstore.bench bert``."""
    return pipeline_bench.run_workload(WORKLOAD, args)
