#!/usr/bin/env python
"""dlstore's ResNet-50 and BERT input pipelines beside DALI (CPU), tf.data and a PyTorch DataLoader
with PIL: the same pipeline on the same data and the same cores, in one run, every contender reading
shuffled, as training reads.

    python benchmarks/pipelines.py                          # the cached 3 GB ImageNet-like set (else 1 GB)
    python benchmarks/pipelines.py --quick                  # tiny sets, small batches: a smoke test
    python benchmarks/pipelines.py --size small --repeat 1 --only resnet50
    python benchmarks/pipelines.py --data '/data/train-*' --bert-data '/data/bert/part-*'
    python benchmarks/pipelines.py --save --markdown docs/pipelines.md  # the committed results and page

ResNet-50 train pipeline, in each contender: read the TFRecord ImageNet-like records, decode a
random crop (RandomResizedCrop: area 0.08..1 of the image, aspect ratio 3/4..4/3, 10 attempts,
then the whole image clamped to the ratio range), resize it to 224 x 224, flip it horizontally
with probability 1/2 and batch it: uint8 NHWC (``--output uint8``, the default: what dlstore's
loader gives by default, and what a GPU job normalises on the GPU), or normalised with ImageNet's
mean and std (``--output float``: float32, NCHW except tf.data's NHWC).
BERT: the seven pretraining features of ``tf.train.Example`` records parsed into fixed-shape
batches (batch 64, sequence 128). docs/pipelines.md lists where the contenders' semantics differ.

Shuffles: dlstore reads through ``dlstore.Dataset`` three times, with ``shuffle="none"`` (the
unshuffled reference), ``"block"`` (its default) and ``"global"``; every peer shuffles with a buffer
of ``--shuffle-buffer`` records (10,000): DALI ``readers.tfrecord(random_shuffle=True,
initial_fill=N)``, tf.data ``.shuffle(N)`` on the records, the PyTorch DataLoader a per-epoch file
order and a shuffle buffer of N / workers records in each worker. Each row says its shuffle.

Every contender runs in its own process (``--worker NAME``, which prints its measurement as one
JSON line), pinned to the same ``--cores`` CPUs (``sched_setaffinity``, which its threads and
worker processes inherit); DALI, tf.data and the DataLoader get that many threads or workers,
dlstore its default for those cores. So one framework's threads and memory do not disturb
another, and the ``tfrecord`` package never shares a process with TensorFlow. Contenders run in
rounds (one measurement each per round, the order rotating), so drift on a shared machine
spreads over all of them alike; figures are medians over rounds.

A measurement: build the pipeline, draw batches untimed for ``--warmup`` batches and
``--warmup-seconds`` (so that prefetch queues filled during start-up are drained and tf.data's
AUTOTUNE settles), then time the batches holding the next ``--images`` images (``--samples`` for
BERT): wall time, the CPU time of the contender's whole process tree (all threads, DataLoader
workers included), the busiest core (system-wide) and the tree's resident memory at the end. The
files are read once before every measurement, so the page cache holds them (warm-cache figures,
even where a neighbour on a shared machine drops the cache); the fraction cached is recorded.
A contender that is not installed, not built yet, or fails keeps its row with the reason.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (ROOT, HERE):  # run from a checkout: measure this tree's dlstore; read_throughput beside this
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchmarks import _harness  # noqa: E402
from dlstore.bench import report, sysinfo  # noqa: E402
from dlstore.bench.storage import dataset_paths  # noqa: E402
from dlstore.synthetic import cached_paths  # noqa: E402

RESULT_PREFIX = "PIPELINES_RESULT "

# The augmentation every ResNet-50 contender is configured to: torchvision's RandomResizedCrop
# defaults, the ImageNet mean and std of torchvision and DALI's examples.
CROP_SIZE = 224
AREA_RANGE = (0.08, 1.0)
RATIO_RANGE = (3.0 / 4.0, 4.0 / 3.0)
CROP_ATTEMPTS = 10
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
OUTPUTS = ("uint8", "float")

# BERT pretraining features at sequence length 128 (Google's create_pretraining_data.py).
BERT_SEQ_LEN = 128
BERT_MAX_PREDICTIONS = 20
BERT_INT_FEATURES = ("input_ids", "input_mask", "segment_ids")
BERT_PRED_FEATURES = ("masked_lm_positions", "masked_lm_ids")

TASKS = {
    "resnet50": {"unit": "images", "title": "ResNet-50 train pipeline"},
    "bert": {"unit": "samples", "title": "BERT pretraining features"},
}


# ---- the contenders ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Contender:
    """A pipeline in the comparison: its name (``--only``, ``--worker``), task, what the tables call
    it, its family (for the ratios), whether it checks TFRecord CRCs, the module it needs, and how
    it differs from the others (the rows of docs/pipelines.md's semantics table)."""

    name: str
    task: str
    label: str
    family: str
    crc: Optional[bool]
    requires: str
    install: str
    decode: str = ""
    resize: str = ""
    output: str = ""
    shuffle: str = ""
    dlstore_shuffle: Optional[str] = None  # the Dataset's shuffle, for dlstore's rows


_DLSTORE_DECODE = ("libjpeg-turbo in C++, the crop window only, at the smallest DCT scale (1/8, 2/8, 4/8 or 8/8) "
                   "covering 224 px")
_DLSTORE_RESIZE = ("one fused pass into the batch buffer: bilinear with antialiasing (torchvision's and PIL's filter), "
                   "flip, normalise")
_DLSTORE_OUTPUT = "float: float32 NCHW, normalised; uint8: uint8 NHWC; label int64 as stored (1..1000)"
_DLSTORE_SHUFFLES = {
    "none": "`Dataset(shuffle=\"none\")`: records in shard order, shards in a seeded order (the unshuffled reference)",
    "block": "`Dataset(shuffle=\"block\")`, its default: 8 MiB blocks in a seeded order within 128 MiB windows, "
             "records through a 64 MiB shuffle buffer",
    "global": "`Dataset(shuffle=\"global\")`: a seeded permutation of all records, each read through the index",
}
_PEER_SHUFFLE = "a shuffle buffer of `--shuffle-buffer` records"

CONTENDERS: Dict[str, Contender] = {
    c.name: c
    for c in [
        Contender("resnet50-dlstore-none", "resnet50", "dlstore resnet50_loader, shuffle none", "dlstore", True,
                  "dlstore.pipeline", "dlstore.pipeline",
                  decode=_DLSTORE_DECODE, resize=_DLSTORE_RESIZE, output=_DLSTORE_OUTPUT,
                  shuffle=_DLSTORE_SHUFFLES["none"], dlstore_shuffle="none"),
        Contender("resnet50-dlstore-block", "resnet50", "dlstore resnet50_loader, shuffle block", "dlstore", True,
                  "dlstore.pipeline", "dlstore.pipeline",
                  decode=_DLSTORE_DECODE, resize=_DLSTORE_RESIZE, output=_DLSTORE_OUTPUT,
                  shuffle=_DLSTORE_SHUFFLES["block"], dlstore_shuffle="block"),
        Contender("resnet50-dlstore-global", "resnet50", "dlstore resnet50_loader, shuffle global", "dlstore", True,
                  "dlstore.pipeline", "dlstore.pipeline",
                  decode=_DLSTORE_DECODE, resize=_DLSTORE_RESIZE, output=_DLSTORE_OUTPUT,
                  shuffle=_DLSTORE_SHUFFLES["global"], dlstore_shuffle="global"),
        Contender("resnet50-dali", "resnet50", "DALI CPU", "dali", False, "nvidia.dali",
                  "pip install nvidia-dali-cuda130",
                  shuffle=f"`readers.tfrecord(random_shuffle=True, initial_fill=N)`: {_PEER_SHUFFLE}",
                  decode="`decoders.image_random_crop` (cpu, nvImageCodec/libjpeg-turbo, ROI decoding of the "
                         "crop window at full scale)",
                  resize="`resize` 224 x 224, linear with antialiasing (DALI's default); "
                         "`crop_mirror_normalize` flips and normalises",
                  output="float: float32 NCHW, normalised; uint8: uint8 NHWC; label int64 (1..1000); numpy "
                         "views of DALI's output buffers (no copy)"),
        Contender("resnet50-tfdata", "resnet50", "tf.data", "tfdata", True, "tensorflow",
                  "pip install tensorflow-cpu",
                  shuffle=f"`.shuffle(N)` on the records, before the map: {_PEER_SHUFFLE}",
                  decode="`sample_distorted_bounding_box` (whole image as the box, min_object_covered 0) + "
                         "`decode_and_crop_jpeg` (libjpeg-turbo, the crop window at full scale)",
                  resize="`tf.image.resize` bilinear, no antialiasing (TF's default); "
                         "`random_flip_left_right`; normalise in float32",
                  output="float: float32 **NHWC** (TF's layout), normalised; uint8: uint8 NHWC (resize "
                         "output rounded); label int64 (1..1000)"),
        Contender("resnet50-torch", "resnet50", "PyTorch DataLoader + PIL", "torch", False, "torch",
                  "pip install torch==2.13.0",
                  shuffle="files in a seeded order each epoch, then a shuffle buffer of N / workers records in each "
                          "worker (a DataLoader takes no `shuffle=True` with an IterableDataset)",
                  decode="`tfrecord` package (protobuf parse per record) + PIL `Image.open().convert('RGB')`: "
                         "the whole image at full scale",
                  resize="RandomResizedCrop as torchvision does it, written with PIL: `resize(BILINEAR, box=crop)` "
                         "(antialiased); flip; `ToTensor` + `Normalize` as torch ops per image",
                  output="float: float32 NCHW, normalised; uint8: uint8 NHWC; label int64 (1..1000); "
                         "collated in the workers, handed over in shared memory"),
        Contender("bert-dlstore-none", "bert", "dlstore bert_loader, shuffle none", "dlstore", True,
                  "dlstore.pipeline", "dlstore.pipeline",
                  decode="the seven features parsed in C++ straight into fixed-shape batch arrays",
                  output="int64 (masked_lm_weights float32), next_sentence_labels (B, 1)",
                  shuffle=_DLSTORE_SHUFFLES["none"], dlstore_shuffle="none"),
        Contender("bert-dlstore-block", "bert", "dlstore bert_loader, shuffle block", "dlstore", True,
                  "dlstore.pipeline", "dlstore.pipeline",
                  decode="the seven features parsed in C++ straight into fixed-shape batch arrays",
                  output="int64 (masked_lm_weights float32), next_sentence_labels (B, 1)",
                  shuffle=_DLSTORE_SHUFFLES["block"], dlstore_shuffle="block"),
        Contender("bert-dlstore-global", "bert", "dlstore bert_loader, shuffle global", "dlstore", True,
                  "dlstore.pipeline", "dlstore.pipeline",
                  decode="the seven features parsed in C++ straight into fixed-shape batch arrays",
                  output="int64 (masked_lm_weights float32), next_sentence_labels (B, 1)",
                  shuffle=_DLSTORE_SHUFFLES["global"], dlstore_shuffle="global"),
        Contender("bert-dali", "bert", "DALI readers.tfrecord", "dali", False, "nvidia.dali",
                  "pip install nvidia-dali-cuda130",
                  shuffle=f"`random_shuffle=True, initial_fill=N`: {_PEER_SHUFFLE}",
                  decode="`readers.tfrecord` with the seven `FixedLenFeature`s, `device_id=None`",
                  output="int64 (masked_lm_weights float32), next_sentence_labels (B, 1); "
                         "numpy views of DALI's output buffers (no copy)"),
        Contender("bert-tfdata", "bert", "tf.data parse_example", "tfdata", True, "tensorflow",
                  "pip install tensorflow-cpu",
                  shuffle=f"`.shuffle(N)` on the records, before `batch`: {_PEER_SHUFFLE}",
                  decode="`TFRecordDataset` -> `batch(64)` -> `parse_example` (batched parse), AUTOTUNE",
                  output="int64 (masked_lm_weights float32), next_sentence_labels (B, 1)"),
    ]
}
FAMILY_LABELS = {"dali": "DALI", "tfdata": "tf.data", "torch": "PyTorch"}


def missing_reason(c: Contender) -> Optional[str]:
    """Why a contender cannot run here (None when it can), found without importing the framework."""
    why = _harness.module_missing(c.requires, c.install)
    return None if why is None else f"not available: {why}"


# ---- what the workers measure --------------------------------------------------------------------

def _proc_stat(pid: int) -> Optional[List[str]]:
    """The fields of /proc/PID/stat after the command name (state first), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def process_tree(root: int) -> List[int]:
    """``root`` and its live descendants (DataLoader workers, spawned helpers)."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _proc_stat(int(entry))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def tree_usage(root: int) -> Dict[str, float]:
    """CPU seconds (user + system, every thread) and resident bytes of ``root``'s process tree."""
    tick, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    cpu = rss = 0.0
    for pid in process_tree(root):
        fields = _proc_stat(pid)
        if fields:  # utime, stime: fields 14 and 15 of stat; rss (pages): field 24
            cpu += (int(fields[11]) + int(fields[12])) / tick
            rss += int(fields[21]) * page
    return {"cpu_seconds": cpu, "rss_bytes": rss}


def _describe(batch: Dict) -> Dict[str, List]:
    """``name -> [shape, dtype]`` of a batch's arrays (numpy, torch or anything with shape and dtype)."""
    return {k: [list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in batch.items()}


def measure(batches: Iterator[Dict], key: str, warmup: int, items: int, warmup_seconds: float = 0.0) -> Dict:
    """Times a batch iterator: the first batch (start-up), then untimed batches until ``warmup``
    batches and ``warmup_seconds`` have passed, then batches until ``items`` items have been drawn;
    ``key`` names the array whose length counts items.

    The warm-up time lets tf.data's AUTOTUNE settle and drains what every contender's prefetch
    queue gathered while the first batch was being made, so that the timed batches are made at
    the steady rate, not handed over from a full queue.
    """
    pid = os.getpid()
    t0 = time.perf_counter()
    first = next(batches)
    startup = time.perf_counter() - t0
    spec = _describe(first)
    del first
    drawn = 1
    while drawn < warmup or time.perf_counter() - t0 < startup + warmup_seconds:
        next(batches)
        drawn += 1
    warmed = drawn
    usage0, ticks0 = tree_usage(pid), sysinfo.per_core_cpu_ticks()
    t0 = time.perf_counter()
    drawn = nbatches = 0
    while drawn < items:
        drawn += len(next(batches)[key])
        nbatches += 1
    seconds = time.perf_counter() - t0
    usage1, ticks1 = tree_usage(pid), sysinfo.per_core_cpu_ticks()
    cpu = usage1["cpu_seconds"] - usage0["cpu_seconds"]
    # Busy time of all cores (USER_HZ ticks, as the process tree's) less the contender's own.
    busy = sum(b1 - b0 for (b0, _), (b1, _) in zip(ticks0, ticks1)) / os.sysconf("SC_CLK_TCK")
    others = max(0.0, busy - cpu) / (seconds * max(1, len(ticks1))) * 100 if ticks1 else None
    return {"items": drawn, "batches": nbatches, "seconds": seconds, "items_per_s": drawn / seconds,
            "cpu_seconds": cpu, "cpu_ms_per_item": 1e3 * cpu / drawn, "startup_seconds": startup,
            "busiest_core_pct": sysinfo.busiest_core_percent(ticks0, ticks1), "others_cpu_pct": others,
            "rss_bytes": usage1["rss_bytes"], "warmup_batches": warmed, "spec": spec}


# ---- ResNet-50 -----------------------------------------------------------------------------------

def _dlstore_dataset(plan: Dict):
    """The ``dlstore.Dataset`` a dlstore contender reads: every file, one rank, its shuffle, the plan's seed."""
    import dlstore

    return dlstore.Dataset(plan["files"], shuffle=plan["dlstore_shuffle"], seed=plan["seed"])


def _dataset_stats(loader, dataset, **extra) -> Dict:
    return dict(loader.stats(), shuffle=dataset.describe_shuffle(), **extra)


def resnet50_dlstore(plan: Dict) -> Iterator[Dict]:
    """dlstore's ``resnet50_loader`` (train) over a ``dlstore.Dataset`` with the row's shuffle, NCHW
    float32 or NHWC uint8, endless; its default thread count, which is one decoding thread per core it
    may use (the pinned cores)."""
    from dlstore.pipeline import native_jpeg_available, resnet50_loader

    float_out = plan["output"] == "float"
    dataset = _dlstore_dataset(plan)
    loader = resnet50_loader(dataset, batch_size=plan["batch_size"], train=True,
                             layout="NCHW" if float_out else "NHWC", dtype="float32" if float_out else "uint8",
                             seed=plan["seed"], epochs=None)
    native, how = native_jpeg_available()
    plan["_stats"] = lambda: _dataset_stats(loader, dataset, decoder=how if native else f"Python decoder ({how})")
    yield from loader


def resnet50_dali(plan: Dict) -> Iterator[Dict]:
    """DALI on the CPU: ``readers.tfrecord`` -> ``decoders.image_random_crop`` -> ``resize`` ->
    ``crop_mirror_normalize`` (random mirror), ``device_id=None``, ``num_threads`` = the cores."""
    import nvidia.dali.tfrecord as tfrec
    import numpy as np
    from nvidia.dali import fn, pipeline_def, types

    float_out = plan["output"] == "float"

    @pipeline_def(batch_size=plan["batch_size"], num_threads=len(plan["cores"]), device_id=None, seed=plan["seed"])
    def train_pipeline():
        inputs = fn.readers.tfrecord(
            path=plan["files"], index_path=plan["indexes"], name="Reader", random_shuffle=True,
            initial_fill=plan["shuffle_buffer"],
            features={"image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                      "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1)})
        images = fn.decoders.image_random_crop(inputs["image/encoded"], device="cpu", output_type=types.RGB,
                                               random_area=list(AREA_RANGE), random_aspect_ratio=list(RATIO_RANGE),
                                               num_attempts=CROP_ATTEMPTS)
        images = fn.resize(images, resize_x=CROP_SIZE, resize_y=CROP_SIZE)
        mirror = fn.random.coin_flip(probability=0.5)
        if float_out:
            images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mirror=mirror,
                                              mean=[255 * m for m in MEAN], std=[255 * s for s in STD])
        else:
            images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="HWC", mirror=mirror)
        return images, fn.reshape(inputs["image/class/label"], shape=[])

    pipe = train_pipeline()
    pipe.build()
    while True:  # the reader wraps around at the end of the data
        images, labels = pipe.run()
        yield {"image": np.asarray(images.as_tensor()), "label": np.asarray(labels.as_tensor())}


