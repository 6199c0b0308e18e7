"""``python -m dlstore.bench resnet50|bert``: steps, jobs, accelerator emulation, tables and JSON with a
fake loader (fast), then the real scenarios end to end at tiny size."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from dataclasses import dataclass

import numpy as np
import pytest

from dlstore.bench import SCENARIOS, load_scenario
from dlstore.bench import bert as bert_bench
from dlstore.bench import resnet50 as resnet50_bench
from dlstore.bench.compute import COMPUTE_PRESETS, Compute, resolve_compute
from dlstore.bench.jobs import run_jobs, summarize_jobs
from dlstore.bench.pipeline_report import build_document, format_report, markdown_report, tier_entry
from dlstore.bench.report import fmt_bytes
from dlstore.bench.ranks import aggregate_ranks
from dlstore.bench.steps import DEFAULT_STEP_BATCHES, CountingSource, fit_batch_size, plan_steps, run_steps
from dlstore.bench.tiers import LoaderSpec, read_share, run_tier

from tests.helpers import REPO as ROOT
TIER_KEYS = ["tier", "io", "mb_per_s", "steps", "cpu_busiest_core_pct"]


# ---- steps -----------------------------------------------------------------------------------------

def test_plan_steps_deals_batches_into_near_equal_steps():
    assert plan_steps(34, 9) == [3, 4, 4, 4, 3, 4, 4, 4, 4]
    assert sum(plan_steps(34, 9)) == 34
    assert plan_steps(5, 9) == [1] * 5  # fewer batches than steps: one batch a step
    assert plan_steps(100, 9, step_batches=7) == [7] * 9  # fixed size wins over the count
    assert plan_steps(None, 3) == [DEFAULT_STEP_BATCHES] * 3
    for bad in (dict(total_batches=0, steps=9), dict(total_batches=10, steps=0),
                dict(total_batches=10, steps=2, step_batches=0)):
        with pytest.raises(ValueError):
            plan_steps(**bad)


def test_fit_batch_size_lowers_it_for_small_data_and_says_so():
    assert fit_batch_size(10_000, 256, 9) == (256, None)
    assert fit_batch_size(None, 256, 9) == (256, None)
    size, note = fit_batch_size(32, 256, 9)
    assert size == 3 and "32 records" in note and "256" in note
    assert note.endswith("too few for 9 steps of batch 256")  # 9 steps of 3 fit: the steps asked for run
    # Fewer records than steps: plan_steps makes one step per record, and the note says so (it did not:
    # --steps 50 ran 32 steps without a word).
    size, note = fit_batch_size(4, 256, 9)
    assert size == 1 and note.endswith("; 4 steps of batch 1, not 9: more data makes more steps")
    assert len(plan_steps(4 // size, 9)) == 4
    # --step-batches: the batch size fits all the steps' batches (it was not fitted at all, and a small
    # set ended in a last_batch='DROP' error).
    size, note = fit_batch_size(64, 256, 9, step_batches=3)
    assert size == 2 and note.endswith("too few for 9 steps of 3 batches of 256")
    size, note = fit_batch_size(20, 256, 9, step_batches=3)
    assert size == 1 and note.endswith("; the data ends after 20 batches")
    # --epochs: the passes together make the steps (it fitted one pass, and said fewer steps than ran).
    size, note = fit_batch_size(4, 256, 9, epochs=3)
    assert size == 1 and "the data holds 4 records x 3 epochs" in note and "steps of batch 1" not in note
    assert len(plan_steps(3 * (4 // size), 9)) == 9
    assert fit_batch_size(40, 256, 9, epochs=3)[0] == 13


class FakeClock:
    """Time that moves only when told: each batch costs ``per_batch`` seconds of loader time."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def _fake_batches(clock, sizes, per_batch):
    for n in sizes:
        clock.now += per_batch
        yield {"image": np.zeros((n, 2), np.uint8), "label": np.zeros(n, np.int64)}


class _Bytes:
    def __init__(self):
        self.bytes = 0


def test_run_steps_times_each_step_and_counts_samples_and_bytes():
    clock = FakeClock()
    counter = _Bytes()

    # Steps of 3, 3, 1 batches at 0.5 s a batch: 48 samples/s; 1000 bytes counted per batch.
    def counting():
        for b in _fake_batches(clock, [8] * 7, 0.5):
            counter.bytes += 1000
            yield b

    ticks = iter([[(0, 100), (0, 100)], [(50, 200), (10, 200)], [(60, 300), (90, 300)], [(70, 400), (90, 400)],
                  [(80, 500), (95, 500)]])
    out = run_steps(counting(), [3, 3, 3], counter=counter, clock=clock, cpu_ticks=lambda: next(ticks))
    assert [s["batches"] for s in out["steps"]] == [3, 3, 1]
    assert [s["samples"] for s in out["steps"]] == [24, 24, 8]
    assert [s["rate"] for s in out["steps"]] == pytest.approx([16.0, 16.0, 16.0])
    assert [s["mb_per_s"] for s in out["steps"]] == pytest.approx([3000 / 1e6 / 1.5] * 2 + [1000 / 1e6 / 0.5])
    assert [s["busiest_core_pct"] for s in out["steps"]] == pytest.approx([50.0, 80.0, 10.0])
    assert out["samples"] == 56 and out["batches"] == 7 and out["bytes"] == 7000
    assert out["seconds"] == pytest.approx(3.5) and out["rate"] == pytest.approx(16.0)
    assert out["ended_early"] is True
    # Over the whole run (first to last sample): 70 and 90 busy ticks of 300.
    assert out["cores_pct"] == pytest.approx([70 / 3, 30.0]) and out["busiest_core_pct"] == pytest.approx(30.0)
    assert out["accelerator_util_pct"] is None and out["steps"][0]["accelerator_util_pct"] is None


