"""ImageNet-like records: a photo-like JPEG with the features of TensorFlow's ImageNet converter
(``build_imagenet_data.py``) in TFRecord, or with an ``IRHeader`` in RecordIO as MXNet's ``im2rec``
writes them.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from dlstore.formats import recordio
from dlstore.formats.example import encode_example
from dlstore.synthetic.images import DEFAULT_QUALITY, DETAIL_SPREAD, encode_jpeg, pillow, synthesize_image
from dlstore.synthetic.shards import check_counts, write_shards

SHARD_PREFIX = "train"  # shards are SHARD_PREFIX-00000-of-NNNNN

__all__ = ["generate_imagenet"]

_IMAGENET_CLASSES = 1000
_IMAGENET_TASK = 16  # records per worker task: small enough for a smooth bar, large enough to amortise IPC


def _imagenet_sample(seed: int, index: int, image_size: Tuple[int, int], quality: int) -> Dict[str, Any]:
    """Record ``index`` of the set made with ``seed``: its JPEG and metadata (all drawn from one stream)."""
    rng = np.random.default_rng([seed, index])
    lo, hi = image_size
    height, width = (int(v) for v in rng.integers(lo, hi + 1, 2))
    label = int(rng.integers(1, _IMAGENET_CLASSES + 1))
    xs, ys = np.sort(rng.uniform(0.0, 1.0, 2)), np.sort(rng.uniform(0.0, 1.0, 2))
    # Texture varies from image to image (a lawn, a sky), as does a photo's size; the mean is calibrated.
    detail = math.exp(float(rng.normal(0.0, DETAIL_SPREAD)))
    jpeg = encode_jpeg(synthesize_image(rng, height, width, detail), quality)
    box = (xs[0], ys[0], xs[1], ys[1])
    return {"jpeg": jpeg, "height": height, "width": width, "label": label, "box": box}


def _imagenet_example(index: int, sample: Dict[str, Any]) -> Dict[str, Any]:
    """The features of ``build_imagenet_data.py`` (TensorFlow models' ImageNet converter), one box each."""
    label = sample["label"]
    xmin, ymin, xmax, ymax = (float(v) for v in sample["box"])
    return {
        "image/height": [sample["height"]],
        "image/width": [sample["width"]],
        "image/colorspace": b"RGB",
        "image/channels": [3],
        "image/class/label": [label],
        "image/class/synset": b"n%08d" % label,
        "image/class/text": b"synthetic class %d" % label,
        "image/object/bbox/xmin": [xmin],
        "image/object/bbox/ymin": [ymin],
        "image/object/bbox/xmax": [xmax],
        "image/object/bbox/ymax": [ymax],
        "image/object/bbox/label": [label],
        "image/format": b"JPEG",
        "image/filename": b"synthetic_%08d.JPEG" % index,
        "image/encoded": sample["jpeg"],
    }


def _imagenet_payloads(task: Tuple[int, int, int, Tuple[int, int], int, str]) -> List[bytes]:
    """Serialized records ``start..stop-1`` (runs in a worker process)."""
    seed, start, stop, image_size, quality, fmt = task
    out = []
    for index in range(start, stop):
        sample = _imagenet_sample(seed, index, image_size, quality)
        if fmt == "tfrecord":
            out.append(encode_example(_imagenet_example(index, sample)))
        else:
            # MXNet's im2rec convention: 0-based float label in the IRHeader, the record number as id.
            out.append(recordio.pack(0, float(sample["label"] - 1), index, 0, sample["jpeg"]))
    return out


def generate_imagenet(out_dir, *, shards: int, records_per_shard: int, seed: int = 0,
                      image_size: Tuple[int, int] = (300, 500), quality: Optional[int] = None,
                      progress: bool = True, format: str = "tfrecord",
                      workers: Optional[int] = None) -> List[str]:
    """Writes an ImageNet-like training set of real JPEGs in TFRecord (or RecordIO) shards.

    Each TFRecord record is a ``tf.train.Example`` with the keys of TensorFlow's ImageNet
    converter: ``image/encoded`` (a baseline JPEG), ``image/height``, ``image/width``,
    ``image/class/label`` (1..1000), ``image/class/synset``, ``image/class/text``,
    ``image/format`` (``b"JPEG"``), ``image/filename`` (``b"synthetic_XXXXXXXX.JPEG"``, the record
    number), ``image/colorspace``, ``image/channels`` and one ``image/object/bbox/*`` box.

    The mean record is 115 KB with the default ``image_size`` and ``quality``, as in ImageNet
    (5th..95th percentile 77..162 KB): texture strength and quality were calibrated together on
    2,000 records (see ``_OCTAVES`` in :mod:`dlstore.synthetic.images`). Images mix a smooth colour field, flat shapes
    with sharp edges and regionally varying texture at several scales, so they cost what photos
    cost to decode, unlike pure noise or flat gradients.

    Parameters
    ----------
    out_dir : str or path-like
        Created if missing. Shards are named ``train-00000-of-00024`` (``.rec`` with ``.idx``
        beside it for RecordIO).
    shards, records_per_shard : int
        The set holds ``shards * records_per_shard`` records.
    seed : int, optional
        Non-negative. Record ``i`` depends only on ``(seed, i)``: the same seed gives the same
        bytes, whatever ``workers`` is.
    image_size : (int, int), optional
        Each side of each image is drawn uniformly from ``lo..hi`` pixels (inclusive).
    quality : int, optional
        JPEG quality 1..95; ``None`` uses the calibrated default (95). Lower qualities give
        smaller records (90: about 87 KB, 85: about 72 KB).
    progress : bool, optional
        Show a progress bar on stderr (only when it is a terminal).
    format : {"tfrecord", "recordio"}, optional
        RecordIO records hold an ``IRHeader`` (0-based label, record number as id) and the JPEG,
        as MXNet's ``im2rec`` writes them.
    workers : int, optional
        Processes encoding JPEGs. ``None``: one per available core (at most 16) for sets of 64
        records or more, none (in this process) for smaller ones. Workers are spawned, not forked, so threads of
        the caller (a running reader, a framework) cannot deadlock them; a calling script needs
        the usual ``if __name__ == "__main__":`` guard.

    Returns
    -------
    list of str
        The shard paths, in order.

    Raises
    ------
    ImportError
        Pillow is not installed (the message says ``pip install pillow``).
    ValueError
        A count, the seed, the size range, the quality or the format is out of range.

    Examples
    --------
    >>> paths = generate_imagenet("/tmp/inet", shards=2, records_per_shard=16)   # doctest: +SKIP
    >>> os.path.basename(paths[0])                                             # doctest: +SKIP
    'train-00000-of-00002'
    """
    check_counts(shards, records_per_shard, seed)
    lo, hi = (int(v) for v in image_size)
    if not 8 <= lo <= hi:
        raise ValueError(f"image_size must be (lo, hi) with 8 <= lo <= hi, got {tuple(image_size)}")
    quality = DEFAULT_QUALITY if quality is None else int(quality)
    if not 1 <= quality <= 95:
        raise ValueError(f"quality must be in 1..95 (Pillow's useful range), got {quality}")
    if format not in ("tfrecord", "recordio"):
        raise ValueError(f"format must be 'tfrecord' or 'recordio', got {format!r}")
    pillow()  # fail before creating anything

    def task(start: int, stop: int):
        return (seed, start, stop, (lo, hi), quality, format)

    return write_shards(out_dir, SHARD_PREFIX, shards, records_per_shard, format, _imagenet_payloads, task,
                         _IMAGENET_TASK, workers, progress, "imagenet")
