"""DALI's contenders, on the CPU (``device_id=None``): ``readers.tfrecord`` with random-crop decoding,
resize and ``crop_mirror_normalize`` for ResNet-50, the seven features for BERT. DALI is imported
only when a contender runs."""
from __future__ import annotations

from typing import Dict, Iterator

import numpy as np

from benchmarks.contenders.spec import AREA_RANGE, CROP_ATTEMPTS, CROP_SIZE, MEAN, RATIO_RANGE, STD, bert_shapes

__all__ = ["resnet50_dali", "bert_dali"]


def resnet50_dali(plan: Dict) -> Iterator[Dict]:
    """DALI on the CPU: ``readers.tfrecord`` -> ``decoders.image_random_crop`` -> ``resize`` ->
    ``crop_mirror_normalize`` (random mirror), ``device_id=None``, ``num_threads`` = the cores."""
    import nvidia.dali.tfrecord as tfrec
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


def bert_dali(plan: Dict) -> Iterator[Dict]:
    """DALI ``readers.tfrecord`` with the seven features, ``device_id=None``; each output as numpy."""
    import nvidia.dali.tfrecord as tfrec
    from nvidia.dali import fn, pipeline_def

    shapes = bert_shapes(plan)
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
