"""JPEG decode with the ResNet-50 augmentation, a batch at a time, into arrays the caller owns.

Train: torchvision's ``RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3))`` then
``RandomHorizontalFlip()``. Eval: ``Resize(256)`` then ``CenterCrop(224)``. Output uint8
``[N, H, W, 3]`` or float32 ``[N, 3, H, W]`` normalised with a mean and std (ImageNet's by default).

Two paths, and :func:`decode_path` says which one runs and why:

``native``
    C++ with libjpeg-turbo (when the extension found it at build time), many images at once with
    the GIL released. Each image is decoded only where its crop lies (``jpeg_crop_scanline``,
    ``jpeg_skip_scanlines``, stopping after the crop's last row) and at the smallest DCT scale
    M/8 that still covers the output (M in 1, 2, 4, 8: the scales libjpeg-turbo has SIMD code
    for), then resized with torchvision's antialiased bilinear filter, flipped and normalised in
    one pass straight into the output slot. Against Pillow decoding the whole image and resizing
    the same window, outputs differ by under 0.25 uint8 levels on average at full size and under
    about 0.5 at reduced DCT scales on photo-like images (tests/unit/test_jpeg_decode.py).
``pil``
    Pillow, one image at a time: the same crops, flips and normalisation (the crop windows come
    from the same C++ function), with Pillow's own JPEG draft mode (scales 1/2, 1/4, 1/8) and the
    same filter. About twice the CPU time per image (benchmarks/jpeg_decode.py); used when the
    extension has no libjpeg.

Images that are not JPEGs (a PNG, GIF, BMP or WebP in ``image/encoded``, as real ImageNet holds a
few) fail in libjpeg with "Not a JPEG file"; those failures, and only those (told by their first
bytes, not by the message), are decoded again by Pillow with the same crop windows, flips, filter
and normalisation as the ``pil`` path, and get status 2 (:data:`FALLBACK`). A batch of JPEGs
costs nothing more: the check runs only on the images libjpeg gave up on. Data that neither
libjpeg nor Pillow can read stays a failure, for ``on_error`` to handle.

Random crops and flips are a pure function of each image's ``uint64`` seed (a counter-based
generator, SplitMix64), never of thread timing or of what was decoded before, so a batch decodes
to the same pixels on every run.
"""
from __future__ import annotations

import io
import re
import threading
import warnings
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from dlstore.errors import CorruptRecordError, DlstoreError

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ON_ERROR",
    "check_eval_resize",
    "native_jpeg_available",
    "decode_path",
    "crop_windows",
    "decode_batch",
    "DECODED",
    "FAILED",
    "FALLBACK",
    "is_jpeg",
]

#: ImageNet's per-channel mean and standard deviation (RGB, in 0..1 units), torchvision's values.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: What :func:`decode_batch` does with an image that does not decode: ``raise`` a
#: CorruptRecordError naming it; ``skip`` (zero-filled, status 1, counted by the caller);
#: ``warn`` (as skip, with a warning per batch).
ON_ERROR = ("raise", "skip", "warn")
BACKENDS = ("auto", "native", "pil")

#: Values of the status :func:`decode_batch` returns, one per image: decoded by the chosen backend;
#: failed (slot zero-filled); not a JPEG, decoded by Pillow (the fallback).
DECODED, FAILED, FALLBACK = 0, 1, 2

# A JPEG starts with SOI (FF D8) and the next marker's FF.
_JPEG_MAGIC = np.frombuffer(b"\xff\xd8\xff", np.uint8)
_BYTESIO_REPR = re.compile(r" <_io\.BytesIO object at 0x[0-9a-fA-F]+>")

# How libjpeg decodes: the accurate DCT and fancy upsampling. The faster settings measured no faster
# here within the run-to-run spread (the method and the upsampling only matter at scale 8/8, and
# Huffman decoding dominates whatever they are), while their error against Pillow's decode was larger.
_TUNING = {"dct_method": "islow", "fancy_upsampling": True}

_decoders: Dict[int, Any] = {}
_decoders_lock = threading.Lock()


def native_jpeg_available() -> Tuple[bool, str]:
    """Whether the C++ extension decodes JPEGs, and with what (or why not).

    Returns
    -------
    (bool, str)
        E.g. ``(True, "libjpeg-turbo 2.1.5 (libjpeg API 62)")``, or ``(False, reason)`` when the
        extension was built without libjpeg-turbo (jpeglib.h not found at build time).
    """
    from dlstore import _C

    ok, info = _C.jpeg_available()
    return bool(ok), str(info)


