"""tf.data's contenders: ``TFRecordDataset`` with ``.shuffle(N)``, then the ResNet-50 map or a batched
``parse_example`` for BERT, AUTOTUNE on the pinned cores. TensorFlow is imported only when a
contender runs."""
from __future__ import annotations

from typing import Dict, Iterator

from benchmarks.contenders.spec import AREA_RANGE, CROP_ATTEMPTS, CROP_SIZE, MEAN, RATIO_RANGE, STD, bert_shapes

__all__ = ["resnet50_tfdata", "bert_tfdata"]


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


def bert_tfdata(plan: Dict) -> Iterator[Dict]:
    """tf.data: ``TFRecordDataset`` -> ``batch`` -> ``parse_example`` (AUTOTUNE) -> prefetch."""
    import tensorflow as tf

    cores = len(plan["cores"])
    tf.config.threading.set_inter_op_parallelism_threads(cores)
    tf.config.threading.set_intra_op_parallelism_threads(cores)
    features = {k: tf.io.FixedLenFeature([n], tf.float32 if k == "masked_lm_weights" else tf.int64)
                for k, n in bert_shapes(plan).items()}
    files = plan["files"]
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=min(len(files), cores))
    ds = ds.shuffle(plan["shuffle_buffer"], seed=plan["seed"]).repeat()  # reshuffled every epoch
    ds = ds.batch(plan["batch_size"], drop_remainder=True)
    ds = ds.map(lambda records: tf.io.parse_example(records, features), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.threading.private_threadpool_size = cores
    yield from ds.with_options(options).as_numpy_iterator()
