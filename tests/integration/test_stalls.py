"""Is the job input-bound, and why: the loader's stall report puts the wait where it is, storage on a
throttled mount (a ``dlstore testbed`` loop device; root only, skipped saying why otherwise) and decode in a
pipeline slowed on purpose; the per-epoch line, and the adapters passing the report through."""
import os
import shutil
import time

import pytest

import dlstore
from dlstore.pipeline import Bert, Loader
from dlstore.placement.world import World
from dlstore.synthetic import generate_bert


class SlowBert(Bert):
    """The BERT pipeline taking ``delay`` seconds more per run of records: a slow decoder."""

    def __init__(self, delay: float):
        super().__init__()
        self.delay = delay

    def bind(self, **kw):
        run = super().bind(**kw)

        def slow(*args):
            time.sleep(self.delay)
            run(*args)

        return slow


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert")
    generate_bert(str(d), shards=2, records_per_shard=200, progress=False)
    return str(d)


def test_a_slow_pipeline_is_a_decode_stall(bert_dir):
    lines = []
    loader = Loader(dlstore.Dataset(bert_dir, shuffle="block", remainder="uneven"), SlowBert(0.01), 16,
                    report_stalls=lines.append, epochs=2)
    steps = sum(1 for _ in loader)
    report = loader.stall_report()
    assert report["steps"] == steps == 2 * (400 // 16)
    assert report["decode_share"] > 0.8 and report["decode_steps"] > 0.8 * steps
    assert report["stalled_fraction"] > 0.8 and report["wait_fraction"] > 0.5
    assert len(lines) == 2 and lines[0].startswith("dlstore loader, epoch 0: waited for data in ")
    assert "decode" in lines[0] and loader.stats()["stalls"]["steps"] == steps


def test_a_fast_consumer_of_a_fast_pipeline_hardly_waits(bert_dir):
    loader = Loader(dlstore.Dataset(bert_dir, shuffle="none"), Bert(), 16, epochs=2)
    for _ in loader:
        time.sleep(0.005)  # a training step far slower than parsing 16 records
    report = loader.stall_report()
    assert report["stalled_fraction"] < 0.2 and report["wait_fraction"] < 0.2, report["line"]


def test_the_adapters_pass_the_report_through(bert_dir):
    torch = pytest.importorskip("torch")
    from dlstore.adapters.torch import DlstoreIterableDataset, TorchLoader

    tl = TorchLoader(Loader(dlstore.Dataset(bert_dir), SlowBert(0.002), 16), device="cpu")
    n = sum(1 for _ in tl)
    assert tl.stall_report()["steps"] == n and tl.stall_report()["decode_share"] > 0.5
    ds = DlstoreIterableDataset(bert_dir, SlowBert(0.002), batch_size=16)
    n = sum(1 for _ in torch.utils.data.DataLoader(ds, batch_size=None))
    assert ds.stall_report()["steps"] == n and ds.stall_report()["decode_share"] > 0.5


@pytest.fixture
def throttled_mount(tmp_path_factory):
    from dlstore.tools.testbed import BLKIO_ROOT, create_testbed, destroy_testbed, missing_tools, root_refusal

    why = root_refusal() or (f"missing tools: {', '.join(missing_tools())}" if missing_tools() else None)
    if not why and not os.path.exists(os.path.join(BLKIO_ROOT, "blkio.throttle.read_bps_device")):
        why = "no cgroup v1 blkio controller to throttle with"
    if why:
        pytest.skip(f"a throttled testbed mount needs root, loop devices and blkio: {why}")
    src = tmp_path_factory.mktemp("src")
    generate_bert(str(src), shards=4, records_per_shard=1000, progress=False)  # ~5 MB
    base = os.fspath(tmp_path_factory.mktemp("testbed"))
    tb = create_testbed(base, 1, size_bytes=64 << 20, throttle_bps=2_000_000, data=os.fspath(src),
                        progress=False)
    try:
        yield tb.mountpoints[0]
    finally:
        destroy_testbed(base)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.root
def test_a_throttled_mount_is_a_storage_stall(throttled_mount):
    # Reads of 256 KiB and a small shuffle buffer: the wait comes in many pieces (with a buffer holding the
    # whole set, or large reads, a few long waits, then many batches at once: few steps stall, for as long).
    ds = dlstore.Dataset("part-*", mounts=[throttled_mount], world=World(rank=0, size=1), io="direct",
                         shuffle="block", buffer_size=64, remainder="uneven", chunk_size=256 << 10,
                         block_size=256 << 10)
    loader = Loader(ds, Bert(), 32)
    steps = sum(1 for _ in loader)
    report = loader.stall_report()
    assert report["steps"] == steps and report["storage_share"] > 0.8, report["line"]
    assert report["storage_steps"] > 2 * report["decode_steps"] and report["wait_fraction"] > 0.5, report["line"]
