"""The run-time CUDA/GDS probe and what its facts allow, with stand-in libraries: no GPU needed."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dlstore.io.cuda import (CudaFacts, cufile_property, device_missing, gds_verdict, kvikio_compat_env,
                             parse_device, probe_cuda)
from tests.stand_ins.cuda_driver_stand_in import CudaDriver, loader

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def probe(tmp_path, driver, env=None, nvfs=False, gpus=(), init=True):
    nvfs_path = tmp_path / "nvidia-fs"
    if nvfs:
        nvfs_path.mkdir()
    for i, name in enumerate(gpus):  # /proc/driver/nvidia/gpus/<bus id>/information
        (tmp_path / "gpus" / f"0000:{i:02x}:00.0").mkdir(parents=True)
        (tmp_path / "gpus" / f"0000:{i:02x}:00.0" / "information").write_text(
            f"Model: \t {name}\nIRQ: 1\nGPU UUID: \t GPU-{i}f0e2a7c-0000-0000-0000-00000000000{i}\n")
    return probe_cuda(init=init, load=loader(driver), environ=env or {}, proc_nvfs=str(nvfs_path),
                      proc_modules=str(tmp_path / "modules"), proc_gpus=str(tmp_path / "gpus"))


def test_no_driver_names_what_is_missing(tmp_path):
    facts = probe(tmp_path, None)
    assert facts.driver is None and facts.devices == []
    assert "libcuda.so.1" in device_missing(facts)
    verdict = gds_verdict(facts)
    assert not verdict.runs and verdict.mode == "none"
    assert "no CUDA driver" in verdict.missing
    # libcufile is looked for on the real machine (find_library_file): named only where it is absent.
    assert ("libcufile not found" in verdict.missing) == (facts.libcufile is None)


def test_driver_devices_are_counted_and_named(tmp_path):
    facts = probe(tmp_path, CudaDriver(["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]))
    assert facts.driver == "13.0" and facts.driver_error == ""
    assert facts.devices == ["NVIDIA H100 80GB HBM3"] * 2
    assert device_missing(facts, 1) == ""
    assert "no CUDA device 2" in device_missing(facts, 2)


def test_driver_without_device_says_no_gpu(tmp_path):
    facts = probe(tmp_path, CudaDriver([], init_rc=100))
    assert facts.driver == "13.0"
    assert "no GPU" in device_missing(facts)
    assert "no GPU" in gds_verdict(facts).missing


def usable(**changes):
    facts = CudaFacts(driver="13.0", devices=["GPU"], kvikio="26.10.0", cupy="14.0.1",
                      libcufile="/usr/lib/libcufile.so.0", nvidia_fs=True)
    for k, v in changes.items():
        setattr(facts, k, v)
    return facts


def test_true_gds_needs_libcufile_and_nvidia_fs():
    assert gds_verdict(usable()).mode == "gds"
    v = gds_verdict(usable(nvidia_fs=False))
    assert v.runs and v.mode == "compat" and "nvidia-fs not loaded" in v.reason
    v = gds_verdict(usable(libcufile=None))
    assert v.mode == "compat" and "libcufile not found" in v.reason
    v = gds_verdict(usable(kvikio_compat="on"))
    assert v.mode == "compat" and "KVIKIO_COMPAT_MODE=on" in v.reason
    v = gds_verdict(usable(kvikio_compat_preferred=True))
    assert v.mode == "compat" and "prefers" in v.reason


def test_compat_mode_off_without_nvidia_fs_cannot_run():
    v = gds_verdict(usable(nvidia_fs=False, kvikio_compat="off"))
    assert not v.runs and "KVIKIO_COMPAT_MODE=off" in v.missing


def test_kvikio_and_cupy_missing_are_named():
    v = gds_verdict(usable(kvikio=None, kvikio_error="kvikio is not installed"))
    assert not v.runs and "kvikio is not installed" in v.missing
    v = gds_verdict(usable(cupy=None))
    assert not v.runs and "cupy" in v.missing


def test_compat_settings_are_read():
    assert kvikio_compat_env({}) == "auto"
    assert kvikio_compat_env({"KVIKIO_COMPAT_MODE": "ON"}) == "on"
    assert kvikio_compat_env({"KVIKIO_COMPAT_MODE": "false"}) == "off"
    text = '{\n // comment\n "properties": {\n  "allow_compat_mode": false // off\n }\n}'
    assert cufile_property(text, "allow_compat_mode") is False
    assert cufile_property('{"properties": {}}', "allow_compat_mode") is None
    assert cufile_property("not json", "use_pci_p2pdma") is None


def test_cufile_json_from_the_environment(tmp_path):
    conf = tmp_path / "cufile.json"
    conf.write_text('{"properties": {"allow_compat_mode": false, "use_pci_p2pdma": true}}')
    facts = probe(tmp_path, CudaDriver(["GPU"]), env={"CUFILE_ENV_PATH_JSON": str(conf)}, nvfs=True)
    assert facts.cufile_json == str(conf) and facts.cufile_allow_compat is False and facts.cufile_p2pdma is True
    assert facts.nvidia_fs


def test_parse_device():
    assert parse_device(None) is None and parse_device("cpu") is None
    assert parse_device("cuda") == 0 and parse_device("cuda:3") == 3
    assert parse_device("cuda:local") == 0 and parse_device(" CUDA:Local", local_rank=3) == 3
    assert parse_device("cuda:2", local_rank=3) == 2  # a numbered GPU is that GPU on every rank
    with pytest.raises(ValueError, match="cuda:N"):
        parse_device("gpu0")


def test_dlstore_info_reports_the_gpu_path(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO)
    done = subprocess.run([sys.executable, "-m", "dlstore", "info", str(tmp_path)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    for name in ("CRC-32C", "JPEG decode", f"O_DIRECT {tmp_path}", "MPI", "CUDA driver", "kvikio", "libcufile",
                 "nvidia-fs", "compat mode", "io='gds'"):
        assert name in done.stdout
    done = subprocess.run([sys.executable, "-m", "dlstore", "info", "--json"], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert set(doc["gds"]) == {"runs", "mode", "reason", "missing"}
    assert doc["gds"]["runs"] == (doc["gds"]["missing"] == "")


# ---- fork safety: a verdict initialises nothing ----------------------------------------------------------

def test_the_probe_without_init_calls_no_cuinit_and_starts_no_kvikio_pool(tmp_path, gpu_libraries):
    driver = gpu_libraries.driver  # libcuda.so.1 for the probe, as for the pinned memory
    facts = probe(tmp_path, driver, gpus=["NVIDIA H100 80GB HBM3"] * 3, init=False,
                  env={"CUDA_VISIBLE_DEVICES": "2,0,7,1"})
    assert driver.calls == ["cuDriverGetVersion"] and not driver.initialized
    assert not gpu_libraries.kvikio.thread_pool_started()
    # The kernel driver's list, narrowed as CUDA narrows it (up to the first ordinal it cannot use).
    assert facts.devices == ["NVIDIA H100 80GB HBM3"] * 2 and "CUDA_VISIBLE_DEVICES=2,0,7,1" in facts.devices_how
    assert facts.kvikio == "26.10.00" and facts.kvikio_compat_preferred is None and device_missing(facts, 1) == ""
    # UUIDs (a unique prefix) and MIG instances as CUDA takes them; an ambiguous or unknown one ends the list.
    for n, (visible, count) in enumerate((("GPU-2f0e,GPU-0", 2), ("GPU-1f0e2a7c-0000-0000-0000-000000000001,-1", 1),
                                          ("MIG-4b4d,GPU-9", 1), ("", 0), ("0,1,2", 3), ("GPU-,1", 0))):
        facts = probe(tmp_path / f"v{n}", driver, gpus=["H100"] * 3, init=False, env={"CUDA_VISIBLE_DEVICES": visible})
        assert len(facts.devices) == count, visible
    assert "no GPU (none in" in device_missing(probe(tmp_path / "none", driver, init=False))


def test_the_probe_with_init_asks_the_driver_and_kvikio(tmp_path, gpu_libraries):
    driver = gpu_libraries.driver
    facts = probe(tmp_path, driver, init=True)
    assert driver.calls[:2] == ["cuDriverGetVersion", "cuInit"] and facts.devices == ["stand-in GPU"] * 2
    assert facts.devices_how == "cuInit" and facts.kvikio_compat_preferred is True
    assert gpu_libraries.kvikio.thread_pool_started()  # asking kvikio starts its pool: only where it reads


def test_dataset_loader_and_readers_probe_cuda_without_init(tmp_path, monkeypatch):
    # Made in a DataLoader's parent, they must leave CUDA and kvikio untouched for the workers it forks.
    import dlstore
    from dlstore.io import cuda
    from dlstore.pipeline.bert import Bert
    from dlstore.pipeline.loader import Loader
    from tests.helpers import write_tfrecord
    from tests.unit.test_memory import bert_file

    inits = []

    def recording_probe(**kwargs):
        inits.append(kwargs.get("init", "the default"))
        return CudaFacts(driver="13.0", devices=["GPU"], kvikio="26.10", cupy="14.2", nvidia_fs=True,
                         libcufile="libcufile.so.0")
    monkeypatch.setattr(cuda, "probe_cuda", recording_probe)
    cuda.cuda_facts.cache_clear()
    try:
        path = write_tfrecord(tmp_path / "a.tfrecord", [b"x"] * 4)
        dlstore.Dataset(path, io="gds", batch_size=2)
        dlstore.open_records(path, io="gds")
        Loader(dlstore.open_records(bert_file(tmp_path, 4)), Bert(16, 4), 2, device="cuda:0")
    finally:
        cuda.cuda_facts.cache_clear()
    assert inits == [False]  # one probe for the process, without init


# ---- what kvikio did -------------------------------------------------------------------------------------

def test_gds_without_nvidia_fs_through_pci_p2pdma():
    v = gds_verdict(usable(nvidia_fs=False, cufile_p2pdma=True, cufile_json="/etc/cufile.json"))
    assert v.mode == "gds" and "PCI P2PDMA (/etc/cufile.json: use_pci_p2pdma)" in v.reason
    assert "kvikio decides per file" in v.reason
    v = gds_verdict(usable(nvidia_fs=False))
    assert v.mode == "compat" and "nvidia-fs not loaded, and no cufile.json does not set use_pci_p2pdma" in v.reason


def test_kvikio_backends_reports_what_moved_the_bytes(tmp_path, gpu_libraries):
    from dlstore.io.cuda import kvikio_backends, kvikio_monitor

    kvikio, cp = gpu_libraries.kvikio, gpu_libraries.cupy
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 1024)  # 256 KiB
    assert kvikio_backends(None)["gds_mode"] == "unknown"
    monitor = kvikio_monitor()
    assert kvikio_backends(monitor)["gds_mode"] == "none"
    buf = cp.empty(1 << 20, dtype=cp.uint8)
    with kvikio.CuFile(path, "r") as f:  # compat mode (no libcufile): everything through POSIX
        f.pread(buf, 65536, 0).get()
    report = kvikio_backends(monitor)
    assert report["gds_mode"] == "compat" and report["bytes"] == {"GDS": 0, "POSIX": 65536}
    kvikio.CUFILE_AVAILABLE = True  # a GDS machine: cuFile for reads at or over gds_threshold, POSIX under it
    monitor = kvikio_monitor()
    with kvikio.CuFile(path, "r") as f:
        if not f.is_direct_io_supported():
            pytest.skip(f"{tmp_path} refuses O_DIRECT: kvikio would read it in compat mode")
        f.pread(buf, 65536, 0).get()
        assert kvikio_backends(monitor)["gds_mode"] == "gds"
        f.pread(buf, 4096, 0).get()
    report = kvikio_backends(monitor)
    assert report["gds_mode"] == "gds+compat" and report["reads"] == {"GDS": 1, "POSIX": 1}
    assert report["reason"].startswith("kvikio's statistics: 65536 bytes in 1 reads through cuFile (GDS), 4096 bytes")
