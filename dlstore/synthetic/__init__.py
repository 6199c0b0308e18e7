"""Synthetic datasets with the byte profile of the real ones: ImageNet-like JPEG shards and BERT features.

They stand in for data a user may not have at hand (``dlstore gen``, and the benchmarks when no
``--data`` is given). What matters for a storage benchmark is what the reader sees: record sizes,
shard sizes, and JPEGs that cost what photos cost to decode. So the images are real JPEGs of
ImageNet's size (each side 300..500 px, 110-120 KB a record on average), and the BERT records carry
the seven pretraining features with the layout and value ranges of ``create_pretraining_data.py``.

Every record is a pure function of ``(seed, record number)``: the same seed gives the same bytes
whatever the number of worker processes. Pillow is needed for the JPEGs and is imported only when
images are made.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import shutil
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

__all__ = ["generate_imagenet", "generate_bert", "cached_dataset", "cached_paths", "PRESETS"]

# Bump when what a given seed produces changes, so that cached sets are made again.
GENERATOR_VERSION = 1

# ---- ImageNet-like records --------------------------------------------------------------------------

# JPEG quality and texture amplitudes, calibrated together so that the mean record of the default
# image sizes (each side uniform in 300..500 px, 160,000 px on average) lands at ImageNet's 115 KB
# (the figure of the Dell EMC Isilon F800 reference architecture). Photos carry about 5.7 bits per pixel at that size;
# even pure luminance noise reaches only ~6.3 at quality 90, so realistic content needs quality
# 95, as many camera and Flickr JPEGs have. With it, the mean grows roughly as the logarithm of
# the texture amplitude. Measured on records 0..1999 of seed 0 (Pillow 13, libjpeg-turbo 3):
# _OCTAVES as below -> mean 114.8 KB (sd 26, 5th..95th percentile 77..162 KB); all amplitudes
# x0.91 -> 111.5 KB; x1.07 -> 117.0 KB. Other image sizes scale the mean with their area.
_DEFAULT_QUALITY = 95
_OCTAVES = (224.0, 112.0, 150.0)  # peak-to-peak luminance amplitude of the ~4 px, ~2 px and 1 px grains
_DETAIL_SPREAD = 0.35  # log-normal sigma of each image's texture strength: busy and calm photos
_IMAGENET_CLASSES = 1000
_IMAGENET_TASK = 16  # records per worker task: small enough for a smooth bar, large enough to amortise IPC


def _pillow():
    """Imports Pillow, or says how to get it."""
    try:
        from PIL import Image, ImageDraw
    except ImportError:
        raise ImportError("synthetic ImageNet records need Pillow to encode JPEGs: pip install pillow "
                          "(or pip install 'dlstore[bench]')") from None
    return Image, ImageDraw


def _synthesize_image(rng: np.random.Generator, height: int, width: int, detail: float):
    """A ``height x width`` Pillow image in YCbCr with a photo's mix of smooth areas, edges and texture.

    Layers, coarse to fine, so that the JPEG spends its bits as on a photo, neither on pure noise
    (far too large, and nothing like a photo to decode) nor on flat gradients (far too small):

    1. a smooth colour field (a 3x4 grid of palette colours, interpolated) with colour texture of
       about 6 px grain, built at 1/6 resolution and interpolated up;
    2. 4..14 flat shapes (ellipses, boxes, polygons, thick lines) with sharp edges;
    3. luminance texture with detail at every scale, amplitude falling with spatial frequency as
       in photos (grains of ~4 px, ~2 px and 1 px summed), strong in some regions and faint in
       others (a smooth mask), scaled by ``detail``.

    The image is made in YCbCr, the space JPEG codes in, so that the texture touches one plane
    instead of three and the encoder converts nothing. Bands are handled as "RGB" images holding
    Y, Cb and Cr until the end: resizing and drawing do not care what the channels mean.
    """
    Image, ImageDraw = _pillow()
    low = (-(-height // 6), -(-width // 6))
    # Scene palette: a random cast with moderately saturated colours around it, as photos have.
    cast = np.array([rng.normal(120.0, 30.0), *rng.normal(128.0, 12.0, 2)])
    palette = np.clip(cast + rng.normal(0.0, 1.0, (12, 3)) * (50.0, 18.0, 18.0), 16, 240)

    # 1. Smooth background and colour texture, at 1/6 resolution.
    grid = palette[rng.integers(0, len(palette), (3, 4))].astype(np.uint8)
    layer = np.asarray(Image.fromarray(grid).resize((low[1], low[0]), Image.BICUBIC), dtype=np.float32)
    weight = np.asarray(Image.fromarray(rng.integers(0, 256, (4, 5), dtype=np.uint8)).resize(
        (low[1], low[0]), Image.BICUBIC), dtype=np.float32) * (1.0 / 255.0)
    layer += rng.uniform(-1.0, 1.0, (*low, 3)).astype(np.float32) * weight[:, :, None] * (30.0, 10.0, 10.0)
    image = Image.fromarray(np.clip(layer, 0, 255).astype(np.uint8)).resize((width, height), Image.BILINEAR)

    # 2. Shapes with sharp edges. Parameters drawn all at once, in a fixed order.
    count = int(rng.integers(4, 15))
    kinds = rng.integers(0, 4, count).tolist()
    colours = [tuple(c) for c in palette[rng.integers(0, len(palette), count)].astype(int).tolist()]
    corners = (rng.uniform(-0.2, 1.0, (count, 2)) * (width, height)).astype(int)
    extents = (rng.uniform(0.05, 0.5, (count, 2)) * (width, height)).astype(int)
    vertices = (rng.uniform(0.0, 1.0, (count, 5, 2)) * (width, height)).astype(int).tolist()
    draw = ImageDraw.Draw(image)
    for i, kind in enumerate(kinds):
        x0, y0 = corners[i].tolist()
        x1, y1 = (corners[i] + extents[i]).tolist()
        if kind == 0:
            draw.ellipse((x0, y0, x1, y1), fill=colours[i])
        elif kind == 1:
            draw.rectangle((x0, y0, x1, y1), fill=colours[i])
        elif kind == 2:
            draw.polygon([tuple(v) for v in vertices[i]], fill=colours[i])
        else:
            draw.line((x0, y0, x1, y1), fill=colours[i], width=max(2, int(extents[i][0]) // 16))

    # 3. Luminance texture: octaves summed at half resolution, interpolated, plus the 1 px grain.
    quarter, half = (-(-height // 4), -(-width // 4)), (-(-height // 2), -(-width // 2))
    octave = rng.random(quarter, dtype=np.float32) - 0.5
    octave = np.asarray(Image.fromarray(octave).resize((half[1], half[0]), Image.BICUBIC))
    octave = octave * _OCTAVES[0] + (rng.random(half, dtype=np.float32) - 0.5) * _OCTAVES[1]
    texture = np.array(Image.fromarray(octave).resize((width, height), Image.BILINEAR))
    texture += (rng.random((height, width), dtype=np.float32) - 0.5) * _OCTAVES[2]
    # The mask is the outer product of two smooth random profiles: as good as a 2-D field for
    # placing busy and calm regions, at the cost of one multiplication.
    rows = np.interp(np.arange(height), np.linspace(0, height, 5), rng.uniform(0.0, 1.0, 5))
    cols = np.interp(np.arange(width), np.linspace(0, width, 6), rng.uniform(0.0, 1.0, 6))
    texture *= np.outer(rows * (0.8 * detail), cols).astype(np.float32) + np.float32(0.2 * detail)
    y, cb, cr = image.split()
    texture += np.asarray(y, dtype=np.float32)
    np.clip(texture, 0, 255, out=texture)
    return Image.merge("YCbCr", (Image.fromarray(texture.astype(np.uint8)), cb, cr))


def _encode_jpeg(image, quality: int) -> bytes:
    """Baseline JPEG with 4:2:0 chroma subsampling, what cameras and ImageNet's files mostly use."""
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality, subsampling="4:2:0")
    return out.getvalue()


