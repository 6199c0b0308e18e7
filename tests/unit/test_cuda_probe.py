"""The run-time CUDA/GDS probe and what its facts allow, with stand-in libraries: no GPU needed."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

from dlstore.io.cuda import (CudaFacts, cufile_allows_compat, device_missing, gds_verdict, kvikio_compat_env,
                             parse_device, probe_cuda)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class FakeDriver:
    """libcuda.so.1 as ctypes sees it: functions taking byref() arguments and returning CUresult."""

    def __init__(self, names, init_rc=0):
        self.names, self.init_rc = names, init_rc

    @staticmethod
    def _set(ref, value):
        ctypes.cast(ref, ctypes.POINTER(ctypes.c_int))[0] = value

    def cuDriverGetVersion(self, ref):
        self._set(ref, 13000)
        return 0

    def cuInit(self, flags):
        return self.init_rc

    def cuDeviceGetCount(self, ref):
        self._set(ref, len(self.names))
        return 0

    def cuDeviceGet(self, ref, i):
        self._set(ref, i)
        return 0

    def cuDeviceGetName(self, buf, n, dev):
        ctypes.memmove(buf, self.names[dev.value].encode() + b"\0", len(self.names[dev.value]) + 1)
        return 0


def loader(libs):
    def load(name):
        for stem, lib in libs.items():
            if stem in os.path.basename(name):
                return lib
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")
    return load


def probe(tmp_path, libs, env=None, nvfs=False):
    nvfs_path = tmp_path / "nvidia-fs"
    if nvfs:
        nvfs_path.mkdir()
    return probe_cuda(load=loader(libs), environ=env or {}, proc_nvfs=str(nvfs_path),
                      proc_modules=str(tmp_path / "modules"), import_modules=False)


def test_no_driver_names_what_is_missing(tmp_path):
    facts = probe(tmp_path, {})
    assert facts.driver is None and facts.devices == []
    assert "libcuda.so.1" in device_missing(facts)
    verdict = gds_verdict(facts)
    assert not verdict.runs and verdict.mode == "none"
    assert "no CUDA driver" in verdict.missing and "libcufile not found" in verdict.missing


def test_driver_devices_are_counted_and_named(tmp_path):
    facts = probe(tmp_path, {"libcuda.so": FakeDriver(["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"])})
    assert facts.driver == "13.0" and facts.driver_error == ""
    assert facts.devices == ["NVIDIA H100 80GB HBM3"] * 2
    assert device_missing(facts, 1) == ""
    assert "no CUDA device 2" in device_missing(facts, 2)


def test_driver_without_device_says_no_gpu(tmp_path):
    facts = probe(tmp_path, {"libcuda.so": FakeDriver([], init_rc=100)})
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
    assert cufile_allows_compat(text) is False
    assert cufile_allows_compat('{"properties": {}}') is None
    assert cufile_allows_compat("not json") is None


def test_cufile_json_from_the_environment(tmp_path):
    conf = tmp_path / "cufile.json"
    conf.write_text('{"properties": {"allow_compat_mode": false}}')
    facts = probe(tmp_path, {"libcuda.so": FakeDriver(["GPU"])}, env={"CUFILE_ENV_PATH_JSON": str(conf)}, nvfs=True)
    assert facts.cufile_json == str(conf) and facts.cufile_allow_compat is False
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
