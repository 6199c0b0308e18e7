"""The PyTorch contender: a ``DataLoader`` over an ``IterableDataset`` that reads the TFRecord files
with the ``tfrecord`` package and augments with PIL as torchvision does (RandomResizedCrop, flip,
ToTensor + Normalize). torch, PIL and tfrecord are imported only when it runs."""
from __future__ import annotations

import io
import math
import random
from typing import Dict, Iterator, List

import numpy as np

from benchmarks.contenders.spec import AREA_RANGE, CROP_ATTEMPTS, CROP_SIZE, MEAN, RATIO_RANGE, STD

__all__ = ["random_resized_crop", "resnet50_torch"]


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
