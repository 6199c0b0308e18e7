"""Run under ``mpirun -np N``: each rank reads its share of a dataset through ``dlstore.Dataset`` (rank
and size detected from the launcher's environment), and rank 0 checks, for several epochs and every
remainder policy, that the ranks together read every record exactly once and agree on the batch count.

Usage: python tests/mpi/exactly_once.py DATA_DIR RESULT_JSON [MOUNT ...]
"""
import hashlib
import json
import sys

from dlstore.sources.dataset import Dataset
from dlstore.distributed import allgather, gather
from dlstore.placement.world import detect_world


def main() -> int:
    data, out, mounts = sys.argv[1], sys.argv[2], sys.argv[3:]
    world = detect_world()
    results = []
    for remainder in ("uneven", "drop", "pad"):
        for shuffle in ("none", "block", "buffer", "global"):
            kw = dict(world=world, seed=5, shuffle=shuffle, remainder=remainder, batch_size=3, io="buffered",
                      buffer_size=5, block_size=64 << 10)
            ds = Dataset("*.tfrecord", mounts=mounts, **kw) if mounts else Dataset(data, **kw)
            for epoch in range(2):
                ds.set_epoch(epoch)
                digests, sizes = [], []
                for batch in ds.batches():
                    sizes.append(batch.num_records)
                    mv = memoryview(batch)
                    digests += [hashlib.sha1(mv[o:o + n]).hexdigest()
                                for o, n in zip(batch.offsets.tolist(), batch.lengths.tolist())]
                agreed = allgather(ds.num_batches)
                every = gather({"rank": world.rank, "records": digests, "batches": agreed, "sizes": sizes,
                                "stats": {k: v for k, v in ds.stats().items() if isinstance(v, int)}})
                if every is not None and world.rank == 0:
                    results.append({"remainder": remainder, "shuffle": shuffle, "epoch": epoch, "ranks": every})
    if world.rank == 0:
        with open(out, "w") as f:
            json.dump({"world": repr(world), "size": world.size, "source": world.source, "results": results}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
