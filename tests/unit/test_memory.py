"""Pinned host memory and the loader's copies to a GPU, through the stand-ins of the CUDA driver and CuPy
(tests/stand_ins, the ``gpu_libraries`` fixture): no CUDA needed. The real path is the ``gpu``-marked test."""
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
from tests.helpers import write_tfrecord


class Registry:
    """register/unregister callables that remember what is registered, for the pool's bookkeeping alone."""

    def __init__(self, fail_above=None):
        self.live, self.calls, self.fail_above = {}, [], fail_above

    def register(self, address, nbytes):
        if self.fail_above is not None and nbytes > self.fail_above:
            raise DlstoreError(f"cuMemHostRegister of {nbytes} bytes at 0x{address:x} on cuda:0 failed: out of memory")
        assert address not in self.live
        self.live[address] = nbytes
        self.calls.append(("register", nbytes))

    def unregister(self, address, nbytes):
        assert self.live.pop(address) == nbytes
        self.calls.append(("unregister", nbytes))


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
    assert pool.acquire(5000) is a  # 12 KiB is not more than twice the 8 KiB needed: reused
    pool.release(a)
    small = pool.acquire(100)  # a (12 KiB) is more than twice the 4 KiB needed: a new buffer
    assert small is not a and pool.stats()["buffers"] == 3
    stats = pool.stats()
    assert stats["reused"] == 2 and stats["in_use"] == 2 and stats["free"] == 1 and stats["pageable"] == 0
    assert stats["registered_bytes"] == 12_288 + 4096 + 4096 and stats["note"] == ""
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


def test_pinning_registers_in_the_target_gpus_primary_context_only(gpu_libraries):
    # cudaHostRegister ran on the thread's current device (GPU 0), so every cuda:local rank opened a
    # context there too; the driver API registers in the target GPU's primary context.
    driver = gpu_libraries.driver
    pool = memory.PinnedPool(device=1)
    buf = pool.acquire(10_000)
    assert driver.registered == {buf.address: (12_288, 1)} and set(driver.contexts) == {1}
    assert buf.pinned and pool.stats()["registered_bytes"] == 12_288
    pool.close()
    assert driver.registered == {} and set(driver.contexts) == {1}
    assert "cuCtxPopCurrent_v2" == driver.calls[-1]  # the thread's context restored after each call


def test_refused_pinning_falls_back_to_pageable_memory_and_says_why(gpu_libraries):
    driver = gpu_libraries.driver
    driver.refuse_above = 8192
    pool = memory.PinnedPool(device=0)
    small, big = pool.acquire(8192), pool.acquire(9000)
    assert small.pinned and not big.pinned and list(driver.registered) == [small.address]
    big.array[:3] = 1  # still usable host memory
    stats = pool.stats()
    assert stats["buffers"] == 2 and stats["pageable"] == 1 and stats["registered_bytes"] == 8192
    assert stats["note"] == ("cuMemHostRegister of 12288 bytes at 0x%x on cuda:0 failed: out of memory: buffers "
                             "left pageable (copies to the GPU are synchronous)" % big.address)
    pool.close()  # only the pinned one is unregistered
    assert driver.registered == {} and driver.calls.count("cuMemHostUnregister") == 1


def test_pinning_without_a_driver_is_named(monkeypatch):
    monkeypatch.setattr(cuda, "load_driver", lambda load=None: None)
    with pytest.raises(DlstoreError, match=r"^cuMemHostRegister of 4096 bytes at 0x[0-9a-f]+ on cuda:0 needs the "
                                           r"CUDA driver \(libcuda.so.1 cannot be loaded\)$"):
        memory.cuda_host_register(memory.PinnedPool(lambda a, n: None).acquire(1).address, 4096)


