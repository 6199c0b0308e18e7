"""Smoke tests of the benchmark: cache control, fio's report, tables, the scenario registry, the
synchronised readers, and ``python -m dlstore.bench storage`` and ``benchmarks/read_throughput.py``
end to end at tiny size."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from dlstore.bench import load_scenario, report, sysinfo
from dlstore.io import pagecache as cache
from dlstore.bench import storage as storage_bench
from dlstore.bench.fio import (FioError, fio_job_file, fio_missing_reason, fitting_block_size, huge_page_pool,
                               huge_pages_needed, parse_fio_json, run_fio)
from dlstore.bench.storage import _BatchBarrier, count_records
from dlstore.errors import DlstoreError

from tests.helpers import REPO as ROOT
from tests.helpers import direct_refused


def _load(path) -> dict:
    with open(path) as f:
        return json.load(f)


def _on_memory_fs(path) -> bool:
    return sysinfo.filesystem_of(os.fspath(path))["fstype"] in ("tmpfs", "ramfs")


# ---- cache control -------------------------------------------------------------------------------

@pytest.fixture
def cached_file(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(os.urandom(4 << 20))
    with open(path, "rb") as f:  # written and read back: its pages are in the cache now
        f.read()
    return os.fspath(path)


def test_meminfo_and_free_page_cache():
    info = cache.meminfo()
    assert info["MemTotal"] > 0 and info["MemTotal"] % 1024 == 0
    assert 0 < cache.free_page_cache_bytes() <= info["MemTotal"]
    with open("/proc/meminfo") as f:  # read independently of dlstore's parser
        cached_kb = next(int(line.split()[1]) for line in f if line.startswith("Cached:"))
    # The cache changes between the two reads: within 256 MiB of each other, and never above the total.
    assert abs(cache.cached_bytes() - cached_kb * 1024) < 256 << 20 and cache.cached_bytes() <= info["MemTotal"]


def test_evict_files_empties_the_cache_of_that_file(cached_file):
    if _on_memory_fs(cached_file):
        pytest.skip("on tmpfs the page cache is the file: nothing to evict")
    assert cache.resident_fraction([cached_file]) > 0.5
    method = cache.evict_files([cached_file])
    assert "posix_fadvise" in method and "1 file" in method
    assert cache.resident_fraction([cached_file]) < 0.05


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root, to become another user")
def test_residency_of_another_users_file_is_unknown(cached_file):
    # mincore reports every page of a file the process neither owns nor may write as resident: unknown.
    from tests.helpers import as_nobody

    assert cache.resident_fraction([cached_file]) is not None
    os.chmod(cached_file, 0o644)
    assert as_nobody(cached_file, lambda p: cache.resident_fraction([p])) == "None"


def test_make_cold_says_which_method_ran(cached_file):
    if _on_memory_fs(cached_file):
        pytest.skip("on tmpfs the page cache is the file: nothing to evict")
    method = cache.make_cold([cached_file])
    if cache.drop_page_cache_refusal() is None:
        assert "drop_caches" in method
    else:
        assert "posix_fadvise" in method and "cannot drop the page cache" in method
    assert cache.resident_fraction([cached_file]) < 0.05


def test_drop_page_cache_refuses_clearly_when_not_allowed(monkeypatch):
    monkeypatch.setattr(cache, "drop_page_cache_refusal", lambda: "not root")
    with pytest.raises(PermissionError, match="not root"):
        cache.drop_page_cache()


def test_resident_fraction_of_an_empty_file(tmp_path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert cache.resident_fraction([os.fspath(empty)]) == 1.0


# ---- fio ---------------------------------------------------------------------------------------------

# Captured from a real run (fio-3.33, the job file fio_job_file() writes for 3 files and 2 jobs) and
# trimmed to the fields a report needs: latency histograms, write/trim sections and disk_util cut.
FIO_JSON = """
{
 "fio version": "fio-3.33",
 "timestamp": 1795290574,
 "time": "Sat Nov 21 19:49:34 2026",
 "global options": {"rw": "read", "bs": "1M", "direct": "1", "ioengine": "psync", "iodepth": "1",
                    "file_service_type": "sequential", "invalidate": "0"},
 "jobs": [
  {"jobname": "read0", "groupid": 0, "error": 0,
   "job options": {"filename": "/tmp/fiot/f0.bin:/tmp/fiot/f2.bin"},
   "read": {"io_bytes": 799014912, "io_kbytes": 780288, "bw_bytes": 664737863, "bw": 649158,
            "iops": 633.943428, "runtime": 1202, "total_ios": 762, "short_ios": 0, "drop_ios": 0},
   "job_runtime": 1201, "usr_cpu": 0.0, "sys_cpu": 7.160699, "ctx": 764, "majf": 0, "minf": 268,
   "elapsed": 2},
  {"jobname": "read1", "groupid": 0, "error": 0,
   "job options": {"filename": "/tmp/fiot/f1.bin"},
   "read": {"io_bytes": 399507456, "io_kbytes": 390144, "bw_bytes": 510226636, "bw": 498268,
            "iops": 486.590038, "runtime": 783, "total_ios": 381, "short_ios": 0, "drop_ios": 0},
   "job_runtime": 782, "usr_cpu": 0.895141, "sys_cpu": 4.859335, "ctx": 382, "majf": 0, "minf": 268,
   "elapsed": 2}
 ]
}
"""


def test_parse_fio_json_sums_jobs_over_the_longest_runtime():
    r = parse_fio_json("fio: a note fio prints first\n" + FIO_JSON)
    assert r.jobs == 2
    assert r.bytes == 799014912 + 399507456
    assert r.seconds == pytest.approx(1.202)
    assert r.gb_per_s == pytest.approx((799014912 + 399507456) / 1.202 / 1e9)
    cpu = 0.07160699 * 1.202 + (0.00895141 + 0.04859335) * 0.783
    assert r.cpu_seconds == pytest.approx(cpu)
    assert r.cpu_seconds_per_gb == pytest.approx(cpu / (r.bytes / 1e9))
    assert r.version == "fio-3.33"
    assert r.describe() == "fio psync qd1, 2 jobs, bs=1M sequential direct=1 reads"
    assert r.queue_depth_one  # one request in flight per job: a reference, not a ceiling
    deep = parse_fio_json(FIO_JSON.replace('"ioengine": "psync", "iodepth": "1"',
                                           '"ioengine": "io_uring", "iodepth": "32"'))
    assert deep.describe().startswith("fio io_uring qd32, 2 jobs") and not deep.queue_depth_one
    assert json.loads(json.dumps(r.to_dict()))["bytes"] == r.bytes


def test_parse_fio_json_errors():
    with pytest.raises(FioError, match="no JSON"):
        parse_fio_json("fio: file not found")
    failed = json.loads(FIO_JSON)
    failed["jobs"][1]["error"] = 22
    with pytest.raises(FioError, match="read1 failed with error 22"):
        parse_fio_json(json.dumps(failed))
    with pytest.raises(FioError, match="no jobs"):
        parse_fio_json('{"jobs": []}')


def test_fio_job_file_deals_files_to_jobs():
    text = fio_job_file(["/d/a", "/d/b", "/d/c", "/d/we:ird"], jobs=2)
    assert "direct=1" in text and "bs=1M" in text and "rw=read" in text and "invalidate=0" in text
    assert "[read0]\nfilename=/d/a:/d/c\n" in text
    assert "[read1]\nfilename=/d/b:/d/we\\:ird\n" in text
    assert text.count("[read") == 2
    assert fio_job_file(["/d/a"], jobs=8).count("[read") == 1  # never more jobs than files
    with pytest.raises(ValueError):
        fio_job_file([], jobs=1)


def test_fio_job_file_buffers(tmp_path):
    # dlstore's buffers are huge pages; fio's must be able to be too, or a VM's disk that pays per
    # 4 KiB segment serves fio at half the rate (docs/engines_cold.md).
    paths = []
    for name in ("a", "b"):
        (tmp_path / name).write_bytes(b"x" * 8192)
        paths.append(os.fspath(tmp_path / name))
    for rw in ("read", "randread"):
        huge = fio_job_file(paths, jobs=2, rw=rw, buffers="huge")
        assert "\nmem=mmaphuge\n" in huge and "mem=malloc" not in huge
        assert "\nmem=malloc\n" in fio_job_file(paths, jobs=2, rw=rw)
    with pytest.raises(ValueError, match="buffers"):
        fio_job_file(paths, jobs=1, buffers="shm")
    r = parse_fio_json(FIO_JSON.replace('"invalidate": "0"', '"invalidate": "0", "mem": "mmaphuge"'))
    assert r.describe() == "fio psync qd1, 2 jobs, bs=1M sequential direct=1 reads, huge-page buffers"


def test_huge_pages_needed_covers_what_fio_maps():
    # fio-3.33 was seen to need 3 pages of 2 MiB for iodepth 2 x 1 MiB, 2 for 1 x 116 KiB (per job).
    two_mib = 2 << 20
    assert huge_pages_needed(2, "1M", 2, two_mib) >= 2 * 3
    assert huge_pages_needed(2, "116k", 1, two_mib) >= 2 * 2
    assert huge_pages_needed(1, "1M", 64, two_mib) >= 32 + 1
    with pytest.raises(ValueError, match="fio size"):
        huge_pages_needed(1, "1X", 1, two_mib)


def test_huge_page_pool_raises_the_overcommit_and_puts_it_back(tmp_path):
    knob = tmp_path / "nr_overcommit_hugepages"
    knob.write_text("3\n")
    info = {"Hugepagesize": 2 << 20, "HugePages_Free": 1, "HugePages_Rsvd": 0, "HugePages_Surp": 2}
    need = huge_pages_needed(2, "1M", 8, 2 << 20)
    with huge_page_pool(2, "1M", 8, overcommit_file=os.fspath(knob), meminfo=lambda: info) as refused:
        assert refused is None
        # the surplus pages in use stay allowed, and what the free pool lacks is added
        assert int(knob.read_text()) == 3 + 2 + need - 1
    assert knob.read_text() == "3\n"
    plenty = dict(info, HugePages_Free=need)
    with huge_page_pool(2, "1M", 8, overcommit_file=os.fspath(knob), meminfo=lambda: plenty) as refused:
        assert refused is None and knob.read_text() == "3\n"  # the free pool serves: nothing changed
    with huge_page_pool(2, "1M", 8, overcommit_file=os.fspath(tmp_path), meminfo=lambda: info) as refused:
        assert "cannot allow" in refused  # not writable (a directory here; not root, in life)
    with huge_page_pool(2, "1M", 8, overcommit_file=os.fspath(knob), meminfo=dict) as refused:
        assert "no huge pages" in refused


def test_fio_reads_a_file_smaller_than_its_block_with_the_largest_block_it_holds(tmp_path):
    small, big = tmp_path / "small", tmp_path / "big"
    small.write_bytes(b"x" * 416_331)  # a BERT shard of 500 records
    big.write_bytes(b"x" * (2 << 20))
    assert fitting_block_size([os.fspath(big)], "1M") == "1M"
    assert fitting_block_size([os.fspath(big), os.fspath(small)], "1M") == "404k"  # 4 KiB blocks it holds whole
    assert fitting_block_size([os.fspath(small)], "116k") == "116k"
    tiny = tmp_path / "tiny"
    tiny.write_bytes(b"x" * 100)
    with pytest.raises(FioError, match=f"{tiny} holds 100 bytes, under one 4 KiB O_DIRECT block"):
        fitting_block_size([os.fspath(big), os.fspath(tiny)], "1M")


def test_a_failing_fio_is_said_in_one_line(tmp_path, monkeypatch):
    import dlstore.bench.fio as fio

    said = "fio: blocksize is larger than data set range\n" * 2  # once per job, as fio-3.33 says it
    monkeypatch.setattr(fio, "fio_missing_reason", lambda: None)
    monkeypatch.setattr(fio.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 2, "", said))
    path = tmp_path / "f"
    path.write_bytes(b"x" * (1 << 20))
    with pytest.raises(FioError) as e:
        run_fio([os.fspath(path)], jobs=2, buffers="malloc")
    assert str(e.value) == "fio exited with 2: fio: blocksize is larger than data set range"


def test_run_fio_on_a_real_file(tmp_path):
    if fio_missing_reason():
        pytest.skip(fio_missing_reason())
    if direct_refused(tmp_path):
        pytest.skip(direct_refused(tmp_path))
    paths = []
    for i in range(2):
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom((3 << 20) + 100))  # a tail shorter than bs is not read by fio
        paths.append(os.fspath(p))
    r = run_fio(paths, jobs=2)
    assert r.jobs == 2 and r.bytes == 2 * (3 << 20) and r.gb_per_s > 0
    # huge-page buffers where this process could allow them, else malloc's and a note saying why
    assert (r.config.get("mem") == "mmaphuge") != bool(r.buffers_note), (r.config, r.buffers_note)
    if os.geteuid() == 0 and os.access("/proc/sys/vm/nr_overcommit_hugepages", os.W_OK):
        assert r.config.get("mem") == "mmaphuge", r.buffers_note
    rand = run_fio(paths, jobs=2, rw="randread", bs="64k", ioengine="io_uring", iodepth=4, buffers="malloc")
    assert rand.config.get("mem") == "malloc" and not rand.buffers_note, (rand.config, rand.buffers_note)
    assert 0 < rand.bytes <= 2 * ((3 << 20) + (64 << 10)), rand.bytes  # each job rounds its share up to bs
    small = tmp_path / "small"
    small.write_bytes(os.urandom(400_000))  # smaller than the 1 MiB block: read with the 388k it holds
    r = run_fio([os.fspath(small)], jobs=1, buffers="malloc")
    assert r.config.get("bs") == "388k" and r.bytes == 388 << 10


# ---- report ------------------------------------------------------------------------------------------

COLUMNS = [report.Column("name", "reader", align="<"), report.Column("gbs", "GB/s", "{:.2f}"),
           report.Column("ratio", "vs fio", report.fmt_ratio)]


def test_text_table_aligns_and_prints_missing_values_as_dash():
    rows = [{"name": "dlstore io=direct", "gbs": 2.456, "ratio": 0.97}, {"name": "DALI", "gbs": None}]
    text = report.text_table(rows, COLUMNS, title="COLD")
    lines = text.splitlines()
    assert lines[0] == "COLD"
    assert lines[1].split() == ["reader", "GB/s", "vs", "fio"]
    assert set(lines[2].replace(" ", "")) == {"-"}
    assert lines[3].split() == ["dlstore", "io=direct", "2.46", "0.97x"]
    assert lines[4].split() == ["DALI", "-", "-"]
    assert len({len(line) for line in lines[1:3]}) == 1  # header and rule line up


def test_markdown_table():
    md = report.markdown_table([{"name": "a|b", "gbs": 1.0, "ratio": float("nan")}], COLUMNS)
    assert md.splitlines() == ["| reader | GB/s | vs fio |", "|:---|---:|---:|", "| a\\|b | 1.00 | - |"]


def test_write_json_round_trips_numpy_values(tmp_path):
    path = report.write_json(os.fspath(tmp_path / "deep" / "r.json"),
                             {"n": np.int64(3), "a": np.arange(3, dtype=np.uint64), "x": 1.5})
    assert _load(path) == {"n": 3, "a": [0, 1, 2], "x": 1.5}


def test_summarize():
    s = report.summarize([2.0, 1.0, 4.0])
    assert s == {"median": 2.0, "min": 1.0, "max": 4.0, "spread_pct": 150.0, "n": 3}
    assert report.summarize([])["median"] is None


# ---- sysinfo -----------------------------------------------------------------------------------------

def test_sysinfo_header(tmp_path):
    f = tmp_path / "x"
    f.write_bytes(b"x")
    info = sysinfo.collect([os.fspath(f)], "direct", "requested")
    text = sysinfo.format_header(info)
    for word in ("CPU", "kernel", "memory", "data", "io engine  direct: requested", "CRC", "GPU/GDS"):
        assert word in text
    assert info["cores"] >= 1 and info["filesystem"] != ""
    assert sysinfo.filesystem_of("/")["mount"] == "/"


def test_other_processes_cores_is_the_machine_busy_time_less_ours():
    tick = os.sysconf("SC_CLK_TCK")
    before, after = [(0, 0), (100, 100)], [(3 * tick, 4 * tick), (100 + tick, 100 + 4 * tick)]
    # 4 s busy over both cores, 1 s of it this process, in 2 s of wall time: others kept 1.5 cores busy.
    assert sysinfo.other_processes_cores(before, after, 1.0, 2.0) == pytest.approx(1.5)
    assert sysinfo.other_processes_cores(before, after, 9.0, 2.0) == 0.0  # never negative
    assert sysinfo.other_processes_cores([], [], 1.0, 2.0) is None
    # Over a few ticks, each core's rounding (a tick each) outweighs what is measured: no figure.
    assert sysinfo.other_processes_cores(before, after, 0.0, 10 / tick) is None


@pytest.mark.slow
def test_a_busy_neighbour_is_seen():
    if not sysinfo.per_core_cpu_ticks():
        pytest.skip("no /proc/stat on this system")
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time() + 1.5\nwhile time.time() < t: pass"])
    try:
        time.sleep(0.3)  # the neighbour is spinning
        ticks0, cpu0, t0 = sysinfo.per_core_cpu_ticks(), sysinfo.process_cpu_seconds(), time.perf_counter()
        time.sleep(1.0)
        seconds = time.perf_counter() - t0
        others = sysinfo.other_processes_cores(ticks0, sysinfo.per_core_cpu_ticks(),
                                               sysinfo.process_cpu_seconds() - cpu0, seconds)
    finally:
        spin.wait()
    assert others > sysinfo.OTHERS_TOLERATED_CORES
    assert any("other processes kept" in w for w in sysinfo.trust_warnings("tier x", seconds, others))


def test_trust_warnings():
    assert sysinfo.trust_warnings("tier page-cache", 5.0, 0.1) == []
    short, = sysinfo.trust_warnings("tier page-cache", 0.15, 0.0)
    assert short.startswith("tier page-cache lasted 0.15 s, under 2 s")
    busy, = sysinfo.trust_warnings("cold pass 2", 5.0, 1.25)
    assert busy.startswith("cold pass 2: other processes kept 1.25 cores busy")
    assert len(sysinfo.trust_warnings("t", 0.5, 1.0)) == 2


def test_busiest_core_percent():
    before = [(100, 1000), (500, 1000)]
    after = [(150, 1100), (590, 1100)]
    assert sysinfo.busiest_core_percent(before, after) == pytest.approx(90.0)
    assert sysinfo.busiest_core_percent(before, before) is None
    assert sysinfo.per_core_cpu_ticks() == [] or all(b <= t for b, t in sysinfo.per_core_cpu_ticks())


# ---- scenarios and readers ---------------------------------------------------------------------------

def _bench(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "dlstore.bench", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


def test_registry_and_unknown_scenarios_exit_2():
    # resnet50 and bert: tests/unit/test_bench_pipelines.py.
    assert load_scenario("storage") is storage_bench
    r = _bench("nonsense")
    assert r.returncode == 2 and "invalid choice" in r.stderr


class _FakeBatch:
    def __init__(self, n):
        self.num_records, self.nbytes = n, 10 * n


class _FakeReader:
    def __init__(self, batches, log, who):
        self._batches, self._log, self._who = batches, log, who

    def batches(self):
        for i, n in enumerate(self._batches):
            self._log.append((self._who, i))
            yield _FakeBatch(n)


def test_synchronised_readers_move_in_lockstep_and_finish_unevenly():
    log = []
    readers = [_FakeReader([1] * 5, log, 0), _FakeReader([2] * 2, log, 1), _FakeReader([3] * 7, log, 2)]
    done = []
    t = threading.Thread(target=lambda: done.append(count_records(readers, sync=True)))
    t.start()
    t.join(10)
    assert not t.is_alive(), "a reader with fewer batches left the others waiting"
    assert done == [(5 + 4 + 21, 10 * (5 + 4 + 21))]
    # A reader takes batch i only after every reader still going has finished batch i - 1, so
    # nothing logged after batch i can be older than batch i - 1.
    for k, (_, i) in enumerate(log):
        assert all(j >= i - 1 for _, j in log[k + 1:])


def test_batch_barrier_lets_the_last_reader_through_when_another_leaves():
    b = _BatchBarrier(2)
    passed = []
    t = threading.Thread(target=lambda: (b.wait(), passed.append(True)))
    t.start()
    b.leave()
    t.join(5)
    assert passed == [True]


def test_count_records_reraises_a_reader_error():
    class Broken:
        def batches(self):
            yield _FakeBatch(1)
            raise OSError("EIO at byte 4096")

    with pytest.raises(OSError, match="EIO"):
        count_records([Broken(), _FakeReader([1, 1], [], 1)], sync=True)


# ---- end to end ----------------------------------------------------------------------------------------

@pytest.fixture
def tiny_set(tmp_path):
    import dlstore

    rng = np.random.default_rng(3)
    for s in range(3):
        with dlstore.TFRecordWriter(os.fspath(tmp_path / f"train-{s}.tfrecord")) as w:
            for n in rng.integers(1, 200_000, 20):
                w.write(rng.bytes(int(n)))
    return tmp_path


STORAGE_KEYS = {"io", "io_reason", "cache", "cache_method", "records", "bytes", "seconds", "gb_per_s",
                "records_per_s", "cpu_seconds_per_gb", "fio_gb_per_s", "ratio_vs_fio", "repeats", "runs",
                "sysinfo"}


@pytest.mark.slow
def test_bench_storage_writes_the_json_keys(tiny_set):
    out = tiny_set / "s.json"
    r = _bench("storage", "--data", os.fspath(tiny_set / "*.tfrecord"), "--io", "buffered", "--cache", "warm",
               "--repeat", "2", "--json", os.fspath(out))
    assert r.returncode == 0, r.stderr
    assert "io engine  buffered: requested" in r.stdout and "median" in r.stdout
    doc = _load(out)
    assert STORAGE_KEYS <= set(doc)
    assert doc["io"] == "buffered" and doc["cache"] == "warm" and doc["records"] == 60
    assert doc["cache_method"] == "one untimed pass first"
    assert len(doc["repeats"]) == 2 and doc["gb_per_s"] > 0
    for rep in doc["repeats"]:  # the per-GB figure is the CPU seconds over the GB read, not a guess
        gb = rep["bytes"] / 1e9
        assert rep["cpu_seconds_per_gb"] == pytest.approx(rep["cpu_seconds"] / gb) and rep["cpu_seconds"] >= 0
    assert doc["repeats"][0]["cached_before"] in (None, pytest.approx(1.0, abs=0.05))
    # A 6 MB set reads in milliseconds: every pass is flagged as too short to trust.
    assert len([w for w in doc["warnings"] if "too short for a stable figure" in w]) == 2
    assert "warning: warm pass 1 lasted" in r.stdout
    if fio_missing_reason() or direct_refused(tiny_set):
        assert doc["fio_gb_per_s"] is None and doc["fio_skipped"]
    else:
        assert doc["fio_gb_per_s"] > 0 and doc["ratio_vs_fio"] > 0
        assert "vs fio: fio psync qd1" in r.stdout and "not the device's ceiling" in r.stdout


@pytest.mark.slow
def test_bench_storage_cold_with_synchronised_readers(tiny_set):
    out = tiny_set / "s.json"
    r = _bench("storage", "--data", os.fspath(tiny_set), "--io", "direct", "--cache", "cold", "--repeat", "1",
               "--readers", "2", "--sync", "--no-fio", "--json", os.fspath(out))
    assert r.returncode == 0, r.stderr
    doc = _load(out)
    assert doc["cache"] == "cold" and doc["readers"] == 2 and doc["sync"] is True and doc["records"] == 60
    assert "drop_caches" in doc["cache_method"] or "posix_fadvise" in doc["cache_method"]
    assert doc["io"] in ("direct", "buffered")  # buffered, with the reason, where O_DIRECT is refused
    assert doc["fio_skipped"] == "--no-fio"


@pytest.mark.slow
def test_bench_storage_reports_the_readers_that_ran(tiny_set):
    # A user trial: --readers 5 over 2 files ran 2 readers (one per file at most) while the header and the
    # JSON said 5.
    out = tiny_set / "s.json"
    r = _bench("storage", "--data", os.fspath(tiny_set), "--io", "buffered", "--cache", "warm", "--repeat", "1",
               "--readers", "5", "--no-fio", "--json", os.fspath(out))
    assert r.returncode == 0, r.stderr
    assert "readers 3 (--readers 5: one per file at most)" in r.stdout
    doc = _load(out)
    assert doc["readers"] == 3 and doc["readers_requested"] == 5 and doc["records"] == 60


def test_bench_storage_under_a_launcher_is_refused_in_one_line(tiny_set):
    # A user trial: under mpirun -np 2 each rank read every file, printed a whole report and wrote the same JSON.
    out = tiny_set / "s.json"
    env = dict(os.environ, OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_LOCAL_RANK="1",
               OMPI_COMM_WORLD_LOCAL_SIZE="2")
    r = _bench("storage", "--data", os.fspath(tiny_set), "--no-fio", "--json", os.fspath(out), env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and not out.exists()
    assert "bench storage runs in one process, not as rank 1 of 2" in r.stderr and "--readers N" in r.stderr


def test_bench_storage_bad_data_exits_2(tmp_path):
    r = _bench("storage", "--data", os.fspath(tmp_path / "nothing-*.tfrecord"))
    assert r.returncode == 2 and "no record file matches" in r.stderr


def test_bench_storage_on_empty_shards_says_there_is_nothing_to_read(tmp_path):
    """A 0-byte shard printed the header, then a TypeError from formatting a rate of None (exit 1)."""
    (tmp_path / "EMPTY.tfrecord").write_bytes(b"")
    r = _bench("storage", "--data", os.fspath(tmp_path / "EMPTY.tfrecord"), "--cache", "warm", "--repeat", "1",
               "--quiet", "--no-fio")
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert f"--data {tmp_path / 'EMPTY.tfrecord'}: nothing to read" in r.stderr
    with pytest.raises(DlstoreError, match="nothing to read"):  # the library entry point, too
        storage_bench.run_storage([os.fspath(tmp_path / "EMPTY.tfrecord")], io="buffered", cache="warm", repeat=1,
                                  fio=False, log=lambda s: None)


@pytest.mark.slow
def test_read_throughput_quick(tmp_path):
    pytest.importorskip("PIL", reason="the synthetic ImageNet-like set needs pillow")
    out = tmp_path / "rt.json"
    md = tmp_path / "rt.md"
    env = dict(os.environ, DLSTORE_CACHE=os.fspath(tmp_path / "cache"))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "read_throughput.py"), "--quick",
                        "--json", os.fspath(out), "--markdown", os.fspath(md)],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = _load(out)
    names = ["dlstore-buffered", "dlstore-mmap", "dlstore-direct", "tfdata", "dali", "dali-no-mmap",
             "dali-o-direct", "tfrecord", "fio"]
    for phase in ("cold", "warm"):
        rows = {row["name"]: row for row in doc["phases"][phase]}
        assert list(rows) == names  # every peer keeps its row: measured, skipped or failed with a reason
        for name, row in rows.items():
            assert row["status"].startswith(("ok", "skipped: ")), (phase, name, row["status"])
        for engine in ("buffered", "mmap", "direct"):
            row = rows[f"dlstore-{engine}"]
            if row["status"] == "ok":
                assert row["records"] == doc["data"]["records"] and row["gb_per_s"] > 0
    assert [t["verdict"] in ("PASS", "FAIL", "SKIP") for t in doc["targets"]] == [True] * 4
    assert "PASS" in r.stdout or "FAIL" in r.stdout or "SKIP" in r.stdout
    assert "## Targets" in md.read_text()


def test_an_output_path_that_cannot_take_the_file_is_said_before_the_run(tmp_path, capsys):
    """--json DIR failed only after the whole run ("odd.tmp19368: Is a directory"), leaving a stray temporary file."""
    from dlstore.bench.__main__ import main

    t0 = time.perf_counter()
    assert main(["resnet50", "--size", "tiny", "--json", str(tmp_path)]) == 2
    assert f"--json {tmp_path} is a directory: give a file name" in capsys.readouterr().err
    assert time.perf_counter() - t0 < 30 and os.listdir(tmp_path) == []  # nothing run, nothing left
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "ro").mkdir(mode=0o555)
        assert main(["bert", "--size", "tiny", "--markdown", str(tmp_path / "ro" / "x.md")]) == 2
        assert "cannot be written" in capsys.readouterr().err
    with pytest.raises(ValueError, match="is a directory"):
        report.check_output_path("--json", str(tmp_path))
    report.check_output_path("--json", str(tmp_path / "new" / "deeper" / "r.json"))  # made when written


@pytest.mark.parametrize("depth", ["-1", "0"])
def test_a_fio_queue_depth_is_positive(depth, capsys):
    """--fio-iodepth -1 was taken and printed as 'qd-1'; 0 only showed as 'fio: skipped'."""
    from dlstore.bench.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["storage", "--fio-iodepth", depth])
    assert e.value.code == 2
    assert f"argument --fio-iodepth: expected a positive integer, not {depth}" in capsys.readouterr().err


def test_other_processes_of_a_rank_leave_out_the_runs_ranks_on_its_host():
    # Under mpirun each rank measured the machine's busy cores less its own CPU: its sibling ranks
    # counted as other processes, and every multi-rank run on one host warned of a busy machine.
    ranks = [("a", 1.7, 90.0), ("a", 1.6, 80.0), ("b", 0.3, 95.0), ("a", None, 85.0)]
    got = sysinfo.outside_the_run(ranks)
    assert got[0] == pytest.approx(1.7 - 1.65) and got[1] == pytest.approx(0.0)  # never below 0
    assert got[2] == pytest.approx(0.3) and got[3] is None  # alone on its host; not measured
    assert not any("other processes" in w for w in sysinfo.trust_warnings("tier x", 5.0, got[0]))
