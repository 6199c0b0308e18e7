"""The stand-ins of tests/stand_ins behave as kvikio 26.10 and CuPy 14.2 do where dlstore depends on it (what
each models, and from where, is in its docstring; the kvikio cases were observed on the real 26.10 wheel)."""
from __future__ import annotations

import sys

import numpy as np
import pytest

DATA = bytes(range(256)) * 400  # 102,400 bytes


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(DATA)
    return path


def test_the_fixture_installs_the_stand_ins_and_removes_them(gpu_libraries):
    import cupy
    import kvikio
    import kvikio.defaults

    assert kvikio is gpu_libraries.kvikio and cupy is gpu_libraries.cupy and kvikio.defaults is kvikio.defaults
    assert kvikio.defaults.is_compat_mode_preferred() and cupy.__version__ == "14.2.0"


def test_the_fixture_is_gone_after_its_test():
    assert "kvikio" not in sys.modules or "stand_in" not in getattr(sys.modules["kvikio"], "__name__", "")


def test_kvikio_open_errors_are_kvikios(gpu_libraries, tmp_path, data_file):
    kvikio = gpu_libraries.kvikio
    with pytest.raises(RuntimeError, match=r"^Unable to open file\. Linux system/library function call error at: "
                                           r".*file_utils\.cpp:160: No such file or directory$"):
        kvikio.CuFile(tmp_path / "missing", "r")
    with pytest.raises(ValueError, match="Unknown file open flag"):
        kvikio.CuFile(data_file, "x")
    with pytest.raises(ValueError, match="Open flag 'a' isn't supported"):
        kvikio.CuFile(data_file, "a")


def test_kvikio_small_reads_are_synchronous_and_fail_in_pread(gpu_libraries, data_file):
    kvikio, cp = gpu_libraries.kvikio, gpu_libraries.cupy
    assert not kvikio.thread_pool_started()
    f = kvikio.CuFile(data_file, "r")
    assert kvikio.thread_pool_started()  # opening a file makes kvikio's defaults and its pool
    assert kvikio.defaults.get("gds_threshold") == 16384  # defaults.cpp, 26.10 (the header's "1 MiB" is stale)
    buf = cp.empty(8192, dtype=cp.uint8)
    future = f.pread(buf, 4096, 100)
    assert future.done() and future.get() == 4096 and bytes(buf.get()[:4096]) == DATA[100:4196]
    # Past the end: the POSIX path raises in pread itself, after copying what it read.
    with pytest.raises(RuntimeError, match=r"^KvikIO failure at: .*posix_io\.hpp:173: POSIX error on pread: EOF$"):
        f.pread(buf, 8192, len(DATA) - 100)
    assert bytes(buf.get()[:100]) == DATA[-100:]


def test_kvikio_large_reads_run_on_the_pool_and_fail_in_get(gpu_libraries, data_file):
    kvikio, cp = gpu_libraries.kvikio, gpu_libraries.cupy
    buf = cp.zeros(200_000, dtype=cp.uint8)
    with kvikio.CuFile(data_file, "r") as f:
        future = f.pread(buf, 200_000, 0)  # no exception yet
        with pytest.raises(RuntimeError, match="POSIX error on pread: EOF"):
            future.get()
        assert bytes(buf.get()[:len(DATA)]) == DATA
        future = f.pread(buf, 50_000, 1000, task_size=16384)
        assert future.get() == 50_000 and bytes(buf.get()[:50_000]) == DATA[1000:51_000]
        # Each future is waited once.
        with pytest.raises(RuntimeError, match=r"^std::future_error: No associated state$"):
            future.get()
        with pytest.raises(ValueError, match="does not refer to a valid shared state"):
            future.done()


def test_kvikio_gds_files_return_a_short_count_at_the_end(gpu_libraries, data_file):
    kvikio, cp = gpu_libraries.kvikio, gpu_libraries.cupy
    gpu_libraries.use_gds()
    from dlstore.io import cuda

    assert cuda.gds_verdict(cuda.cuda_facts()).mode == "gds" and not kvikio.defaults.is_compat_mode_preferred()
    with kvikio.CuFile(data_file, "r") as f:
        if not f.is_direct_io_supported():
            pytest.skip("this filesystem refuses O_DIRECT: kvikio reads the file in compat mode")
        buf = cp.empty(200_000, dtype=cp.uint8)
        assert f.pread(buf, 200_000, 0).get() == len(DATA)  # cuFileRead's count, not an exception
    kvikio.REFUSED_FILES.add(str(data_file))  # cuFile refuses the handle: compat for this file
    with kvikio.CuFile(data_file, "r") as f:
        assert not f.is_direct_io_supported()


