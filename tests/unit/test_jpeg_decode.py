"""The ResNet-50 JPEG decode (dlstore.pipeline.decode): crops against a pure-Python oracle of
torchvision's sampling, pixels against Pillow decoding the same window, and the error policy.

Tolerances, in uint8 levels (mean absolute error over a 224 x 224 x 3 output):

- window decoded at full size (DCT scale 8/8) vs Pillow's full decode of the same float window with
  its antialiased bilinear resize: <= 0.5 (measured 0.14..0.21). Not bit-exact: Pillow's wheel
  bundles another libjpeg-turbo, and it rounds to uint8 between its two resize passes.
- window decoded at a reduced DCT scale (M/8 < 1, images over 448 px) vs the same reference on
  photo-like content: <= 1.0 (measured 0.34..0.52). The reduced IDCT low-passes differently from
  a triangle filter, more so on 1-pixel noise textures (about 2 levels there).
"""
from __future__ import annotations

import io
import math

import numpy as np
import pytest

import dlstore
from dlstore.errors import CorruptRecordError, DlstoreError
from dlstore.formats.example import bytes_feature_spans, encode_example, parse_batch
from dlstore.pipeline import decode
from dlstore.pipeline.decode import crop_windows, decode_batch, decode_path, native_jpeg_available

from tests.helpers import SpanBatch

Image = pytest.importorskip("PIL.Image", reason="Pillow makes the test JPEGs and the reference decode")
ImageDraw = pytest.importorskip("PIL.ImageDraw")

NATIVE, NATIVE_WHY = native_jpeg_available()
native_only = pytest.mark.skipif(not NATIVE, reason=f"no native JPEG decoder: {NATIVE_WHY}")
MEAN = np.array(decode.IMAGENET_MEAN, np.float32)
STD = np.array(decode.IMAGENET_STD, np.float32)

# ---- a pure-Python oracle of the crop sampling --------------------------------------------------

_M64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _uniform(seed: int, counter: int) -> float:
    return (_mix64((_mix64(seed) + (counter + 1) * 0x9E3779B97F4A7C15) & _M64) >> 11) * 2.0 ** -53


