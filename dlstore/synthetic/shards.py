"""Writing a generated set's shards from worker processes: records are made in tasks (a pool of
spawned processes, or this one), and written in order, so that the bytes do not depend on the
number of workers.
"""
from __future__ import annotations

import multiprocessing
import os
import shutil
from typing import Any, Callable, Iterator, List, Optional

from dlstore._progress import Progress
from dlstore.writers import RecordIOWriter, TFRecordWriter

__all__ = ["check_counts", "default_workers", "payload_stream", "write_shards"]


def check_counts(shards: int, records_per_shard: int, seed: int) -> None:
    """Raises ValueError unless the counts are positive and the seed non-negative."""
    if int(shards) < 1 or int(records_per_shard) < 1:
        raise ValueError(f"shards and records_per_shard must be positive, "
                         f"got {shards} and {records_per_shard}")
    if int(seed) < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")


def default_workers(records: int) -> int:
    """One process per usable core (at most 16); none for sets too small to repay starting them."""
    if records < 64:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 16))


def payload_stream(make: Callable[[Any], List[bytes]], tasks: List[Any],
                    workers: int) -> Iterator[List[bytes]]:
    """The payload lists of ``tasks`` in order, made here or by a pool of spawned processes."""
    if workers <= 1:
        for t in tasks:
            yield make(t)
        return
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        # imap keeps task order, so the shards come out the same as with one process.
        yield from pool.imap(make, tasks)


def shard_names(prefix: str, shards: int) -> List[str]:
    """``prefix-00000-of-0000N`` ...: how ``dlstore gen`` and ``dlstore convert`` name their shards."""
    return [f"{prefix}-{i:05d}-of-{shards:05d}" for i in range(shards)]


def refuse_other_sets(out_dir: str, names: List[str]) -> None:
    """Raises when ``out_dir`` holds record files other than ``names`` (shard names, with or without a
    format's suffix): written beside them, this set would read as one dataset with theirs.

    Raises
    ------
    DlstoreError
        Naming the directory, how many such files and one of them.
    """
    from dlstore.errors import DlstoreError
    from dlstore.sources.reader import list_record_files

    if not os.path.isdir(out_dir):
        return
    mine = set(names)
    others = [n for n in list_record_files(out_dir) if n not in mine and os.path.splitext(n)[0] not in mine]
    if others:
        raise DlstoreError(f"{out_dir} already holds {len(others)} record {'file' if len(others) == 1 else 'files'} "
                           f"this run would not overwrite (e.g. {others[0]}), which would read as one dataset with "
                           f"these: give an empty or new directory", path=out_dir)


def write_shards(out_dir, prefix: str, shards: int, records_per_shard: int, fmt: str,
                  make: Callable[[Any], List[bytes]], task: Callable[[int, int], Any], task_size: int,
                  workers: Optional[int], progress: bool, label: str, copies: int = 1) -> List[str]:
    """Writes ``shards`` shards of ``records_per_shard`` records each (``fmt``: tfrecord or recordio)
    named ``{prefix}-00000-of-NNNNN``, then ``copies - 1`` byte copies of them; returns the paths.

    ``task(start, stop)`` describes records ``start..stop-1`` and ``make(task)`` serializes them,
    in ``workers`` spawned processes (``None``: :func:`default_workers`), ``task_size`` records a
    task; ``label`` names the progress bar.
    """
    out_dir = os.fspath(out_dir)
    shards, records_per_shard = int(shards), int(records_per_shard)
    total = shards * records_per_shard
    workers = default_workers(total) if workers is None else max(1, int(workers))
    if int(copies) < 1 or (int(copies) > 1 and fmt != "tfrecord"):
        raise ValueError(f"copies must be at least 1 (and 1 for {fmt}, whose index names the file), got {copies}")
    files = shards * int(copies)
    names = shard_names(prefix, files)
    refuse_other_sets(out_dir, names)  # before anything is written
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, n + (".rec" if fmt == "recordio" else "")) for n in names]
    # Tasks never straddle a shard, so each result goes to one writer.
    tasks = [task(s * records_per_shard + a, s * records_per_shard + min(a + task_size, records_per_shard))
             for s in range(shards) for a in range(0, records_per_shard, task_size)]

    def open_writer(i: int):
        if fmt == "recordio":
            return RecordIOWriter(paths[i], idx_path=os.path.join(out_dir, names[i] + ".idx"))
        return TFRecordWriter(paths[i])

    bar = Progress(total=total * int(copies), desc=f"gen {label}", unit="rec", enabled=None if progress else False,
                   piped="lines")
    written, writer, shard = 0, None, -1
    try:
        for payloads in payload_stream(make, tasks, workers):
            if written // records_per_shard != shard:
                if writer is not None:
                    writer.close()
                shard = written // records_per_shard
                writer = open_writer(shard)
            for p in payloads:
                writer.write(p)
            written += len(payloads)
            bar.update(len(payloads))
        if writer is not None:
            writer.close()
            writer = None
        for i in range(shards, files):  # the copies: bytes copied, nothing encoded again
            shutil.copyfile(paths[i % shards], paths[i])
            bar.update(records_per_shard)
    finally:
        if writer is not None:
            writer.close()
        bar.close()
    assert written == total, (written, total)
    return paths
