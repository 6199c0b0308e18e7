"""``gpu-check``'s training step (:mod:`dlstore.bench.train_check`) on the CPU: the host feed trains and is
its own match, and a feed whose images, labels or losses differ from the host's is a failure that says so.
The GPU feeds themselves run on a GPU machine only (``python -m dlstore.bench gpu-check``)."""
from __future__ import annotations

import numpy as np
import pytest

from dlstore.bench import gpu_check, train_check
from dlstore.synthetic.imagenet import generate_imagenet

torch = pytest.importorskip("torch", reason="the training step trains with torch")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return generate_imagenet(tmp_path_factory.mktemp("train"), shards=4, records_per_shard=12,
                             image_size=(64, 80), progress=False, workers=1)


def test_the_host_feed_trains_and_matches_itself(images):
    figures, sums, labels = train_check.train("cpu", images, batch_size=8, epochs=2, size=32)
    assert figures["images"] == 2 * 48 and len(sums) == len(labels) == 96
    assert figures["finite"] and figures["images_per_s"] > 0
    assert sorted(labels[:48].tolist()) == sorted(labels[48:].tolist())  # each epoch every image once
    assert labels[:48].tolist() != labels[48:].tolist()  # shuffled again each epoch
    out = train_check.compare_feeds(images, 0, feeds=("cpu",), batch_size=8, epochs=2, size=32)
    assert out["ok"], out
    assert "96 images" in out["figures"]["cpu"]


@pytest.mark.parametrize("broken, said", [("sums", "images differ from the host's"),
                                          ("labels", "labels differ from the host's"),
                                          ("loss", "a loss is not finite")])
def test_a_feed_unlike_the_host_fails_saying_how(images, monkeypatch, broken, said):
    real = train_check.train

    def train(feed, *a, **kw):
        figures, sums, labels = real("cpu", *a, **kw)
        if feed == "loader":
            if broken == "sums":
                sums = sums.copy()
                sums[3] += 1
            elif broken == "labels":
                labels = np.roll(labels, 1)
            else:
                figures = {**figures, "finite": False}
        return figures, sums, labels

    monkeypatch.setattr(train_check, "train", train)
    out = train_check.compare_feeds(images, 0, feeds=("loader", "adapter"), batch_size=8, epochs=1, size=32)
    assert not out["ok"] and out["detail"] == f"loader: {said}"


def test_gpu_check_runs_the_training_step_before_the_suite():
    assert gpu_check.STEPS.index("training") == gpu_check.STEPS.index("suite") - 1
