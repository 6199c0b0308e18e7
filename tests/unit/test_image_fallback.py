"""Images that are not JPEGs in the ResNet-50 decode: PNG, GIF, BMP and WebP go to Pillow with the same
crops, flips and filter, get status 2 and are counted by the loader; data no decoder reads still fails.

The reference for a PNG's pixels is torch's antialiased bilinear ``interpolate`` (torchvision's
tensor ``resized_crop``) on the window ``crop_windows`` gives: independent of Pillow's resize. Train
windows are whole pixels, so the crop is exact; the bound is rounding (measured below 0.5 levels).
"""
from __future__ import annotations

import io

import numpy as np
import pytest

import dlstore
from dlstore.errors import CorruptRecordError
from dlstore.formats.example import encode_example
from dlstore.pipeline.decode import DECODED, FAILED, FALLBACK, crop_windows, decode_batch, is_jpeg

Image = pytest.importorskip("PIL.Image", reason="Pillow makes the test images and is the fallback decoder")


def pixels(height, width, seed):
    """Smooth colour waves and mild noise: photo-like, so that a JPEG of it is close to the original."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([128 + 100 * np.sin(xx / (23 + 9 * c) + yy / (31 + 5 * c) + c + seed) for c in range(3)], -1)
    return np.clip(base + rng.normal(0, 3, base.shape), 0, 255).astype(np.uint8)


def encode(array, fmt, mode="RGB", **kw):
    out = io.BytesIO()
    Image.fromarray(array).convert(mode).save(out, fmt, **kw)
    return out.getvalue()


def pack(images):
    parts, offsets, at = [], [], 5  # odd offsets: nothing may assume alignment
    for im in images:
        offsets.append(at)
        parts.append(im + b"\0")
        at += len(im) + 1
    return b"\0" * 5 + b"".join(parts), np.array(offsets, np.uint64), np.array([len(i) for i in images], np.uint64)


def run(images, *, train=True, layout="hwc", **kw):
    buffer, offsets, lengths = pack(images)
    n = len(images)
    seeds = np.arange(n, dtype=np.uint64) * 7919 + 11
    out = np.full((n, 224, 224, 3), 77, np.uint8) if layout == "hwc" else np.full((n, 3, 224, 224), 7, np.float32)
    status = decode_batch(buffer, offsets, lengths, out, train=train, seeds=seeds if train else None, **kw)
    return out, status, seeds


def torch_reference(array, window, flip):
    """torchvision's tensor path: crop the whole-pixel window, antialiased bilinear to 224, mirror."""
    torch = pytest.importorskip("torch")
    x, y, w, h = (int(v) for v in window)
    assert (x, y, w, h) == tuple(float(v) for v in window)  # train windows are whole pixels
    t = torch.from_numpy(array[y:y + h, x:x + w]).permute(2, 0, 1)[None].float()
    t = torch.nn.functional.interpolate(t, size=(224, 224), mode="bilinear", antialias=True, align_corners=False)
    out = t[0].permute(1, 2, 0).round().clamp(0, 255).numpy()
    return out[:, ::-1] if flip else out


MIXED = [
    ("jpeg", lambda a: encode(a, "JPEG", quality=92)),
    ("png", lambda a: encode(a, "PNG")),
    ("png rgba", lambda a: encode(a, "PNG", mode="RGBA")),
    ("gif", lambda a: encode(a, "GIF", mode="P")),
    ("bmp", lambda a: encode(a, "BMP")),
    ("webp lossless", lambda a: encode(a, "WEBP", lossless=True)),
    ("grayscale png", lambda a: encode(a, "PNG", mode="L")),
]


