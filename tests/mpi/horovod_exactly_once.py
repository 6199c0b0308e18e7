"""Run under ``horovodrun -np N``: each rank takes its rank and world from Horovod (``hvd.init()``),
reads its share of a dataset through ``dlstore.Dataset`` for two epochs in every shuffle, and writes
the SHA-1 of each record it saw, per shuffle and epoch, to ``OUT_DIR/rank-R.json``; the test compares.

Usage: python tests/mpi/horovod_exactly_once.py DATA_DIR OUT_DIR
"""
import hashlib
import json
import os
import sys

import horovod.torch as hvd

from dlstore.sources.dataset import Dataset
from dlstore.placement.world import detect_world


def main() -> int:
    data, out = sys.argv[1], sys.argv[2]
    hvd.init()
    world = detect_world(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                         local_size=hvd.local_size())
    launcher = detect_world()  # what dlstore finds alone, from the launcher's variables
    seen = {}
    for shuffle in ("none", "block", "buffer", "global"):
        ds = Dataset(data, world=world, seed=3, shuffle=shuffle, remainder="uneven", batch_size=4, io="buffered",
                     buffer_size=5, block_size=64 << 10)
        for epoch in range(2):
            ds.set_epoch(epoch)
            digests = []
            for batch in ds.batches():
                mv = memoryview(batch)
                digests += [hashlib.sha1(mv[o:o + n]).hexdigest()
                            for o, n in zip(batch.offsets.tolist(), batch.lengths.tolist())]
            seen[f"{shuffle}/{epoch}"] = digests
    with open(os.path.join(out, f"rank-{hvd.rank()}.json"), "w") as f:
        json.dump({"rank": hvd.rank(), "size": hvd.size(), "launcher": [launcher.rank, launcher.size,
                                                                         launcher.source], "seen": seen}, f)
    hvd.join()  # every rank done before any exits
    return 0


if __name__ == "__main__":
    sys.exit(main())