def _imagenet_sample(seed: int, index: int, image_size: Tuple[int, int], quality: int) -> Dict[str, Any]:
    """Record ``index`` of the set made with ``seed``: its JPEG and metadata (all drawn from one stream)."""
    rng = np.random.default_rng([seed, index])
    lo, hi = image_size
    height, width = (int(v) for v in rng.integers(lo, hi + 1, 2))
    label = int(rng.integers(1, _IMAGENET_CLASSES + 1))
    xs, ys = np.sort(rng.uniform(0.0, 1.0, 2)), np.sort(rng.uniform(0.0, 1.0, 2))
    # Texture varies from image to image (a lawn, a sky), as does a photo's size; the mean is calibrated.
    detail = math.exp(float(rng.normal(0.0, _DETAIL_SPREAD)))
    jpeg = _encode_jpeg(_synthesize_image(rng, height, width, detail), quality)
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
    from dlstore.formats import recordio
    from dlstore.formats.example import encode_example

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
    2,000 records (see ``_OCTAVES`` in the source). Images mix a smooth colour field, flat shapes
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
    _check_counts(shards, records_per_shard, seed)
    lo, hi = (int(v) for v in image_size)
    if not 8 <= lo <= hi:
        raise ValueError(f"image_size must be (lo, hi) with 8 <= lo <= hi, got {tuple(image_size)}")
    quality = _DEFAULT_QUALITY if quality is None else int(quality)
    if not 1 <= quality <= 95:
        raise ValueError(f"quality must be in 1..95 (Pillow's useful range), got {quality}")
    if format not in ("tfrecord", "recordio"):
        raise ValueError(f"format must be 'tfrecord' or 'recordio', got {format!r}")
    _pillow()  # fail before creating anything

    def task(start: int, stop: int):
        return (seed, start, stop, (lo, hi), quality, format)

    return _write_shards(out_dir, "train", shards, records_per_shard, format, _imagenet_payloads, task,
                         _IMAGENET_TASK, workers, progress, "imagenet")


