"""``python -m dlstore.bench resnet50``: the ResNet-50 input pipeline, images/s per step as the Graphcore + DDN
reference architecture reports it.

JPEG records are read, decoded (only the crop window, at the smallest DCT scale that covers it),
augmented and batched by :class:`dlstore.pipeline.ResNet50` through :class:`dlstore.pipeline.Loader`,
in the tiers page-cache, local-cold and target; see :mod:`dlstore.bench.pipeline_bench` for what a
step, a job and the accelerator emulation are.
"""
from __future__ import annotations

import argparse

from dlstore.bench import pipeline_bench
from dlstore.bench.tiers import Workload

__all__ = ["WORKLOAD", "add_arguments", "run"]


def _pipeline_kwargs(args: argparse.Namespace) -> dict:
    return {"train": not args.eval, "layout": args.layout, "dtype": args.dtype}


def _describe(args: argparse.Namespace) -> str:
    what = ("eval: resize 256, centre crop 224" if args.eval else
            "train: RandomResizedCrop 224, flip")
    return f"{what}, {args.layout} {args.dtype}"


WORKLOAD = Workload(
    name="resnet50",
    unit="images",
    dataset_kind="imagenet",
    pipeline="ResNet50",
    default_batch_size=256,
    pipeline_kwargs=_pipeline_kwargs,
    describe=_describe,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of the ``resnet50`` scenario."""
    pipeline_bench.add_common_arguments(p, WORKLOAD)
    p.add_argument("--eval", action="store_true",
                   help="the evaluation pipeline (resize 256, centre crop 224) instead of training's")
    p.add_argument("--layout", choices=("NHWC", "NCHW"), default="NHWC", help="batch layout (default: %(default)s)")
    p.add_argument("--dtype", choices=("uint8", "float32"), default="uint8",
                   help="uint8 pixels, or float32 normalised with ImageNet's mean and std (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``python -m dlstore.bench resnet50``."""
    return pipeline_bench.run_workload(WORKLOAD, args)
