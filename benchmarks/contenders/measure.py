"""What a contender's worker process measures: its batches timed after a warm-up, with the CPU time
and memory of its whole process tree (threads and DataLoader workers included), printed as one JSON
result line for the parent.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Dict, Iterator, List, Optional

from benchmarks import _harness
from benchmarks.contenders import PIPELINES
from benchmarks.contenders.spec import CONTENDERS
from dlstore.bench import sysinfo

__all__ = ["RESULT_PREFIX", "process_tree", "tree_usage", "measure", "worker"]

RESULT_PREFIX = "PIPELINES_RESULT "


def _proc_stat(pid: int) -> Optional[List[str]]:
    """The fields of /proc/PID/stat after the command name (state first), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def process_tree(root: int) -> List[int]:
    """``root`` and its live descendants (DataLoader workers, spawned helpers)."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _proc_stat(int(entry))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def tree_usage(root: int) -> Dict[str, float]:
    """CPU seconds (user + system, every thread) and resident bytes of ``root``'s process tree."""
    tick, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    cpu = rss = 0.0
    for pid in process_tree(root):
        fields = _proc_stat(pid)
        if fields:  # utime, stime: fields 14 and 15 of stat; rss (pages): field 24
            cpu += (int(fields[11]) + int(fields[12])) / tick
            rss += int(fields[21]) * page
    return {"cpu_seconds": cpu, "rss_bytes": rss}


def _describe(batch: Dict) -> Dict[str, List]:
    """``name -> [shape, dtype]`` of a batch's arrays (numpy, torch or anything with shape and dtype)."""
    return {k: [list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in batch.items()}


def measure(batches: Iterator[Dict], key: str, warmup: int, items: int, warmup_seconds: float = 0.0) -> Dict:
    """Times a batch iterator: the first batch (start-up), then untimed batches until ``warmup``
    batches and ``warmup_seconds`` have passed, then batches until ``items`` items have been drawn;
    ``key`` names the array whose length counts items.

    The warm-up time lets tf.data's AUTOTUNE settle and drains what every contender's prefetch
    queue gathered while the first batch was being made, so that the timed batches are made at
    the steady rate, not handed over from a full queue.
    """
    pid = os.getpid()
    t0 = time.perf_counter()
    first = next(batches)
    startup = time.perf_counter() - t0
    spec = _describe(first)
    del first
    drawn = 1
    while drawn < warmup or time.perf_counter() - t0 < startup + warmup_seconds:
        next(batches)
        drawn += 1
    warmed = drawn
    usage0, ticks0 = tree_usage(pid), sysinfo.per_core_cpu_ticks()
    t0 = time.perf_counter()
    drawn = nbatches = 0
    while drawn < items:
        drawn += len(next(batches)[key])
        nbatches += 1
    seconds = time.perf_counter() - t0
    usage1, ticks1 = tree_usage(pid), sysinfo.per_core_cpu_ticks()
    cpu = usage1["cpu_seconds"] - usage0["cpu_seconds"]
    # Busy time of all cores (USER_HZ ticks, as the process tree's) less the contender's own.
    busy = sum(b1 - b0 for (b0, _), (b1, _) in zip(ticks0, ticks1)) / os.sysconf("SC_CLK_TCK")
    others = max(0.0, busy - cpu) / (seconds * max(1, len(ticks1))) * 100 if ticks1 else None
    return {"items": drawn, "batches": nbatches, "seconds": seconds, "items_per_s": drawn / seconds,
            "cpu_seconds": cpu, "cpu_ms_per_item": 1e3 * cpu / drawn, "startup_seconds": startup,
            "busiest_core_pct": sysinfo.busiest_core_percent(ticks0, ticks1), "others_cpu_pct": others,
            "rss_bytes": usage1["rss_bytes"], "warmup_batches": warmed, "spec": spec}


def _jsonable_stats(stats) -> Dict:
    """The loader's ``stats()`` with only what JSON can hold (numbers, strings, lists, dicts)."""
    try:
        return json.loads(json.dumps(stats, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)))
    except (TypeError, ValueError):
        return {"repr": repr(stats)}


def worker(name: str, plan_path: str) -> int:
    """``--worker NAME``: pins itself to the plan's cores, measures one contender once and prints
    one JSON result line: the measurement, ``{"unavailable": why}`` or ``{"error": why}``."""
    with open(plan_path) as f:
        plan = json.load(f)
    c = CONTENDERS[name]
    plan = dict(plan[c.task], cores=plan["cores"], seed=plan["seed"], family=c.family,
                dlstore_shuffle=c.dlstore_shuffle)
    # Pinned before any framework is imported, so every thread and worker process inherits it.
    os.sched_setaffinity(0, plan["cores"])
    out: Dict = {"name": name}
    try:
        batches = PIPELINES[name](plan)
        key = "image" if c.task == "resnet50" else "input_ids"
        out.update(measure(batches, key, plan["warmup"], plan["items"], plan["warmup_seconds"]))
        if "_stats" in plan:
            out["loader_stats"] = _jsonable_stats(plan["_stats"]())
    except ImportError as e:  # dlstore.pipeline not built yet, or a framework half-installed
        out = {"name": name, "unavailable": f"not available: {e}"}
    except Exception as e:  # noqa: BLE001 - reported in the contender's row, with the traceback on stderr
        traceback.print_exc()
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()] or [""]
        # DALI's messages run over many lines, the cause among the last ("Assert on ... failed: ...").
        cause = next((ln for ln in reversed(lines[1:]) if "failed" in ln.lower() or "error:" in ln.lower()),
                     lines[-1])
        text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {cause}"
        out = {"name": name, "error": f"{type(e).__name__}: {text}"[:400]}
    out["versions"] = _harness.framework_versions()
    print(RESULT_PREFIX + json.dumps(out), flush=True)
    sys.stderr.flush()
    os._exit(0)  # no framework teardown (DALI and DataLoader workers can take seconds to stop)