@pytest.mark.parametrize("backend", ["auto", "pil"])
def test_mixed_batch_decodes_every_format(backend):
    arrays = [pixels(180 + 10 * i, 260 - 15 * i, i) for i in range(len(MIXED))]
    images = [make(a) for (_, make), a in zip(MIXED, arrays)]
    out, status, seeds = run(images, backend=backend)
    assert status.tolist() == [DECODED] + [FALLBACK] * (len(MIXED) - 1)
    assert is_jpeg(*pack(images)).tolist() == [True] + [False] * (len(MIXED) - 1)
    assert all(out[i].std() > 10 for i in range(len(images)))  # real pixels, not a fill


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "WEBP"])
def test_lossless_images_match_torchvision_tensor_crops(fmt):
    arrays = [pixels(200 + 37 * i, 300 - 29 * i, 10 + i) for i in range(4)]
    kw = {"lossless": True} if fmt == "WEBP" else {}
    out, status, seeds = run([encode(a, fmt, **kw) for a in arrays])
    assert (status == FALLBACK).all()
    heights, widths = [a.shape[0] for a in arrays], [a.shape[1] for a in arrays]
    windows, flips, _ = crop_windows(heights, widths, seeds, train=True)
    for i, a in enumerate(arrays):
        error = np.abs(out[i].astype(np.float64) - torch_reference(a, windows[i], flips[i])).mean()
        assert error <= 0.5, (i, error)


@pytest.mark.parametrize("train", [True, False])
def test_png_and_jpeg_of_the_same_pixels_agree(train):
    """The fallback and the native path share the geometry (windows, flips, eval resize): a PNG and a
    near-lossless JPEG of the same pixels give nearly the same output."""
    arrays = [pixels(240, 330, 3), pixels(400, 260, 4)]
    jpegs = [encode(a, "JPEG", quality=100, subsampling=0) for a in arrays]
    pngs = [encode(a, "PNG") for a in arrays]
    from_jpeg, s1, _ = run(jpegs, train=train)
    from_png, s2, _ = run(pngs, train=train)
    assert (s1 == DECODED).all() and (s2 == FALLBACK).all()
    assert np.abs(from_jpeg.astype(np.int16) - from_png).mean() <= 1.0


def test_float_output_of_a_png_is_its_normalised_uint8():
    png = [encode(pixels(220, 300, 5), "PNG")]
    u8, _, _ = run(png)
    f32, status, _ = run(png, layout="chw")
    assert status.tolist() == [FALLBACK]
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    want = (u8[0].transpose(2, 0, 1) / 255.0 - mean[:, None, None]) / std[:, None, None]
    assert np.abs(f32[0] - want).max() <= 1e-5


@pytest.mark.parametrize("train", [True, False])
def test_a_16_bit_grayscale_png_keeps_its_high_byte(train):
    """A 16-bit grayscale PNG decodes as the 8-bit PNG of its samples' high bytes (what
    tf.io.decode_image(..., dtype=tf.uint8) gives): Pillow opens it as mode I;16, and convert("RGB")
    clipped every sample at 255, a white image."""
    yy, xx = np.mgrid[0:240, 0:300]
    deep = ((xx * 211 + yy * 97) % 65536).astype(np.uint16)
    out = io.BytesIO()
    Image.fromarray(deep).save(out, "PNG")
    assert Image.open(io.BytesIO(out.getvalue())).mode.startswith("I")
    shallow = encode((deep >> 8).astype(np.uint8), "PNG", mode="L")
    got, status, _ = run([out.getvalue()], train=train)
    want, _, _ = run([shallow], train=train)
    assert status.tolist() == [FALLBACK]
    assert got.std() > 10 and np.array_equal(got, want)


