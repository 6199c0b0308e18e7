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

fio's buffers are huge pages where this process may allow them (``mem=mmaphuge``, see
:func:`huge_page_pool`), as dlstore's are (its aligned buffers ask for transparent huge pages). The
layout of the buffer in physical memory reaches the device: a read into 4 KiB pages is a request of
one segment per page (at most ``max_segments``, 254 on a virtio disk, so ~1 MiB per request), a read
into a huge page one segment. A virtual disk whose host pays per segment (the 2-core VM of
docs/engines_cold.md) then serves fio's default ``malloc`` buffers at about half the rate it serves the
same reads into huge pages, so a 4 KiB-page fio is no reference for a reader whose buffers are huge.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

__all__ = ["FioError", "FioResult", "fio_missing_reason", "fio_job_file", "parse_fio_json", "run_fio", "fio_sweep",
           "block_size_for", "huge_pages_needed", "huge_page_pool", "BUFFERS"]

# fio's ``mem`` for each way of backing its buffers: huge pages (what dlstore's buffers are) or malloc.
BUFFERS = {"huge": "mmaphuge", "malloc": "malloc"}
_OVERCOMMIT = "/proc/sys/vm/nr_overcommit_hugepages"


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
    buffers_note: str = ""  # why fio's buffers were not huge pages, where run_fio asked for them

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """Which fio job this is, e.g. ``fio psync qd1, 2 jobs, bs=1M sequential direct=1 reads``
        (``, huge-page buffers`` added where fio's buffers were huge pages)."""
        c = self.config
        jobs = f"{self.jobs} job{'s' if self.jobs != 1 else ''}"
        pattern = "random" if c.get("rw") == "randread" else "sequential"
        huge = ", huge-page buffers" if c.get("mem") == BUFFERS["huge"] else ""
        return (f"fio {c.get('ioengine', '?')} qd{c.get('iodepth', 1)}, {jobs}, "
                f"bs={c.get('bs', '?')} {pattern} direct={c.get('direct', '1')} reads{huge}")

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
                 iodepth: int = 1, rw: str = "read", buffers: str = "malloc") -> str:
    """A fio job file that reads ``paths`` once with O_DIRECT, split over ``jobs`` jobs.

    ``rw="read"``: with fewer files than jobs, each file gets its own job (fio reads whole files here;
    splitting one file between jobs would change the access pattern being compared).
    ``rw="randread"``: every job reads every file in random order, ``1 / jobs`` of their bytes each.
    ``buffers``: ``"huge"`` (``mem=mmaphuge``: fio's buffers in huge pages, which the kernel must be
    able to give: :func:`huge_page_pool`) or ``"malloc"`` (fio's default).
    """
    if not paths:
        raise ValueError("fio needs at least one file")
    if rw not in ("read", "randread"):
        raise ValueError(f"rw must be 'read' or 'randread', not {rw!r}")
    if buffers not in BUFFERS:
        raise ValueError(f"buffers must be one of {sorted(BUFFERS)}, not {buffers!r}")
    # invalidate=0: by default fio evicts each file from the page cache before reading it, which
    # would turn a warm benchmark cold behind its back. O_DIRECT bypasses the cache anyway.
    lines = ["[global]", f"rw={rw}", f"bs={bs}", "direct=1", f"ioengine={ioengine}", f"iodepth={iodepth}",
             "invalidate=0", f"mem={BUFFERS[buffers]}"]
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


def _size_bytes(size: str) -> int:
    """fio's size text (``116k``, ``1M``, ``4096``) in bytes (k, M, G as powers of 1024, as fio reads them)."""
    text = str(size).strip()
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1:].lower(), 1)
    digits = text[:-1] if scale != 1 else text
    if not digits.isdigit():
        raise ValueError(f"not a fio size: {size!r}")
    return int(digits) * scale


def fitting_block_size(paths: Sequence[str], bs: str) -> str:
    """``bs``, or where a file is smaller, the largest multiple of 4 KiB that it holds: fio refuses a
    block larger than a file ("blocksize is larger than data set range"), and such a file is read in one
    request either way.

    Raises
    ------
    FioError
        When a file is under 4 KiB, one O_DIRECT block: fio cannot read it with O_DIRECT.
    """
    smallest = min(paths, key=os.path.getsize)
    size = os.path.getsize(smallest)
    if size < 4096:
        raise FioError(f"{smallest} holds {size} bytes, under one 4 KiB O_DIRECT block: fio cannot read it")
    return bs if _size_bytes(bs) <= size else f"{size // 4096 * 4}k"


