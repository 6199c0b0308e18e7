"""Train ResNet-50 in PyTorch on TFRecord shards read by dlstore.

The model is written out below in plain torch (no torchvision). Data: dlstore's ResNet-50 train
pipeline (random-resized crop decoded in C++, flip, normalise, NCHW float32) behind a
``DlstoreIterableDataset``, so each rank and each DataLoader worker reads its own share of the
records, every record once per epoch.

One process (a few CPU steps on the tiny synthetic set)::

    python examples/pytorch_resnet50.py --steps 3 --batch-size 4

Four ranks on one host (rank from Open MPI's environment, gradients averaged with mpi4py)::

    mpirun -np 4 --oversubscribe --allow-run-as-root python examples/pytorch_resnet50.py --steps 2

Watching the input live: ``--metrics-port 9300`` serves Prometheus metrics of the loaders (records and
bytes per rank and mount, failovers, skipped records, the wait for each batch, storage vs decode
stalls; each rank on 9300 + its local rank) for the Grafana dashboard in
examples/grafana/dlstore-input.json, and prints per epoch whether the job waited for its data and why::

    python examples/pytorch_resnet50.py --steps 20 --metrics-port 9300

See examples/README.md for torchrun, horovodrun and poprun.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from data_parallel import add_training_args, data_parallel, log, threads_per_rank

import dlstore.metrics
import dlstore.synthetic
from dlstore.adapters.torch import DlstoreIterableDataset
from dlstore.pipeline import ResNet50

# TensorFlow's ImageNet converter writes labels 1..1000 (0 is "background"); TF's ResNets have 1001
# outputs for it. The synthetic set follows the converter.
NUM_CLASSES = 1001


# ---- the model --------------------------------------------------------------------------------------


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (stride here, as in torchvision's "ResNet v1.5"), 1x1 expand, plus the shortcut."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int):
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        nn.init.zeros_(self.bn3.weight)  # each block starts as the identity: steadier early training
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = None
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.shortcut is None else self.shortcut(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50Model(nn.Module):
    """ResNet-50: a 7x7 stem, four stages of 3, 4, 6, 3 bottlenecks (widths 64..512), average pool, FC."""

    def __init__(self, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1))
        blocks, channels = [], 64
        for width, count, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(count):
                blocks.append(Bottleneck(channels, width, stride if i == 0 else 1))
                channels = width * Bottleneck.expansion
        self.stages = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.stages(self.stem(x))), 1))


# ---- training ---------------------------------------------------------------------------------------


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_training_args(parser, batch_size=8, steps=5, lr=0.01)
    parser.add_argument("--image-size", type=int, default=224,
                        help="crop size fed to the model (224 as in MLPerf; smaller for a quick smoke run)")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes per rank")
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve Prometheus metrics of the input on PORT + local rank (0: a free port) and "
                             "print per epoch how often the job waited for its data, and why (with --workers 0: "
                             "workers' loaders live in their own processes)")
    args = parser.parse_args(argv)

    world, average_gradients = data_parallel(args.dist)
    if args.metrics_port is not None:
        port = dlstore.metrics.serve(args.metrics_port)
        log(world, f"metrics: serving on http://0.0.0.0:{port}/metrics")
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    torch.set_num_threads(threads_per_rank(world))
    paths = args.data or dlstore.synthetic.cached_dataset("imagenet", "tiny", progress=world.rank == 0)

    # Shuffled (the Dataset's block shuffle); remainder="drop" gives every rank and worker the same
    # number of full batches, so no rank waits for another in the gradient all-reduce.
    dataset = DlstoreIterableDataset(paths, ResNet50(train=True, layout="NCHW", dtype="float32", size=args.image_size),
                                     batch_size=args.batch_size, last_batch="DROP", remainder="drop", seed=args.seed,
                                     report_stalls=(lambda line: log(world, line)) if args.metrics_port is not None
                                     else False)
    log(world, f"reads {dataset.share().describe()}" + (f", split among {args.workers} DataLoader workers"
                                                        if args.workers else ""))
    model = ResNet50Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-5)
    loss_fn = nn.CrossEntropyLoss()

    step, samples, epoch = 0, 0, 0
    start = time.perf_counter()
    while step < args.steps:
        dataset.set_epoch(epoch)
        seen = 0
        for batch in torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=args.workers):
            images, labels = batch["image"], batch["label"]
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            average_gradients(model.parameters())
            optimizer.step()
            step += 1
            seen += len(labels)
            log(world, f"step {step} epoch {epoch} loss {loss.item():.4f} images {tuple(images.shape)}")
            if step == args.steps:
                break
        if seen == 0:
            raise SystemExit(f"rank {world.rank} got no full batch of {args.batch_size}: use a smaller --batch-size "
                             f"or more data")
        samples += seen
        epoch += 1
    elapsed = time.perf_counter() - start
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    log(world, f"done: {step} steps, {samples} images in {elapsed:.1f} s ({samples / elapsed:.1f} images/s); "
               f"parameter checksum {checksum:.6f}")
    if args.metrics_port is not None and not args.workers:
        log(world, f"input over the run: {dataset.stall_report()['line']}")


if __name__ == "__main__":
    main()
