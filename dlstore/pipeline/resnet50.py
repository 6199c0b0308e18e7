"""The ResNet-50 input pipeline: JPEGs decoded in C++ (crop window only, smallest DCT scale) into batches.

Train: RandomResizedCrop 224 (scale 0.08-1, ratio 3/4-4/3) and a horizontal flip with probability
1/2, as torchvision; eval: resize the shorter side to 256 and take the centre 224 x 224. Outputs
uint8 NHWC, or float32 NCHW normalised with ImageNet's mean and std, plus int64 labels.

Per run of records the pipeline makes three batch calls, each in C++ with the GIL released:
the labels are parsed into the label array (TFRecord: ``image/class/label``; RecordIO: the
``IRHeader``'s label, read with numpy), the JPEG inside each record is located without a copy
(TFRecord: the ``image/encoded`` bytes found by the C++ Example reader; RecordIO: what follows the
header), and :func:`dlstore.pipeline.decode.decode_batch` decodes and augments every image into
its row of the batch on several threads. Each image's crop and flip come from a seed that is a
function of ``(seed, epoch, sample position)`` only.

An image that is not a JPEG (a PNG, GIF, BMP...) is decoded by Pillow instead, with the same crop,
resize, flip and normalisation, and counted in ``loader.stats()["fallback_decodes"]``; see
:mod:`dlstore.pipeline.decode`.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from dlstore.errors import CorruptRecordError
from dlstore.formats.recordio import IRHEADER_BYTES
from dlstore.io.system import available_cores
from dlstore.pipeline.decode import (FALLBACK, IMAGENET_MEAN, IMAGENET_STD, check_eval_resize, decode_batch,
                                     decode_path)
from dlstore.pipeline.loader import Loader
from dlstore.sources.dataset import dataset_for
from dlstore.pipeline.stages import Field, Pipeline, PipelineRun, naming_missing_features, sample_seeds

__all__ = ["ResNet50", "resnet50_loader", "recordio_labels"]


class ResNet50(Pipeline):
    """ImageNet training or evaluation images, decoded and augmented in C++, with their labels.

    Parameters
    ----------
    train : bool, optional
        RandomResizedCrop + flip (train) or resize + centre crop (eval).
    layout : {"NHWC", "NCHW"}, optional
        ``image`` is ``(B, size, size, 3)`` or ``(B, 3, size, size)``.
    dtype : {"uint8", "float32"}, optional
        uint8 values as decoded, or float32 normalised with ``mean`` and ``std``. The decoder
        writes uint8 NHWC or float32 NCHW; those are the two combinations accepted.
    size : int, optional
        Output side (224).
    mean, std : sequence of 3 floats, optional
        Normalisation for float32 output, in 0..1 units: ``(value / 255 - mean) / std``.
    label_offset : int, optional
        Added to every label. TensorFlow's ImageNet converter stores labels 1..1000 (0 meaning
        background); ``label_offset=-1`` gives 0..999. RecordIO labels (MXNet's ``im2rec``) are
        0-based already.
    scale, ratio : (float, float), optional
        RandomResizedCrop's area fraction and aspect-ratio ranges.
    eval_resize : int, optional
        Eval: the shorter side is resized to this before the centre crop (256; at least ``size``).
        Training ignores it.
    image_feature, label_feature : str, optional
        TFRecord: the ``tf.train.Example`` features holding the encoded image (bytes) and the label
        (int64); TensorFlow's ImageNet converter's names by default (``image/encoded``,
        ``image/class/label``). A record lacking either is reported with every feature it lacks.

    Raises
    ------
    ValueError
        For an unsupported layout/dtype pair or out-of-range parameters.
    """

    name = "resnet50"
    formats = ("tfrecord", "recordio")

    def __init__(self, train: bool = True, layout: str = "NHWC", dtype: str = "uint8", size: int = 224,
                 mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                 label_offset: int = 0, scale: Tuple[float, float] = (0.08, 1.0),
                 ratio: Tuple[float, float] = (3 / 4, 4 / 3), eval_resize: int = 256,
                 image_feature: str = "image/encoded", label_feature: str = "image/class/label"):
        layout, dtype = str(layout).upper(), str(dtype)
        if (layout, dtype) not in (("NHWC", "uint8"), ("NCHW", "float32")):
            raise ValueError(f"layout/dtype must be NHWC/uint8 or NCHW/float32, got {layout}/{dtype}")
        if int(size) < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"mean and std need 3 values each, std positive; got {mean} and {std}")
        if not 0 < scale[0] <= scale[1] or not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"scale and ratio must be increasing positive ranges, got {scale} and {ratio}")
        self.train = bool(train)
        self.layout, self.dtype, self.size = layout, dtype, int(size)
        self.mean, self.std = tuple(float(v) for v in mean), tuple(float(v) for v in std)
        self.label_offset = int(label_offset)
        self.scale, self.ratio = (float(scale[0]), float(scale[1])), (float(ratio[0]), float(ratio[1]))
        self.eval_resize = int(eval_resize)
        check_eval_resize(self.train, self.size, self.eval_resize)
        self.image_feature, self.label_feature = str(image_feature), str(label_feature)
        self._counts = {"fallback_decodes": 0}

    def counters(self) -> Dict[str, int]:
        """``fallback_decodes``: images that were not JPEGs, decoded by Pillow (since the last :meth:`bind`)."""
        return dict(self._counts)

    def fields(self) -> Dict[str, Field]:
        s = self.size
        image = ((s, s, 3), np.dtype(np.uint8)) if self.layout == "NHWC" else ((3, s, s), np.dtype(np.float32))
        return {"image": image, "label": ((), np.dtype(np.int64))}

    def default_threads(self) -> int:
        return available_cores()

    def bind(self, *, format: str, seed: int, threads: int) -> PipelineRun:
        from dlstore import _C

        self.check_format(format)
        image_feature, label_feature = self.image_feature, self.label_feature
        label_spec = [(label_feature, "int64", 1, None)]
        parse = _C.parse_example_batch
        locate = _C.example_bytes_spans
        options = dict(train=self.train, mean=self.mean, std=self.std, threads=threads, on_error="raise",
                       scale=self.scale, ratio=self.ratio, eval_resize=self.eval_resize)
        counts = self._counts = {"fallback_decodes": 0}

        def decode(buffer: Any, offsets: np.ndarray, lengths: np.ndarray, images: np.ndarray,
                   seeds: np.ndarray) -> None:
            status = decode_batch(buffer, offsets, lengths, images, seeds=seeds, **options)
            # Counted once the run succeeds: a run that raises is decoded again record by record
            # (the loader's on_error), and its fallbacks are counted then.
            counts["fallback_decodes"] += int(np.count_nonzero(status == FALLBACK))

        offset = self.label_offset

        def run_tfrecord(buffer: Any, offsets: np.ndarray, lengths: np.ndarray, out: Dict[str, np.ndarray],
                         row: int, epoch: int, position: int) -> None:
            n = len(offsets)
            labels = out["label"]
            parse(buffer, offsets, lengths, label_spec, {label_feature: labels}, row, 1)
            if offset:
                labels[row:row + n] += offset
            jpeg_offsets, jpeg_lengths = locate(buffer, offsets, lengths, image_feature)
            decode(buffer, jpeg_offsets, jpeg_lengths, out["image"][row:row + n],
                   sample_seeds(seed, epoch, position, n))

        def run_recordio(buffer: Any, offsets: np.ndarray, lengths: np.ndarray, out: Dict[str, np.ndarray],
                         row: int, epoch: int, position: int) -> None:
            n = len(offsets)
            labels, jpeg_offsets, jpeg_lengths = recordio_labels(buffer, offsets, lengths)
            out["label"][row:row + n] = labels + offset
            decode(buffer, jpeg_offsets, jpeg_lengths, out["image"][row:row + n],
                   sample_seeds(seed, epoch, position, n))

        if format != "tfrecord":
            return run_recordio
        return naming_missing_features(run_tfrecord, {"image_feature": image_feature, "label_feature": label_feature},
                                       "ResNet50(image_feature=..., label_feature=...) or resnet50_loader(...)")

    def describe(self) -> Dict[str, Any]:

        return {"pipeline": self.name, "train": self.train, "layout": self.layout, "dtype": self.dtype,
                "size": self.size, "decoder": decode_path()}

    def __repr__(self) -> str:
        return (f"ResNet50(train={self.train}, layout={self.layout!r}, dtype={self.dtype!r}, size={self.size})")


def recordio_labels(buffer: Any, offsets: np.ndarray, lengths: np.ndarray
                    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels and JPEG spans of RecordIO image records (``IRHeader`` then the image), in numpy.

    The label is the header's float label, or the first of the ``flag`` extra labels stored after
    the header when ``flag > 0`` (MXNet's ``pack`` with an array label), cast to int64.

    Returns
    -------
    (labels int64, jpeg offsets uint64, jpeg lengths uint64)

    Raises
    ------
    CorruptRecordError
        A record shorter than its header says, naming the record's index in the run.
    """
    data = np.frombuffer(buffer, dtype=np.uint8)
    n = len(offsets)
    if n and int(lengths.min()) < IRHEADER_BYTES:
        k = int(np.argmax(lengths < IRHEADER_BYTES))
        raise CorruptRecordError.of_record(k, f"RecordIO image record of {int(lengths[k])} bytes is shorter than "
                                              f"an IRHeader ({IRHEADER_BYTES} bytes)")
    head = data[offsets[:, None] + np.arange(8, dtype=np.uint64)].view("<u4")  # (n, 2): flag, label bits
    flags = head[:, 0].astype(np.uint64)
    values = head[:, 1].view("<f4").copy()
    header = IRHEADER_BYTES + 4 * flags
    if n and (header > lengths).any():
        k = int(np.argmax(header > lengths))
        raise CorruptRecordError.of_record(k, f"IRHeader says {int(flags[k])} extra labels, which do not fit in "
                                              f"the record of {int(lengths[k])} bytes")
    extra = np.flatnonzero(flags)
    if extra.size:
        first = offsets[extra] + np.uint64(IRHEADER_BYTES)
        values[extra] = data[first[:, None] + np.arange(4, dtype=np.uint64)].view("<f4")[:, 0]
    # A label is a class number: NaN, infinity or one past int64 cast to garbage (NaN became -2**63).
    bad = ~np.isfinite(values) | (np.abs(values) >= 2.0 ** 63)
    if n and bad.any():
        k = int(np.argmax(bad))
        raise CorruptRecordError.of_record(k, f"RecordIO label {float(values[k])!r} is not a class number")
    return values.astype(np.int64), offsets + header, lengths - header


def resnet50_loader(source: Any, batch_size: int = 256, train: bool = True, layout: str = "NHWC",
                    dtype: str = "uint8", io: Optional[str] = None, prefetch: int = 2,
                    threads: Optional[int] = None, **kw: Any):
    """A :class:`~dlstore.pipeline.Loader` of ResNet-50 batches from TFRecord or RecordIO files.

    Parameters
    ----------
    source : Source, or str, path-like or sequence of them
        A :class:`~dlstore.Dataset` or :func:`~dlstore.open_records` reader; or files, globs or
        directories, read through a :class:`~dlstore.Dataset` of this rank's share (rank and size
        from the launcher), shuffled for training (``shuffle="block"``; ``"none"`` for eval, unless
        given).
    batch_size, prefetch : int, optional
    train, layout, dtype : optional
        See :class:`ResNet50`; its other arguments (``size``, ``mean``, ``std``, ``label_offset``,
        ``scale``, ``ratio``, ``eval_resize``, ``image_feature``, ``label_feature``) may be given here too.
    io : str, optional
        I/O engine (``auto`` by default, resolved and reported in ``loader.stats()``).
    threads : int, optional
        Decoding threads; default: every core this process may use.
    **kw
        For the Dataset made from paths: ``shuffle``, ``remainder`` (with ``train=False``, ``uneven`` by
        default: every image once over all ranks, a rank whose share runs out first yielding the agreed
        empty batch), ``buffer_size``, ``world``,
        ``mounts``..., and :class:`~dlstore.ReadOptions` (``verify``, ``chunk_size``...);
        :class:`Loader` arguments (``last_batch``, ``seed``, ``epochs``, ``copy``, ``allocator``,
        ``device``: images are decoded on the host, then each batch is copied to that GPU); ``seed`` and
        ``on_error`` go to both.

    Returns
    -------
    Loader

    Examples
    --------
    >>> loader = resnet50_loader("/data/imagenet/train-*", batch_size=256)   # doctest: +SKIP
    >>> batch = next(iter(loader))                                          # doctest: +SKIP
    >>> batch["image"].shape, batch["label"].shape                          # doctest: +SKIP
    ((256, 224, 224, 3), (256,))
    """

    pipeline_keys = ("size", "mean", "std", "label_offset", "scale", "ratio", "eval_resize", "image_feature",
                     "label_feature")
    pipeline = ResNet50(train, layout, dtype, **{k: kw.pop(k) for k in pipeline_keys if k in kw})
    if io is not None:
        kw["io"] = io
    device = kw.pop("device", None)  # the loader's: images are decoded on the host, each batch then copied there
    # Evaluation reads every record once over all ranks (uneven shares, the ranks agreeing on the batch count
    # with empty batches): the padding by repeated records that keeps training ranks in step would count some
    # images twice in a validation metric.
    evaluation = {} if train else {"remainder": "uneven"}
    source = dataset_for(source, kw, shared=("seed", "on_error"), rest=True, shuffle="block" if train else "none",
                         **evaluation)
    return Loader(source, pipeline, batch_size, prefetch=prefetch, threads=threads, device=device, **kw)