def test_run_steps_stops_at_the_end_of_the_plan_and_closes_the_iterator():
    clock = FakeClock()
    closed = []

    def batches():
        try:
            yield from _fake_batches(clock, [4] * 100, 0.1)
        finally:
            closed.append(True)

    out = run_steps(batches(), [2, 2], clock=clock, cpu_ticks=lambda: [])
    assert out["batches"] == 4 and out["samples"] == 16 and not out["ended_early"]
    assert closed == [True]
    assert out["busiest_core_pct"] is None  # no /proc/stat: unknown, not zero


def test_run_steps_emulated_compute_gives_accelerator_utilisation():
    clock = FakeClock()
    # The loader needs 0.1 s a batch, the accelerator 0.3 s: a real loader would prefetch behind the
    # sleep; here the times simply add, so AU = 0.3 / 0.4.
    out = run_steps(_fake_batches(clock, [8] * 6, 0.1), [3, 3], compute_s=0.3, clock=clock, sleep=clock.sleep,
                    cpu_ticks=lambda: [])
    assert out["accelerator_util_pct"] == pytest.approx(75.0)
    assert [s["accelerator_util_pct"] for s in out["steps"]] == pytest.approx([75.0, 75.0])
    assert out["compute_seconds"] == pytest.approx(1.8)


def test_run_steps_with_real_time_counts_wall_and_process_cpu():
    out = run_steps(({"x": np.zeros(2)} for _ in range(4)), [2, 2], compute_s=0.01)
    assert out["samples"] == 8 and out["seconds"] >= 0.04
    assert 50 <= out["accelerator_util_pct"] <= 100
    # One thread mostly asleep: some CPU, bounded by the cores there are.
    assert out["process_cpu_pct"] is not None and 0 <= out["process_cpu_pct"] <= 100 * (os.cpu_count() or 1)


def test_counting_source_counts_and_delegates():
    class Batch:
        def __init__(self, n):
            self.nbytes, self.num_records = 100 * n, n

    class Source:
        engine = "buffered"
        engine_reason = "asked for"

        def batches(self):
            yield Batch(2)
            yield Batch(3)

        def state_dict(self):
            return {"epoch": 0}

    src = CountingSource(Source())
    assert sum(b.num_records for b in src.batches()) == 5
    assert (src.bytes, src.records) == (500, 5)
    assert src.engine == "buffered" and src.state_dict() == {"epoch": 0}


def test_read_share_says_whether_reading_or_decoding_took_the_time():
    assert read_share({"source_s": 1.0, "pipeline_s": 3.0}) == pytest.approx(25.0)
    assert read_share({"source_s": 0.0, "pipeline_s": 0.0}) is None
    assert read_share({"batches": 3}) is None and read_share(None) is None


# ---- accelerator presets ------------------------------------------------------------------------------

def test_resolve_compute_presets_and_milliseconds():
    assert resolve_compute(None, "resnet50", 256) is None
    a100 = resolve_compute("a100", "resnet50", 400)
    assert a100.seconds_per_batch == pytest.approx(0.435) and "MLPerf Storage" in a100.source
    h100 = resolve_compute("h100", "resnet50", 256)
    assert h100.samples_per_s(256) == pytest.approx(400 / 0.224)
    ms = resolve_compute("120", "resnet50", 256)
    assert ms.seconds_per_batch == pytest.approx(0.12) and "command line" in ms.source
    b = resolve_compute("a100", "bert", 64, variant=384)
    assert b.samples_per_s(64) == pytest.approx(COMPUTE_PRESETS["bert"]["a100"].rates[384])
    assert "rough" in b.source
    pod = resolve_compute("pod64-host", "bert", 64, variant=128)
    assert pod.samples_per_s(64) == pytest.approx(3708.0) and "Graphcore" in pod.source
    for bad in ("tpu", "0", "-5", "nan", "inf"):
        with pytest.raises(ValueError):
            resolve_compute(bad, "resnet50", 256)
    with pytest.raises(ValueError, match="no figure"):
        resolve_compute("a100", "bert", 64, variant=512)


# ---- jobs, ranks, the document -------------------------------------------------------------------------

