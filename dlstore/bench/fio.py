"""fio beside a benchmark: ``direct=1`` reads of the same files the benchmark reads.

A single figure is a reference for what the device gives that fio job, not the device's ceiling:
with the default ``psync`` engine each job has one request in flight (queue depth 1), and an
asynchronous engine with a deeper queue (``libaio`` or ``io_uring``, ``iodepth`` 8 to 32) often
reads faster. Every report names the job (:meth:`FioResult.describe`); :func:`fio_sweep` runs the
grid (sequential and random, several depths) whose best is the ceiling.

Sequential jobs mirror dlstore's parallelism: the files are dealt round-robin to ``jobs`` fio jobs,
each reading its files one after another (``file_service_type=sequential``), as a reader thread of
dlstore walks its files. Random jobs (``rw="randread"``) each read a share of every file's blocks in
random order, ``jobs`` of them together reading the files' bytes once, as a global shuffle's record
reads do. fio's JSON output is parsed into a :class:`FioResult`.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

__all__ = ["FioError", "FioResult", "fio_missing_reason", "fio_job_file", "parse_fio_json", "run_fio", "fio_sweep",
           "block_size_for"]


class FioError(RuntimeError):
    """fio ran and failed, or printed something that is not its JSON report."""


@dataclass
class FioResult:
    """What fio measured. ``gb_per_s`` is decimal GB (1e9 bytes) per second over all jobs."""

    gb_per_s: float
    bytes: int
    seconds: float
    jobs: int
    cpu_seconds: float
    cpu_seconds_per_gb: Optional[float]
    version: str = ""
    config: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """Which fio job this is, e.g. ``fio psync qd1, 2 jobs, bs=1M sequential direct=1 reads``."""
        c = self.config
        jobs = f"{self.jobs} job{'s' if self.jobs != 1 else ''}"
        pattern = "random" if c.get("rw") == "randread" else "sequential"
        return (f"fio {c.get('ioengine', '?')} qd{c.get('iodepth', 1)}, {jobs}, "
                f"bs={c.get('bs', '?')} {pattern} direct={c.get('direct', '1')} reads")

    @property
    def queue_depth_one(self) -> bool:
        """One request in flight per job (psync, or iodepth 1): a reference figure, not a ceiling."""
        c = self.config
        return c.get("ioengine", "psync") in ("psync", "sync", "pvsync") or str(c.get("iodepth", 1)) == "1"


def fio_missing_reason() -> Optional[str]:
    """None when fio is on PATH, else a sentence saying it is missing and how to get it."""
    if shutil.which("fio"):
        return None
    return "fio is not installed (apt-get install fio, dnf install fio): no fio figure to compare with"


def _escape(path: str) -> str:
    # fio separates several files of one job with ':'; a literal colon in a path is written '\:'.
    return os.path.abspath(path).replace(":", "\\:")


def block_size_for(record_bytes: float) -> str:
    """fio's ``bs`` for reads of records of this mean size: rounded up to 4 KiB, as O_DIRECT reads them."""
    return f"{max(1, -(-int(record_bytes) // 4096)) * 4}k"


def fio_job_file(paths: Sequence[str], jobs: int, bs: str = "1M", ioengine: str = "psync",
                 iodepth: int = 1, rw: str = "read") -> str:
    """A fio job file that reads ``paths`` once with O_DIRECT, split over ``jobs`` jobs.

    ``rw="read"``: with fewer files than jobs, each file gets its own job (fio reads whole files here;
    splitting one file between jobs would change the access pattern being compared).
    ``rw="randread"``: every job reads every file in random order, ``1 / jobs`` of their bytes each.
    """
    if not paths:
        raise ValueError("fio needs at least one file")
    if rw not in ("read", "randread"):
        raise ValueError(f"rw must be 'read' or 'randread', not {rw!r}")
    # invalidate=0: by default fio evicts each file from the page cache before reading it, which
    # would turn a warm benchmark cold behind its back. O_DIRECT bypasses the cache anyway.
    lines = ["[global]", f"rw={rw}", f"bs={bs}", "direct=1", f"ioengine={ioengine}", f"iodepth={iodepth}",
             "invalidate=0"]
    if rw == "read":
        jobs = max(1, min(int(jobs), len(paths)))
        lines += ["file_service_type=sequential", ""]
        for j in range(jobs):
            mine = paths[j::jobs]
            lines += [f"[read{j}]", "filename=" + ":".join(_escape(p) for p in mine), ""]
        return "\n".join(lines)
    jobs = max(1, int(jobs))
    total = sum(os.path.getsize(p) for p in paths)
    lines += [f"io_size={max(1, total // jobs)}", f"numjobs={jobs}", "", "[randread]",
              "filename=" + ":".join(_escape(p) for p in paths), ""]
    return "\n".join(lines)


