"""Data-parallel training with Horovod on ImageNet-style TFRecords read by dlstore.

Horovod is the source of truth for who this process is: ``hvd.init()``, then dlstore's
``Dataset`` gets ``hvd.rank()``/``hvd.size()`` (and the local ones) explicitly, so each rank reads
its own share of the records, every record once per epoch across ranks, whatever launched the job.
The model is deliberately tiny (a few convolutions on small ResNet-50-style crops): the point is the
data path and Horovod's ``DistributedOptimizer``, not the network. Build Horovod first
(``bash examples/install_horovod.sh``; see examples/README.md), then::

    horovodrun --gloo -np 2 -H localhost:2 python examples/horovod_resnet50.py --steps 5
    mpirun -np 2 --oversubscribe --allow-run-as-root python examples/horovod_resnet50.py --steps 5
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn

from data_parallel import log, threads_per_rank

import dlstore
import dlstore.synthetic
from dlstore.adapters.torch import TorchLoader
from dlstore.pipeline import Loader, ResNet50
from dlstore.placement.world import detect_world

NUM_CLASSES = 1001  # labels 1..1000 as TensorFlow's ImageNet converter writes them (0: background)


def tiny_convnet(num_classes: int = NUM_CLASSES) -> nn.Module:
    """Three strided convolutions and a linear head: enough to train, small enough for a CPU smoke run."""
    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(inplace=True))
    return nn.Sequential(block(3, 16), block(16, 32), block(32, 64), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, num_classes))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="record files (glob, directory); default: the tiny synthetic set")
    parser.add_argument("--steps", type=int, default=5, help="training steps (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=8, help="images per rank per step")
    parser.add_argument("--image-size", type=int, default=64, help="crop size fed to the model")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate, scaled by the number of ranks")
    parser.add_argument("--seed", type=int, default=0, help="seeds the data order, augmentation and weights")
    args = parser.parse_args(argv)

    try:
        import horovod.torch as hvd
    except ImportError as e:
        sys.exit(f"horovod.torch does not import ({e}): build it with bash examples/install_horovod.sh")
    hvd.init()
    # dlstore takes the world from Horovod rather than from the launcher's variables.
    world = detect_world(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                         local_size=hvd.local_size())

    torch.manual_seed(args.seed)
    torch.set_num_threads(threads_per_rank(world))
    paths = args.data or dlstore.synthetic.cached_dataset("imagenet", "tiny", progress=world.rank == 0)
    # remainder="drop": every rank gets the same number of full batches, so none waits in an allreduce
    # for a batch that never comes.
    dataset = dlstore.Dataset(paths, world=world, shuffle="block", seed=args.seed, remainder="drop")
    log(world, f"Horovod rank {hvd.rank()} of {hvd.size()} "
        f"(local {hvd.local_rank()} of {hvd.local_size()}); reads {dataset.describe()}")
    loader = Loader(dataset, ResNet50(train=True, layout="NCHW", dtype="float32", size=args.image_size),
                    args.batch_size, last_batch="DROP", seed=args.seed, epochs=None)
    batches = TorchLoader(loader)

    model = tiny_convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    # Horovod averages the gradients in the optimizer's step; the ranks start from rank 0's weights.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    loss_fn = nn.CrossEntropyLoss()

    start = time.perf_counter()
    step = samples = 0
    for batch in batches:
        images, labels = batch["image"], batch["label"].long().flatten()
        loss = loss_fn(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        samples += len(labels)
        log(world, f"step {step} loss {loss.item():.4f} images {tuple(images.shape)}")
        if step == args.steps:
            break
    loader.close()
    if step == 0:
        sys.exit(f"rank {world.rank} got no full batch of {args.batch_size}: use a smaller --batch-size")
    elapsed = time.perf_counter() - start
    images_per_s = hvd.allreduce(torch.tensor(samples / elapsed), op=hvd.Sum).item()
    # The same weights on every rank after the averaged steps: the checksums printed agree.
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    log(world, f"done: {step} steps, {samples} images in {elapsed:.1f} s; all ranks {images_per_s:.1f} images/s; "
        f"parameter checksum {checksum:.6f}")


if __name__ == "__main__":
    main()