def resnet50_tfdata(plan: Dict) -> Iterator[Dict]:
    """tf.data: ``TFRecordDataset`` -> parse -> ``sample_distorted_bounding_box`` +
    ``decode_and_crop_jpeg`` -> resize -> random flip -> normalise, AUTOTUNE, batch, prefetch."""
    import tensorflow as tf

    cores = len(plan["cores"])
    tf.config.threading.set_inter_op_parallelism_threads(cores)
    tf.config.threading.set_intra_op_parallelism_threads(cores)
    tf.random.set_seed(plan["seed"])
    float_out = plan["output"] == "float"
    features = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
                "image/class/label": tf.io.FixedLenFeature([], tf.int64)}
    whole = tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4])
    mean = tf.constant([255 * m for m in MEAN], tf.float32)
    std = tf.constant([255 * s for s in STD], tf.float32)

    def train_sample(record):
        parsed = tf.io.parse_single_example(record, features)
        jpeg = parsed["image/encoded"]
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            tf.image.extract_jpeg_shape(jpeg), bounding_boxes=whole, min_object_covered=0.0,
            aspect_ratio_range=RATIO_RANGE, area_range=AREA_RANGE, max_attempts=CROP_ATTEMPTS,
            use_image_if_no_bounding_boxes=True)
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        image = tf.image.decode_and_crop_jpeg(jpeg, window, channels=3)
        image = tf.image.resize(image, [CROP_SIZE, CROP_SIZE], method="bilinear")
        image = tf.image.random_flip_left_right(image)
        if float_out:
            image = (image - mean) / std
        else:
            image = tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)
        return {"image": image, "label": parsed["image/class/label"]}

    files = plan["files"]
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=min(len(files), cores))
    ds = ds.shuffle(plan["shuffle_buffer"], seed=plan["seed"]).repeat()  # reshuffled every epoch
    ds = ds.map(train_sample, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(plan["batch_size"], drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.threading.private_threadpool_size = cores
    options.deterministic = False  # as TF's official ImageNet input: late samples do not hold up a batch
    yield from ds.with_options(options).as_numpy_iterator()


def random_resized_crop(rng, height: int, width: int):
    """``(top, left, h, w)`` of a RandomResizedCrop window, as torchvision draws it: up to
    ``CROP_ATTEMPTS`` draws of an area fraction and a log-uniform aspect ratio that fit the image,
    else the whole image clamped to the ratio range, centred."""
    area = height * width
    log_lo, log_hi = math.log(RATIO_RANGE[0]), math.log(RATIO_RANGE[1])
    for _ in range(CROP_ATTEMPTS):
        target = area * rng.uniform(*AREA_RANGE)
        ratio = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target * ratio)))
        h = int(round(math.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    if width / height < RATIO_RANGE[0]:
        w, h = width, int(round(width / RATIO_RANGE[0]))
    elif width / height > RATIO_RANGE[1]:
        h, w = height, int(round(height * RATIO_RANGE[1]))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


def _torch_dataset(plan: Dict):
    """An ``IterableDataset`` over the TFRecord files read with the ``tfrecord`` package: PIL decode,
    RandomResizedCrop (PIL, bilinear), flip, ToTensor + Normalize; files dealt among the
    DataLoader's workers (records, when there are fewer files than workers), shuffled
    (:func:`_shuffled_examples`); repeats forever."""
    import io
    import random

    import numpy as np
    import torch
    from PIL import Image

    float_out = plan["output"] == "float"
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    description = {"image/encoded": "byte", "image/class/label": "int"}

    class TFRecordImages(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            worker, workers = (info.id, info.num_workers) if info else (0, 1)
            rng = random.Random(plan["seed"] * 1000 + worker)
            for example in _shuffled_examples(plan, description, worker, workers, rng):
                yield self.sample(example, rng)

        @staticmethod
        def sample(example, rng):
            image = Image.open(io.BytesIO(example["image/encoded"])).convert("RGB")
            top, left, h, w = random_resized_crop(rng, image.height, image.width)
            image = image.resize((CROP_SIZE, CROP_SIZE), Image.BILINEAR, box=(left, top, left + w, top + h))
            if rng.random() < 0.5:
                image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            pixels = torch.from_numpy(np.array(image, np.uint8, copy=True))
            if float_out:  # torchvision's ToTensor and Normalize
                pixels = pixels.permute(2, 0, 1).contiguous().to(torch.float32).div_(255.0)
                pixels.sub_(mean).div_(std)
            return {"image": pixels, "label": int(example["image/class/label"][0])}

    return TFRecordImages()


def _shuffled_examples(plan: Dict, description: Dict, worker: int, workers: int, rng) -> Iterator[Dict]:
    """A DataLoader worker's share of the records, endless and shuffled as a PyTorch user shuffles an
    iterable dataset: every epoch a new file order (seeded, the same in every worker), then a shuffle
    buffer of ``shuffle_buffer // workers`` records in the worker."""
    import random

    from tfrecord.reader import example_loader

    files = plan["files"]
    size = max(1, plan["shuffle_buffer"] // workers)
    buffer: List[Dict] = []
    epoch = 0
    while True:
        order = list(files)
        random.Random(plan["seed"] * 7919 + epoch).shuffle(order)
        by_file = len(order) >= workers
        for path in (order[worker::workers] if by_file else order):
            for i, example in enumerate(example_loader(path, None, description)):
                if not by_file and i % workers != worker:
                    continue
                if len(buffer) < size:
                    buffer.append(example)
                    continue
                j = rng.randrange(size)
                buffer[j], example = example, buffer[j]
                yield example
        epoch += 1


def resnet50_torch(plan: Dict) -> Iterator[Dict]:
    """PyTorch ``DataLoader`` with PIL, ``num_workers`` = the cores, persistent workers."""
    import torch

    torch.set_num_threads(len(plan["cores"]))
    loader = torch.utils.data.DataLoader(_torch_dataset(plan), batch_size=plan["batch_size"],
                                         num_workers=len(plan["cores"]), persistent_workers=True,
                                         prefetch_factor=2, drop_last=True)
    yield from loader


# ---- BERT ----------------------------------------------------------------------------------------

def _bert_shapes(plan: Dict) -> Dict[str, int]:
    return {**{k: plan["seq_len"] for k in BERT_INT_FEATURES},
            **{k: plan["max_predictions"] for k in BERT_PRED_FEATURES + ("masked_lm_weights",)},
            "next_sentence_labels": 1}


def bert_dlstore(plan: Dict) -> Iterator[Dict]:
    """dlstore's ``bert_loader`` over a ``dlstore.Dataset`` with the row's shuffle, endless, its default
    thread count (one parsing thread beside the loader's own: at batch 64 a pool costs more in
    hand-offs than it saves), on the pinned cores."""
    from dlstore.pipeline import bert_loader

    dataset = _dlstore_dataset(plan)
    loader = bert_loader(dataset, batch_size=plan["batch_size"], seq_len=plan["seq_len"], seed=plan["seed"],
                         epochs=None)
    plan["_stats"] = lambda: _dataset_stats(loader, dataset)
    yield from loader


def bert_dali(plan: Dict) -> Iterator[Dict]:
    """DALI ``readers.tfrecord`` with the seven features, ``device_id=None``; each output as numpy."""
    import nvidia.dali.tfrecord as tfrec
    import numpy as np
    from nvidia.dali import fn, pipeline_def

    shapes = _bert_shapes(plan)
    names = list(shapes)

    @pipeline_def(batch_size=plan["batch_size"], num_threads=len(plan["cores"]), device_id=None, seed=plan["seed"])
    def bert_pipeline():
        features = {k: (tfrec.FixedLenFeature([n], tfrec.float32, 0.0) if k == "masked_lm_weights"
                        else tfrec.FixedLenFeature([n], tfrec.int64, 0)) for k, n in shapes.items()}
        inputs = fn.readers.tfrecord(path=plan["files"], index_path=plan["indexes"], features=features,
                                     name="Reader", random_shuffle=True, initial_fill=plan["shuffle_buffer"])
        return tuple(inputs[k] for k in names)

    pipe = bert_pipeline()
    pipe.build()
    while True:
        yield {k: np.asarray(out.as_tensor()) for k, out in zip(names, pipe.run())}


def bert_tfdata(plan: Dict) -> Iterator[Dict]:
    """tf.data: ``TFRecordDataset`` -> ``batch`` -> ``parse_example`` (AUTOTUNE) -> prefetch."""
    import tensorflow as tf

    cores = len(plan["cores"])
    tf.config.threading.set_inter_op_parallelism_threads(cores)
    tf.config.threading.set_intra_op_parallelism_threads(cores)
    features = {k: tf.io.FixedLenFeature([n], tf.float32 if k == "masked_lm_weights" else tf.int64)
                for k, n in _bert_shapes(plan).items()}
    files = plan["files"]
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=min(len(files), cores))
    ds = ds.shuffle(plan["shuffle_buffer"], seed=plan["seed"]).repeat()  # reshuffled every epoch
    ds = ds.batch(plan["batch_size"], drop_remainder=True)
    ds = ds.map(lambda records: tf.io.parse_example(records, features), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.threading.private_threadpool_size = cores
    yield from ds.with_options(options).as_numpy_iterator()


PIPELINES: Dict[str, Callable[[Dict], Iterator[Dict]]] = {
    **{f"resnet50-dlstore-{s}": resnet50_dlstore for s in _DLSTORE_SHUFFLES},
    "resnet50-dali": resnet50_dali,
    "resnet50-tfdata": resnet50_tfdata,
    "resnet50-torch": resnet50_torch,
    **{f"bert-dlstore-{s}": bert_dlstore for s in _DLSTORE_SHUFFLES},
    "bert-dali": bert_dali,
    "bert-tfdata": bert_tfdata,
}


def expected_spec(plan: Dict) -> Dict[str, List]:
    """The shapes and dtypes a contender's batches must have (the ``status`` check)."""
    b = plan["batch_size"]
    if plan["task"] == "bert":
        return {k: [[b, n], "float32" if k == "masked_lm_weights" else "int64"]
                for k, n in _bert_shapes(plan).items()}
    if plan["output"] == "uint8":
        image = [[b, CROP_SIZE, CROP_SIZE, 3], "uint8"]
    elif plan["family"] == "tfdata":
        image = [[b, CROP_SIZE, CROP_SIZE, 3], "float32"]
    else:
        image = [[b, 3, CROP_SIZE, CROP_SIZE], "float32"]
    return {"image": image, "label": [[b], "int64"]}


def _jsonable_stats(stats) -> Dict:
    """The loader's ``stats()`` with only what JSON can hold (numbers, strings, lists, dicts)."""
    try:
        return json.loads(json.dumps(stats, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)))
    except (TypeError, ValueError):
        return {"repr": repr(stats)}


def worker(name: str, plan_path: str) -> int:
    """``--worker NAME``: pins itself to the plan's cores, measures one contender once and prints
    one JSON result line: the measurement, ``{"unavailable": why}`` or ``{"error": why}``."""
    with open(plan_path) as f:
        plan = json.load(f)
    c = CONTENDERS[name]
    plan = dict(plan[c.task], cores=plan["cores"], seed=plan["seed"], family=c.family,
                dlstore_shuffle=c.dlstore_shuffle)
    # Pinned before any framework is imported, so every thread and worker process inherits it.
    os.sched_setaffinity(0, plan["cores"])
    out: Dict = {"name": name}
    try:
        batches = PIPELINES[name](plan)
        key = "image" if c.task == "resnet50" else "input_ids"
        out.update(measure(batches, key, plan["warmup"], plan["items"], plan["warmup_seconds"]))
        if "_stats" in plan:
            out["loader_stats"] = _jsonable_stats(plan["_stats"]())
    except ImportError as e:  # dlstore.pipeline not built yet, or a framework half-installed
        out = {"name": name, "unavailable": f"not available: {e}"}
    except Exception as e:  # noqa: BLE001 - reported in the contender's row, with the traceback on stderr
        traceback.print_exc()
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()] or [""]
        # DALI's messages run over many lines, the cause among the last ("Assert on ... failed: ...").
        cause = next((ln for ln in reversed(lines[1:]) if "failed" in ln.lower() or "error:" in ln.lower()),
                     lines[-1])
        text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {cause}"
        out = {"name": name, "error": f"{type(e).__name__}: {text}"[:400]}
    out["versions"] = _harness.framework_versions()
    print(RESULT_PREFIX + json.dumps(out), flush=True)
    sys.stderr.flush()
    os._exit(0)  # no framework teardown (DALI and DataLoader workers can take seconds to stop)


def run_worker(name: str, plan_path: str, timeout: float) -> Dict:
    """Runs ``--worker name`` in a fresh interpreter; returns its result, or ``{"error": why}``."""
    return _harness.run_worker(__file__, ["--worker", name, "--plan", plan_path], RESULT_PREFIX, timeout)


# ---- the run -------------------------------------------------------------------------------------

def default_sizes(args) -> Dict[str, str]:
    """The generated sets' presets: ``--quick`` tiny; else the cached 3 GB ImageNet-like set, or the
    1 GB one when it is not cached; BERT's 65,536 records."""
    if args.quick:
        return {"imagenet": args.size or "tiny", "bert": args.bert_size or "tiny"}
    image = args.size or ("3gb" if cached_paths("imagenet", "3gb") else "default")
    return {"imagenet": image, "bert": args.bert_size or "default"}


def task_plan(task: str, paths: List[str], args) -> Dict:
    """What the workers of one task need: files, DALI indexes, batch size and counts."""
    from dlstore.reader import open_records

    from read_throughput import index_files  # the same cached DALI indexes as the read benchmark

    probe = open_records(paths, io="auto")
    if probe.format != "tfrecord" or any(c != "none" for c in probe.compression):
        raise ValueError(f"{task}: the pipelines read uncompressed TFRecord files; these are {probe.format} "
                         f"({', '.join(sorted(set(probe.compression)))})")
    indexes, records, payload = index_files(paths)
    if task == "resnet50":
        batch = args.batch_size or (16 if args.quick else 256)
        items = args.images or (64 if args.quick else 7680)
        warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    else:
        batch = args.bert_batch_size or 64
        items = args.samples or (640 if args.quick else 320_000)
        warmup = args.warmup if args.warmup is not None else (1 if args.quick else 20)
    if records < batch:
        raise ValueError(f"{task}: {records} records, fewer than one batch of {batch}")
    return {"task": task, "files": paths, "indexes": indexes, "records": records, "payload_bytes": payload,
            "file_bytes": sum(os.path.getsize(p) for p in paths), "batch_size": batch, "items": items,
            "warmup": warmup, "warmup_seconds": args.warmup_seconds if args.warmup_seconds is not None else (
                0.0 if args.quick else 3.0), "output": args.output, "seq_len": BERT_SEQ_LEN,
            "shuffle_buffer": args.shuffle_buffer,
            "max_predictions": BERT_MAX_PREDICTIONS}


def run_all(selected: Sequence[str], plan: Dict, repeat: int, timeout: float) -> Dict[str, Dict]:
    """Runs the selected contenders, each in its own process, in ``repeat`` rotating rounds; returns
    per name ``{"runs": [...]}``, ``{"skipped": why}`` or ``{"error": why}``."""
    from dlstore.bench.cache import make_warm, resident_fraction

    results: Dict[str, Dict] = {}
    runnable = []
    for name in selected:
        reason = missing_reason(CONTENDERS[name])
        if reason:
            results[name] = {"skipped": reason}
            print(f"{CONTENDERS[name].label:<26} {reason}", flush=True)
        else:
            runnable.append(name)
    with tempfile.TemporaryDirectory(prefix="dlstore-pipelines-") as tmp:
        plan_path = os.path.join(tmp, "plan.json")
        with open(plan_path, "w") as f:
            json.dump(plan, f)
        for r in range(repeat):
            order = runnable[r % len(runnable):] + runnable[:r % len(runnable)] if runnable else []
            print(f"round {r + 1} of {repeat}: {', '.join(order)}", flush=True)
            for name in order:
                if "error" in results.get(name, {}) or "skipped" in results.get(name, {}):
                    continue  # failed or unavailable in its first round: not retried
                c = CONTENDERS[name]
                # Pipelines on data in RAM, not the disk (a neighbour may have dropped the cache).
                make_warm(plan[c.task]["files"])
                cached = resident_fraction(plan[c.task]["files"])
                got = run_worker(name, plan_path, timeout)
                if "unavailable" in got:
                    results[name] = {"skipped": got["unavailable"], "versions": got.get("versions", {})}
                    print(f"{c.label:<26} {got['unavailable']}", flush=True)
                    continue
                if "error" in got:
                    print(f"{c.label:<26} failed in round {r + 1}: {got['error']}", flush=True)
                    if "runs" in results.get(name, {}):
                        results[name].setdefault("round_errors", []).append(got["error"])
                    else:
                        results[name] = got
                    continue
                got["cached_before"] = cached
                unit = TASKS[c.task]["unit"]
                print(f"{c.label:<26} {got['items_per_s']:10,.0f} {unit}/s  {got['cpu_ms_per_item']:.3f} CPU ms "
                      f"each  (startup {got['startup_seconds']:.1f} s)", flush=True)
                entry = results.setdefault(name, {"runs": [], "versions": got.get("versions", {})})
                entry["runs"].append(got)
    return results


def task_rows(task: str, selected: Sequence[str], results: Dict[str, Dict], plan: Dict) -> List[Dict]:
    """One task's table: a row per selected contender (measured, skipped or failed), with ratios."""
    rows = []
    for name in (n for n in selected if CONTENDERS[n].task == task):
        c, res = CONTENDERS[name], results.get(name, {})
        row: Dict = {"name": name, "contender": c.label, "family": c.family, "crc": c.crc,
                     "shuffle": c.dlstore_shuffle or f"buffer {plan['shuffle_buffer']:,}"}
        if "skipped" in res:
            rows.append(dict(row, status=res["skipped"]))
            continue
        if "error" in res:
            rows.append(dict(row, status=f"failed: {res['error']}"))
            continue
        runs = res["runs"]
        for key in ("items_per_s", "cpu_ms_per_item", "busiest_core_pct", "others_cpu_pct", "startup_seconds",
                    "cached_before"):
            row[key] = _harness.median([r.get(key) for r in runs])
        row["rss_mb"] = _harness.median([r["rss_bytes"] / 1e6 for r in runs])
        spread = report.summarize([r["items_per_s"] for r in runs])["spread_pct"]
        row["spread_pct"] = spread if len(runs) > 1 else None
        spec = runs[0]["spec"]
        row["spec"] = spec
        key = "image" if task == "resnet50" else "input_ids"
        shape, dtype = spec.get(key, [[], "?"])
        row["output"] = f"{dtype} {'x'.join(str(d) for d in shape)}"
        expected = expected_spec(dict(plan, family=c.family))
        wrong = sorted(k for k in expected if spec.get(k) != expected[k])
        row["status"] = "ok" if not wrong else "wrong output: " + "; ".join(
            f"{k} {spec.get(k)} (expected {expected[k]})" for k in wrong)
        if res.get("round_errors"):
            row["status"] += f" ({len(res['round_errors'])} round(s) failed: {res['round_errors'][0]})"
        if "loader_stats" in runs[-1]:
            stats = row["loader_stats"] = runs[-1]["loader_stats"]
            row["how"] = "; ".join(f"{k} {stats[k]}" for k in ("engine", "threads", "decoder", "parser", "shuffle")
                                   if stats.get(k) is not None)
        row["runs"] = runs
        rows.append(row)
    add_ratios(rows)
    unit = TASKS[task]["unit"]
    for row in rows:  # the JSON names: images_per_s / samples_per_s
        if "items_per_s" in row:
            row[f"{unit}_per_s"] = row["items_per_s"]
    return rows


def add_ratios(rows: List[Dict]) -> None:
    """``vs_dali``, ``vs_tfdata`` and ``vs_torch``: items/s over that (shuffled) peer's items/s, same task;
    ``vs_none``: a dlstore row over dlstore's unshuffled row."""
    ok = [r for r in rows if r.get("items_per_s") and str(r.get("status", "")).startswith("ok")]
    base = {r["family"]: r["items_per_s"] for r in ok if r["family"] != "dlstore"}
    for r in ok:
        if r["family"] == "dlstore" and r.get("shuffle") == "none":
            base["none"] = r["items_per_s"]
    for r in rows:
        if not r.get("items_per_s"):
            continue
        for family in FAMILY_LABELS:
            if base.get(family):
                r[f"vs_{family}"] = r["items_per_s"] / base[family]
        if r["family"] == "dlstore" and base.get("none"):
            r["vs_none"] = r["items_per_s"] / base["none"]


# Issue 8's targets: dlstore's global shuffle against its own unshuffled read and the shuffled peers.
BERT_GLOBAL_VS_DALI = 3.0       # samples/s >= this x DALI readers.tfrecord (random_shuffle)
BERT_GLOBAL_VS_NONE = 0.8       # samples/s >= this x dlstore unshuffled
RESNET50_GLOBAL_VS_NONE = 0.95  # images/s >= this x dlstore unshuffled
RESNET50_GLOBAL_VS_DALI = 1.5   # images/s >= this x DALI CPU (random_shuffle)
RESNET50_GLOBAL_VS_TFDATA = 1.2  # images/s >= this x tf.data (.shuffle(N))


def targets(tables: Dict[str, List[Dict]]) -> List[Dict]:
    """Issue 8's targets (shuffled), each with the measured ratio and PASS, FAIL or SKIP (why)."""
    def rate(task: str, family: str, shuffle: Optional[str] = None) -> Optional[float]:
        for r in tables.get(task, []):
            if r["family"] == family and (shuffle is None or r.get("shuffle") == shuffle) \
                    and str(r.get("status", "")).startswith("ok"):
                return r.get("items_per_s")
        return None

    def verdict(target: str, mine: Optional[float], peer: Optional[float], peer_name: str, factor: float) -> Dict:
        if mine is None or not peer:
            missing = (["dlstore global"] if mine is None else []) + ([peer_name] if not peer else [])
            return {"target": target, "value": None, "text": "-",
                    "verdict": f"SKIP ({', '.join(missing)} not measured)"}
        ratio = mine / peer
        return {"target": target, "value": ratio, "text": f"{ratio:.2f}x {peer_name}",
                "verdict": "PASS" if ratio >= factor else "FAIL"}

    out = []
    if "bert" in tables:
        mine = rate("bert", "dlstore", "global")
        out.append(verdict(f"bert: dlstore global >= {BERT_GLOBAL_VS_DALI:g} x DALI (shuffled) samples/s", mine,
                           rate("bert", "dali"), "DALI", BERT_GLOBAL_VS_DALI))
        out.append(verdict(f"bert: dlstore global >= {BERT_GLOBAL_VS_NONE:g} x dlstore unshuffled", mine,
                           rate("bert", "dlstore", "none"), "dlstore none", BERT_GLOBAL_VS_NONE))
    if "resnet50" in tables:
        mine = rate("resnet50", "dlstore", "global")
        out.append(verdict(f"resnet50: dlstore global >= {RESNET50_GLOBAL_VS_NONE:g} x dlstore unshuffled", mine,
                           rate("resnet50", "dlstore", "none"), "dlstore none", RESNET50_GLOBAL_VS_NONE))
        out.append(verdict(f"resnet50: dlstore global >= {RESNET50_GLOBAL_VS_DALI:g} x DALI CPU (shuffled)", mine,
                           rate("resnet50", "dali"), "DALI", RESNET50_GLOBAL_VS_DALI))
        out.append(verdict(f"resnet50: dlstore global >= {RESNET50_GLOBAL_VS_TFDATA:g} x tf.data .shuffle(N)",
                           mine, rate("resnet50", "tfdata"), "tf.data", RESNET50_GLOBAL_VS_TFDATA))
    return out


def columns(task: str) -> List[report.Column]:
    unit = TASKS[task]["unit"]
    cols = [
        report.Column("contender", "contender", align="<"),
        report.Column("shuffle", "shuffle", align="<"),
        report.Column("output", "output", align="<"),
        report.Column("crc", "CRC", lambda v: "yes" if v else "no", align="<"),
        report.Column("items_per_s", f"{unit}/s", "{:,.0f}"),
        report.Column("cpu_ms_per_item", f"CPU ms/{unit[:-1]}", "{:.3f}" if task == "resnet50" else "{:.4f}"),
    ]
    families = ("dali", "tfdata", "torch") if task == "resnet50" else ("dali", "tfdata")
    cols += [report.Column(f"vs_{f}", f"vs {FAMILY_LABELS[f]}", report.fmt_ratio) for f in families]
    cols += [report.Column("vs_none", "vs dlstore none", report.fmt_ratio)]
    cols += [
        report.Column("spread_pct", "spread", lambda v: f"{v:.0f}%"),
        report.Column("busiest_core_pct", "busiest core", lambda v: f"{v:.0f}%"),
        report.Column("others_cpu_pct", "others", lambda v: f"{v:.0f}%"),
        report.Column("rss_mb", "RSS", lambda v: f"{v:,.0f} MB"),
        report.Column("startup_seconds", "first batch", lambda v: f"{v:.1f} s"),
        report.Column("status", "status", align="<"),
    ]
    return cols


TARGET_COLUMNS = [
    report.Column("target", "target (issue 8: shuffled, warm cache)", align="<"),
    report.Column("text", "measured", align="<"),
    report.Column("verdict", "verdict", align="<"),
]
SEMANTICS_COLUMNS = [
    report.Column("contender", "contender", align="<"),
    report.Column("shuffle", "shuffle", align="<"),
    report.Column("crc", "CRC", lambda v: "yes" if v else "no", align="<"),
    report.Column("decode", "read + decode", align="<"),
    report.Column("resize", "crop, resize, flip, normalise", align="<"),
    report.Column("output", "output", align="<"),
]
SAME_FOR_ALL = [
    ("RandomResizedCrop", f"area {AREA_RANGE[0]:g}..{AREA_RANGE[1]:g} of the image, aspect ratio 3/4..4/3, "
     f"{CROP_ATTEMPTS} attempts; horizontal flip with probability 1/2; with `--output float`, ImageNet mean "
     f"{MEAN} and std {STD} (times 255 on 0..255 pixels)"),
    ("order", "every contender shuffles, as training reads (the `shuffle` column of each table and below): the "
     "peers through a shuffle buffer of `--shuffle-buffer` records, dlstore through `dlstore.Dataset`; dlstore's "
     "`none` row reads unshuffled, the reference its shuffles are compared with (tf.data interleaves as many "
     "files as there are cores)"),
    ("cores", "each contender pinned to the same cores (`sched_setaffinity`, inherited by every thread "
     "and worker process); DALI's `num_threads`, tf.data's private thread pool (AUTOTUNE within it) and "
     "the DataLoader's workers set to that many; dlstore with its default: a decoding thread per core for "
     "ResNet-50, one parsing thread for BERT (at batch 64 a pool costs more in hand-offs than it saves)"),
]
DIFFERENCES = [
    "**Crop sampling.** dlstore, the PIL contender (torchvision's algorithm) and DALI draw the area "
    "fraction uniformly and the aspect ratio log-uniformly. tf.data's `sample_distorted_bounding_box` "
    "draws the ratio uniformly, then the crop height uniformly among those meeting the area range, which "
    "favours small crops: `python benchmarks/crop_area.py` (2,000 draws on a 400 x 400 image) gives a "
    "median crop of 0.38 of the image against 0.47 for RandomResizedCrop. Smaller crops mean fewer rows "
    "to decode and fewer pixels to "
    "resize, so this favours tf.data here. When all 10 draws miss (rare for ImageNet-sized images) dlstore "
    "and torchvision take the whole image clamped to the ratio range, centred; DALI the same at a random "
    "position; tf.data the whole image.",
    "**Decode scale and resize filter.** dlstore decodes the crop at the smallest DCT scale M/8 that "
    "still covers 224 px (1/8, 2/8, 4/8 or 8/8: libjpeg-turbo's scaled IDCT does part of the "
    "downscaling), then resizes the rest with antialiased bilinear, PIL's and torchvision's filter. "
    "DALI and tf.data decode the crop window at full scale; PIL decodes the "
    "whole image at full scale (torchvision does not use Pillow's draft mode). PIL's BILINEAR and DALI's "
    "linear resize are antialiased when scaling down (the filter widens with the scale); "
    "`tf.image.resize` bilinear is not (TF's default, as in TF's official ImageNet input): cheaper, and "
    "aliased on large crops.",
    "**Output.** With `--output uint8` (the default) every contender gives uint8 NHWC and no "
    "normalisation (tf.data rounds its float resize output). With `--output float` dlstore, DALI and "
    "PyTorch give float32 NCHW; tf.data gives float32 NHWC, TF's own layout, since a transpose would cost "
    "it work no TF user pays. Float output costs tf.data most (compare the CPU ms per image of the "
    "`--output float` and `--output uint8` runs); DALI's cost hardly changes, its "
    "`crop_mirror_normalize` doing the same pass either way.",
    "**CRC.** dlstore and tf.data check each TFRecord's CRC-32C; DALI and the `tfrecord` package do not.",
    "**tf.data determinism.** The ResNet-50 pipeline runs with `deterministic = False`, so a slow image "
    "does not hold up its batch (it can only help tf.data's throughput); the others keep record order.",
    "**Labels** are the stored `image/class/label` (1..1000) everywhere, as int64.",
]


def plan_line(task: str, plan: Dict) -> str:
    """One task's data and counts, for the header and the markdown page."""
    warmup = f"{plan['warmup']} warm-up batch" + ("es" if plan["warmup"] != 1 else "")
    if plan.get("warmup_seconds"):
        warmup += f" and {plan['warmup_seconds']:g} s"
    return (f"{len(plan['files'])} TFRecord files, {report.fmt_bytes(plan['file_bytes'])}, {plan['records']:,} "
            f"records (mean {report.fmt_bytes(plan['payload_bytes'] / max(plan['records'], 1))}), "
            f"{'set ' + plan['size'] if plan.get('size') else 'from --data'}; batch {plan['batch_size']}, {warmup}, "
            f"then {plan['items']:,} {TASKS[task]['unit']} timed; peers' shuffle buffer {plan['shuffle_buffer']:,} "
            f"records; "
            + (f"output {plan['output']}" if task == "resnet50" else f"seq {plan['seq_len']}"))


def _markdown_doc(doc: Dict) -> str:
    """The results as a markdown page (docs/pipelines.md): setup, semantics, tables, targets."""
    info = doc["sysinfo"]
    versions = [f"dlstore {info['dlstore']}", f"Python {info['python']}"]
    versions += [f"{k} {v}" for k, v in sorted(doc["versions"].items())]
    rounds = f"{doc['repeat']} round{'s' if doc['repeat'] != 1 else ''}"
    lines = [
        "# Input pipelines: dlstore beside DALI (CPU), tf.data and PyTorch + PIL",
        "",
        f"Written by `{' '.join(doc['command'])}` on {doc['date']}.",
        "",
        (f"- **Machine**: {info['cpu']}, {info['cores']} cores, {info['memory_bytes'] / 1e9:.0f} GB RAM, "
         f"{info['kernel']}; {info['crc']}; GPU: {info['gpu']}"),
        (f"- **Cores**: every contender pinned to CPUs {doc['cores']}; DALI, tf.data and PyTorch with "
         f"{len(doc['cores'])} threads or DataLoader workers, dlstore with its default thread count for those "
         "cores (under its table)"),
    ]
    lines += [f"- **{TASKS[task]['title']}**: {plan_line(task, plan)}" for task, plan in doc["plans"].items()]
    lines += [
        (f"- **Method**: {rounds}; each round runs every contender once in its own process (the order "
         "rotating), the page cache warmed before each; figures are medians over rounds; spread = (max - min) / "
         "median; CPU ms per item is the process tree's user + system time (all threads, DataLoader workers "
         "included); `busiest core` is system-wide; RSS is the process tree's at the end, shared pages "
         "counted in each process; `first batch` is the time to build the pipeline and draw one batch."),
        (f"- **Load**: 1-minute load average {doc['load_average']:.2f} before the run; `others` is the busy "
         "time of the cores not spent by the contender's processes during its timed batches (other "
         "processes, interrupts, hypervisor steal), as a share of all cores: near 0% on an idle machine; "
         "more means other work competed for the cores and the absolute rates are low (the ratios suffer "
         "less, the rounds spreading the drift over all contenders)"),
        "- **Versions**: " + ", ".join(versions),
        "",
    ]
    for task, rows in doc["tables"].items():
        lines += [f"## {TASKS[task]['title']}", "", report.markdown_table(rows, columns(task))]
        lines += [f"{r['contender']}: {r['how']}." for r in rows if r.get("how")] + [""]
    lines += ["## Targets", "", report.markdown_table(doc["targets"], TARGET_COLUMNS)]
    if doc.get("quick"):
        lines += ["`--quick`: a smoke test on tiny sets; start-up costs dominate and the ratios say nothing "
                  "about the targets.", ""]
    lines += ["## What each contender does", "", "The same in all of them:", ""]
    lines += [f"- **{k}**: {v}" for k, v in SAME_FOR_ALL]
    lines += [""]
    for task in doc["tables"]:
        rows = [dict(vars(c), contender=c.label) for c in CONTENDERS.values() if c.task == task]
        cols = SEMANTICS_COLUMNS if task == "resnet50" else [c for c in SEMANTICS_COLUMNS if c.key != "resize"]
        lines += [f"### {TASKS[task]['title']}", "", report.markdown_table(rows, cols)]
    lines += ["### Where the semantics differ", ""] + [f"- {d}" for d in DIFFERENCES] + [""]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    from dlstore.bench.storage import SIZES
    from dlstore.synthetic import PRESETS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", metavar="GLOB", help="ImageNet-like TFRecord files (default: a generated set)")
    p.add_argument("--size", choices=SIZES, default=None,
                   help="generated ImageNet-like set without --data (default: 3gb when cached, else default; "
                        "tiny with --quick)")
    p.add_argument("--bert-data", metavar="GLOB", help="BERT pretraining TFRecord files (default: a generated set)")
    p.add_argument("--bert-size", choices=tuple(PRESETS["bert"]), default=None,
                   help="generated BERT set without --bert-data (default: default, 65,536 records; tiny with --quick)")
    p.add_argument("--only", metavar="NAMES",
                   help="comma-separated contenders, families or tasks: " + ", ".join(CONTENDERS))
    p.add_argument("--output", choices=OUTPUTS, default="uint8",
                   help="ResNet-50 batches: uint8 (NHWC, not normalised) or float (float32, normalised; NCHW, "
                        "tf.data NHWC) (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=None, help="ResNet-50 batch (default: 256; 16 with --quick)")
    p.add_argument("--bert-batch-size", type=int, default=None, help="BERT batch (default: 64)")
    p.add_argument("--images", type=int, default=None,
                   help="ResNet-50 images timed after the warm-up (default: 7680; 64 with --quick)")
    p.add_argument("--samples", type=int, default=None,
                   help="BERT samples timed after the warm-up (default: 320000; 640 with --quick)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed batches first, the first included (default: 2 ResNet-50, 20 BERT; 1 with --quick)")
    p.add_argument("--warmup-seconds", type=float, default=None,
                   help="and at least this long after the first batch (default: 3; 0 with --quick)")
    p.add_argument("--cores", type=int, default=2, help="CPUs every contender is pinned to (default: %(default)s)")
    p.add_argument("--repeat", type=int, default=None, metavar="N",
                   help="rounds, one measurement per contender each (default: 3; 1 with --quick)")
    p.add_argument("--seed", type=int, default=0, help="shuffle and augmentation seed (default: %(default)s)")
    p.add_argument("--shuffle-buffer", type=int, default=10_000, metavar="N",
                   help="records in the peers' shuffle buffers: DALI's initial_fill, tf.data's shuffle, the "
                        "DataLoader's (split among its workers) (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="tiny sets, small counts, one round: a smoke test")
    _harness.add_output_arguments(p, "pipelines")
    p.add_argument("--markdown", metavar="FILE", help="also write the tables as a markdown page")
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed to each contender's process")
    p.add_argument("--render", metavar="JSON",
                   help="measure nothing: write --markdown from the results JSON of an earlier run")
    p.add_argument("--worker", metavar="NAME", help=argparse.SUPPRESS)
    p.add_argument("--plan", help=argparse.SUPPRESS)
    return p


def select(only: Optional[str]) -> List[str]:
    """Contender names from ``--only`` (names, families or tasks), in table order; ValueError naming what is unknown."""
    return _harness.select(only, CONTENDERS, ("family", "task"))


def main(argv: Optional[List[str]] = None) -> int:
    from dlstore.errors import DlstoreError

    p = build_parser()
    args = p.parse_args(argv)
    if args.worker:
        if args.worker not in CONTENDERS or not args.plan:
            p.error(f"--worker takes a contender name and --plan, not {args.worker!r}")
        return worker(args.worker, args.plan)
    if args.render:
        return _harness.render(args.render, args.markdown, _markdown_doc)
    try:
        selected = select(args.only)
        json_path = _harness.results_path("pipelines", json_path=args.json, save=args.save, quick=args.quick)
    except ValueError as e:
        p.error(str(e))
    repeat = args.repeat or (1 if args.quick else 3)
    for flag in ("repeat", "cores", "batch_size", "bert_batch_size", "images", "samples"):
        value = repeat if flag == "repeat" else getattr(args, flag)
        if value is not None and value < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    allowed = sorted(os.sched_getaffinity(0))
    cores = allowed[:args.cores]

    sizes = default_sizes(args)
    tasks = [t for t in TASKS if any(CONTENDERS[n].task == t for n in selected)]
    plans: Dict[str, Dict] = {}
    try:
        for task in tasks:
            kind, data = ("imagenet", args.data) if task == "resnet50" else ("bert", args.bert_data)
            plans[task] = task_plan(task, dataset_paths(data, sizes[kind], kind), args)
            plans[task]["size"] = None if data else sizes[kind]
    except (DlstoreError, ValueError) as e:
        print(f"pipelines: {e}", file=sys.stderr)
        return 2

    info = sysinfo.collect(plans[tasks[0]]["files"] if tasks else [])
    extra = [("cores", f"CPUs {cores} for every contender" + (
        f" (only {len(cores)} of the {args.cores} asked for are available)" if len(cores) < args.cores else ""))]
    extra += [(task, plan_line(task, plan)) for task, plan in plans.items()]
    extra.append(("rounds", str(repeat)))
    load_before = os.getloadavg()[0]
    extra.append(("load", f"1-minute load average {load_before:.2f} (other work competes for the cores)"))
    print(sysinfo.format_header(info, extra=extra) + "\n", flush=True)

    results = run_all(selected, dict(plans, cores=cores, seed=args.seed), repeat, args.timeout)
    tables = {task: task_rows(task, selected, results, plans[task]) for task in tasks}
    for task, rows in tables.items():
        print(f"\n{TASKS[task]['title'].upper()}")
        print(report.text_table(rows, columns(task)))
    for row in (r for rows in tables.values() for r in rows if r.get("how")):
        print(f"{row['contender']}: {row['how']}")
    verdicts = targets(tables)
    if verdicts:
        print()
        print(report.text_table(verdicts, TARGET_COLUMNS))
    print("\nCRC: dlstore and tf.data check every record's CRC-32C; DALI and the tfrecord package do not. "
          "docs/pipelines.md lists the other differences.")
    if args.quick:
        print("--quick: a smoke test on tiny sets; start-up costs dominate and the ratios say nothing about "
              "the targets.")

    doc = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": ["python", "benchmarks/pipelines.py"] + list(sys.argv[1:] if argv is None else argv),
        "sysinfo": info, "cores": cores, "repeat": repeat, "load_average": load_before, "quick": args.quick,
        "seed": args.seed,
        "plans": {t: {k: v for k, v in plan.items() if k != "indexes"} for t, plan in plans.items()},
        "tables": tables, "targets": verdicts,
        "versions": {k: v for r in results.values() for k, v in r.get("versions", {}).items()},
    }
    _harness.write_outputs(doc, json_path, args.markdown, _markdown_doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
