#!/usr/bin/env python
"""How large the ResNet-50 train crops are: dlstore's RandomResizedCrop (torchvision's algorithm, also
DALI's and the PIL contender's) beside tf.data's ``sample_distorted_bounding_box`` with the same area
and ratio ranges, as ``benchmarks/pipelines.py`` configures them.

    python benchmarks/crop_area.py [--draws 2000] [--size 400]

Prints the median and mean fraction of the image each crop covers. Smaller crops mean fewer rows to
decode, which is why the sampling matters when the pipelines are compared (docs/pipelines.md).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.contenders.spec import AREA_RANGE, CROP_ATTEMPTS, RATIO_RANGE  # noqa: E402
from dlstore.pipeline.decode import crop_windows  # noqa: E402


def dlstore_fractions(draws: int, size: int) -> np.ndarray:
    sides = np.full(draws, size)
    windows, _, _ = crop_windows(sides, sides, np.arange(draws, dtype=np.uint64), train=True,
                                 scale=AREA_RANGE, ratio=RATIO_RANGE)
    return windows[:, 2] * windows[:, 3] / (size * size)


def tfdata_fractions(draws: int, size: int) -> np.ndarray:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    tf.random.set_seed(0)
    whole = tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4])
    out = np.empty(draws)
    for i in range(draws):
        _, box_size, _ = tf.image.sample_distorted_bounding_box(
            [size, size, 3], bounding_boxes=whole, min_object_covered=0.0, aspect_ratio_range=RATIO_RANGE,
            area_range=AREA_RANGE, max_attempts=CROP_ATTEMPTS, use_image_if_no_bounding_boxes=True)
        out[i] = float(box_size[0]) * float(box_size[1]) / (size * size)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draws", type=int, default=2000)
    p.add_argument("--size", type=int, default=400, help="side of the square image, pixels (default 400)")
    args = p.parse_args(argv)
    for name, fractions in (("dlstore / torchvision RandomResizedCrop", dlstore_fractions(args.draws, args.size)),
                            ("tf.data sample_distorted_bounding_box", tfdata_fractions(args.draws, args.size))):
        print(f"{name:42s} median {np.median(fractions):.2f}  mean {fractions.mean():.2f}  "
              f"of a {args.size} x {args.size} image, {args.draws} draws")
    return 0


if __name__ == "__main__":
    sys.exit(main())
