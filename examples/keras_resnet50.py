"""Fit Keras's ResNet-50 (random initial weights) on TFRecord shards read by dlstore.

dlstore's ResNet-50 train pipeline (random-resized crop decoded in C++, flip; uint8 NHWC) becomes a
``tf.data.Dataset`` through :func:`dlstore.adapters.tensorflow.as_tf_dataset`, with a proper
``element_spec``; the cast and ImageNet normalisation run as one ``map`` over whole batches.

    python examples/keras_resnet50.py --steps 3 --batch-size 4
    python examples/keras_resnet50.py --steps 2 --batch-size 2 --image-size 64 --eager   # the smoke test's run

``--image-size`` sets both the crop and the model's input (Keras's ResNet50 accepts 32 px and up):
a CPU step at 64 px costs a fraction of one at 224. ``--eager`` skips tracing the training step
into a graph, which for ResNet-50 takes longer than a few eager steps.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported: no start-up chatter

import tensorflow as tf  # noqa: E402

import dlstore.synthetic  # noqa: E402
from dlstore.adapters.tensorflow import as_tf_dataset  # noqa: E402
from dlstore.pipeline import IMAGENET_MEAN, IMAGENET_STD, resnet50_loader  # noqa: E402
from dlstore.placement.world import detect_world  # noqa: E402

# TensorFlow's ImageNet converter writes labels 1..1000 (0 is "background"); 1001 outputs, as TF's ResNets.
NUM_CLASSES = 1001
MEAN = tf.constant(IMAGENET_MEAN) * 255.0
STD = tf.constant(IMAGENET_STD) * 255.0


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="record files (glob, directory); default: the tiny synthetic set")
    parser.add_argument("--steps", type=int, default=5, help="training steps (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=224, help="crop and model input size (at least 32)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eager", action="store_true",
                        help="run the steps eagerly: no graph tracing, quicker for a handful of steps (the smoke test)")
    args = parser.parse_args(argv)

    world = detect_world()
    if world.size > 1:
        print(f"{world.describe()}: this example trains one model per process; see examples/README.md "
              f"for data-parallel launch lines", flush=True)
    tf.keras.utils.set_random_seed(args.seed)
    paths = args.data or dlstore.synthetic.cached_dataset("imagenet", "tiny", progress=world.rank == 0)

    # endless epochs (a new crop of each image every epoch); DROP keeps the batch dimension fixed
    loader = resnet50_loader(paths, batch_size=args.batch_size, train=True, layout="NHWC", dtype="uint8",
                             size=args.image_size, seed=args.seed, last_batch="DROP", epochs=None)
    dataset = as_tf_dataset(loader)
    print("element_spec:", dataset.element_spec, flush=True)

    def to_model_inputs(batch):
        image = (tf.cast(batch["image"], tf.float32) - MEAN) / STD
        return image, batch["label"]

    dataset = dataset.map(to_model_inputs, num_parallel_calls=1).prefetch(1)
    model = tf.keras.applications.ResNet50(weights=None, input_shape=(args.image_size, args.image_size, 3),
                                           classes=NUM_CLASSES)
    model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=args.lr, momentum=0.9),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=False), metrics=["accuracy"],
                  run_eagerly=args.eager)
    start = time.perf_counter()
    history = model.fit(dataset, epochs=1, steps_per_epoch=args.steps, verbose=2, shuffle=False)
    elapsed = time.perf_counter() - start
    loader.close()
    print(f"done: {args.steps} steps of {args.batch_size} images in {elapsed:.1f} s; "
          f"loss {history.history['loss'][-1]:.4f}; loader read {loader.stats()['samples']} images "
          f"through the {loader.stats().get('engine')} engine", flush=True)


if __name__ == "__main__":
    main()
