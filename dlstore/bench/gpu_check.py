"""``python -m dlstore.bench gpu-check``: the GPU path end to end on a GPU machine, in one command.

Meant for a machine with CUDA, CuPy and torch that reaches no package registry (docs/gpu.md says what
to carry there). In order, each step timed and reported even when an earlier one failed:

1. ``build``: the C++ core rebuilt in place from this source tree (nothing to do for an installed copy);
2. ``tests``: the ``gpu``- and ``gds``-marked tests and the GPU reader's tests (:data:`GPU_TESTS`);
3. ``identical``: ``Dataset(io="gds")`` against ``io="buffered"``, batch by batch, byte for byte and
   stats key for stats key, for every shuffle, one and two ranks, two mounts per rank, with reads under
   and over kvikio's ``gds_threshold`` (16 KiB in kvikio 26.10, not the 1 MiB its header says);
4. ``sanitizer``: the gds reader and its kernels under ``compute-sanitizer --tool memcheck``;
5. ``throughput``: gds, kvikio's own ``CuFile.pread`` and direct + pinned + copy, warm and cold, CRC on
   (:func:`dlstore.bench.storage.run_storage`); the frame kernel alone on 8 MiB reads of 110 KB records;
6. ``pipelines``: ``bench resnet50`` and ``bench bert`` with ``--device``;
7. ``training``: a torch training step fed by ``Loader(device=)`` and by ``TorchLoader``'s copies, given the
   host's images and labels in the host's order (:mod:`dlstore.bench.train_check`);
8. ``suite``: the rest of the test suite (not ``slow``, not ``mpi``) on this machine's Python and compiler,
   where the first GPU run found what no GPU test would: every error message crashed the process.

It writes ``gpu_check.json`` and ``gpu_check.md`` and exits 0 when every step that ran passed, 1 when
one failed, 2 (one line) where there is no GPU, kvikio or CuPy.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from dlstore.formats.tfrecord import FOOTER_BYTES, HEADER_BYTES, frame_parts

from dlstore.io import cuda
from dlstore.io.cuda import gds_verdict, parse_device

__all__ = ["add_arguments", "run", "STEPS", "crc_bench_inputs", "crc_kernel_gb_per_s"]

GPU_TESTS = ["tests/unit/test_gds.py", "tests/integration/test_gds_dataset.py", "tests/unit/test_memory.py",
             "tests/unit/test_adapters_device.py", "tests/unit/test_read_schedule.py"]
STEPS = ("build", "tests", "identical", "sanitizer", "throughput", "pipelines", "training", "suite")
_HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a source tree's root
_LOG: List[str] = []  # every subprocess's output and every step's traceback, written out as gpu_check.log
_DEADLINE = [float("inf")]  # time.monotonic() by which a subprocess must end (the budget, plus the last step's grace)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of the ``gpu-check`` scenario."""
    p.add_argument("--device", default="cuda:0", metavar="cuda:N", help="the GPU to check (default: %(default)s)")
    p.add_argument("--out", default="gpu-check", metavar="DIR",
                   help="where gpu_check.json and gpu_check.md go (default: %(default)s)")
    p.add_argument("--skip", action="append", default=[], choices=STEPS, help="leave a step out (repeatable)")
    p.add_argument("--budget", type=float, default=540.0, metavar="SECONDS",
                   help="steps not started within this many seconds are reported as not run (default: %(default)s)")
    p.add_argument("--sanitizer-target", metavar="DIR", help=argparse.SUPPRESS)  # what compute-sanitizer runs