def _job(index, samples, seconds, start, au=None, nbytes=1_000_000):
    return {"job": index, "samples": samples, "bytes": nbytes, "seconds": seconds, "rate": samples / seconds,
            "accelerator_util_pct": au, "start": start, "end": start + seconds}


def test_summarize_jobs_aggregates_over_the_common_start_to_the_last_end():
    jobs = [_job(0, 100, 2.0, 10.0, au=95.0), _job(1, 100, 4.0, 10.5, au=80.0)]
    row = summarize_jobs(2, jobs, start=10.0, cores_pct=[40.0, None, 70.0],
                         compute=Compute(0.5, "x", "y"), batch_size=10)
    assert row["seconds"] == pytest.approx(4.5) and row["rate"] == pytest.approx(200 / 4.5)
    assert row["per_job_rate_mean"] == pytest.approx((50 + 25) / 2) and row["per_job_rate_min"] == pytest.approx(25)
    assert row["mb_per_s"] == pytest.approx(2 / 4.5) and row["busiest_core_pct"] == 70.0
    assert row["accelerator_util_pct"] == pytest.approx(87.5)
    # Two accelerators need 2 x 20 samples/s.
    assert row["sustained_pct"] == pytest.approx(100 * (200 / 4.5) / 40)
    assert [j["job"] for j in row["per_job"]] == [0, 1]
    assert summarize_jobs(1, [_job(0, 10, 1.0, 0.0)], 0.0, [])["accelerator_util_pct"] is None


def _tier(name, rates, samples_per_step=100, seconds_per_step=None, au=None, io="buffered"):
    steps = []
    for i, r in enumerate(rates):
        s = seconds_per_step or samples_per_step / r
        steps.append({"step": i + 1, "batches": 1, "samples": samples_per_step, "bytes": 1000 * samples_per_step,
                      "seconds": s, "rate": samples_per_step / s, "mb_per_s": 1000 * samples_per_step / 1e6 / s,
                      "busiest_core_pct": 50.0, "compute_seconds": None, "accelerator_util_pct": au})
    seconds = sum(s["seconds"] for s in steps)
    samples = samples_per_step * len(rates)
    return {"tier": name, "io": io, "io_reason": "asked for", "cache": "warm", "cache_method": "read once",
            "cached_before": 1.0, "steps": steps, "samples": samples, "bytes": 1000 * samples, "seconds": seconds,
            "rate": samples / seconds, "mb_per_s": 1000 * samples / 1e6 / seconds, "busiest_core_pct": 60.0,
            "cores_pct": [60.0, 20.0], "process_cpu_pct": 150.0, "batches": len(rates), "accelerator_util_pct": au,
            "compute_seconds": None, "ended_early": False, "loader_stats": None}


def test_aggregate_ranks_sums_samples_over_the_slowest_rank():
    r0 = [_tier("local-cold", [100, 100])]
    r1 = [_tier("local-cold", [50, 50, 50])]
    (agg,) = aggregate_ranks([r0, r1])
    assert agg["ranks"] == 2 and agg["samples"] == 500
    assert agg["seconds"] == pytest.approx(6.0) and agg["rate"] == pytest.approx(500 / 6.0)
    assert [s["rate"] for s in agg["steps"]] == pytest.approx([150, 150, 50])


def _doc(workload, compute=None, jobs=None, ranks=None):
    tiers = [_tier("page-cache", [200, 210]), _tier("local-cold", [100, 150], au=None if compute is None else 88.0)]
    config = {"step_batches_text": "1 batch of 100", "plan": [1, 1]}
    return build_document(workload, tiers, info={"cpu": "test CPU", "cores": 2}, config=config, compute=compute,
                          batch_size=100, jobs=jobs, ranks=ranks, notes=["a note"],
                          warnings=["tier page-cache lasted 0.15 s, under 2 s: too short"])


def test_document_has_the_agreed_keys_per_tier():
    doc = json.loads(json.dumps(_doc(resnet50_bench.WORKLOAD)))
    assert doc["benchmark"] == "resnet50" and doc["sysinfo"]["cpu"] == "test CPU"
    for t in doc["tiers"]:
        assert list(t)[:6] == ["tier", "io", "images_per_s", "mb_per_s", "steps", "cpu_busiest_core_pct"]
        assert len(t["steps"]) == 2 and all(isinstance(r, float) for r in t["steps"])
    assert doc["tiers"][1]["steps"] == pytest.approx([100, 150])
    assert doc["tiers"][1]["images_per_s"] == pytest.approx(200 / 1.666667, rel=1e-4)
    bert = _doc(bert_bench.WORKLOAD)
    assert all("samples_per_s" in t and "images_per_s" not in t for t in bert["tiers"])
    assert any("no accelerator emulated" in v for v in bert["verdict"])
    assert any("local-cold" in v and "% of the page-cache tier" in v for v in bert["verdict"])


@pytest.mark.parametrize("reading, who", [(None, "storage"), (80.0, "storage"),
                                         (8.0, "the input pipeline (CPU-bound: it waits for records 8% of its time")])
