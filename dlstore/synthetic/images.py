"""Photo-like JPEGs: images with a photo's mix of smooth areas, sharp edges and texture, encoded as
cameras encode them, calibrated so that ImageNet-sized images make ImageNet-sized files.

Pillow is needed, and imported only when an image is made (:func:`pillow` says how to get it).
"""
from __future__ import annotations

import io

import numpy as np

__all__ = ["DEFAULT_QUALITY", "DETAIL_SPREAD", "pillow", "synthesize_image", "encode_jpeg"]

# JPEG quality and texture amplitudes, calibrated together so that the mean record of the default
# image sizes (each side uniform in 300..500 px, 160,000 px on average) lands at ImageNet's 115 KB
# (the figure of the Dell EMC Isilon F800 reference architecture). Photos carry about 5.7 bits per pixel at that size;
# even pure luminance noise reaches only ~6.3 at quality 90, so realistic content needs quality
# 95, as many camera and Flickr JPEGs have. With it, the mean grows roughly as the logarithm of
# the texture amplitude. Measured on records 0..1999 of seed 0 (Pillow 13, libjpeg-turbo 3):
# _OCTAVES as below -> mean 114.8 KB (sd 26, 5th..95th percentile 77..162 KB); all amplitudes
# x0.91 -> 111.5 KB; x1.07 -> 117.0 KB. Other image sizes scale the mean with their area.
DEFAULT_QUALITY = 95
_OCTAVES = (224.0, 112.0, 150.0)  # peak-to-peak luminance amplitude of the ~4 px, ~2 px and 1 px grains
DETAIL_SPREAD = 0.35  # log-normal sigma of each image's texture strength: busy and calm photos
def pillow():
    """Imports Pillow, or says how to get it."""
    try:
        from PIL import Image, ImageDraw
    except ImportError:
        raise ImportError("synthetic ImageNet records need Pillow to encode JPEGs: pip install pillow "
                          "(or pip install 'dlstore[bench]')") from None
    return Image, ImageDraw


def synthesize_image(rng: np.random.Generator, height: int, width: int, detail: float):
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
    Image, ImageDraw = pillow()
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


def encode_jpeg(image, quality: int) -> bytes:
    """Baseline JPEG with 4:2:0 chroma subsampling, what cameras and ImageNet's files mostly use."""
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality, subsampling="4:2:0")
    return out.getvalue()
