"""Shared fixtures: payloads of awkward sizes, a directory that takes O_DIRECT, each engine in turn,
unreadable files, ``io="gds"`` through the host stand-in. Helpers that tests import live in tests/helpers.py."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import ENGINES, REPO, direct_refused


@pytest.fixture(autouse=True)
def direct_reads_the_device(monkeypatch):
    """O_DIRECT engines read the device in every test, as ``DLSTORE_DIRECT_CACHE=0`` asks: a test's files
    were just written, so they sit in the page cache, and by default direct and io_uring would read them
    from there (the ``direct_cache`` setting), leaving their O_DIRECT reads untested. The tests of that
    setting (tests/integration/test_direct_cache.py) turn it back on."""
    monkeypatch.setenv("DLSTORE_DIRECT_CACHE", "0")


@pytest.fixture
def payloads():
    """Records of awkward sizes: empty, 1 byte, around 4096, larger than a 64 KiB chunk."""
    rng = np.random.default_rng(7)
    sizes = [0, 1, 3, 4095, 4096, 4097, 12, 16, 200_000, 0, 65_536, 70_001, 5, 1_000_000, 333]
    sizes += rng.integers(0, 20_000, 60).tolist()
    return [rng.bytes(int(n)) for n in sizes]


@pytest.fixture
def direct_dir(tmp_path):
    """A temporary directory on a filesystem that accepts O_DIRECT, so ``io="direct"`` reads direct.

    ``tmp_path`` when it accepts O_DIRECT (not tmpfs); else a directory under the repository's
    ``build/`` or /var/tmp, removed afterwards; the test is skipped, saying why, when none does.
    """
    if not direct_refused(tmp_path):
        yield tmp_path
        return
    for base in (os.path.join(REPO, "build"), "/var/tmp"):
        try:
            os.makedirs(base, exist_ok=True)
            d = tempfile.mkdtemp(prefix="dlstore-direct-", dir=base)
        except OSError:
            continue
        try:
            if not direct_refused(d):
                yield Path(d)
                return
        finally:
            shutil.rmtree(d, ignore_errors=True)
    pytest.skip(f"no filesystem here accepts O_DIRECT (tried {tmp_path}, {REPO}/build, /var/tmp)")


@pytest.fixture(params=ENGINES)
def engine(request) -> str:
    """Each engine in turn (a test's own ``parametrize("engine", ...)`` overrides this); io_uring is
    skipped, saying why, where the kernel refuses it (its fallback is tested apart)."""
    if request.param == "io_uring":
        from dlstore.io.select import probe_io_uring

        if probe_io_uring():
            pytest.skip(f"io_uring cannot run here: {probe_io_uring()}")
    return request.param


@pytest.fixture
def engine_dir(engine, request, tmp_path):
    """Where to write the files a test reads with ``engine``: :func:`direct_dir` for the O_DIRECT
    engines (``direct``, ``io_uring``)."""
    if engine in ("direct", "io_uring"):
        return request.getfixturevalue("direct_dir")
    return tmp_path


@pytest.fixture
def make_unreadable(monkeypatch):
    """A function that makes a file unreadable to dlstore, as ``chmod 000`` does for a user.

    Root ignores file permissions, so for root the file's opening in :mod:`dlstore.sources.reader` is
    refused with EACCES as well.
    """
    import builtins

    from dlstore.sources import reader as reader_module

    refused = set()

    def refusing_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) in refused:
            raise PermissionError(13, "Permission denied", os.fspath(file))
        return builtins.open(file, *args, **kwargs)

    def make(path) -> None:
        os.chmod(path, 0)
        refused.add(os.path.realpath(path))
        if os.geteuid() == 0:
            monkeypatch.setattr(reader_module, "open", refusing_open, raising=False)

    yield make
    for path in refused:
        os.chmod(path, 0o644)


@pytest.fixture
def stand_in_gds(gpu_libraries, monkeypatch):
    """``io="gds"`` resolving as on a GPU machine with true GDS (two GPUs), its reader running over the
    kvikio and CuPy stand-ins (``gpu_libraries``) and the kernels compiled for the host. Returns the
    ``gpu_libraries`` namespace."""
    from dlstore.io import cuda

    facts = cuda.CudaFacts(**dict(gpu_libraries.facts.as_dict(), libcufile="libcufile.so.0", nvidia_fs=True,
                                  kvikio_compat_preferred=False))
    monkeypatch.setattr(cuda, "cuda_facts", lambda init=False: facts)
    gpu_libraries.facts = facts
    return gpu_libraries


@pytest.fixture
def gpu_libraries(monkeypatch):
    """kvikio 26.10 and CuPy 14 as host stand-ins (tests/stand_ins), installed as ``kvikio``,
    ``kvikio.defaults`` and ``cupy`` and removed afterwards, each fresh (no kvikio thread pool yet, empty
    CuPy pools); the CUDA driver is the driver stand-in (two GPUs: pinning is recorded per GPU), and
    :func:`dlstore.io.cuda.cuda_facts` says so: kvikio and CuPy installed, kvikio in its compat mode (no
    libcufile). Returns a namespace: ``kvikio``, ``cupy``, ``driver``, ``facts`` and ``use_gds()`` (the
    machine gets libcufile and nvidia-fs: kvikio reads files that take O_DIRECT through cuFile)."""
    import sys
    from types import SimpleNamespace

    from dlstore.io import cuda, memory
    from tests.stand_ins import cupy_stand_in, kvikio_stand_in
    from tests.stand_ins.cuda_driver_stand_in import CudaDriver

    kvikio_stand_in.reset()
    cupy_stand_in.reset()
    for name, module in (("kvikio", kvikio_stand_in), ("kvikio.defaults", kvikio_stand_in.defaults),
                         ("cupy", cupy_stand_in)):
        monkeypatch.setitem(sys.modules, name, module)
    driver = CudaDriver(["stand-in GPU"] * cupy_stand_in.DEVICES)
    facts = cuda.CudaFacts(driver="13.0", devices=list(driver.names), devices_how="stand-in",
                           kvikio=kvikio_stand_in.__version__, cupy=cupy_stand_in.__version__,
                           kvikio_compat_preferred=True)
    monkeypatch.setattr(cuda, "load_driver", lambda load=None: driver)
    monkeypatch.setattr(memory, "_contexts", {})  # the primary contexts this process retained: none yet
    monkeypatch.setattr(cuda, "cuda_facts", lambda init=False: facts)
    def use_gds() -> None:  # a machine with libcufile and nvidia-fs: kvikio reads through cuFile where it can
        kvikio_stand_in.CUFILE_AVAILABLE = True
        facts.libcufile, facts.nvidia_fs, facts.kvikio_compat_preferred = "libcufile.so.0", True, False

    yield SimpleNamespace(kvikio=kvikio_stand_in, cupy=cupy_stand_in, driver=driver, facts=facts, use_gds=use_gds)
    kvikio_stand_in.reset()
    cupy_stand_in.reset()