def test_the_verdict_names_what_holds_the_rate(reading, who):
    """A decode-bound tier (its loader waiting for records 8% of the time) was said to be storage's limit."""
    compute = Compute(0.5, "a100: 500 ms per batch of 100", "test", "a100")
    doc = _doc(resnet50_bench.WORKLOAD, compute=compute)
    for t in doc["tiers"]:
        t["read_share_pct"] = reading
    from dlstore.bench.pipeline_report import _verdict

    line = next(v for v in _verdict(doc, resnet50_bench.WORKLOAD, compute, 100, 1) if "sustains" in v)
    assert line.split(": ", 1)[1].startswith(f"{who}")


def test_verdict_with_emulated_accelerators_and_jobs():
    compute = Compute(0.5, "a100: 500 ms per batch of 100", "test", "a100")  # 200 samples/s per accelerator
    jobs = {"rows": [dict(jobs=1, rate=190.0, per_job_rate_mean=190.0, per_job_rate_min=190.0, mb_per_s=1.0,
                          busiest_core_pct=50.0, accelerator_util_pct=95.0, sustained_pct=95.0),
                     dict(jobs=2, rate=300.0, per_job_rate_mean=150.0, per_job_rate_min=140.0, mb_per_s=1.0,
                          busiest_core_pct=99.0, accelerator_util_pct=75.0, sustained_pct=75.0)],
            "shards": "same files", "steps_per_job": 1, "batches_per_job": 2, "cache_method": "evicted", "tier": "x"}
    doc = _doc(resnet50_bench.WORKLOAD, compute=compute, jobs=jobs)
    cold = doc["tiers"][1]
    assert cold["sustained_pct"] == pytest.approx(100 * cold["images_per_s"] / 200)
    assert cold["required_mb_per_s_per_accelerator"] == pytest.approx(200 * 1000 / 1e6)
    text = "\n".join(doc["verdict"])
    assert "storage sustains" in text and "of what 1 accelerator (a100) needs" in text
    assert "each accelerator needs 0.2 MB/s" in text and "below MLPerf Storage's 90%" in text
    assert "AU >= 90% with up to 1 job" in text
    report_text = format_report(doc)
    assert "concurrent jobs" in report_text and "aggregate images/s" in report_text and "AU" in report_text
    assert "accelerator emulated: a100" in report_text and "note: a note" in report_text
    assert report_text.splitlines()[-1] == "warning: tier page-cache lasted 0.15 s, under 2 s: too short"
    assert "needed MB/s per accel." in report_text
    assert "each runs 1 step, 2 batches;" in report_text
    jobs["batches_per_job"] = 1
    assert "each runs 1 step, 1 batch;" in format_report(_doc(resnet50_bench.WORKLOAD, compute=compute, jobs=jobs))
    md = markdown_report(doc)
    assert md.startswith("## dlstore.bench resnet50") and "| step |" in md and "| jobs |" in md
    assert "- warning: tier page-cache lasted 0.15 s" in md


def test_step_table_puts_tiers_side_by_side_with_missing_steps_as_dash():
    short = _tier("target", [90])
    doc = build_document(resnet50_bench.WORKLOAD, [_tier("page-cache", [200, 210, 220]), short],
                         info={}, config={"step_batches_text": "1 batch"}, compute=None, batch_size=100)
    text = format_report(doc)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("step"))
    assert "page-cache images/s" in header and "target images/s" in header
    third = next(line for line in lines if line.startswith("3 "))
    assert "220" in third and third.rstrip().endswith("-")


def test_per_rank_tables_under_mpi():
    r0 = [_tier("local-cold", [100, 100])]
    r1 = [_tier("local-cold", [50, 50])]
    doc = build_document(bert_bench.WORKLOAD, aggregate_ranks([r0, r1]), info={},
                         config={"step_batches_text": "1 batch"}, compute=None, batch_size=10, ranks=[r0, r1])
    assert doc["world_size"] == 2 and len(doc["ranks"]) == 2
    assert doc["tiers"][0]["samples_per_s"] == pytest.approx(400 / 4.0)  # over the slower rank's 4 s
    text = format_report(doc)
    assert "rank 0: samples/s per step" in text and "rank 1: samples/s per step" in text


