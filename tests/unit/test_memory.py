"""Pinned host memory's bookkeeping and the loader's copies to a GPU, through stand-ins for
``cudaHostRegister`` and for the device: no CUDA needed. The real path is the ``gpu``-marked test."""
from __future__ import annotations

import re

import numpy as np
import pytest

import dlstore
from dlstore.errors import DlstoreError
from dlstore.formats.example import encode_example
from dlstore.io import cuda, memory
from dlstore.pipeline.bert import Bert
from dlstore.pipeline.loader import Loader
from dlstore.placement.world import World
from tests.gpu_stand_ins import STAND_IN_FACTS, DlpackHostDevice, Registry, use_gpu_stand_in
from tests.helpers import write_tfrecord


def test_buffers_are_page_aligned_rounded_and_registered_once():
    reg = Registry()
    pool = memory.PinnedPool(reg.register, reg.unregister, page=4096)
    a = pool.acquire(10_000)
    assert a.address % 4096 == 0 and a.capacity == 12_288 and reg.live == {a.address: 12_288}
    a.array[:5] = 7  # writable host memory
    b = pool.acquire(0)
    assert b.capacity == 4096 and b.address != a.address
    pool.release(a)
    again = pool.acquire(9000)  # fits in a's 12 KiB, not more than twice as large: reused
    assert again is a and len(reg.calls) == 2
    pool.release(again)
    big = pool.acquire(5000)  # a would do, but 12 KiB is more than twice 8 KiB... it is not: reused
    assert big is a
    pool.release(big)
    small = pool.acquire(100)  # a (12 KiB) is more than twice the 4 KiB needed: a new buffer
    assert small is not a and pool.stats()["buffers"] == 3
    stats = pool.stats()
    assert stats["reused"] == 2 and stats["in_use"] == 2 and stats["free"] == 1
    assert stats["registered_bytes"] == 12_288 + 4096 + 4096
    with pytest.raises(ValueError, match="not in use"):
        pool.release(a)
    pool.close()
    assert reg.live == {} and pool.stats()["registered_bytes"] == 0


def test_allocator_gives_the_loader_arrays_in_pinned_buffers():
    reg = Registry()
    pool = memory.PinnedPool(reg.register, reg.unregister)
    x = pool.allocator((3, 5), np.float32)
    assert x.shape == (3, 5) and x.dtype == np.float32 and x.flags.c_contiguous and x.flags.writeable
    assert x.ctypes.data % memory.PAGE == 0 and x.ctypes.data in reg.live
    x[:] = 1.5
    assert float(x.sum()) == 22.5


def test_a_failed_registration_is_named():
    reg = Registry(fail_above=8192)
    pool = memory.PinnedPool(reg.register, reg.unregister)
    pool.acquire(8192)
    with pytest.raises(DlstoreError, match="cudaHostRegister of 12288 bytes .* out of memory"):
        pool.acquire(9000)
    assert pool.stats()["buffers"] == 1


def test_copier_waits_for_the_copy_before_the_host_slot_is_reused():
    dev = memory.HostDevice()
    copier = memory.DeviceCopier(dev, sets=2)
    host = {"x": np.arange(8, dtype=np.int64).reshape(4, 2)}
    out1 = copier.send(host)
    assert np.array_equal(out1["x"], host["x"]) and out1["x"] is not host["x"]
    assert [k for k, _ in dev.log] == ["wait consumer", "copy", "record", "consumer waits"]
    copier.done_with_host()
    assert dev.log[-1][0] == "synchronize"
    out2 = copier.send({"x": host["x"][:3] + 100})  # a partial batch: the start of the next set
    assert out2["x"].shape == (3, 2) and out2["x"].base is not out1["x"]
    assert np.array_equal(out2["x"], host["x"][:3] + 100)
    out3 = copier.send(host)  # the first set again
    assert out3["x"] is out1["x"]
    assert copier.copies == 3


def bert_file(tmp_path, n):
    rows = []
    for i in range(n):
        rows.append(encode_example({
            "input_ids": np.arange(16, dtype=np.int64) + i, "input_mask": np.ones(16, dtype=np.int64),
            "segment_ids": np.zeros(16, dtype=np.int64), "masked_lm_positions": np.arange(4, dtype=np.int64),
            "masked_lm_ids": np.full(4, i, dtype=np.int64), "masked_lm_weights": np.ones(4, dtype=np.float32),
            "next_sentence_labels": np.array([i % 2], dtype=np.int64)}))
    return write_tfrecord(tmp_path / "bert.tfrecord", rows)