def run(args: argparse.Namespace) -> int:
    index = parse_device(args.device)
    missing = gds_verdict(cuda.cuda_facts(), index or 0).missing
    if index is None or missing:
        print(f"gpu-check: {missing or 'needs a CUDA device (--device cuda:N)'}", file=sys.stderr)
        return 2
    if args.sanitizer_target:
        read_every_shuffle(args.sanitizer_target, index)
        return 0
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="dlstore-gpu-check-")
    steps: Dict[str, Callable[[], Dict[str, Any]]] = {
        "build": _build, "tests": _tests, "identical": lambda: _identical(work, index),
        "sanitizer": lambda: _sanitizer(work, index, args.device), "throughput": lambda: _throughput(index),
        "pipelines": lambda: _pipelines(args.device, work), "training": lambda: _training(work, index),
        "suite": _suite}
    started, results = time.monotonic(), []
    # A step started inside the budget may run 60 s past it, no more: the report is written after every step,
    # so a run cut short by its caller still leaves what it found.
    _DEADLINE[0] = started + args.budget + 60
    facts = cuda.cuda_facts()
    head = {"device": facts.devices[index], "driver": facts.driver, "kvikio": facts.kvikio, "cupy": facts.cupy,
            "gds": gds_verdict(facts, index).reason}
    try:
        for name in STEPS:
            if name in args.skip or time.monotonic() - started > args.budget:
                why = "--skip" if name in args.skip else f"the {args.budget:.0f} s budget was spent"
                results.append({"step": name, "ok": None, "seconds": 0.0, "detail": f"not run: {why}"})
            else:
                t0 = time.monotonic()
                try:
                    out = steps[name]()
                except Exception as e:  # noqa: BLE001 - a step that breaks is a finding, and the others still run
                    out = {"ok": False, "detail": f"{type(e).__name__}: {e}"}
                    _LOG.append(f"== {name}: {traceback.format_exc()}")
                results.append({"step": name, "seconds": round(time.monotonic() - t0, 1), **out})
                print(f"gpu-check: {name}: {'ok' if out['ok'] else 'not run' if out['ok'] is None else 'FAILED'}"
                      f" ({results[-1]['seconds']} s) {out.get('detail', '')}", flush=True)
            _write(args.out, {**head, "steps": results})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"gpu-check: wrote {args.out}/gpu_check.json, gpu_check.md and gpu_check.log")
    return 1 if any(r["ok"] is False for r in results) else 0


def _write(out: str, doc: Dict[str, Any]) -> None:
    with open(os.path.join(out, "gpu_check.json"), "w") as f:
        json.dump(doc, f, indent=2, default=str)
    with open(os.path.join(out, "gpu_check.md"), "w") as f:
        f.write(markdown(doc))
    with open(os.path.join(out, "gpu_check.log"), "w") as f:
        f.write("\n".join(_LOG) + "\n")


def markdown(doc: Dict[str, Any]) -> str:
    """The report as a markdown table: a row per step, its figures after it."""
    rows = [f"gpu-check on {doc['device']} (driver {doc['driver']}, kvikio {doc['kvikio']}, CuPy {doc['cupy']}); "
            f"{doc['gds']}", "", "| step | result | seconds | detail |", "|---|---|---:|---|"]
    for r in doc["steps"]:
        verdict = "ok" if r["ok"] else "not run" if r["ok"] is None else "**failed**"
        rows.append(f"| {r['step']} | {verdict} | {r['seconds']} | {r.get('detail', '')} |")
    for r in doc["steps"]:
        for key, value in r.get("figures", {}).items():
            rows.append(f"| {r['step']}: {key} | | | {value} |")
    return "\n".join(rows) + "\n"