def test_the_mpi_aggregate_has_every_tier_key_the_au_per_step_and_the_decoder():
    # A user trial: under mpirun the aggregate step table lacked the AU column the per-rank tables had, the
    # decoder line was missing, and the aggregate tiers lacked keys docs/bench.md says every tier has.
    ranks = []
    for rates in ([100, 100], [50, 50]):
        tier = _tier("local-cold", rates, au=80.0)
        tier.update(loader_stats={"decoder": "libjpeg-turbo (test)"}, compute_seconds=1.0, other_processes_cores=0.5)
        ranks.append([tier])
    doc = build_document(resnet50_bench.WORKLOAD, aggregate_ranks(ranks), info={},
                         config={"step_batches_text": "1 batch"}, compute=Compute(0.5, "x", "y"), batch_size=10,
                         ranks=ranks)
    agg = doc["tiers"][0]
    documented = TIER_KEYS + ["images_per_s", "batches", "samples", "bytes", "seconds", "compute_seconds",
                              "accelerator_util_pct", "cores_pct", "process_cpu_pct", "other_processes_cores",
                              "ended_early", "read_records", "read_bytes", "io_reason", "cache", "cache_method",
                              "cached_before", "read_share_pct", "loader_stats", "step_details", "bytes_per_sample",
                              "required_mb_per_s_per_accelerator", "sustained_pct"]
    assert set(documented) - set(agg) == set()
    assert agg["compute_seconds"] == 2.0 and agg["other_processes_cores"] == 0.5 and agg["ended_early"] is False
    assert agg["cores_pct"] is None and agg["loader_stats"] is None  # per rank, in doc["ranks"]
    assert [s["accelerator_util_pct"] for s in agg["step_details"]] == [80.0, 80.0]
    text = format_report(doc)
    aggregate_table = text.split("rank 0:")[0]
    assert "AU" in aggregate_table.splitlines()[1] and "decoder: libjpeg-turbo (test)" in text
    _, note = fit_batch_size(880, 256, 9, holder="the smallest rank's share")
    assert "the smallest rank's share holds 880 records" in note


def test_no_mpi_without_a_launcher(monkeypatch):
    from dlstore.distributed import mpi_comm
    from dlstore.placement import world

    monkeypatch.setattr(world, "detect_world", lambda: world.World())
    class Forbidden(types.ModuleType):
        def __getattr__(self, name):
            raise AssertionError("mpi4py used without a launcher")

    monkeypatch.setitem(sys.modules, "mpi4py", Forbidden("mpi4py"))
    assert mpi_comm() is None
    # With a launcher's world of 2 but no mpi4py: still a plain run, not an error.
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    monkeypatch.setattr(world, "detect_world", lambda: world.World(rank=0, size=2, local_size=2))
    assert mpi_comm() is None


# ---- one tier and the jobs with a fake loader ------------------------------------------------------------

class FakeLoader:
    """Yields ``batches`` batches of ``batch_size`` from a real reader's files, taking ``delay`` s each."""

    def __init__(self, source, batch_size, batches, delay, close_delay=0.0):
        self.source, self.batch_size, self.n, self.delay = source, batch_size, batches, delay
        self.close_delay = close_delay  # a loader waiting for an in-flight read on slow storage as it stops
        self.closed = False

    def __iter__(self):
        for batch in self.source.batches():  # drives the counting source, as the loader would
            del batch
        for _ in range(self.n):
            time.sleep(self.delay)
            yield {"image": np.zeros((self.batch_size, 1), np.uint8)}

    def stats(self):
        return {"engine": self.source.engine}

    def close(self):
        time.sleep(self.close_delay)
        self.closed = True


@dataclass(frozen=True)
class FakeSpec(LoaderSpec):
    """A LoaderSpec whose loader is :class:`FakeLoader` (picklable: the jobs' processes import this module)."""

    fake_batches: int = 6
    fake_delay: float = 0.002
    fake_close_delay: float = 0.0

    def open(self):
        from dlstore.sources.reader import open_records

        source = CountingSource(open_records(list(self.paths), io=self.io, verify=self.verify))
        return FakeLoader(source, self.batch_size, self.fake_batches, self.fake_delay, self.fake_close_delay), source

    def rotated(self, job, jobs):
        k = job * len(self.paths) // jobs
        return FakeSpec(self.pipeline, self.pipeline_kwargs, self.paths[k:] + self.paths[:k], self.batch_size,
                        self.io, self.verify, fake_batches=self.fake_batches, fake_delay=self.fake_delay)


@pytest.fixture
def shards(tmp_path):
    import dlstore

    paths = []
    for s in range(3):
        p = os.fspath(tmp_path / f"part-{s}.tfrecord")
        with dlstore.TFRecordWriter(p) as w:
            for i in range(10):
                w.write(bytes([s, i]) * 500)
        paths.append(p)
    return paths


@pytest.mark.parametrize("cold", [False, True])
def test_run_tier_prepares_the_cache_and_reports_it(shards, cold):
    spec = FakeSpec("ResNet50", {}, tuple(shards), batch_size=4, io="buffered")
    out = run_tier("local-cold" if cold else "page-cache", spec, [2, 2, 2], cold=cold, log=lambda s: None)
    assert out["io"] == "buffered" and out["samples"] == 24 and len(out["steps"]) == 3
    assert out["bytes"] == 30 * 1000 and out["loader_stats"] == {"engine": "buffered"}
    # The steps' 30,000 bytes include the 6 records read ahead past the plan's 24 samples: what each
    # sample needs from storage is a record's 1,000 bytes (it was 1,250: bytes over samples).
    entry = tier_entry(out, "images_per_s", Compute(0.5, "x", "y"), batch_size=4)
    assert entry["bytes_per_sample"] == 1000
    assert entry["required_mb_per_s_per_accelerator"] == pytest.approx(8 * 1000 / 1e6)
    if cold:
        assert out["cache"] == "cold"
        assert "drop_caches" in out["cache_method"] or "posix_fadvise" in out["cache_method"]
    else:
        assert out["cache"] == "warm" and out["cache_method"].startswith("read once")
        assert out["cached_before"] in (None, pytest.approx(1.0, abs=0.05))