def huge_pages_needed(jobs: int, bs: str, iodepth: int, page_bytes: int) -> int:
    """Huge pages of ``page_bytes`` that ``jobs`` fio jobs with ``mem=mmaphuge`` map: each maps ``iodepth``
    buffers of ``bs`` bytes and a 4 KiB page of alignment, rounded up to whole pages; fio-3.33 was seen
    to need one page more than that (an iodepth of 2 x 1 MiB maps three 2 MiB pages), one more is slack."""
    per_job = -(-(_size_bytes(bs) * max(1, int(iodepth)) + 4096) // page_bytes) + 2
    return max(1, int(jobs)) * per_job


@contextlib.contextmanager
def huge_page_pool(jobs: int, bs: str, iodepth: int, overcommit_file: str = _OVERCOMMIT,
                   meminfo: Optional[Callable[[], dict]] = None) -> Iterator[Optional[str]]:
    """Lets ``jobs`` fio jobs map their buffers (``iodepth`` x ``bs`` each) in huge pages while the block
    runs; yields None when they may, else why not.

    Free pages of the reserved pool (``HugePages_Free``) serve as they are. Otherwise, as root, the
    kernel's overcommit of huge pages (``/proc/sys/vm/nr_overcommit_hugepages``) is raised by what is
    missing, so that fio's pages are taken from free memory when it maps them and given back when it
    exits; the setting is put back on leaving the block. Nothing is reserved while fio is not running.
    """
    from dlstore.io.system import meminfo as read_meminfo

    info = (meminfo or read_meminfo)()
    page = info.get("Hugepagesize", 0)  # bytes
    if not page:
        yield "the kernel has no huge pages (no Hugepagesize in /proc/meminfo)"
        return
    missing = huge_pages_needed(jobs, bs, iodepth, page) - info.get("HugePages_Free", 0) + info.get("HugePages_Rsvd", 0)
    if missing <= 0:
        yield None
        return
    try:
        with open(overcommit_file) as f:
            before = f.read().strip()
        with open(overcommit_file, "w") as f:
            f.write(f"{int(before) + info.get('HugePages_Surp', 0) + missing}\n")
    except (OSError, ValueError) as e:
        yield f"cannot allow {missing} more huge pages ({overcommit_file}: {e})"
        return
    try:
        yield None
    finally:
        with open(overcommit_file, "w") as f:
            f.write(before + "\n")


def run_fio(paths: Sequence[str], jobs: int, bs: str = "1M", ioengine: str = "psync", iodepth: int = 1,
            timeout: Optional[float] = 600, rw: str = "read", buffers: str = "auto") -> FioResult:
    """Runs fio on ``paths`` (O_DIRECT, ``rw`` ``read`` or ``randread``) and returns its throughput.

    ``buffers="auto"`` gives fio huge-page buffers where :func:`huge_page_pool` can (as dlstore's
    buffers are), else malloc's, and the result's ``buffers_note`` says why not; ``"huge"`` and
    ``"malloc"`` ask for one.

    Files smaller than ``bs`` are read with the largest block they hold (:func:`fitting_block_size`);
    the result's ``config["bs"]`` says which.

    Raises
    ------
    FioError
        When fio is missing, fails (e.g. the filesystem refuses O_DIRECT) or times out, or a file is under
        4 KiB.
    """
    missing = fio_missing_reason()
    if missing:
        raise FioError(missing)
    bs = fitting_block_size(paths, bs) if paths else bs
    if buffers not in ("auto", *BUFFERS):
        raise ValueError(f"buffers must be 'auto' or one of {sorted(BUFFERS)}, not {buffers!r}")
    if buffers == "malloc":
        return _run_fio_job(paths, jobs, bs, ioengine, iodepth, timeout, rw, "malloc")
    with huge_page_pool(jobs, bs, iodepth) as refused:
        if refused is None:
            try:
                return _run_fio_job(paths, jobs, bs, ioengine, iodepth, timeout, rw, "huge")
            except FioError as e:
                if buffers == "huge":
                    raise
                refused = f"fio failed with huge-page buffers: {e}"
        elif buffers == "huge":
            raise FioError(f"no huge pages for fio's buffers: {refused}")
    result = _run_fio_job(paths, jobs, bs, ioengine, iodepth, timeout, rw, "malloc")
    result.buffers_note = f"malloc buffers, not huge pages: {refused}"[:300]
    return result


def _run_fio_job(paths: Sequence[str], jobs: int, bs: str, ioengine: str, iodepth: int,
                 timeout: Optional[float], rw: str, buffers: str) -> FioResult:
    with tempfile.TemporaryDirectory(prefix="dlstore-fio-") as tmp:
        job = os.path.join(tmp, "read.fio")
        with open(job, "w") as f:
            f.write(fio_job_file(list(paths), jobs, bs=bs, ioengine=ioengine, iodepth=iodepth, rw=rw,
                                 buffers=buffers))
        cmd: List[str] = ["fio", "--output-format=json", job]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise FioError(f"fio did not finish within {timeout} s") from None
    if proc.returncode != 0:
        # One line: fio repeats a job file's error once per job.
        lines = dict.fromkeys(x.strip() for x in (proc.stderr.strip() or proc.stdout.strip()).splitlines())
        detail = "; ".join(x for x in lines if x)[-500:]
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
