"""The CUDA kernels of io="gds" as Python sees them: their source (``kernels.cu``, shipped beside this
module, whose comments give each kernel's arguments), their names, frame status codes and launch
configurations. Launched with CuPy's ``RawModule(code=CUDA_SOURCE).get_function(name)(grid, block, args,
shared_mem=...)``: pointers as device arrays (``unsigned char*``: uint8, ``long long*``: int64, ``unsigned
long long*``: uint64), scalars as numpy scalars of the C type (``int``: np.int32, ``long long``: np.int64).
"""
from __future__ import annotations

import functools
import os
from typing import Tuple


from dlstore.formats.tfrecord import FOOTER_BYTES, HEADER_BYTES

__all__ = ["FRAME_OK", "FRAME_LENGTH", "FRAME_LENGTH_CRC", "FRAME_DATA_CRC", "FRAME_HEADER", "FRAME_FOOTER",
           "FRAMES_KERNEL_NAME", "GATHER_KERNEL_NAME", "FRAME_THREADS", "GATHER_THREADS", "CUDA_SOURCE_PATH",
           "CUDA_SOURCE", "cuda_source", "frames_launch", "gather_launch"]

#: Frame status codes, the same from the CUDA kernel (``DLSTORE_FRAME_*`` in kernels.cu) and its host twin.
FRAME_OK, FRAME_LENGTH, FRAME_LENGTH_CRC, FRAME_DATA_CRC = 0, 1, 2, 3
FRAME_HEADER, FRAME_FOOTER = HEADER_BYTES, FOOTER_BYTES

FRAMES_KERNEL_NAME = "dlstore_tfrecord_frames"
GATHER_KERNEL_NAME = "dlstore_gather"

#: Threads per block: a frame-check block takes one record at a time (DLSTORE_FRAME_THREADS, the most its
#: shared memory and __launch_bounds__ allow); a gather block one record, a 16-byte word per thread.
FRAME_THREADS = 256
GATHER_THREADS = 256
# Grid caps: blocks beyond what the GPU runs at once (132 SMs x 8 blocks of 256 threads on an H100) only
# queue, and each frame-check block builds its 8 KB of CRC tables once for all the records it takes.
_FRAME_MAX_BLOCKS = 2048
_GATHER_MAX_BLOCKS = 4096

CUDA_SOURCE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels.cu")


@functools.lru_cache(maxsize=None)
def cuda_source() -> str:
    """The text of ``kernels.cu``: both kernels, for NVRTC (CuPy ``RawModule(code=...)``)."""
    with open(CUDA_SOURCE_PATH, encoding="utf-8") as f:
        return f.read()


CUDA_SOURCE = cuda_source()

Launch = Tuple[Tuple[int], Tuple[int], int]


def frames_launch(n_records: int) -> Launch:
    """``(grid, block, shared_mem_bytes)`` for ``dlstore_tfrecord_frames`` over ``n_records`` frames.

    A block of :data:`FRAME_THREADS` per record (up to a cap; each block then takes every grid-th record),
    its shared memory static (9 KB: the CRC tables and the slices' registers), so no dynamic shared
    memory. ``n_records`` 0 gives one block that does nothing.
    """
    return (max(1, min(int(n_records), _FRAME_MAX_BLOCKS)),), (FRAME_THREADS,), 0


def gather_launch(n_records: int) -> Launch:
    """``(grid, block, shared_mem_bytes)`` for ``dlstore_gather`` of ``n_records`` records: a block per
    record up to a cap (each block then takes every grid-th record), no shared memory."""
    return (max(1, min(int(n_records), _GATHER_MAX_BLOCKS)),), (GATHER_THREADS,), 0