def decode_path(backend: str = "auto") -> str:
    """One line for logs and benchmark headers: which decoder ``backend`` resolves to, and why.

    Raises
    ------
    RuntimeError
        ``backend="native"`` in a build without libjpeg.
    """
    return _resolve(backend)[1]


def _resolve(backend: str) -> Tuple[str, str]:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    ok, info = native_jpeg_available()
    if backend == "native" and not ok:
        raise RuntimeError(f"native JPEG decode asked for, but {info}")
    if backend == "pil" or not ok:
        why = "asked for" if backend == "pil" else info
        return "pil", f"pil: Pillow decodes and resizes one image at a time ({why})"
    upsampling = "on" if _TUNING["fancy_upsampling"] else "off"
    return "native", (f"native: {info}, crop window only, at the smallest covering DCT scale M/8, "
                      f"{_TUNING['dct_method']} IDCT, fancy upsampling {upsampling}")


def _pair(name: str, value: Sequence[float]) -> Tuple[float, float]:
    lo, hi = (float(v) for v in value)
    if not 0 < lo <= hi:
        raise ValueError(f"{name} must be (low, high) with 0 < low <= high, got {tuple(value)!r}")
    return lo, hi


def crop_windows(heights, widths, seeds, *, train: bool, size: Tuple[int, int] = (224, 224),
                 scale: Sequence[float] = (0.08, 1.0), ratio: Sequence[float] = (3 / 4, 4 / 3),
                 flip_probability: float = 0.5, eval_resize: int = 256
                 ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The crops, flips and DCT scales :func:`decode_batch` uses for images of these sizes.

    Parameters
    ----------
    heights, widths : array_like of int
        Image sizes in pixels.
    seeds : array_like of uint64
        One per image (ignored for eval).
    train, size, scale, ratio, flip_probability, eval_resize
        As in :func:`decode_batch`; ``size`` is the output ``(height, width)``.

    Returns
    -------
    windows : numpy.ndarray
        float64 ``[N, 4]``: ``x, y, w, h`` of the crop in pixel-edge coordinates of the full image
        (train crops are whole pixels, as torchvision's; eval windows are the region that
        ``Resize(eval_resize)`` + ``CenterCrop(size)`` shows, in general fractional).
    flips : numpy.ndarray
        bool ``[N]``: mirrored after the resize (always False for eval).
    dct_scales : numpy.ndarray
        int8 ``[N]``: the M of the M/8 scale the native decoder uses.
    """
    from dlstore import _C

    check_eval_resize(train, size, eval_resize)
    heights = np.ascontiguousarray(heights, dtype=np.int64)
    widths = np.ascontiguousarray(widths, dtype=np.int64)
    if seeds is None:
        seeds = np.zeros(heights.shape, np.uint64)
    seeds = np.ascontiguousarray(seeds, dtype=np.uint64)
    return _C.image_crop_windows(heights, widths, seeds, bool(train), int(size[0]), int(size[1]),
                                 _pair("scale", scale), _pair("ratio", ratio), float(flip_probability),
                                 int(eval_resize))


def _native_decoder(threads: int):
    """One decoder (thread pool and per-thread scratch) per thread count, kept for the process."""
    from dlstore import _C

    with _decoders_lock:
        decoder = _decoders.get(threads)
        if decoder is None:
            decoder = _C.JpegDecoder(threads, _TUNING["dct_method"], _TUNING["fancy_upsampling"], True)
            _decoders[threads] = decoder
    return decoder


def check_eval_resize(train: bool, size: Any, eval_resize: int) -> None:
    """Refuses an evaluation resize smaller than the output (``size``: an int or (height, width)); training
    crops at random, so ``eval_resize`` is evaluation's alone.

    Raises
    ------
    ValueError
        Naming both sizes and the least ``eval_resize`` that works.
    """
    least = max(size) if isinstance(size, (tuple, list)) else int(size)
    if not train and int(eval_resize) < least:
        raise ValueError(f"eval_resize ({int(eval_resize)}) must be at least the output size ({least}) to evaluate: "
                         f"the centre crop is taken from the image resized to it; pass eval_resize={least} or more")


def decode_batch(buffer: Any, offsets: np.ndarray, lengths: np.ndarray, out: np.ndarray, *, train: bool,
                 seeds: Optional[np.ndarray] = None, mean: Sequence[float] = IMAGENET_MEAN,
                 std: Sequence[float] = IMAGENET_STD, threads: int = 2, on_error: str = "raise",
                 scale: Sequence[float] = (0.08, 1.0), ratio: Sequence[float] = (3 / 4, 4 / 3),
                 flip_probability: float = 0.5, eval_resize: int = 256, backend: str = "auto") -> np.ndarray:
    """Decodes, crops, resizes, flips and normalises a batch of JPEGs into ``out``.

    Parameters
    ----------
    buffer : bytes-like
        Any object with the buffer protocol holding the encoded images, e.g. a ``RecordBatch``
        (the JPEGs are then read where they lie inside the records: see
        :func:`dlstore.formats.example.bytes_feature_spans`).
    offsets, lengths : numpy.ndarray
        uint64 ``[N]``: image ``i`` is ``buffer[offsets[i]:offsets[i] + lengths[i]]``.
    out : numpy.ndarray
        Written in place, one slot per image: uint8 ``[N, H, W, 3]`` (RGB, 0..255) or float32
        ``[N, 3, H, W]`` (``(value / 255 - mean) / std``). C-contiguous and writable; reuse it across
        batches (a row slice ``out[a:b]`` of a larger array works too).
    train : bool
        RandomResizedCrop + horizontal flip (True) or Resize(eval_resize) + CenterCrop (False).
    seeds : numpy.ndarray, optional
        uint64 ``[N]``, one per image: its crop and flip are a pure function of it. Required for train.
    mean, std : sequence of 3 floats
        Per-channel normalisation of float output, in 0..1 units.
    threads : int
        Threads decoding at once (the calling thread is one of them).
    on_error : {"raise", "skip", "warn"}
        For an image that does not decode (corrupt or truncated data, neither a JPEG nor an image
        Pillow reads).
    scale, ratio : (float, float)
        RandomResizedCrop's area fraction and aspect-ratio ranges.
    flip_probability : float
        Chance of a horizontal flip (train).
    eval_resize : int
        Eval: the shorter side is resized to this before the centre crop; at least the output size.
    backend : {"auto", "native", "pil"}
        ``auto`` takes the native decoder when the build has it; :func:`decode_path` says which runs.

    Returns
    -------
    numpy.ndarray
        uint8 ``[N]`` status: 0 (:data:`DECODED`), 1 (:data:`FAILED`: its slot is zero-filled) or
        2 (:data:`FALLBACK`: not a JPEG, decoded by Pillow).

    Raises
    ------
    dlstore.CorruptRecordError
        ``on_error="raise"`` and an image did not decode: the message names the image's index in
        the batch, its bytes in the buffer, and what libjpeg and Pillow said.

    Examples
    --------
    >>> out = np.empty((len(offsets), 224, 224, 3), np.uint8)                      # doctest: +SKIP
    >>> status = decode_batch(batch, offsets, lengths, out, train=True, seeds=seeds)  # doctest: +SKIP
    """
    offsets = np.ascontiguousarray(offsets, dtype=np.uint64)
    lengths = np.ascontiguousarray(lengths, dtype=np.uint64)
    n = len(offsets)
    if offsets.ndim != 1 or lengths.shape != offsets.shape:
        raise ValueError(f"offsets and lengths must be 1-D and of one size, got {offsets.shape} and {lengths.shape}")
    size = _check_out(out, n)
    if seeds is None:
        if train:
            raise ValueError("train=True needs seeds: one uint64 per image")
        seeds = np.zeros(n, np.uint64)
    seeds = np.ascontiguousarray(seeds, dtype=np.uint64)
    if seeds.shape != (n,):
        raise ValueError(f"seeds must have shape ({n},), got {seeds.shape}")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
    if int(threads) < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    check_eval_resize(train, size, eval_resize)
    if not 0.0 <= float(flip_probability) <= 1.0:
        raise ValueError(f"flip_probability must be in [0, 1], got {flip_probability}")
    mean = [float(v) for v in mean]
    std = [float(v) for v in std]
    if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        raise ValueError("mean and std need 3 values each, std positive")
    params = dict(scale=_pair("scale", scale), ratio=_pair("ratio", ratio), flip_probability=float(flip_probability),
                  eval_resize=int(eval_resize))

    path, _ = _resolve(backend)
    pil_args = (buffer, offsets, lengths, seeds, out, bool(train), mean, std, size, params)
    if path == "native":
        status, failures = _native_decoder(int(threads)).decode(
            buffer, offsets, lengths, seeds, out, bool(train), mean, std, params["scale"], params["ratio"],
            params["flip_probability"], params["eval_resize"])
        if failures:  # only then: a batch of JPEGs pays nothing for the fallback
            failures = _fallback(pil_args, status, failures)
    else:
        status = np.zeros(n, np.uint8)
        failures = _decode_pil(*pil_args, np.arange(n))
        for i, _ in failures:
            status[i] = FAILED
        status[(status == DECODED) & ~is_jpeg(buffer, offsets, lengths)] = FALLBACK
    if failures:
        _report(failures, offsets, lengths, on_error)
    return status


def is_jpeg(buffer: Any, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Which images start as a JPEG does (``FF D8 FF``): bool ``[N]``, in numpy, no per-image Python.

    Raises
    ------
    DlstoreError
        An image's bytes lie outside the buffer.

    Examples
    --------
    >>> is_jpeg(b"\\xff\\xd8\\xff\\xe0..\\x89PNG", np.array([0, 6], np.uint64), np.array([6, 4], np.uint64)).tolist()
    [True, False]
    """
    offsets = np.asarray(offsets, dtype=np.uint64)
    lengths = np.asarray(lengths, dtype=np.uint64)
    data = np.frombuffer(buffer, dtype=np.uint8)
    if len(offsets) and int((offsets + lengths).max()) > data.size:
        k = int(np.argmax(offsets + lengths > np.uint64(data.size)))
        raise DlstoreError(f"image {k}: bytes {int(offsets[k])}..{int(offsets[k] + lengths[k])} lie outside the "
                           f"buffer of {data.size} bytes")
    long_enough = lengths >= np.uint64(len(_JPEG_MAGIC))
    heads = data[offsets[long_enough, None] + np.arange(len(_JPEG_MAGIC), dtype=np.uint64)]
    out = np.zeros(len(offsets), bool)
    out[long_enough] = (heads == _JPEG_MAGIC).all(axis=1)
    return out


def _fallback(pil_args, status: np.ndarray, failures):
    """Decodes the failed images that are not JPEGs with Pillow; returns the failures left.

    ``status`` is updated in place: :data:`FALLBACK` for each image Pillow decoded. An image that
    Pillow cannot read either keeps its failure, with both decoders' words.
    """
    buffer, offsets, lengths = pil_args[:3]
    failed = np.array([i for i, _ in failures], np.int64)
    others = failed[~is_jpeg(buffer, offsets[failed], lengths[failed])]
    if not others.size:
        return failures
    pillow_failed = dict(_decode_pil(*pil_args, others))
    status[others] = FALLBACK
    left = []
    for i, message in failures:
        if i in pillow_failed:
            status[i] = FAILED
            left.append((i, f"not a JPEG ({message}), and Pillow cannot read it either ({pillow_failed[i]})"))
        elif not status[i] == FALLBACK:
            left.append((i, message))
    return left


def _check_out(out: Any, n: int) -> Tuple[int, int]:
    """The output (height, width) that ``out`` holds; raises if it is not a batch layout this module writes."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be C-contiguous and writable")
    if out.dtype == np.uint8 and out.ndim == 4 and out.shape[3] == 3:
        size = out.shape[1:3]
    elif out.dtype == np.float32 and out.ndim == 4 and out.shape[1] == 3:
        size = out.shape[2:4]
    else:
        raise ValueError(f"out must be uint8 [N, H, W, 3] or float32 [N, 3, H, W], got {out.dtype} {out.shape}")
    if out.shape[0] != n:
        raise ValueError(f"out has {out.shape[0]} slots for {n} images")
    if min(size) < 1:
        raise ValueError(f"out has no pixels: {out.shape}")
    return int(size[0]), int(size[1])


def _report(failures, offsets: np.ndarray, lengths: np.ndarray, on_error: str) -> None:
    index, message = failures[0]
    what = "image decode failed" if message.startswith("not a JPEG") else "JPEG decode failed"
    start = int(offsets[index])
    where = f"image {index} of the batch (bytes {start}..{start + int(lengths[index])} of the buffer)"
    others = [str(i) for i, _ in failures[1:]]
    if len(others) > 8:
        others = others[:8] + [f"... ({len(failures) - 1} in all)"]
    more = f"; images {', '.join(others)} failed too" if others else ""
    if on_error == "raise":
        reason = f"{what}: {message}{more}"
        raise CorruptRecordError(f"{where}: {reason}", record=int(index), reason=reason)
    if on_error == "warn":
        warnings.warn(f"{where}: {what}, zero-filled: {message}{more}", RuntimeWarning, stacklevel=3)


def _eight_bit(image):
    """``image`` with 8-bit samples: 16-bit grayscale (Pillow's ``I;16`` modes, and ``I``, which a 16-bit PNG
    opens as in older Pillow) keeps its high byte, as ``tf.io.decode_image(..., dtype=tf.uint8)`` does;
    ``convert("RGB")`` clips those samples at 255, so a 16-bit PNG came out white. Other modes as they are."""
    if image.mode.startswith("I;16") or (image.mode == "I" and image.format == "PNG"):
        from PIL import Image

        high = np.right_shift(np.asarray(image).astype(np.uint32), 8)
        return Image.fromarray(np.minimum(high, 255).astype(np.uint8), "L")
    return image


def _decode_pil(buffer, offsets, lengths, seeds, out, train, mean, std, size, params, indices):
    """The Pillow path for images ``indices``: the same windows and flips, Pillow's DCT draft scaling
    (JPEG only) and antialiased bilinear. Returns ``[(index, what Pillow said)]`` of the failures,
    whose slots are zero-filled."""
    try:
        from PIL import Image
    except ImportError:
        raise RuntimeError("no decoder: Pillow is not installed, and it decodes the images libjpeg cannot "
                           "(not JPEGs) and, in a build without libjpeg-turbo, every image (pip install "
                           "pillow, or install libjpeg62-turbo-dev and rebuild)") from None
    view = memoryview(buffer).cast("B")
    out_h, out_w = size
    failures = []
    scale_c = (1.0 / (255.0 * np.asarray(std, np.float32))).astype(np.float32)[:, None, None]
    bias_c = (-np.asarray(mean, np.float32) / np.asarray(std, np.float32)).astype(np.float32)[:, None, None]
    for i in (int(k) for k in indices):
        start = int(offsets[i])
        try:
            image = Image.open(io.BytesIO(view[start:start + int(lengths[i])]))
            width, height = image.size
            (window,), (flip,), _ = crop_windows([height], [width], seeds[i:i + 1], train=train, size=size,
                                                 **params)
            x, y, w, h = (float(v) for v in window)
            # Draft mode: Pillow's DCT scaling, 1/1 .. 1/8 in powers of two, such that the whole image
            # stays at least the requested size; requesting the output scaled up by image / window
            # keeps the window covering the output, as the native path's M/8 does. Other formats
            # have no draft mode (None): decoded at full size. convert("RGB") as torchvision's
            # loader: palette and grayscale expanded, alpha dropped.
            drafted = image.draft("RGB", (int(np.ceil(width * out_w / w)), int(np.ceil(height * out_h / h))))
            factor = width / drafted[1][2] if drafted else 1.0  # the reduction; pixel edges scale with it
            image = _eight_bit(image)
            rgb = image.convert("RGB").resize(
                (out_w, out_h), Image.BILINEAR,
                box=(x / factor, y / factor, (x + w) / factor, (y + h) / factor))
            if flip:
                rgb = rgb.transpose(Image.FLIP_LEFT_RIGHT)
            pixels = np.asarray(rgb)
        except Exception as e:  # noqa: BLE001 - Pillow raises many kinds for bad data; each is reported
            out[i] = 0
            said = _BYTESIO_REPR.sub("", str(e))  # "cannot identify image file <_io.BytesIO object at 0x..>"
            failures.append((i, f"Pillow: {type(e).__name__}: {said}"))
            continue
        if out.dtype == np.uint8:
            out[i] = pixels
        else:
            out[i] = pixels.transpose(2, 0, 1) * scale_c + bias_c
    return failures