def _run(cmd: List[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess:
    """``cmd``'s output, kept whole in the log; it may not outlast the budget's deadline."""
    timeout = max(10.0, min(timeout, _DEADLINE[0] - time.monotonic()))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        _LOG.append(f"== {' '.join(cmd)}: killed after {timeout:.0f} s\n"
                    f"{_text(e.stdout)[-20000:]}\n{_text(e.stderr)[-20000:]}")
        raise
    _LOG.append(f"== {' '.join(cmd)}: exit {p.returncode}\n{p.stdout[-30000:]}\n{p.stderr[-30000:]}")
    return p


def _text(b: Any) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def _build() -> Dict[str, Any]:
    if not os.path.exists(os.path.join(_HERE, "setup.py")):
        return {"ok": True, "detail": "an installed copy: nothing to build"}
    p = _run([sys.executable, "setup.py", "build_ext", "--inplace", "-j", str(os.cpu_count() or 2)], 300, cwd=_HERE)
    return {"ok": p.returncode == 0, "detail": "built in place" if p.returncode == 0 else p.stderr[-400:]}


def _tests() -> Dict[str, Any]:
    # The modules that hold gpu/gds tests and the GPU reader's stand-in tests; none needs a package the GPU
    # machine lacks (no hypothesis, TensorFlow or DALI at import).
    return _pytest(GPU_TESTS, 300)


def _suite() -> Dict[str, Any]:
    # The rest of the suite: the tests step has run the GPU modules already.
    return _pytest(["-m", "not slow and not mpi", "--maxfail=50", *(f"--ignore={t}" for t in GPU_TESTS), "tests"],
                   300)


def _pytest(args: List[str], timeout: float) -> Dict[str, Any]:
    if not os.path.isdir(os.path.join(_HERE, "tests")):
        return {"ok": None, "detail": "no tests/ beside the package (an installed copy)"}
    try:  # pytest-xdist, where installed (the GPU image has it), runs the modules on every core
        import xdist  # noqa: F401
        spread = ["-n", str(min(12, os.cpu_count() or 1)), "-p", "no:benchmark"]  # pytest-benchmark refuses xdist
    except ImportError:
        spread = []
    p = _run([sys.executable, "-m", "pytest", "-q", "-rfEs", "--tb=short", "-p", "no:cacheprovider", *spread, *args],
             timeout, cwd=_HERE)
    last = (p.stdout.strip().splitlines() or ["no output"])[-1]
    return {"ok": p.returncode == 0, "detail": last}


def make_shards(directory: str, records: int, record_bytes: int, shards: int, seed: int = 0) -> List[str]:
    """``shards`` TFRecord files of ``records`` random records each (sizes about ``record_bytes``)."""
    from dlstore import TFRecordWriter

    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    paths = []
    for s in range(shards):
        path = os.path.join(directory, f"part-{s:03d}.tfrecord")
        with TFRecordWriter(path) as w:
            for r in range(records):
                w.write(b"%d.%d|" % (s, r) + rng.bytes(int(rng.integers(record_bytes // 2, record_bytes * 3 // 2))))
        paths.append(path)
    return paths


def _records(batch: Any) -> List[bytes]:
    data = batch.buffer.get().tobytes() if getattr(batch, "on_gpu", False) else memoryview(batch).tobytes()
    return [data[o:o + n] for o, n in zip(batch.offsets.tolist(), batch.lengths.tolist())]


def _identical(work: str, index: int) -> Dict[str, Any]:
    import dlstore
    from dlstore.placement.sharding import SHUFFLES

    checked, problems = 0, []
    # kvikio runs a read under its gds_threshold (16 KiB in 26.10) at once in pread, a larger one on its pool:
    # 3 KB records (a global shuffle reads them one by one, under it) and 110 KB records in 8 MiB reads (over).
    for tag, chunk, record_bytes, records in (("under", 64 << 10, 3_000, 200), ("over", 8 << 20, 110_000, 120)):
        mounts = [os.path.join(work, f"{tag}-m{m}") for m in range(4)]
        names = [os.path.basename(p) for p in make_shards(mounts[0], records, record_bytes, 6)]
        for m in mounts[1:]:
            shutil.copytree(mounts[0], m, dirs_exist_ok=True)
        for shuffle in SHUFFLES:
            for size in (1, 2):
                for rank in range(size):
                    kw = dict(mounts=mounts, world=dlstore.world(rank=rank, size=size), shuffle=shuffle,
                              batch_size=16, seed=3, mounts_per_rank=2, chunk_size=chunk)
                    host = dlstore.Dataset(names, io="buffered", **kw)
                    gpu = dlstore.Dataset(names, io="gds", device=f"cuda:{index}", **kw)
                    want = [_records(b) for b in host.batches()]
                    got = [_records(b) for b in gpu.batches()]
                    checked += 1
                    if got != want:
                        problems.append(f"{tag} {shuffle} rank {rank}/{size}: batches differ")
                    lost = set(host.stats()) - set(gpu.stats())
                    if lost:
                        problems.append(f"{tag} {shuffle} rank {rank}/{size}: gds stats lack {sorted(lost)}")
    detail = f"{checked} passes byte-identical" if not problems else "; ".join(problems[:4])
    return {"ok": not problems, "detail": detail}


def read_every_shuffle(directory: str, index: int) -> None:
    """One gds pass of each shuffle over a small set (what compute-sanitizer watches)."""
    import dlstore
    from dlstore.placement.sharding import SHUFFLES

    paths = make_shards(directory, 30, 40_000, 3)
    for shuffle in SHUFFLES:
        ds = dlstore.Dataset(paths, io="gds", device=f"cuda:{index}", shuffle=shuffle, batch_size=8,
                             chunk_size=256 << 10)
        for _ in ds.batches():
            pass


def _sanitizer(work: str, index: int, device: str) -> Dict[str, Any]:
    tool = shutil.which("compute-sanitizer")
    if tool is None:
        return {"ok": None, "detail": "compute-sanitizer is not on PATH"}
    p = _run([tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, "-m", "dlstore.bench", "gpu-check",
              "--device", device, "--sanitizer-target", os.path.join(work, "sanitizer")], 300)
    summary = [line for line in p.stdout.splitlines() if "ERROR SUMMARY" in line]
    return {"ok": p.returncode == 0, "detail": summary[-1] if summary else p.stderr[-300:]}


def _throughput(index: int) -> Dict[str, Any]:
    from dlstore.bench.storage import dataset_paths, run_storage

    # The ~1 GB default set: the first GPU run read the 300 MB one in under a second a pass, and its cold ratios
    # spread 0.93-1.23x.
    paths = dataset_paths(None, "default", progress=False)
    figures: Dict[str, Any] = {}
    # Warm, direct reads what the page cache holds from it (the direct_cache setting), as kvikio's compat
    # reads do; buffered + pinned + copy is the host path io="auto" picks for a warm cache.
    for io, caches in (("gds", "both"), ("direct", "both"), ("buffered", "warm")):
        for r in run_storage(paths, io=io, cache=caches, repeat=3, fio=False, device=index, log=lambda _: None):
            label = "gds" if io == "gds" else f"{io} + pinned + copy"
            figures[f"{label}, {r['cache']}"] = (f"{r['gb_per_s']:.2f} GB/s, kvikio {r['kvikio_gb_per_s']:.2f} GB/s: "
                                                 f"{r['ratio_vs_kvikio']:.2f}x")
    figures["frame kernel alone"] = f"{crc_kernel_gb_per_s(index):.1f} GB/s (8 MiB of 110 KB records, CRC on)"
    return {"ok": True, "detail": "CRC on; see figures", "figures": figures}


def crc_bench_inputs(n_bytes: int = 8 << 20, record_bytes: int = 110_000,
                     seed: int = 0) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A synthetic read for timing ``dlstore_tfrecord_frames`` alone: ``(buf, rel, size)`` on the host.

    ``buf`` (uint8, ``n_bytes``) holds valid TFRecord frames of ``record_bytes`` each (random payloads),
    the last one shorter to end the buffer (or zero padding under 16 bytes); ``rel`` and ``size`` (int64)
    are where each frame starts and its size, as the index gives them. Every frame checks
    ``FRAME_OK``, so a timing run also checks the kernel's answer.
    """
    if record_bytes < HEADER_BYTES + FOOTER_BYTES:
        raise ValueError(f"record_bytes={record_bytes}: a TFRecord frame takes at least 16 bytes")
    full, rest = divmod(int(n_bytes), int(record_bytes))
    size = np.full(full, record_bytes, dtype=np.int64)
    if rest >= HEADER_BYTES + FOOTER_BYTES:
        size = np.append(size, rest)
    rel = np.concatenate([[0], np.cumsum(size)[:-1]]).astype(np.int64)
    buf = np.zeros(int(n_bytes), dtype=np.uint8)
    payload = np.random.default_rng(seed).integers(0, 256, int(size.sum()), dtype=np.uint8)
    for at, frame in zip(rel.tolist(), size.tolist()):
        data = payload[at:at + frame - HEADER_BYTES - FOOTER_BYTES]
        header, footer = frame_parts(data)
        buf[at:at + HEADER_BYTES] = np.frombuffer(header, dtype=np.uint8)
        buf[at + HEADER_BYTES:at + frame - FOOTER_BYTES] = data
        buf[at + frame - FOOTER_BYTES:at + frame] = np.frombuffer(footer, dtype=np.uint8)
    return buf, rel, size


def crc_kernel_gb_per_s(index: int, repeat: int = 50) -> float:
    """The frame kernel alone (length and CRCs checked) over 8 MiB of valid 110 KB records, in GB/s."""
    import cupy

    from dlstore.io.gds import kernels

    buf, rel, size = crc_bench_inputs(8 << 20, 110_000)
    with cupy.cuda.Device(index):
        fn = cupy.RawModule(code=kernels.CUDA_SOURCE).get_function(kernels.FRAMES_KERNEL_NAME)
        buf_d, rel_d, size_d = cupy.asarray(buf), cupy.asarray(rel), cupy.asarray(size)
        status = cupy.empty(len(rel), dtype=cupy.uint8)
        grid, block, shared = kernels.frames_launch(len(rel))

        def launch() -> None:
            fn(grid, block, (buf_d, rel_d, size_d, np.int32(len(rel)), np.int32(1), status), shared_mem=shared)

        launch()
        if int(status.max()) != kernels.FRAME_OK:
            raise RuntimeError("the frame kernel flags valid records")
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(repeat):
            launch()
        stop.record()
        stop.synchronize()
        seconds = cupy.cuda.get_elapsed_time(start, stop) / 1000
    return int(size.sum()) * repeat / seconds / 1e9


def _pipelines(device: str, work: str) -> Dict[str, Any]:
    figures, ok = {}, True
    for name in ("resnet50", "bert"):
        out = os.path.join(work, f"{name}.json")
        # The default sets (the throughput step made ResNet-50's): on the first GPU machine the small ones
        # gave tiers under a second.
        p = _run([sys.executable, "-m", "dlstore.bench", name, "--device", device, "--size", "default",
                  "--quiet", "--json", out], 240)
        if p.returncode != 0:
            ok = False
            figures[name] = f"exit {p.returncode}: {(p.stderr.strip().splitlines() or [''])[-1]}"
            continue
        with open(out) as f:
            figures[name] = _headline(json.load(f))
    return {"ok": ok, "detail": "bench resnet50 and bert --device", "figures": figures}


def _training(work: str, index: int) -> Dict[str, Any]:
    try:
        import torch  # noqa: F401
    except ImportError:
        return {"ok": None, "detail": "torch is not installed"}
    from dlstore.bench.train_check import compare_feeds
    from dlstore.synthetic.imagenet import generate_imagenet

    # 768 small images: four epochs take seconds, and the first (left out of the rates) holds the set-up.
    paths = generate_imagenet(os.path.join(work, "training"), shards=8, records_per_shard=96, image_size=(160, 200),
                              progress=False)
    return compare_feeds(paths, index)


def _headline(doc: Dict[str, Any]) -> str:
    """The per-tier rate a pipeline bench's JSON leads with (``<unit>_per_s``), in a line."""
    key = f"{doc.get('unit', 'images')}_per_s"
    parts = [f"{t['tier']} {t[key]:,.0f} {doc.get('unit', '')}/s" for t in doc.get("tiers", []) if t.get(key)]
    return ", ".join(parts) or "ran (see the bench's own JSON)"