def bert_file(tmp_path, n):
    rows = []
    for i in range(n):
        rows.append(encode_example({
            "input_ids": np.arange(16, dtype=np.int64) + i, "input_mask": np.ones(16, dtype=np.int64),
            "segment_ids": np.zeros(16, dtype=np.int64), "masked_lm_positions": np.arange(4, dtype=np.int64),
            "masked_lm_ids": np.full(4, i, dtype=np.int64), "masked_lm_weights": np.ones(4, dtype=np.float32),
            "next_sentence_labels": np.array([i % 2], dtype=np.int64)}))
    return write_tfrecord(tmp_path / "bert.tfrecord", rows)


def host(batch):
    return {k: v.get() for k, v in batch.items()}


def test_copier_orders_its_copies_between_the_consumers_streams(gpu_libraries):
    cp = gpu_libraries.cupy
    copier = memory.DeviceCopier(0, rows=4, sets=2)
    x = np.arange(8, dtype=np.int64).reshape(4, 2)
    out1 = copier.send({"x": x})
    assert isinstance(out1["x"], cp.ndarray) and np.array_equal(out1["x"].get(), x)
    consumer, copies = cp.get_current_stream().ptr, copier._stream.ptr
    kinds = [(e[0], e[1]) for e in cp.log]
    # The copier's stream waits for the consumer's queued work, copies, and the consumer waits for the copies.
    assert kinds == [("record", consumer), ("wait_event", copies), ("set", copies), ("record", copies),
                     ("wait_event", consumer)]
    copier.done_with_host()
    assert cp.log[-1] == ("event synchronize", cp.log[3][2])
    out2 = copier.send({"x": x[:3] + 100})  # a short batch: the first rows of the next set
    assert out2["x"].shape == (3, 2) and out2["x"].data.ptr != out1["x"].data.ptr
    assert np.array_equal(out2["x"].get(), x[:3] + 100)
    assert copier.send({"x": x})["x"].data.ptr == out1["x"].data.ptr  # the first set again
    assert copier.copies == 3
    with pytest.raises(ValueError, match="a batch of 5 rows for device arrays of 4"):
        copier.send({"x": np.zeros((5, 2), np.int64)})


def test_a_short_first_batch_does_not_size_the_device_arrays(gpu_libraries):
    copier = memory.DeviceCopier(0, rows=4)
    short = copier.send({"x": np.ones((2, 3), np.float32)})
    assert short["x"].shape == (2, 3)
    full = np.arange(12, dtype=np.float32).reshape(4, 3)
    for _ in range(3):
        assert np.array_equal(copier.send({"x": full})["x"].get(), full)


def test_a_gpu_loader_resumed_near_an_epochs_end_then_runs_full_batches(tmp_path, gpu_libraries):
    # A resume with PARTIAL whose first batch is the epoch's short last one, then a whole epoch.
    path = bert_file(tmp_path, 37)
    want = [dict(b) for b in Loader(dlstore.open_records(path), Bert(16, 4), 8, last_batch="PARTIAL", copy=True)]
    loader = Loader(dlstore.open_records(path), Bert(16, 4), 8, last_batch="PARTIAL", device="cuda:0")
    loader.load_state_dict({"epoch": 0, "sample_in_epoch": 32, "seed": loader.seed})
    got = [host(b) for b in loader] + [host(b) for b in loader]
    assert [len(g["input_ids"]) for g in got] == [5, 8, 8, 8, 8, 5]
    for g, w in zip(got, want[-1:] + want):
        assert all(np.array_equal(g[k], w[k]) for k in w)


def test_loader_on_a_gpu_through_the_stand_ins(tmp_path, gpu_libraries):
    path = bert_file(tmp_path, 37)
    want = [dict(b) for b in Loader(dlstore.open_records(path), Bert(16, 4), 8, last_batch="PARTIAL", copy=True)]
    loader = Loader(dlstore.open_records(path), Bert(16, 4), 8, last_batch="PARTIAL", device="cuda:0")
    got = [host(b) for b in loader]
    assert len(got) == len(want) == 5
    for g, w in zip(got, want):
        assert g.keys() == w.keys() and all(np.array_equal(g[k], w[k]) for k in w)
    stats = loader.stats()
    assert stats["device"] == "cuda:0" and stats["device_copies"] == 5 and stats["pinned"]["pageable"] == 0
    # Every slot of the ring is in memory pinned for GPU 0; each host slot was freed only after its copy.
    live = gpu_libraries.driver.registered
    assert stats["pinned"]["in_use"] == len(loader._ring.slots) * len(want[0])
    assert all(live[a.ctypes.data][1] == 0 for slot in loader._ring.slots for a in slot.values())
    assert sum(e[0] == "event synchronize" for e in gpu_libraries.cupy.log) >= 4