@pytest.mark.slow
def test_run_jobs_runs_one_to_n_processes(shards):
    spec = FakeSpec("ResNet50", {}, tuple(shards), batch_size=4, io="buffered", fake_batches=3)
    prepared = []
    out = run_jobs(spec, 2, [3], prepare=lambda: prepared.append(1) or "prepared", timeout=120)
    assert prepared == [1, 1] and out["cache_method"] == "prepared"
    assert [r["jobs"] for r in out["rows"]] == [1, 2]
    assert [r["samples"] for r in out["rows"]] == [12, 24]
    assert [len(r["per_job"]) for r in out["rows"]] == [1, 2]
    assert all(r["rate"] > 0 and r["bytes"] == r["jobs"] * 30_000 for r in out["rows"])


def test_a_jobs_end_is_its_last_batch_not_its_loaders_shutdown(shards):
    # A user trial: the row of 1 job said 102 images/s beside the job's own 122, as its end was taken after
    # the loader had closed (waiting for an in-flight read on slow storage), and its own time at the last batch.
    import queue
    import threading

    from dlstore.bench.jobs import _job_main

    spec = FakeSpec("ResNet50", {}, tuple(shards), batch_size=4, io="buffered", fake_batches=3, fake_close_delay=0.5)
    ready, results, start = queue.Queue(), queue.Queue(), threading.Event()
    start.set()
    t0 = time.monotonic()
    _job_main(spec, [3], 0.0, 0, ready, start, results)
    index, measured, error = results.get(timeout=5)
    assert error is None and index == 0 and time.monotonic() - t0 >= 0.5
    assert measured["end"] - measured["start"] == pytest.approx(measured["seconds"], abs=0.05)
    row = summarize_jobs(1, [measured], measured["start"], [])
    assert row["rate"] == pytest.approx(row["per_job_rate_mean"], rel=0.05)


def test_run_jobs_reports_a_failing_job(shards):
    spec = FakeSpec("ResNet50", {}, tuple(shards[:1]) + ("/nonexistent/shard.tfrecord",), batch_size=4)
    with pytest.raises(RuntimeError, match="job 0 of 1 failed"):
        run_jobs(spec, 1, [1], prepare=lambda: "", timeout=120)


# ---- the registry and the plot ---------------------------------------------------------------------------

def test_scenarios_are_registered():
    assert {"storage", "resnet50", "bert", "gpu-check"} <= set(SCENARIOS)
    assert load_scenario("resnet50") is resnet50_bench and load_scenario("bert") is bert_bench
    with pytest.raises(KeyError):
        load_scenario("planned")


def test_each_benchs_io_help_offers_only_the_engines_it_accepts():
    # resnet50, bert and mlperf said "gds ... names what is missing" while --io gds was an invalid choice.
    from dlstore.bench.__main__ import build_parser

    scenarios = build_parser()._subparsers._group_actions[0].choices
    for name in ("storage", "resnet50", "bert", "mlperf"):
        io, = [a for a in scenarios[name]._actions if "--io" in a.option_strings]
        gds_offered = "names what is missing where it cannot run" in io.help
        assert gds_offered == ("gds" in io.choices), (name, io.help, io.choices)
        if "gds" not in io.choices:
            assert "bench storage --io gds" in io.help, (name, io.help)  # where it is, then
        else:
            assert name == "storage"  # the bench that reads into GPU memory (docs/gpu.md)