# ---- BERT pretraining records ------------------------------------------------------------------------

# bert-base-uncased vocabulary: [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103, single
# characters from 999, whole words and pieces from 1996 ("the") to 30521.
VOCAB_SIZE = 30522
PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 101, 102, 103
_FIRST_WORD_ID = 1996
_PUNCTUATION_IDS = np.array([1010, 1012, 1005, 1011, 1025, 1029], dtype=np.int64)  # , . ' - ; ?
_MASKED_LM_PROB = 0.15
_SHORT_SEQ_PROB = 0.1
_BERT_TASK = 256


def _wordpieces(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` token ids with a Zipf-like word frequency and some punctuation."""
    ranks = rng.zipf(1.15, n) - 1
    ids = _FIRST_WORD_ID + ranks % (VOCAB_SIZE - _FIRST_WORD_ID)
    punct = rng.random(n) < 0.08
    ids[punct] = _PUNCTUATION_IDS[rng.integers(0, len(_PUNCTUATION_IDS), int(punct.sum()))]
    return ids.astype(np.int64)


def _bert_features(seed: int, index: int, seq_len: int, max_predictions: int) -> Dict[str, np.ndarray]:
    """Record ``index``: ``[CLS] A [SEP] B [SEP]`` then zero padding, with 15% of the tokens masked.

    As ``create_pretraining_data.py`` makes them: most sequences are nearly full (sentences end
    before the limit), one in ten is short; masked positions avoid [CLS]/[SEP], are sorted, and are
    replaced by [MASK] 80% of the time, a random token 10%, left as they were 10%.
    """
    rng = np.random.default_rng([seed, index])
    if rng.random() < _SHORT_SEQ_PROB:
        length = int(rng.integers(5, seq_len + 1))
    else:
        length = seq_len - int(rng.integers(0, seq_len // 8 + 1))
    length = max(length, 5)
    pieces = length - 3
    len_a = int(rng.integers(1, pieces))
    words = _wordpieces(rng, pieces)
    words[len_a - 1] = words[-1] = 1012  # each segment ends a sentence

    input_ids = np.zeros(seq_len, np.int64)
    input_ids[0] = CLS_ID
    input_ids[1:1 + len_a] = words[:len_a]
    input_ids[1 + len_a] = SEP_ID
    input_ids[2 + len_a:length - 1] = words[len_a:]
    input_ids[length - 1] = SEP_ID
    input_mask = np.zeros(seq_len, np.int64)
    input_mask[:length] = 1
    segment_ids = np.zeros(seq_len, np.int64)
    segment_ids[2 + len_a:length] = 1

    predictions = min(max_predictions, max(1, int(round(pieces * _MASKED_LM_PROB))))
    candidates = np.concatenate([np.arange(1, 1 + len_a), np.arange(2 + len_a, length - 1)])
    positions = np.sort(rng.choice(candidates, predictions, replace=False))
    originals = input_ids[positions].copy()
    fate = rng.random(predictions)
    random_tokens = rng.integers(999, VOCAB_SIZE, predictions)
    input_ids[positions] = np.where(fate < 0.8, MASK_ID, np.where(fate < 0.9, random_tokens, originals))

    masked_lm_positions = np.zeros(max_predictions, np.int64)
    masked_lm_positions[:predictions] = positions
    masked_lm_ids = np.zeros(max_predictions, np.int64)
    masked_lm_ids[:predictions] = originals
    masked_lm_weights = np.zeros(max_predictions, np.float32)
    masked_lm_weights[:predictions] = 1.0
    return {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "masked_lm_positions": masked_lm_positions,
        "masked_lm_ids": masked_lm_ids,
        "masked_lm_weights": masked_lm_weights,
        "next_sentence_labels": np.array([rng.integers(0, 2)], np.int64),
    }


def _bert_payloads(task: Tuple[int, int, int, int, int]) -> List[bytes]:
    """Serialized records ``start..stop-1`` (runs in a worker process)."""
    from dlstore.formats.example import encode_example

    seed, start, stop, seq_len, max_predictions = task
    return [encode_example(_bert_features(seed, i, seq_len, max_predictions)) for i in range(start, stop)]


def generate_bert(out_dir, *, shards: int, records_per_shard: int, seed: int = 0, seq_len: int = 128,
                  max_predictions: int = 20, copies: int = 1, progress: bool = True,
                  workers: Optional[int] = None) -> List[str]:
    """Writes BERT pretraining records (``tf.train.Example``) in TFRecord shards.

    Each record has the seven features of ``create_pretraining_data.py``: ``input_ids``,
    ``input_mask``, ``segment_ids`` (``seq_len`` int64 each; ``[CLS] A [SEP] B [SEP]`` then zero
    padding, vocabulary of 30,522 as bert-base-uncased), ``masked_lm_positions``,
    ``masked_lm_ids`` (``max_predictions`` int64, zero padded), ``masked_lm_weights``
    (``max_predictions`` float, 1.0 for real predictions) and ``next_sentence_labels`` (one int64).

    Parameters
    ----------
    out_dir : str or path-like
        Created if missing. Shards are named ``part-00000-of-00500`` as in MLPerf's BERT set.
    shards, records_per_shard : int
        The set holds ``shards * records_per_shard`` records.
    seed : int, optional
        Non-negative; record ``i`` depends only on ``(seed, i)``.
    seq_len : int, optional
        Sequence length; 128 and 384 are the usual presets. At least 8.
    max_predictions : int, optional
        Masked-LM slots per record (20 for 128, 56 or 76 for longer sequences).
    copies : int, optional
        Write the ``shards`` shards this many times, as ``shards * copies`` files (copy ``c`` of
        shard ``s`` is file ``c * shards + s``): a set large enough to time, at the cost of encoding
        ``shards * records_per_shard`` records only (encoding runs at ~1,500 records/s a core, the
        parser at ~500,000). Reading costs the same whatever the content, and the Dell EMC Isilon
        reference architecture expanded ImageNet by copies too.
    progress : bool, optional
        Show a progress bar on stderr (only when it is a terminal).
    workers : int, optional
        Encoding processes, as for :func:`generate_imagenet`.

    Returns
    -------
    list of str
        The shard paths, in order.
    """
    _check_counts(shards, records_per_shard, seed)
    if int(seq_len) < 8:
        raise ValueError(f"seq_len must be at least 8, got {seq_len}")
    if int(max_predictions) < 1:
        raise ValueError(f"max_predictions must be at least 1, got {max_predictions}")

    def task(start: int, stop: int):
        return (seed, start, stop, int(seq_len), int(max_predictions))

    return _write_shards(out_dir, "part", shards, records_per_shard, "tfrecord", _bert_payloads, task,
                         _BERT_TASK, workers, progress, "bert", copies=copies)


# ---- writing shards, in order, from worker processes ---------------------------------------------------

def _check_counts(shards: int, records_per_shard: int, seed: int) -> None:
    if int(shards) < 1 or int(records_per_shard) < 1:
        raise ValueError(f"shards and records_per_shard must be positive, "
                         f"got {shards} and {records_per_shard}")
    if int(seed) < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")


def _default_workers(records: int) -> int:
    """One process per usable core (at most 16); none for sets too small to repay starting them."""
    if records < 64:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 16))


def _payload_stream(make: Callable[[Any], List[bytes]], tasks: List[Any],
                    workers: int) -> Iterator[List[bytes]]:
    """The payload lists of ``tasks`` in order, made here or by a pool of spawned processes."""
    if workers <= 1:
        for t in tasks:
            yield make(t)
        return
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        # imap keeps task order, so the shards come out the same as with one process.
        yield from pool.imap(make, tasks)


def _write_shards(out_dir, prefix: str, shards: int, records_per_shard: int, fmt: str,
                  make: Callable[[Any], List[bytes]], task: Callable[[int, int], Any], task_size: int,
                  workers: Optional[int], progress: bool, label: str, copies: int = 1) -> List[str]:
    import dlstore
    from dlstore._progress import Progress

    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    shards, records_per_shard = int(shards), int(records_per_shard)
    total = shards * records_per_shard
    workers = _default_workers(total) if workers is None else max(1, int(workers))
    if int(copies) < 1 or (int(copies) > 1 and fmt != "tfrecord"):
        raise ValueError(f"copies must be at least 1 (and 1 for {fmt}, whose index names the file), got {copies}")
    files = shards * int(copies)
    names = [f"{prefix}-{i:05d}-of-{files:05d}" for i in range(files)]
    paths = [os.path.join(out_dir, n + (".rec" if fmt == "recordio" else "")) for n in names]
    # Tasks never straddle a shard, so each result goes to one writer.
    tasks = [task(s * records_per_shard + a, s * records_per_shard + min(a + task_size, records_per_shard))
             for s in range(shards) for a in range(0, records_per_shard, task_size)]

    def open_writer(i: int):
        if fmt == "recordio":
            return dlstore.RecordIOWriter(paths[i], idx_path=os.path.join(out_dir, names[i] + ".idx"))
        return dlstore.TFRecordWriter(paths[i])

    bar = Progress(total=total * int(copies), desc=f"gen {label}", unit="rec", enabled=None if progress else False,
                   piped="lines")
    written, writer, shard = 0, None, -1
    try:
        for payloads in _payload_stream(make, tasks, workers):
            if written // records_per_shard != shard:
                if writer is not None:
                    writer.close()
                shard = written // records_per_shard
                writer = open_writer(shard)
            for p in payloads:
                writer.write(p)
            written += len(payloads)
            bar.update(len(payloads))
        if writer is not None:
            writer.close()
            writer = None
        for i in range(shards, files):  # the copies: bytes copied, nothing encoded again
            shutil.copyfile(paths[i % shards], paths[i])
            bar.update(records_per_shard)
    finally:
        if writer is not None:
            writer.close()
        bar.close()
    assert written == total, (written, total)
    return paths


# ---- cached sets ---------------------------------------------------------------------------------------

#: Named sizes for :func:`cached_dataset`: generator arguments per kind and size.
PRESETS: Dict[str, Dict[str, Dict[str, Any]]] = {
    "imagenet": {
        "tiny": {"shards": 2, "records_per_shard": 16},           # ~3.7 MB, for tests
        "small": {"shards": 8, "records_per_shard": 330},         # ~300 MB
        "default": {"shards": 16, "records_per_shard": 550},      # ~1 GB
        "3gb": {"shards": 24, "records_per_shard": 1088},         # ~3 GB, 26,112 records
    },
    "bert": {  # 0.83 KB a record at seq_len 128; encoding runs at ~1,500 records/s a core
        "tiny": {"shards": 2, "records_per_shard": 32},
        "small": {"shards": 8, "records_per_shard": 2048},        # 16k records, ~14 MB
        "default": {"shards": 16, "records_per_shard": 4096},     # 65k records, ~55 MB
        # python -m dlstore.bench bert's baseline: the default set's 65k records in 16 copies, 1M records,
        # ~870 MB, so that a tier lasts seconds (the parser reads ~500k records/s) while only 65k are encoded.
        "bench": {"shards": 16, "records_per_shard": 4096, "copies": 16},
        "large": {"shards": 64, "records_per_shard": 16384},      # 1M records, ~870 MB
    },
}
_GENERATORS = {"imagenet": generate_imagenet, "bert": generate_bert}
_MARKER = "COMPLETE.json"


def _read_marker(directory: str, identity: Dict[str, Any]) -> Optional[List[str]]:
    """The shard paths if ``directory`` holds a finished set of this identity (kind, version, params)."""
    try:
        with open(os.path.join(directory, _MARKER)) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    if {key: marker.get(key) for key in identity} != identity:
        return None
    paths = []
    for name, size in marker.get("shards", {}).items():
        path = os.path.join(directory, name)
        try:
            if os.path.getsize(path) != size:
                return None
        except OSError:
            return None
        paths.append(path)
    return sorted(paths) or None


@contextlib.contextmanager
def _exclusive(lock_path: str):
    """Holds an exclusive lock on ``lock_path``: ranks of one job, or two jobs, generate a set only once."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): the marker still keeps a half-made set from being used
        yield
        return
    with open(lock_path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _cache_entry(kind: str, size: str, cache_dir, overrides: Dict[str, Any]):
    """``(cache root, the set's directory, its identity, generator parameters)``; nothing is read."""
    if kind not in PRESETS:
        raise ValueError(f"kind must be one of {sorted(PRESETS)}, got {kind!r}")
    if size not in PRESETS[kind]:
        raise ValueError(f"size must be one of {list(PRESETS[kind])} for {kind}, got {size!r}")
    params = dict(PRESETS[kind][size], **overrides)
    for ignored in ("progress", "workers"):  # how it is made, not what is made
        params.pop(ignored, None)
    identity = {"kind": kind, "version": GENERATOR_VERSION, "params": params}
    # Normalise through JSON so the marker compares equal after a round trip (tuples become lists).
    identity = json.loads(json.dumps(identity, sort_keys=True))
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    if cache_dir is None:
        from dlstore import settings

        cache_dir = os.path.join(settings.get("cache_dir"), "synthetic")
    root = os.path.expanduser(os.fspath(cache_dir))
    return root, os.path.join(root, f"{kind}-{size}-{digest}"), identity, params


def cached_paths(kind: str, size: str = "default", cache_dir=None, **overrides: Any) -> Optional[List[str]]:
    """The shard paths of a finished synthetic set of this preset (and these overrides) in the cache,
    or None; unlike :func:`cached_dataset` it never generates."""
    _, directory, identity, _ = _cache_entry(kind, size, cache_dir, overrides)
    return _read_marker(directory, identity)


def cached_dataset(kind: str, size: str = "default", cache_dir=None, *, progress: bool = True,
                   **overrides: Any) -> List[str]:
    """The shard paths of a synthetic set, generating it the first time it is asked for.

    Sets live in ``<cache_dir>/<kind>-<size>-<hash of the parameters>``. A marker file, written
    last, records the parameters and each shard's size: a set whose marker is missing (an
    interrupted generation), stale or contradicted by the files is removed and made again. An
    exclusive lock beside the set makes concurrent callers (ranks of one job) wait for one
    generation instead of racing.

    Parameters
    ----------
    kind : {"imagenet", "bert"}
    size : str, optional
        A preset of :data:`PRESETS`: imagenet ``tiny`` (2 x 16 records, for tests), ``small``
        (~300 MB), ``default`` (~1 GB), ``3gb`` (24 shards, ~3 GB); bert ``tiny``, ``small``,
        ``default``, ``large``.
    cache_dir : str or path-like, optional
        Where sets are kept; default ``<cache_dir setting>/synthetic``, i.e.
        ``$DLSTORE_CACHE/synthetic`` or ``~/.cache/dlstore/synthetic``.
    progress : bool, optional
        Show a progress bar while generating.
    **overrides
        Generator arguments replacing the preset's (``seed``, ``seq_len``, ``image_size``, ...);
        they are part of the hash, so each combination is its own set.

    Returns
    -------
    list of str
        Shard paths, sorted.

    Examples
    --------
    >>> paths = cached_dataset("bert", "small", seq_len=384)   # doctest: +SKIP
    """
    root, directory, identity, params = _cache_entry(kind, size, cache_dir, overrides)
    found = _read_marker(directory, identity)
    if found is not None:
        return found
    os.makedirs(root, exist_ok=True)
    with _exclusive(directory + ".lock"):
        found = _read_marker(directory, identity)  # made by whoever held the lock before us
        if found is not None:
            return found
        if os.path.exists(directory):  # left over from an interrupted run
            shutil.rmtree(directory)
        paths = _GENERATORS[kind](directory, progress=progress, **params)
        marker = {**identity, "shards": {os.path.basename(p): os.path.getsize(p) for p in paths}}
        tmp = os.path.join(directory, _MARKER + ".tmp")
        with open(tmp, "w") as f:
            json.dump(marker, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(directory, _MARKER))
    return sorted(paths)