def test_loader_on_a_gpu_without_cuda_names_what_is_missing(tmp_path, monkeypatch):
    path = bert_file(tmp_path, 4)
    monkeypatch.setattr(cuda, "cuda_facts", lambda init=False: cuda.CudaFacts(
        driver_error="no CUDA driver (libcuda.so.1 cannot be loaded)"))
    with pytest.raises(DlstoreError, match=r"^device='cuda:0' needs a CUDA GPU and CuPy: no CUDA driver"):
        Loader(dlstore.open_records(path), Bert(16, 4), 2, device="cuda:0")
    monkeypatch.setattr(cuda, "cuda_facts", lambda init=False: cuda.CudaFacts(driver="13.0", devices=["GPU"]))
    with pytest.raises(DlstoreError, match="CuPy"):
        Loader(dlstore.open_records(path), Bert(16, 4), 2, device="cuda:0")
    with pytest.raises(ValueError, match="cuda:N"):
        Loader(dlstore.open_records(path), Bert(16, 4), 2, device="tpu")
    # The CPU is no device to copy to.
    assert Loader(dlstore.open_records(path), Bert(16, 4), 2, device="cpu").stats().get("device") is None


def test_cpu_is_host_memory_for_a_dataset_and_a_reader_and_contradicts_gds(tmp_path, monkeypatch):
    # Dataset(device="cpu") was taken without a word while its docs named cuda:N only; with io="gds" it read
    # into cuda:0 (Dataset) or left the GPU reader without a device (open_records).
    path = write_tfrecord(tmp_path / "a.tfrecord", [b"a", b"bb", b"ccc"])
    for device in ("cpu", "CPU", None):
        ds = dlstore.Dataset(path, device=device, batch_size=3)
        assert ds.device_index is None and [b.num_records for b in ds.batches()] == [3]
        assert dlstore.open_records(path, device=device).device_index is None
    for doc in (dlstore.Dataset.__doc__, dlstore.open_records.__doc__):
        assert "``None`` or ``\"cpu\"``: host memory" in doc
    monkeypatch.setattr(cuda, "cuda_facts", lambda init=False: cuda.CudaFacts(driver="13.0", devices=["GPU"]))
    for make in (dlstore.Dataset, dlstore.open_records):  # said before whatever gds lacks here
        with pytest.raises(ValueError, match=r"^io='gds' reads into GPU memory, but device='cpu' asks for host "
                                             r"memory: pass device='cuda:N', or omit it for cuda:0"):
            make(path, io="gds", device="cpu")


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
    monkeypatch.setattr(cuda, "cuda_facts", lambda init=False: cuda.CudaFacts(driver="13.0", devices=["A", "B"],
                                                                              cupy="13.6"))
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
    monkeypatch.setattr(cuda, "cuda_facts", lambda init=False: facts)
    with pytest.raises(DlstoreError) as e:
        memory.check_device(device)
    assert str(e.value) == line
    with pytest.raises(DlstoreError, match=f"^{re.escape(line)}$"):
        memory.device_copier(device)  # the loader's copier: the same check


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cuda:-1", "gpu:0", 0])
def test_check_device_refuses_what_is_not_a_device(monkeypatch, device):
    monkeypatch.setattr(cuda, "cuda_facts", lambda init=False: pytest.fail("a malformed device needs no CUDA facts"))
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda', 'cuda:N' or 'cuda:local'"):
        memory.check_device(device)