@pytest.mark.parametrize("name", ["resnet50", "bert", "mlperf"])
def test_gds_from_the_environment_is_refused_by_the_host_benches(tmp_path, monkeypatch, capsys, name):
    # --io's choices refuse gds on the command line; DLSTORE_IO=gds reached mlperf's loaders unchecked.
    from dlstore.bench.__main__ import main as bench_main

    monkeypatch.setenv("DLSTORE_IO", "gds")
    assert bench_main([name, "--data", str(tmp_path / "none-*"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "io='gds' (from DLSTORE_IO) is for bench storage" in err and len(err.splitlines()) == 1, err
    assert not os.listdir(tmp_path)  # said before any data is made


@pytest.mark.slow
def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib")
    from dlstore.bench.plot import plot_document

    jobs = {"rows": [dict(jobs=1, rate=100.0, per_job_rate_mean=100.0), dict(jobs=2, rate=150.0,
                                                                            per_job_rate_mean=75.0)], "tier": "x"}
    doc = json.loads(json.dumps(_doc(resnet50_bench.WORKLOAD, jobs=jobs)))
    out = plot_document(doc, os.fspath(tmp_path / "p.png"))
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # a name without a suffix: matplotlib writes NAME.png, and that is the name said ("wrote NAME" was not there)
    assert plot_document(doc, os.fspath(tmp_path / "q")) == os.fspath(tmp_path / "q.png")
    assert os.path.isfile(tmp_path / "q.png") and not os.path.exists(tmp_path / "q")


def test_plot_without_matplotlib_says_how_to_get_it(monkeypatch):
    import builtins

    from dlstore.bench import plot

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(plot.MatplotlibMissing, match="pip install matplotlib"):
        plot.plot_document({"tiers": []}, "x.png")


# ---- end to end at tiny size ------------------------------------------------------------------------------

def _bench(*args, tmp_path, timeout=120):
    env = dict(os.environ, DLSTORE_CACHE=os.fspath(tmp_path / "cache"), DLSTORE_NO_PROGRESS="1")
    return subprocess.run([sys.executable, "-m", "dlstore.bench", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)


def _load(path):
    with open(path) as f:
        return json.load(f)


@pytest.mark.slow
def test_bench_resnet50_tiny_writes_the_json_keys(tmp_path):
    pytest.importorskip("PIL", reason="the synthetic ImageNet-like set needs pillow")
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    r = _bench("resnet50", "--size", "tiny", "--json", os.fspath(out), "--markdown", os.fspath(md),
               tmp_path=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "images/s per step" in r.stdout and "page-cache images/s" in r.stdout and "verdict:" in r.stdout
    doc = _load(out)
    assert [t["tier"] for t in doc["tiers"]] == ["page-cache", "local-cold"]
    for t in doc["tiers"]:
        assert set(TIER_KEYS + ["images_per_s"]) <= set(t)
        assert t["images_per_s"] > 0 and t["mb_per_s"] > 0 and len(t["steps"]) >= 1
        assert all(r > 0 for r in t["steps"])
    assert doc["tiers"][0]["io"] in ("buffered", "mmap")
    # The bench chose the page-cache tier's engine, not the user (it said "requested" for --io auto).
    assert doc["tiers"][0]["io_reason"] == "the page-cache tier reads from RAM: buffered"
    cold = doc["tiers"][1]
    assert "drop_caches" in cold["cache_method"] or "posix_fadvise" in cold["cache_method"]
    assert {"cpu", "cores", "kernel"} <= set(doc["sysinfo"])
    assert md.read_text().startswith("## dlstore.bench resnet50")


@pytest.mark.slow
def test_bench_bert_tiny_with_jobs_and_compute(tmp_path):
    out = tmp_path / "b.json"
    r = _bench("bert", "--size", "tiny", "--jobs", "2", "--compute", "5", "--json", os.fspath(out),
               tmp_path=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # Storage's limit or the pipeline's, as the run's reading share says: either way a verdict against the compute.
    assert "concurrent jobs" in r.stdout and " sustains " in r.stdout and "of what 1 accelerator" in r.stdout
    doc = _load(out)
    for t in doc["tiers"]:
        assert set(TIER_KEYS + ["samples_per_s"]) <= set(t) and "images_per_s" not in t
        assert 0 < t["accelerator_util_pct"] <= 100 and t["required_mb_per_s_per_accelerator"] > 0
    assert [row["jobs"] for row in doc["jobs"]["rows"]] == [1, 2]
    assert all(row["rate"] > 0 for row in doc["jobs"]["rows"])


@pytest.mark.slow
def test_bench_resnet50_target_tier_from_data(tmp_path):
    pytest.importorskip("PIL", reason="the synthetic ImageNet-like set needs pillow")
    from dlstore.synthetic import generate_imagenet

    target = generate_imagenet(os.fspath(tmp_path / "target"), shards=2, records_per_shard=6, progress=False)
    out = tmp_path / "t.json"
    r = _bench("resnet50", "--data", os.path.dirname(target[0]), "--tiers", "target", "--batch-size", "2",
               "--steps", "3", "--json", os.fspath(out), tmp_path=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = _load(out)
    assert [t["tier"] for t in doc["tiers"]] == ["target"]
    assert doc["tiers"][0]["images_per_s"] > 0


@pytest.mark.slow
def test_bench_target_tier_alone_on_replica_mounts_sizes_its_steps(tmp_path):
    # The target tier alone planned its steps without counting its records: 12 records at the default
    # batch 256 ended in a last_batch='DROP' error. And its header counted every copy as a file.
    pytest.importorskip("PIL", reason="the synthetic ImageNet-like set needs pillow")
    import shutil

    from dlstore.synthetic import generate_imagenet

    first = generate_imagenet(os.fspath(tmp_path / "m0"), shards=2, records_per_shard=6, progress=False)
    shutil.copytree(tmp_path / "m0", tmp_path / "m1")
    out = tmp_path / "t.json"
    r = _bench("resnet50", "--data", "train-*", "--mounts", tmp_path / "m0", tmp_path / "m1", "--tiers", "target",
               "--json", os.fspath(out), tmp_path=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    one_copy = sum(os.path.getsize(p) for p in first)
    target = next(line for line in r.stdout.splitlines() if line.startswith("target  "))
    assert target.startswith(f"target     2 shards, {fmt_bytes(one_copy)} (4 copies in all, {fmt_bytes(2 * one_copy)}) "
                             "on 2 mounts")
    assert "note: batch size lowered from 256 to 1: the data holds 12 records" in r.stdout
    tier = _load(out)["tiers"][0]
    assert not tier["ended_early"] and tier["samples"] == 12


@pytest.mark.slow
def test_bench_pipeline_argument_errors_exit_2(tmp_path):
    r = _bench("resnet50", "--tiers", "target", tmp_path=tmp_path)
    assert r.returncode == 2 and "needs --data" in r.stderr
    r = _bench("bert", "--tiers", "nvme", tmp_path=tmp_path)
    assert r.returncode == 2 and "unknown nvme" in r.stderr
    r = _bench("resnet50", "--mounts", "/a", "/b", tmp_path=tmp_path)
    assert r.returncode == 2 and "--mounts needs --data" in r.stderr


@pytest.mark.slow
def test_bench_reads_every_mount_given_and_says_which_it_read(tmp_path):
    # A user trial: with --mounts A B one process read A alone, the report said "on 2 mounts", and swapping the
    # order swapped the verdict; only the JSON's loader_stats named the mount read.
    pytest.importorskip("PIL", reason="the synthetic ImageNet-like set needs pillow")
    import shutil

    from dlstore.synthetic import generate_imagenet

    generate_imagenet(os.fspath(tmp_path / "m0"), shards=2, records_per_shard=6, progress=False)
    shutil.copytree(tmp_path / "m0", tmp_path / "m1")
    mounts = [os.fspath(tmp_path / "m0"), os.fspath(tmp_path / "m1")]
    for per_rank, read in ((None, mounts), ("1", mounts[:1])):
        out = tmp_path / "t.json"
        r = _bench("resnet50", "--data", "train-*", "--mounts", *mounts, "--tiers", "target", "--json",
                   os.fspath(out), *(("--mounts-per-rank", per_rank) if per_rank else ()), tmp_path=tmp_path)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        tier = _load(out)["tiers"][0]
        assert tier["loader_stats"]["source"]["mounts"] == read
        assert f"; read through {', '.join(read)}" in r.stdout
        header = next(line for line in r.stdout.splitlines() if line.startswith("target  "))
        assert header.endswith("this process through all of them at once" if per_rank is None else
                               f"this process through {read[0]} at once")
    r = _bench("resnet50", "--data", "train-*", "--mounts", *mounts, "--mounts-per-rank", "3", tmp_path=tmp_path)
    assert r.returncode == 2 and "--mounts-per-rank must be 1..2" in r.stderr


@pytest.mark.slow
def test_a_target_smaller_than_one_batch_is_refused_in_one_line(tmp_path):
    # A user trial: a 3-record target beside the baseline's batch of 256 ended in "TypeError: object of type
    # 'CountingSource' has no len()" from the loader, exit 1, after the baseline tiers had run.
    pytest.importorskip("PIL", reason="the synthetic ImageNet-like set needs pillow")
    from dlstore.synthetic import generate_imagenet

    generate_imagenet(os.fspath(tmp_path / "three"), shards=1, records_per_shard=3, progress=False)
    out = tmp_path / "r.json"
    r = _bench("resnet50", "--size", "tiny", "--batch-size", "8", "--steps", "2", "--data",
               os.fspath(tmp_path / "three"), "--json", os.fspath(out), tmp_path=tmp_path)
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert "the target holds 3 records, fewer than one batch of 8" in r.stderr
    assert "Use more data or --batch-size 3 or less" in r.stderr


@pytest.mark.slow
def test_a_target_larger_than_the_baseline_is_said_to_be_read_in_part(tmp_path):
    # A user trial: beside --size small, a 1 GB target read 2,816 of its 8,800 records under a header saying
    # "9 steps per tier over 1 epoch", with no note: the steps are planned on the baseline.
    pytest.importorskip("PIL", reason="the synthetic ImageNet-like set needs pillow")
    from dlstore.synthetic import generate_imagenet

    generate_imagenet(os.fspath(tmp_path / "big"), shards=2, records_per_shard=40, progress=False)
    out = tmp_path / "r.json"
    r = _bench("resnet50", "--size", "tiny", "--batch-size", "8", "--steps", "2", "--tiers", "local-cold,target",
               "--data", os.fspath(tmp_path / "big"), "--json", os.fspath(out), tmp_path=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "2 steps per tier over 1 epoch of the baseline" in r.stdout
    assert ("note: target: the steps are planned on the baseline, so the target tier reads 32 of its 80 records "
            "(40%), not a whole epoch of it") in r.stdout
    target = next(t for t in _load(out)["tiers"] if t["tier"] == "target")
    assert target["samples"] == 32