def test_kvikio_statistics_count_failures_without_bytes(gpu_libraries, data_file):
    kvikio, cp = gpu_libraries.kvikio, gpu_libraries.cupy
    monitor = kvikio.SummaryMonitor()
    buf = cp.empty(8192, dtype=cp.uint8)
    with kvikio.CuFile(data_file, "r") as f:
        f.pread(buf, 1000, 0).get()
        with pytest.raises(RuntimeError):
            f.pread(buf, 8192, len(DATA) - 10)
    s = monitor.get()
    assert set(s.by_backend) == {"POSIX", "GDS", "MMAP", "REMOTE_HTTP", "REMOTE_HDFS"}
    assert s.by_backend["POSIX"]["num_ops"] == 2 and s.by_backend["POSIX"]["num_errors"] == 1
    assert s.bytes_transferred == 1000 and s.bytes_requested == 9192


def test_cupy_views_share_memory_and_set_checks_like_cupy(gpu_libraries):
    cp = gpu_libraries.cupy
    a = cp.zeros((4, 3), dtype=cp.int64)
    view = a[1:3]
    assert view.shape == (2, 3) and view.data.ptr == a.data.ptr + 24 and view.nbytes == 48
    view.set(np.ones((2, 3), np.int64))
    assert a.get()[:, 0].tolist() == [0, 1, 1, 0]
    with pytest.raises(TypeError, match="int32 array cannot be set to int64 array"):
        view.set(np.ones((2, 3), np.int32))
    with pytest.raises(ValueError, match="Shape mismatch"):
        view.set(np.ones((3, 3), np.int64))
    cai = a.__cuda_array_interface__
    assert cai["data"] == (a.data.ptr, False) and cai["stream"] == 1 and cai["version"] == 3
    with cp.cuda.Device(1):
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            b = cp.empty(3, dtype=cp.uint8)
            assert b.__cuda_array_interface__["stream"] == stream.ptr and b.__dlpack_device__() == (2, 1)
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        with cp.cuda.Device(cp.DEVICES):
            pass


def test_cupy_dlpack_orders_the_consumers_stream_after_cupys(gpu_libraries):
    cp = gpu_libraries.cupy
    a = cp.asarray(np.arange(5, dtype=np.int32))
    stream = cp.cuda.Stream()
    with stream:
        capsule = a.__dlpack__(stream=0x7000)
    assert cp.log[-2:] == [("record", stream.ptr, cp.log[-2][2]), ("wait_event", 0x7000, cp.log[-2][2])]
    assert np.from_dlpack(type("C", (), {"__dlpack__": lambda self, **k: capsule,
                                         "__dlpack_device__": lambda self: (1, 0)})()).tolist() == [0, 1, 2, 3, 4]
    a.__dlpack__(stream=-1)  # no ordering asked
    assert cp.log[-1] == ("dlpack", -1)


def test_cupy_pool_hands_a_dropped_arrays_memory_out_again_on_its_stream(gpu_libraries):
    cp = gpu_libraries.cupy
    pool = cp.get_default_memory_pool()
    a = cp.empty(1000, dtype=cp.uint8)
    ptr, view = a.data.ptr, a[10:20]
    assert pool.used_bytes() == 1024 and pool.free_bytes() == 0
    del a
    assert pool.used_bytes() == 1024  # the view keeps the block
    del view
    assert pool.used_bytes() == 0 and pool.free_bytes() == 1024
    with cp.cuda.Stream():
        assert cp.empty(1000, dtype=cp.uint8).data.ptr != ptr  # another stream's allocation: not this block
    assert cp.empty(600, dtype=cp.uint8).data.ptr == ptr  # the same stream: handed out again
    big, small = cp.empty(70_000, dtype=cp.uint8), cp.empty(2000, dtype=cp.uint8)
    ptrs = big.data.ptr, small.data.ptr
    del big, small
    assert cp.empty(1500, dtype=cp.uint8).data.ptr == ptrs[1]  # the best fit of several free blocks


def test_cupy_raw_module_gives_the_host_kernel(gpu_libraries, monkeypatch):
    import types

    cp = gpu_libraries.cupy
    calls = []
    kernels = types.ModuleType("tests.stand_ins.host_kernels")
    kernels.host_kernel = lambda name: (lambda grid, block, args, shared_mem=0: calls.append((name, grid, args)))
    monkeypatch.setitem(sys.modules, "tests.stand_ins.host_kernels", kernels)
    module = cp.RawModule(code="__global__ void k() {}")
    module.get_function("dlstore_gather")((1,), (256,), (3,))
    assert calls == [("dlstore_gather", (1,), (3,))]


def test_kvikio_refuses_a_non_contiguous_buffer(gpu_libraries, data_file):
    cp = gpu_libraries.cupy
    with gpu_libraries.kvikio.CuFile(data_file, "r") as f:
        with pytest.raises(ValueError, match="^Array must be contiguous$"):
            f.pread(cp.empty((4, 4096), dtype=cp.uint8)[:, :100], 400, 0)
        with pytest.raises(ValueError, match="^Size is greater than the size of the buffer$"):
            f.pread(cp.empty(10, dtype=cp.uint8), 11, 0)
