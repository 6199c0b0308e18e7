"""Blocks: a consumer's record runs cut at fixed byte boundaries of each shard, each read through one mount.

A shard is cut into blocks of about ``block_bytes`` (block ``j`` holds the records whose frame starts
in ``[j * block_bytes, (j + 1) * block_bytes)``), independently of the epoch and of who reads it.
A block is always read through the same mount, so the page cache of that mount stays useful from one
epoch to the next; a rank given several mounts alternates between them block by block so that all
of them stream at once. Pure functions: no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

__all__ = ["Block", "cut_blocks", "interleave_by_mount"]


@dataclass(frozen=True)
class Block:
    """Records ``start`` .. ``stop`` of ``shard``, all in the shard's block number ``number``."""

    shard: int
    start: int
    stop: int
    number: int


def cut_blocks(runs: Sequence[Tuple[int, int, int]], frame_offsets: Dict[int, np.ndarray],
               block_bytes: int) -> List[Block]:
    """Cuts record runs ``(shard, start, stop)`` where they cross a block boundary of their shard.

    ``frame_offsets[shard]`` holds the byte offset of each record's frame in the shard.
    """
    out: List[Block] = []
    for shard, start, stop in runs:
        if stop <= start:
            continue
        numbers = frame_offsets[shard][start:stop] // block_bytes
        cuts = np.flatnonzero(numbers[1:] != numbers[:-1]) + 1
        edges = [0, *cuts.tolist(), stop - start]
        for a, b in zip(edges[:-1], edges[1:]):
            out.append(Block(shard, start + a, start + b, int(numbers[a])))
    return out


def interleave_by_mount(blocks: Sequence[Block], mounts: Sequence[int]) -> List[int]:
    """The order to read ``blocks`` in so that consecutive reads alternate between mounts.

    ``mounts[i]`` is the mount block ``i`` is read through. Blocks keep their order per mount; the
    mounts take turns in the order each first appears. Returns indices into ``blocks``.
    """
    queues: Dict[int, List[int]] = {}
    for i, m in enumerate(mounts):
        queues.setdefault(m, []).append(i)
    if len(queues) <= 1:
        return list(range(len(blocks)))
    order: List[int] = []
    lists = list(queues.values())
    depth = max(len(q) for q in lists)
    for k in range(depth):
        order.extend(q[k] for q in lists if k < len(q))
    return order