def test_loader_on_a_gpu_through_the_stand_ins(tmp_path, monkeypatch):
    path = bert_file(tmp_path, 37)
    reg = Registry()
    monkeypatch.setattr(memory, "cuda_host_register", reg.register)
    monkeypatch.setattr(memory, "cuda_host_unregister", reg.unregister)
    dev = memory.HostDevice()
    monkeypatch.setattr(memory, "device_copier",
                        lambda device, local_rank=0: ((0, memory.DeviceCopier(dev), "stand-in copies") if device
                                                      else (None, None, "")))
    want = [dict(b) for b in Loader(dlstore.open_records(path), Bert(16, 4), 8, last_batch="PARTIAL", copy=True)]
    loader = Loader(dlstore.open_records(path), Bert(16, 4), 8, last_batch="PARTIAL", device="cuda:0")
    got = [{k: v.copy() for k, v in b.items()} for b in loader]
    assert len(got) == len(want) == 5
    for g, w in zip(got, want):
        assert g.keys() == w.keys() and all(np.array_equal(g[k], w[k]) for k in w)
    stats = loader.stats()
    assert stats["device"] == "cuda:0" and stats["device_copies"] == 5
    # Every slot of the ring is in pinned memory; each host slot was freed only after its copy finished.
    assert stats["pinned"]["in_use"] == len(loader._ring.slots) * len(want[0])
    assert all(a.ctypes.data in reg.live for slot in loader._ring.slots for a in slot.values())
    kinds = [k for k, _ in dev.log]
    assert kinds.count("synchronize") >= 4


def test_loader_on_a_gpu_without_cuda_names_what_is_missing(tmp_path, monkeypatch):
    path = bert_file(tmp_path, 4)
    monkeypatch.setattr(cuda, "cuda_facts", lambda: cuda.CudaFacts(driver_error="no CUDA driver (libcuda.so.1 "
                                                                                 "cannot be loaded)"))
    with pytest.raises(DlstoreError, match=r"^device='cuda:0' needs a CUDA GPU and CuPy: no CUDA driver"):
        Loader(dlstore.open_records(path), Bert(16, 4), 2, device="cuda:0")
    monkeypatch.setattr(cuda, "cuda_facts", lambda: cuda.CudaFacts(driver="13.0", devices=["GPU"]))
    with pytest.raises(DlstoreError, match="CuPy"):
        Loader(dlstore.open_records(path), Bert(16, 4), 2, device="cuda:0")
    with pytest.raises(ValueError, match="cuda:N"):
        Loader(dlstore.open_records(path), Bert(16, 4), 2, device="tpu")
    # The CPU is no device to copy to.
    assert Loader(dlstore.open_records(path), Bert(16, 4), 2, device="cpu").stats().get("device") is None


class TorchLikeDevice:
    """What a torch.device's str gives."""

    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


@pytest.mark.parametrize("device, index", [
    (None, None), ("cpu", None), (" CPU ", None), (TorchLikeDevice("cpu"), None),
    ("cuda", 0), ("cuda:0", 0), ("CUDA:1", 1), (TorchLikeDevice("cuda:1"), 1),
])
def test_check_device_parses_and_checks(monkeypatch, device, index):
    monkeypatch.setattr(cuda, "cuda_facts", lambda: cuda.CudaFacts(driver="13.0", devices=["A", "B"], cupy="13.6"))
    assert memory.check_device(device) == index


@pytest.mark.parametrize("facts, device, line", [
    (cuda.CudaFacts(driver_error="no CUDA driver (libcuda.so.1 cannot be loaded)"), "cuda:0",
     "device='cuda:0' needs a CUDA GPU and CuPy: no CUDA driver (libcuda.so.1 cannot be loaded)"),
    (cuda.CudaFacts(driver="13.0", driver_error="no GPU (cuInit: no CUDA-capable device)"), "cuda",
     "device='cuda' needs a CUDA GPU and CuPy: no GPU (cuInit: no CUDA-capable device)"),
    (cuda.CudaFacts(driver="13.0", devices=["A", "B"], cupy="13.6"), "cuda:2",
     "device='cuda:2' needs a CUDA GPU and CuPy: no CUDA device 2 (the driver sees 2)"),
    (cuda.CudaFacts(driver="13.0", devices=["A"], cupy_error="cupy is not installed (pip install 'dlstore[gpu]')"),
     TorchLikeDevice("cuda:0"),
     "device='cuda:0' needs a CUDA GPU and CuPy: cupy is not installed (pip install 'dlstore[gpu]')"),
])
def test_check_device_names_exactly_what_is_missing_in_one_line(monkeypatch, facts, device, line):
    monkeypatch.setattr(cuda, "cuda_facts", lambda: facts)
    with pytest.raises(DlstoreError) as e:
        memory.check_device(device)
    assert str(e.value) == line
    with pytest.raises(DlstoreError, match=f"^{re.escape(line)}$"):
        memory.device_copier(device)  # the loader's copier: the same check


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cuda:-1", "gpu:0", 0])
def test_check_device_refuses_what_is_not_a_device(monkeypatch, device):
    monkeypatch.setattr(cuda, "cuda_facts", lambda: pytest.fail("a malformed device needs no CUDA facts"))
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda', 'cuda:N' or 'cuda:local'"):
        memory.check_device(device)


