"""A training step fed by dlstore's GPU paths, its batches compared with the host's (``gpu-check``'s
``training`` step).

Three feeds of the same ResNet-50 loader (global shuffle, fixed seed, several epochs), each training a
small convolutional net with torch:

- ``loader``: ``Loader(device="cuda:local")`` (``cuda:N`` where this process's local rank is not N) through
  :class:`~dlstore.adapters.torch.TorchLoader`
  (batches copied to the GPU by the loader, handed to torch through DLPack);
- ``adapter``: a host ``Loader`` with :func:`~dlstore.adapters.torch.pinned_allocator`, copied by
  ``TorchLoader(device="cuda:N")`` (``non_blocking`` copies from page-locked memory);
- ``cpu``: a host ``Loader`` through ``TorchLoader(device="cpu")``, the reference.

Each GPU feed must hand the training step the reference's images and labels in the reference's order
(a per-image sum and the label, copied out of the step after the fact), and its losses must stay finite.
The rates are images per second with the step, the first epoch (set-up, CuPy's and cuDNN's first use)
left out.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

__all__ = ["FEEDS", "train", "compare_feeds"]

FEEDS = ("loader", "adapter", "cpu")


def _adapter(feed: str, paths: Sequence[str], index: int, **kw: Any):
    from dlstore.adapters.torch import TorchLoader, pinned_allocator
    from dlstore.pipeline import resnet50_loader
    from dlstore.placement.world import detect_world

    if feed == "loader":  # cuda:local where this process's local rank is that GPU (so the launcher's count is used)
        local = detect_world().local_rank == index
        return TorchLoader(resnet50_loader(paths, device="cuda:local" if local else f"cuda:{index}", **kw))
    if feed == "adapter":
        return TorchLoader(resnet50_loader(paths, allocator=pinned_allocator(), **kw), device=f"cuda:{index}")
    if feed == "cpu":
        return TorchLoader(resnet50_loader(paths, **kw), device="cpu")
    raise ValueError(f"feed must be one of {FEEDS}, not {feed!r}")


def train(feed: str, paths: Sequence[str], index: int = 0, *, batch_size: int = 64, epochs: int = 4,
          size: int = 96, seed: int = 11) -> Tuple[Dict[str, Any], np.ndarray, np.ndarray]:
    """Trains a small net on ``feed``'s batches: ``(figures, per-image sums, labels)`` in the order the step
    saw them. ``figures``: images, images/s after the first epoch, first and last loss, all losses finite."""
    import torch

    adapter = _adapter(feed, paths, index, batch_size=batch_size, shuffle="global", seed=seed, epochs=epochs,
                       size=size)
    dev = torch.device(adapter.device)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                              torch.nn.Flatten(), torch.nn.Linear(16, 1001)).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    per_epoch = adapter.loader.batches_per_epoch() or 1
    sums: List[Any] = []
    labels: List[Any] = []
    losses: List[Any] = []
    images = timed_from = 0
    started = None
    for step, batch in enumerate(adapter):
        if step == per_epoch:  # the first epoch over: time the rest
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            started, timed_from = time.perf_counter(), images
        x, y = batch["image"], batch["label"]
        if x.device != dev or y.device != dev:
            raise AssertionError(f"{feed}: a batch on {x.device}/{y.device}, not {dev}")
        # Copies: the loader reuses its buffers once the next batch is drawn.
        sums.append(x.to(torch.int64).sum(dim=(1, 2, 3)))
        labels.append(y.to(torch.int64, copy=True))
        loss = torch.nn.functional.cross_entropy(net(x.permute(0, 3, 1, 2).float().div_(255)), y.long())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        images += int(x.shape[0])
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    values = [float(v) for v in losses]
    rate = None
    if started is not None and images > timed_from:
        rate = round((images - timed_from) / (time.perf_counter() - started))
    figures = {"images": images, "images_per_s": rate, "loss_first": values[0] if values else None,
               "loss_last": values[-1] if values else None, "finite": bool(np.isfinite(values).all())}
    return figures, torch.cat(sums).cpu().numpy(), torch.cat(labels).cpu().numpy()


def compare_feeds(paths: Sequence[str], index: int, feeds: Sequence[str] = ("loader", "adapter"),
                  **kw: Any) -> Dict[str, Any]:
    """Each of ``feeds`` against the ``cpu`` reference: ``{"ok", "detail", "figures"}`` for the report."""
    reference, ref_sums, ref_labels = train("cpu", paths, index, **kw)
    figures = {"cpu": _line(reference)}
    problems = []
    for feed in feeds:
        got, sums, labels = train(feed, paths, index, **kw)
        figures[feed] = _line(got)
        if not np.array_equal(sums, ref_sums):
            problems.append(f"{feed}: images differ from the host's")
        if not np.array_equal(labels, ref_labels):
            problems.append(f"{feed}: labels differ from the host's")
        if not got["finite"]:
            problems.append(f"{feed}: a loss is not finite")
    detail = "; ".join(problems) or (f"{', '.join(feeds)}: the host's {reference['images']} images and labels, "
                                     "in its order, losses finite")
    return {"ok": not problems, "detail": detail, "figures": figures}


def _line(figures: Dict[str, Any]) -> str:
    rate = figures["images_per_s"]
    return (f"{figures['images']} images, {rate:,} images/s after the first epoch" if rate else
            f"{figures['images']} images") + f"; loss {figures['loss_first']:.4f} -> {figures['loss_last']:.4f}"