def test_data_no_decoder_reads_keeps_the_error_policy():
    good = encode(pixels(100, 120, 1), "JPEG")
    png = encode(pixels(100, 120, 2), "PNG")
    images = [good, b"plain text, not an image", png, good[: len(good) // 3], b"", png[:40]]
    out, status, _ = run(images, train=False, on_error="skip")
    assert status.tolist() == [DECODED, FAILED, FALLBACK, FAILED, FAILED, FAILED]
    assert not out[[1, 3, 4, 5]].any()
    with pytest.raises(CorruptRecordError) as info:
        run(images, train=False)
    message = str(info.value)
    assert message.startswith("image 1 of the batch") and "image decode failed: not a JPEG" in message
    assert "Pillow cannot read it either" in message and "BytesIO" not in message
    assert "images 3, 4, 5 failed too" in message
    # A truncated JPEG is a JPEG: libjpeg's word stands, Pillow is not asked.
    with pytest.raises(CorruptRecordError, match="image 0 of the batch .*: JPEG decode failed: "):
        run([good[: len(good) // 3]], train=False)


def test_is_jpeg_handles_short_and_empty_images():
    buffer = b"\xff\xd8\xff\xdb" + b"\xff\xd8" + b"\x89PNG"
    offsets = np.array([0, 4, 4, 6, 0], np.uint64)
    lengths = np.array([4, 2, 0, 4, 3], np.uint64)
    assert is_jpeg(buffer, offsets, lengths).tolist() == [True, False, False, False, True]
    with pytest.raises(dlstore.DlstoreError, match="image 1: bytes 8..12 lie outside the buffer of 10 bytes"):
        is_jpeg(buffer, np.array([0, 8], np.uint64), np.array([4, 4], np.uint64))
    with pytest.raises(dlstore.DlstoreError, match="outside the buffer"):  # the pil path checks as the native one
        decode_batch(buffer, np.array([8], np.uint64), np.array([4], np.uint64), np.empty((1, 224, 224, 3), np.uint8),
                     train=False, backend="pil")


# ---- through the loader --------------------------------------------------------------------------------


def write_set(path, images, labels):
    with dlstore.TFRecordWriter(str(path)) as w:
        for data, label in zip(images, labels):
            w.write(encode_example({"image/encoded": data, "image/class/label": [label]}))
    return str(path)


def test_loader_counts_fallbacks_once_even_when_a_record_is_skipped(tmp_path):
    from dlstore.pipeline.resnet50 import resnet50_loader

    jpeg = encode(pixels(150, 170, 1), "JPEG")
    png = encode(pixels(150, 170, 2), "PNG")
    gif = encode(pixels(150, 170, 3), "GIF", mode="P")
    images = [jpeg, png, jpeg[:200], gif, jpeg, png, jpeg, jpeg]  # one truncated JPEG in the first batch
    path = write_set(tmp_path / "mixed.tfrecord", images, range(len(images)))
    loader = resnet50_loader(path, batch_size=4, shuffle="none", on_error="skip", last_batch="PARTIAL", threads=2)
    labels = [label for batch in loader for label in batch["label"].tolist()]
    stats = loader.stats()
    assert labels == [0, 1, 3, 4, 5, 6, 7]
    # The first batch failed as a whole, then went record by record: its PNG and GIF count once.
    assert stats["skipped"] == 1 and stats["fallback_decodes"] == 3
    with pytest.raises(dlstore.CorruptRecordError, match=r"mixed.tfrecord: record at byte \d+ \(sample 2 of epoch 0\)"):
        list(resnet50_loader(path, batch_size=4, shuffle="none"))


def test_fallback_pixels_through_the_loader_equal_decode_batch(tmp_path):
    from dlstore.pipeline.resnet50 import resnet50_loader
    from dlstore.pipeline.stages import sample_seeds

    arrays = [pixels(200, 260, 7), pixels(260, 200, 8)]
    images = [encode(arrays[0], "PNG"), encode(arrays[1], "JPEG")]
    path = write_set(tmp_path / "two.tfrecord", images, [1, 2])
    loader = resnet50_loader(path, batch_size=2, shuffle="none", seed=4, threads=1)
    batch = next(iter(loader))
    buffer, offsets, lengths = pack(images)
    out = np.empty((2, 224, 224, 3), np.uint8)
    status = decode_batch(buffer, offsets, lengths, out, train=True, seeds=sample_seeds(4, 0, 0, 2))
    assert status.tolist() == [FALLBACK, DECODED]
    assert np.array_equal(batch["image"], out) and loader.stats()["fallback_decodes"] == 1