def test_cuda_local_is_the_gpu_of_the_local_rank_and_checked_as_such(monkeypatch):
    monkeypatch.setattr(cuda, "cuda_facts", lambda: cuda.CudaFacts(driver="13.0", devices=["A", "B"], cupy="13.6"))
    assert [memory.check_device("cuda:local", r) for r in (0, 1)] == [0, 1]
    with pytest.raises(DlstoreError, match=r"^device='cuda:local' needs a CUDA GPU and CuPy: no CUDA device 2 "
                                           r"\(the driver sees 2\)$"):
        memory.check_device("cuda:local", 2)  # a third rank on a host with two GPUs


def test_a_loader_on_cuda_local_copies_to_its_ranks_gpu(tmp_path, monkeypatch):
    path = bert_file(tmp_path, 20)
    use_gpu_stand_in(monkeypatch)
    monkeypatch.setattr(cuda, "cuda_facts", lambda: cuda.CudaFacts(driver="13.0", devices=["A", "B"], cupy="x"))
    made = []
    monkeypatch.setattr(memory, "CupyDevice", lambda index: made.append(index) or DlpackHostDevice())
    second = dlstore.Dataset(path, world=World(rank=1, size=2, local_rank=1, local_size=2), shuffle="none")
    loader = Loader(second, Bert(16, 4), 4, device="cuda:local")
    assert loader.device == "cuda:1" and made == [1] and loader.stats()["device_path"] == memory.device_path(1)
    first = dlstore.Dataset(path, world=World(rank=0, size=2, local_rank=0, local_size=2), shuffle="none")
    assert Loader(first, Bert(16, 4), 4, device="cuda:local").device == "cuda:0"


def test_a_gds_dataset_on_cuda_local_reads_into_its_ranks_gpu(tmp_path, stand_in_gds):
    path = write_tfrecord(tmp_path / "a.tfrecord", [b"%d" % i for i in range(10)])
    for rank in (0, 1):
        ds = dlstore.Dataset(path, io="gds", device="cuda:local", batch_size=4,
                             world=World(rank=rank, size=2, local_rank=rank, local_size=2))
        assert ds.device_index == rank
        list(ds.batches())
        assert stand_in_gds[-1][2] == rank  # the backend reads into that GPU


def test_synchronize_waits_for_the_last_copies_and_is_a_no_op_on_the_cpu(tmp_path, monkeypatch):
    path = bert_file(tmp_path, 20)
    cpu = Loader(dlstore.open_records(path), Bert(16, 4), 8)
    cpu.synchronize()  # before, during and after an iteration: nothing to wait for
    assert cpu.device is None and len([cpu.synchronize() for _ in cpu]) == 2
    reg = use_gpu_stand_in(monkeypatch)
    assert memory.check_device("cuda:0") == 0 and cuda.cuda_facts() is STAND_IN_FACTS
    loader = Loader(dlstore.open_records(path), Bert(16, 4), 8, device="cuda")
    assert loader.device == "cuda:0" and loader.stats()["device_path"] == memory.device_path(0)
    log = reg.device.log
    for _ in loader:
        assert log[-1][0] == "consumer waits"  # the batch's copies are queued, not waited for
        loader.synchronize()
        assert log[-1] == ("synchronize", log[-2][1])  # the event recorded after this batch's copies
        loader.synchronize()  # nothing outstanding now
        assert log[-1][0] == "synchronize" and log[-2][0] == "consumer waits"
    assert loader.stats()["device_copies"] == 2


@pytest.mark.gpu
def test_loader_yields_cupy_arrays_on_the_gpu(tmp_path):
    missing = cuda.device_missing(cuda.cuda_facts())
    if missing or cuda.cuda_facts().cupy is None:
        pytest.skip(missing or "CuPy is not installed")
    import cupy

    path = bert_file(tmp_path, 37)
    want = [dict(b) for b in Loader(dlstore.open_records(path), Bert(16, 4), 8, copy=True)]
    got = [{k: cupy.asnumpy(v) for k, v in b.items()}
           for b in Loader(dlstore.open_records(path), Bert(16, 4), 8, device="cuda:0")]
    assert all(np.array_equal(g[k], w[k]) for g, w in zip(got, want) for k in w) and len(got) == len(want)