def test_cuda_local_is_the_gpu_of_the_local_rank_and_checked_as_such(monkeypatch):
    monkeypatch.setattr(cuda, "cuda_facts", lambda init=False: cuda.CudaFacts(driver="13.0", devices=["A", "B"],
                                                                              cupy="13.6"))
    assert [memory.check_device("cuda:local", r) for r in (0, 1)] == [0, 1]
    with pytest.raises(DlstoreError, match=r"^device='cuda:local' needs a CUDA GPU and CuPy: no CUDA device 2 "
                                           r"\(the driver sees 2\)$"):
        memory.check_device("cuda:local", 2)  # a third rank on a host with two GPUs


def test_a_loader_on_cuda_local_copies_to_its_ranks_gpu_and_pins_for_it(tmp_path, gpu_libraries):
    path = bert_file(tmp_path, 20)
    second = dlstore.Dataset(path, world=World(rank=1, size=2, local_rank=1, local_size=2), shuffle="none")
    loader = Loader(second, Bert(16, 4), 4, device="cuda:local")
    assert loader.device == "cuda:1" and loader.stats()["device_path"] == memory.device_path(1)
    batch = next(iter(loader))
    assert {a.device.id for a in batch.values()} == {1}
    # Its pinned buffers are registered in GPU 1's context; GPU 0 got none.
    assert set(gpu_libraries.driver.contexts) == {1}
    assert {device for _, device in gpu_libraries.driver.registered.values()} == {1}
    first = dlstore.Dataset(path, world=World(rank=0, size=2, local_rank=0, local_size=2), shuffle="none")
    assert Loader(first, Bert(16, 4), 4, device="cuda:local").device == "cuda:0"


def test_a_gds_dataset_on_cuda_local_reads_into_its_ranks_gpu(tmp_path, stand_in_gds):
    path = write_tfrecord(tmp_path / "a.tfrecord", [b"%d" % i for i in range(10)])
    for rank in (0, 1):
        ds = dlstore.Dataset(path, io="gds", device="cuda:local", batch_size=4,
                             world=World(rank=rank, size=2, local_rank=rank, local_size=2))
        assert ds.device_index == rank
        list(ds.batches())
        assert {b.buffer.device.id for b in ds.batches()} == {rank}  # read into that GPU


def test_synchronize_waits_for_the_last_copies_and_is_a_no_op_on_the_cpu(tmp_path, gpu_libraries):
    path = bert_file(tmp_path, 20)
    cpu = Loader(dlstore.open_records(path), Bert(16, 4), 8)
    cpu.synchronize()  # before, during and after an iteration: nothing to wait for
    assert cpu.device is None and len([cpu.synchronize() for _ in cpu]) == 2
    loader = Loader(dlstore.open_records(path), Bert(16, 4), 8, device="cuda")
    assert loader.device == "cuda:0" and loader.stats()["device_path"] == memory.device_path(0)
    log = gpu_libraries.cupy.log
    for _ in loader:
        assert log[-1][0] == "wait_event"  # the batch's copies are queued, the consumer's stream waits
        event = log[-1][2]
        loader.synchronize()
        assert log[-1] == ("event synchronize", event)
        loader.synchronize()  # nothing outstanding now
        assert log[-1] == ("event synchronize", event)
    assert loader.stats()["device_copies"] == 2


@pytest.mark.gpu
def test_loader_yields_cupy_arrays_on_the_gpu(tmp_path):
    facts = cuda.cuda_facts(init=True)
    missing = cuda.device_missing(facts)
    if missing or facts.cupy is None:
        pytest.skip(missing or "CuPy is not installed")
    import cupy

    path = bert_file(tmp_path, 37)
    want = [dict(b) for b in Loader(dlstore.open_records(path), Bert(16, 4), 8, copy=True)]
    got = [{k: cupy.asnumpy(v) for k, v in b.items()}
           for b in Loader(dlstore.open_records(path), Bert(16, 4), 8, device="cuda:0")]
    assert all(np.array_equal(g[k], w[k]) for g, w in zip(got, want) for k in w) and len(got) == len(want)
