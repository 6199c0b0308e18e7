"""What decoding only the crop window at a reduced DCT scale buys: images/s of the ResNet-50 train
(and eval) decode, dlstore's native decoder beside the same decoder reading whole images at full
size, and beside Pillow doing the same crops, on the same JPEGs and threads, in one run.

    python benchmarks/jpeg_decode.py [--images 1024] [--threads 2] [--repeats 3] [--json PATH]

The JPEGs are the first ``--images`` records of the ``small`` synthetic ImageNet preset (generated
and cached on first use), copied into one buffer beforehand so that only decoding is timed. Each
figure is the median of ``--repeats`` timed passes after one warm-up pass; ``cpu ms/image`` is the
process CPU time per image, which a busy machine inflates less than wall time.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import io
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import dlstore  # noqa: E402
from dlstore import _C, synthetic  # noqa: E402
from dlstore.bench import report, sysinfo  # noqa: E402
from dlstore.formats.example import bytes_feature_spans  # noqa: E402
from dlstore.pipeline.decode import (IMAGENET_MEAN, IMAGENET_STD, crop_windows, decode_path,  # noqa: E402
                                     native_jpeg_available)

SIZE = 224


def load_jpegs(count: int):
    """The first ``count`` JPEGs of the small preset, in one buffer: (buffer, offsets, lengths, sizes)."""
    paths = synthetic.cached_dataset("imagenet", "small")
    parts, total = [], 0
    for batch in dlstore.open_records(paths).batches():
        offsets, lengths = bytes_feature_spans(batch, "image/encoded")
        view = memoryview(batch)
        for o, n in zip(offsets.tolist(), lengths.tolist()):
            parts.append(bytes(view[o:o + n]))
            total += 1
            if total == count:
                break
        if total == count:
            break
    lengths = np.array([len(p) for p in parts], np.uint64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.uint64)
    from PIL import Image

    sizes = np.array([Image.open(io.BytesIO(p)).size[::-1] for p in parts])  # (height, width)
    return b"".join(parts), offsets, lengths, sizes


def timed(run, n: int, repeats: int) -> dict:
    run()  # warm-up: thread pools, scratch buffers, page faults of the output
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {"images_per_s": n / statistics.median(walls), "cpu_ms_per_image": statistics.median(cpus) / n * 1e3}


def native(buffer, offsets, lengths, seeds, out, train: bool, threads: int, window: bool):
    decoder = _C.JpegDecoder(threads, "islow", True, window)
    return lambda: decoder.decode(buffer, offsets, lengths, seeds, out, train, list(IMAGENET_MEAN),
                                  list(IMAGENET_STD), (0.08, 1.0), (3 / 4, 4 / 3), 0.5, 256)


def pillow(buffer, offsets, lengths, sizes, seeds, out, train: bool, threads: int):
    """Pillow on ``threads`` threads (it releases the GIL while decoding and resizing): full decode,
    then the same window resized with its antialiased bilinear filter, flipped, into ``out``."""
    from PIL import Image

    windows, flips, _ = crop_windows(sizes[:, 0], sizes[:, 1], seeds, train=train)
    view = memoryview(buffer)

    def one(i: int) -> None:
        image = Image.open(io.BytesIO(view[int(offsets[i]):int(offsets[i] + lengths[i])])).convert("RGB")
        x, y, w, h = windows[i]
        image = image.resize((SIZE, SIZE), Image.BILINEAR, box=(x, y, x + w, y + h))
        if flips[i]:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        out[i] = np.asarray(image)

    pool = concurrent.futures.ThreadPoolExecutor(threads)
    return lambda: list(pool.map(one, range(len(offsets))))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    ok, why = native_jpeg_available()
    if not ok:
        print(f"no native JPEG decoder: {why}", file=sys.stderr)
        return 2
    buffer, offsets, lengths, sizes = load_jpegs(args.images)
    n = len(offsets)
    seeds = np.arange(n, dtype=np.uint64) * 7919 + 1
    out = np.empty((n, SIZE, SIZE, 3), np.uint8)
    print(sysinfo.format_header(sysinfo.collect(), extra=[
        ("decoder", decode_path()), ("images", f"{n} JPEGs, {lengths.mean() / 1e3:.1f} kB mean, "
                                              f"{sizes.min()}..{sizes.max()} px a side"),
        ("threads", str(args.threads)), ("load", " ".join(f"{v:.1f}" for v in os.getloadavg()))]))

    data = (buffer, offsets, lengths)
    cases = [
        ("train", "dlstore: crop window, DCT scale", native(*data, seeds, out, True, args.threads, True)),
        ("train", "dlstore: full image, full size", native(*data, seeds, out, True, args.threads, False)),
        ("train", "Pillow: full image, same crop", pillow(*data, sizes, seeds, out, True, args.threads)),
        ("eval", "dlstore: crop window, DCT scale", native(*data, seeds, out, False, args.threads, True)),
        ("eval", "dlstore: full image, full size", native(*data, seeds, out, False, args.threads, False)),
    ]
    rows = []
    for mode, name, run in cases:
        rows.append({"mode": mode, "decoder": name, **timed(run, n, args.repeats)})
    base = {r["mode"]: r["images_per_s"] for r in rows if r["decoder"].startswith("dlstore: crop")}
    for r in rows:
        r["window_speedup"] = base[r["mode"]] / r["images_per_s"]
    print()
    print(report.text_table(rows, [
        report.Column("mode", "mode", align="<"), report.Column("decoder", "decoder", align="<"),
        report.Column("images_per_s", "images/s", "{:,.0f}"),
        report.Column("cpu_ms_per_image", "cpu ms/image", "{:.2f}"),
        report.Column("window_speedup", "window decode is", report.fmt_ratio)]))
    if args.json:
        report.write_json(args.json, {"sysinfo": sysinfo.collect(), "threads": args.threads, "images": n,
                                      "results": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