def parse_fio_json(text: str) -> FioResult:
    """Parses ``fio --output-format=json`` output (one group, any number of jobs).

    Bytes are summed over jobs; the time is the longest job's runtime, since jobs run together;
    CPU seconds are each job's ``usr_cpu + sys_cpu`` percent of its runtime.

    Raises
    ------
    FioError
        When the text holds no JSON report, or a job reports an error.
    """
    start = text.find("{")  # fio may print notes ("fio: ...") before the report
    if start < 0:
        raise FioError(f"fio printed no JSON report: {text.strip()[:300]!r}")
    try:
        report = json.loads(text[start:])
    except json.JSONDecodeError as e:
        raise FioError(f"fio's JSON report does not parse ({e}): {text[start:start + 200]!r}") from None
    jobs = report.get("jobs") or []
    if not jobs:
        raise FioError("fio's report lists no jobs")
    total = 0
    longest_ms = 0
    cpu = 0.0
    for job in jobs:
        if job.get("error"):
            raise FioError(f"fio job {job.get('jobname')} failed with error {job['error']}")
        rd = job["read"]
        total += int(rd["io_bytes"])
        runtime_ms = int(rd.get("runtime") or job.get("job_runtime") or 0)
        longest_ms = max(longest_ms, runtime_ms)
        cpu += (float(job.get("usr_cpu", 0.0)) + float(job.get("sys_cpu", 0.0))) / 100.0 * runtime_ms / 1000.0
    seconds = longest_ms / 1000.0
    if seconds <= 0 or total <= 0:
        raise FioError(f"fio read {total} bytes in {seconds} s: nothing to measure (files smaller than bs?)")
    config = dict(report.get("global options") or {})
    return FioResult(gb_per_s=total / seconds / 1e9, bytes=total, seconds=seconds, jobs=len(jobs),
                     cpu_seconds=cpu, cpu_seconds_per_gb=cpu / (total / 1e9),
                     version=str(report.get("fio version", "")), config=config)


def run_fio(paths: Sequence[str], jobs: int, bs: str = "1M", ioengine: str = "psync", iodepth: int = 1,
            timeout: Optional[float] = 600, rw: str = "read") -> FioResult:
    """Runs fio on ``paths`` (O_DIRECT, ``rw`` ``read`` or ``randread``) and returns its throughput.

    Raises
    ------
    FioError
        When fio is missing, fails (e.g. the filesystem refuses O_DIRECT) or times out.
    """
    missing = fio_missing_reason()
    if missing:
        raise FioError(missing)
    with tempfile.TemporaryDirectory(prefix="dlstore-fio-") as tmp:
        job = os.path.join(tmp, "read.fio")
        with open(job, "w") as f:
            f.write(fio_job_file(list(paths), jobs, bs=bs, ioengine=ioengine, iodepth=iodepth, rw=rw))
        cmd: List[str] = ["fio", "--output-format=json", job]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise FioError(f"fio did not finish within {timeout} s") from None
    if proc.returncode != 0:
        detail = (proc.stderr.strip() or proc.stdout.strip())[-500:]
        raise FioError(f"fio exited with {proc.returncode}: {detail}")
    return parse_fio_json(proc.stdout)


def fio_sweep(paths: Sequence[str], jobs: int, patterns: Sequence[Tuple[str, str]],
              depths: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), ioengine: str = "io_uring",
              before: Optional[Callable[[], object]] = None) -> List[FioResult]:
    """fio ``io_uring`` over the grid ``patterns`` (``(rw, bs)`` pairs) x ``depths``: its best is what
    the device gives these files. ``before`` runs before each job (e.g. dropping the page cache)."""
    out = []
    for rw, bs in patterns:
        for depth in depths:
            if before is not None:
                before()
            out.append(run_fio(paths, jobs, bs=bs, ioengine=ioengine, iodepth=depth, rw=rw))
    return out