def oracle_train(height: int, width: int, seed: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's RandomResizedCrop.get_params, drawing from the documented counters."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for attempt in range(10):
        c = 4 * attempt
        target = area * (scale[0] + (scale[1] - scale[0]) * _uniform(seed, c))
        aspect = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * _uniform(seed, c + 1))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = min(int(_uniform(seed, c + 2) * (height - h + 1)), height - h)
            left = min(int(_uniform(seed, c + 3) * (width - w + 1)), width - w)
            return (left, top, w, h), _uniform(seed, 1000) < 0.5
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return ((width - w) // 2, (height - h) // 2, w, h), _uniform(seed, 1000) < 0.5


def oracle_eval(height: int, width: int, resize: int = 256, size: int = 224):
    """torchvision's Resize(resize) + CenterCrop(size) as the window of the original image."""
    if width <= height:
        new_w, new_h = resize, int(resize * height / width)
    else:
        new_w, new_h = int(resize * width / height), resize
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    sx, sy = width / new_w, height / new_h
    return (left * sx, top * sy, size * sx, size * sy), (new_w, new_h, left, top)


# ---- test images and the Pillow reference --------------------------------------------------------


def photo_jpeg(height: int, width: int, seed: int, mode: str = "RGB", quality: int = 90, **save) -> bytes:
    """A photo-like JPEG: smooth colour waves, shapes with edges, mild blur and sensor noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([128 + 100 * np.sin(xx / (37 + 10 * c) + yy / (53 + 7 * c) + c + seed) for c in range(3)], -1)
    image = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(20):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        x1, y1 = x0 + int(rng.integers(2, max(3, width // 3))), y0 + int(rng.integers(2, max(3, height // 3)))
        draw.ellipse((x0, y0, x1, y1), fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    pixels = np.asarray(image, np.float32) + rng.normal(0, 4, (height, width, 3))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).convert(mode)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality, **save)
    return out.getvalue()


def reference(jpeg: bytes, window, flip: bool, size=(224, 224)) -> np.ndarray:
    """Pillow: full decode, the same float window resized (antialiased bilinear), mirrored; int16 HWC."""
    x, y, w, h = (float(v) for v in window)
    image = Image.open(io.BytesIO(jpeg)).convert("RGB")
    image = image.resize((size[1], size[0]), Image.BILINEAR, box=(x, y, x + w, y + h))
    if flip:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(image).astype(np.int16)


def pack(jpegs):
    """One buffer holding the JPEGs back to back, at odd offsets, and their (offsets, lengths)."""
    parts, offsets, at = [], [], 3
    parts.append(b"pad")
    for j in jpegs:
        offsets.append(at)
        parts.append(j + b"\0")
        at += len(j) + 1
    return b"".join(parts), np.array(offsets, np.uint64), np.array([len(j) for j in jpegs], np.uint64)


def sizes_of(jpegs):
    hw = np.array([Image.open(io.BytesIO(j)).size[::-1] for j in jpegs])
    return hw[:, 0], hw[:, 1]


def run(jpegs, *, train=True, seeds=None, layout="hwc", size=(224, 224), **kw):
    buffer, offsets, lengths = pack(jpegs)
    n = len(jpegs)
    if seeds is None:
        seeds = np.arange(n, dtype=np.uint64) * 977 + 5
    if layout == "hwc":
        out = np.full((n, size[0], size[1], 3), 77, np.uint8)
    else:
        out = np.full((n, 3, size[0], size[1]), 7.0, np.float32)
    status = decode_batch(buffer, offsets, lengths, out, train=train, seeds=seeds, **kw)
    return out, status, seeds


def mean_abs_error(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(out.astype(np.int16) - ref).mean())


def tolerance(dct_scale: int) -> float:
    """The module docstring's bounds: full-size decode, or a reduced DCT scale (photo-like content)."""
    return 0.5 if dct_scale == 8 else 1.0


@pytest.fixture(scope="module")
def synthetic_jpegs(tmp_path_factory):
    """Real 300..500 px JPEGs from dlstore.synthetic, read back through the record reader, with labels."""
    from dlstore import synthetic

    directory = tmp_path_factory.mktemp("imagenet")
    paths = synthetic.generate_imagenet(directory, shards=1, records_per_shard=10, progress=False, workers=1)
    jpegs, labels = [], []
    for batch in dlstore.open_records(paths).batches():
        offsets, lengths = bytes_feature_spans(batch, "image/encoded")
        view = memoryview(batch)
        jpegs += [bytes(view[o:o + n]) for o, n in zip(offsets.tolist(), lengths.tolist())]
        labels += parse_batch(batch, {"image/class/label": (np.int64, 1)})["image/class/label"][:, 0].tolist()
    return jpegs, labels


# ---- crop sampling ---------------------------------------------------------------------------------


def test_train_windows_match_the_oracle():
    rng = np.random.default_rng(0)
    heights = rng.integers(1, 2000, 400)
    widths = rng.integers(1, 2000, 400)
    heights[:40] = 1  # extreme ratios take the centre-crop fallback
    widths[40:80] = 3
    seeds = rng.integers(0, 2 ** 63, 400, dtype=np.uint64)
    windows, flips, _ = crop_windows(heights, widths, seeds, train=True)
    for i in range(len(seeds)):
        window, flip = oracle_train(int(heights[i]), int(widths[i]), int(seeds[i]))
        assert tuple(windows[i]) == window, (heights[i], widths[i], seeds[i])
        assert flips[i] == flip
    assert 0.4 < flips.mean() < 0.6


def test_train_windows_cover_the_scale_and_ratio_ranges():
    seeds = np.arange(4000, dtype=np.uint64)
    windows, _, _ = crop_windows(np.full(4000, 400), np.full(4000, 500), seeds, train=True)
    area = windows[:, 2] * windows[:, 3] / (400 * 500)
    ratio = windows[:, 2] / windows[:, 3]
    assert area.min() < 0.1 and area.max() > 0.95
    # Rounding to whole pixels widens the ratio range by a hair.
    assert ratio.min() >= 0.74 and ratio.max() <= 1.35 and ratio.min() < 0.77 and ratio.max() > 1.3
    assert (windows[:, 0] >= 0).all() and (windows[:, 0] + windows[:, 2] <= 500).all()
    assert (windows[:, 1] >= 0).all() and (windows[:, 1] + windows[:, 3] <= 400).all()


def test_eval_windows_match_resize_then_centre_crop():
    for height, width in [(375, 500), (500, 375), (256, 256), (300, 301), (1000, 333), (224, 3000)]:
        windows, flips, _ = crop_windows([height], [width], None, train=False)
        expected, _ = oracle_eval(height, width)
        np.testing.assert_allclose(windows[0], expected, rtol=1e-12)
        assert not flips[0]


def test_dct_scale_is_the_smallest_covering_power_of_two():
    heights = np.array([100, 300, 447, 448, 500, 900, 1000, 2000, 5000])
    for train in (True, False):
        windows, _, scales = crop_windows(heights, heights, np.arange(9, dtype=np.uint64), train=train)
        for (_, _, w, h), m in zip(windows, scales):
            assert m in (1, 2, 4, 8)
            covers = min(w, h) * m / 8 >= 224 - 1e-6
            assert covers or m == 8  # a crop under 224 px is enlarged from full size
            if m > 1:
                assert min(w, h) * (m // 2) / 8 < 224  # the next smaller scale would not cover


# ---- pixels ----------------------------------------------------------------------------------------


@native_only
def test_train_matches_pillow_on_synthetic_imagenet(synthetic_jpegs):
    jpegs, labels = synthetic_jpegs
    assert len(labels) == len(jpegs) and all(1 <= v <= 1000 for v in labels)
    out, status, seeds = run(jpegs, train=True)
    assert not status.any()
    heights, widths = sizes_of(jpegs)
    windows, flips, _ = crop_windows(heights, widths, seeds, train=True)
    for i, jpeg in enumerate(jpegs):
        assert mean_abs_error(out[i], reference(jpeg, windows[i], flips[i])) <= 0.5, i


@native_only
def test_eval_matches_pillow_resize_256_then_centre_crop(synthetic_jpegs):
    jpegs, _ = synthetic_jpegs
    out, status, _ = run(jpegs, train=False, seeds=None)
    assert not status.any()
    for i, jpeg in enumerate(jpegs):
        image = Image.open(io.BytesIO(jpeg)).convert("RGB")
        _, (new_w, new_h, left, top) = oracle_eval(image.size[1], image.size[0])
        ref = image.resize((new_w, new_h), Image.BILINEAR).crop((left, top, left + 224, top + 224))
        assert mean_abs_error(out[i], np.asarray(ref).astype(np.int16)) <= 0.5, i


@pytest.mark.slow
@native_only
@pytest.mark.parametrize("train", [True, False])
def test_reduced_dct_scales_match_pillow_on_large_images(train):
    shapes = [(1200, 1600), (900, 700), (2000, 1500), (1000, 1000), (640, 480)]
    jpegs = [photo_jpeg(h, w, i) for i, (h, w) in enumerate(shapes)]
    seen = set()
    for round_ in range(3):
        seeds = np.arange(len(jpegs), dtype=np.uint64) + 1000 * round_
        out, status, _ = run(jpegs, train=train, seeds=seeds)
        assert not status.any()
        heights, widths = sizes_of(jpegs)
        windows, flips, scales = crop_windows(heights, widths, seeds, train=train)
        seen.update(scales.tolist())
        for i, jpeg in enumerate(jpegs):
            assert mean_abs_error(out[i], reference(jpeg, windows[i], flips[i])) <= tolerance(scales[i]), i
    assert {2, 4} <= seen  # the reduced IDCTs did run


@native_only
def test_window_decode_equals_full_size_decode_at_scale_one(synthetic_jpegs):
    """jpeg_crop_scanline + skip + early stop give the pixels a whole-image decode gives."""
    from dlstore import _C

    jpegs, _ = synthetic_jpegs
    buffer, offsets, lengths = pack(jpegs)
    seeds = np.arange(len(jpegs), dtype=np.uint64)
    outs = []
    for window_decode in (True, False):
        out = np.empty((len(jpegs), 224, 224, 3), np.uint8)
        decoder = _C.JpegDecoder(2, "islow", True, window_decode)
        status, failures = decoder.decode(buffer, offsets, lengths, seeds, out, True, list(MEAN), list(STD),
                                          (0.08, 1.0), (3 / 4, 4 / 3), 0.5, 256)
        assert not failures
        outs.append(out)
    _, _, scales = crop_windows(*sizes_of(jpegs), seeds, train=True)
    assert (scales == 8).all()  # 300..500 px images: no reduced scale, so the two must agree
    # iMCU-aligned crops upsample chroma at their edges from the crop alone: a few pixels differ.
    assert mean_abs_error(outs[0], outs[1].astype(np.int16)) <= 0.05


@native_only
def test_same_seed_same_pixels_whatever_threads_and_order(synthetic_jpegs):
    jpegs, _ = synthetic_jpegs
    seeds = np.arange(len(jpegs), dtype=np.uint64) * 31 + 7
    one, _, _ = run(jpegs, seeds=seeds, threads=1)
    two, _, _ = run(jpegs, seeds=seeds, threads=2)
    assert np.array_equal(one, two)
    order = np.random.default_rng(1).permutation(len(jpegs))
    shuffled, _, _ = run([jpegs[i] for i in order], seeds=seeds[order], threads=2)
    assert np.array_equal(shuffled, one[order])
    other, _, _ = run(jpegs, seeds=seeds + 1, threads=2)
    assert not np.array_equal(other, one)


@native_only
def test_decoding_after_a_fork(synthetic_jpegs):
    # A DataLoader worker is a fork of a process whose decoder already ran on helper threads; the
    # child has none of those threads and must decode with its own.
    import os
    import signal

    jpegs, _ = synthetic_jpegs
    seeds = np.arange(len(jpegs), dtype=np.uint64)
    parent, _, _ = run(jpegs, seeds=seeds, threads=2)
    pid = os.fork()
    if pid == 0:
        signal.alarm(30)  # a hang fails the test instead of blocking it
        try:
            child, _, _ = run(jpegs, seeds=seeds, threads=2)
            os._exit(0 if np.array_equal(child, parent) else 3)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child ended with status {status}"


@native_only
def test_flip_mirrors_the_same_crop(synthetic_jpegs):
    jpegs, _ = synthetic_jpegs
    plain, _, seeds = run(jpegs, flip_probability=0.0)
    flipped, _, _ = run(jpegs, seeds=seeds, flip_probability=1.0)
    assert np.array_equal(flipped, plain[:, :, ::-1, :])


@pytest.mark.parametrize("backend", ["native", "pil"])
def test_float_chw_is_the_normalised_uint8(synthetic_jpegs, backend):
    if backend == "native" and not NATIVE:
        pytest.skip(f"no native JPEG decoder: {NATIVE_WHY}")
    jpegs, _ = synthetic_jpegs
    as_uint8, _, seeds = run(jpegs, backend=backend)
    as_float, status, _ = run(jpegs, seeds=seeds, layout="chw", backend=backend)
    assert not status.any() and as_float.dtype == np.float32
    expected = (as_uint8.transpose(0, 3, 1, 2) / np.float32(255) - MEAN[:, None, None]) / STD[:, None, None]
    # uint8 rounds to the nearest level; float keeps the unrounded value: at most half a level apart.
    assert np.abs(as_float - expected).max() <= 0.5 / 255 / STD.min() + 1e-5


@native_only
def test_custom_mean_and_std():
    jpegs = [photo_jpeg(300, 400, 3)]
    as_uint8, _, seeds = run(jpegs)
    as_float, _, _ = run(jpegs, seeds=seeds, layout="chw", mean=(0.5, 0.5, 0.5), std=(0.5, 0.25, 1.0))
    expected = (as_uint8[0].transpose(2, 0, 1) / 255.0 - 0.5) / np.array([0.5, 0.25, 1.0])[:, None, None]
    assert np.abs(as_float[0] - expected).max() <= 0.5 / 255 / 0.25 + 1e-5


@native_only
def test_grayscale_cmyk_and_progressive_jpegs():
    jpegs = [photo_jpeg(360, 480, 1, mode="L"), photo_jpeg(360, 480, 2, mode="CMYK"),
             photo_jpeg(480, 360, 3, progressive=True), photo_jpeg(520, 700, 4, subsampling="4:4:4")]
    out, status, seeds = run(jpegs)
    assert not status.any()
    windows, flips, scales = crop_windows(*sizes_of(jpegs), seeds, train=True)
    for i, jpeg in enumerate(jpegs):
        assert mean_abs_error(out[i], reference(jpeg, windows[i], flips[i])) <= tolerance(scales[i]), i
    assert np.array_equal(out[0, ..., 0], out[0, ..., 1]) and np.array_equal(out[0, ..., 0], out[0, ..., 2])


@native_only
@pytest.mark.parametrize("train", [True, False])
def test_images_smaller_than_the_output_are_enlarged(train):
    shapes = [(1, 1), (30, 40), (16, 300), (223, 223), (100, 224)]
    jpegs = [photo_jpeg(h, w, i) for i, (h, w) in enumerate(shapes)]
    out, status, seeds = run(jpegs, train=train)
    assert not status.any()
    windows, flips, scales = crop_windows(*sizes_of(jpegs), seeds, train=train)
    assert (scales == 8).all()
    for i, jpeg in enumerate(jpegs):
        assert mean_abs_error(out[i], reference(jpeg, windows[i], flips[i])) <= 0.5, shapes[i]
    assert len(np.unique(out[0].reshape(-1, 3), axis=0)) == 1  # one pixel: one colour everywhere


@native_only
def test_other_output_sizes():
    jpegs = [photo_jpeg(375, 500, 9)]
    out, status, seeds = run(jpegs, size=(160, 128), eval_resize=180, train=False)
    assert not status.any()
    windows, _, scales = crop_windows(*sizes_of(jpegs), seeds, train=False, size=(160, 128), eval_resize=180)
    assert scales[0] == 4  # 267 x 333 covers 128 x 160 at half size
    assert mean_abs_error(out[0], reference(jpegs[0], windows[0], False, size=(160, 128))) <= tolerance(4)


# ---- errors ----------------------------------------------------------------------------------------


def broken_batch():
    good = photo_jpeg(300, 400, 5)
    return [good, good[: len(good) // 3], b"this is not a JPEG", good, b""]


@native_only
def test_corrupt_and_truncated_images_raise_naming_the_index():
    with pytest.raises(CorruptRecordError) as info:
        run(broken_batch(), train=False)
    message = str(info.value)
    assert "image 1 of the batch" in message and "Premature end of JPEG file" in message
    assert "images 2, 4 failed too" in message


@native_only
def test_skip_zero_fills_and_reports_status():
    jpegs = broken_batch()
    out, status, _ = run(jpegs, train=False, on_error="skip")
    assert status.tolist() == [0, 1, 1, 0, 1]
    assert not out[[1, 2, 4]].any()
    alone, _, _ = run([jpegs[0]], train=False)
    assert np.array_equal(out[0], alone[0]) and np.array_equal(out[3], alone[0])


@native_only
def test_warn_policy_warns_once_per_batch():
    with pytest.warns(RuntimeWarning, match="image 1 of the batch"):
        _, status, _ = run(broken_batch(), train=False, on_error="warn")
    assert status.sum() == 3


def test_pil_backend_names_the_failing_image():
    with pytest.raises(CorruptRecordError, match="image 1 of the batch"):
        run(broken_batch(), train=False, backend="pil")


def test_argument_errors():
    jpegs = [photo_jpeg(100, 100, 0)]
    buffer, offsets, lengths = pack(jpegs)
    out = np.empty((1, 224, 224, 3), np.uint8)
    with pytest.raises(ValueError, match="needs seeds"):
        decode_batch(buffer, offsets, lengths, out, train=True)
    with pytest.raises(ValueError, match="uint8"):
        decode_batch(buffer, offsets, lengths, np.empty((1, 224, 224, 3), np.float32), train=False)
    with pytest.raises(ValueError, match="slots"):
        decode_batch(buffer, offsets, lengths, np.empty((2, 224, 224, 3), np.uint8), train=False)
    with pytest.raises(ValueError, match="C-contiguous"):
        decode_batch(buffer, offsets, lengths, np.empty((1, 224, 448, 3), np.uint8)[:, :, ::2], train=False)
    with pytest.raises(ValueError, match="on_error"):
        decode_batch(buffer, offsets, lengths, out, train=False, on_error="ignore")
    with pytest.raises(ValueError, match="eval_resize") as direct:
        decode_batch(buffer, offsets, lengths, out, train=False, eval_resize=200)
    from dlstore.pipeline.resnet50 import ResNet50

    with pytest.raises(ValueError) as pipeline:
        ResNet50(train=False, size=224, eval_resize=200)
    assert str(direct.value) == str(pipeline.value)  # one check, one message (they differed)
    from dlstore.pipeline.decode import crop_windows

    with pytest.raises(ValueError) as windows:  # it computed windows from a resize smaller than the crop
        crop_windows([300], [400], None, train=False, size=(224, 224), eval_resize=200)
    assert str(windows.value) == str(direct.value)
    with pytest.raises(ValueError, match="backend"):
        decode_batch(buffer, offsets, lengths, out, train=False, backend="gpu")
    if NATIVE:
        with pytest.raises(DlstoreError, match="outside the buffer"):
            decode_batch(buffer, offsets + np.uint64(10 ** 6), lengths, out, train=False)


# ---- which path runs, and the Pillow fallback -------------------------------------------------------


def test_decode_path_says_which_decoder_runs():
    assert decode_path("pil").startswith("pil: ")
    if NATIVE:
        assert NATIVE_WHY.startswith("libjpeg")
        assert decode_path().startswith("native: libjpeg")
    else:
        assert decode_path().startswith("pil: ") and "without" in decode_path()
        with pytest.raises(RuntimeError, match="native JPEG decode asked for"):
            decode_path("native")


def test_pil_backend_draws_the_same_crops(synthetic_jpegs):
    jpegs, _ = synthetic_jpegs
    for train in (True, False):
        out, status, seeds = run(jpegs, train=train, backend="pil")
        assert not status.any()
        windows, flips, _ = crop_windows(*sizes_of(jpegs), seeds, train=train)
        for i, jpeg in enumerate(jpegs):
            # Pillow's draft mode (its DCT scaling) runs when a window spans twice the output.
            assert mean_abs_error(out[i], reference(jpeg, windows[i], flips[i])) <= 1.0, i


# ---- locating the JPEGs inside tf.train.Example records -------------------------------------------


def test_bytes_feature_spans_point_into_the_records():
    images = [b"\xff\xd8first", b"", b"\xff\xd8" + bytes(range(256)) * 3]
    records = [encode_example({"image/encoded": img, "image/class/label": [i]}) for i, img in enumerate(images)]
    batch = SpanBatch(records)
    offsets, lengths = bytes_feature_spans(batch, "image/encoded")
    assert [batch.buffer[o:o + n] for o, n in zip(offsets.tolist(), lengths.tolist())] == images
    labels = parse_batch(batch, {"image/class/label": (np.int64, 1)})["image/class/label"]
    assert labels[:, 0].tolist() == [0, 1, 2]


def test_bytes_feature_spans_errors_name_the_record():
    records = [encode_example({"image/encoded": b"x"}), encode_example({"other": b"y"})]
    with pytest.raises(DlstoreError, match="record 1: feature 'image/encoded': missing"):
        bytes_feature_spans(SpanBatch(records), "image/encoded")
    records = [encode_example({"image/encoded": [b"a", b"b"]})]
    with pytest.raises(DlstoreError, match="has 2 values, expected 1"):
        bytes_feature_spans(SpanBatch(records), "image/encoded")
    records = [encode_example({"image/encoded": [1, 2]})]
    with pytest.raises(DlstoreError, match="expected bytes_list"):
        bytes_feature_spans(SpanBatch(records), "image/encoded")
    with pytest.raises(CorruptRecordError, match="record 0"):
        bytes_feature_spans(SpanBatch([b"\x0a\xff"]), "image/encoded")
