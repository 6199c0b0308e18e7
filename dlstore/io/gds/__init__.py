"""``io="gds"``: TFRecord records read straight into GPU memory through kvikio's ``CuFile``.

The engine is written so that everything but the CUDA calls runs anywhere:

- :func:`plan_reads` (pure numpy) groups a read plan (per record: file, frame offset, frame size,
  as the index gives them) into large reads, each starting on a 4096-byte boundary, as cuFile needs
  for true GDS; :func:`frame_positions` says where each record lies in its read's buffer.
- A *device backend* does the rest: opens files, allocates buffers, reads ranges into them, and
  checks each record's frame, returning one status byte per record (:data:`FRAME_OK` ...).
  :class:`KvikioBackend` reads with ``CuFile.pread`` into CuPy buffers and checks frames with a
  CUDA kernel (``dlstore_tfrecord_frames`` in ``kernels.cu``: length against the index, then the length
  and data CRC-32C, a block per record), so only the status bytes come back to the host.
  :class:`HostBackend` is its stand-in: numpy buffers, ``os.preadv``, and the C++ core's CRC-32C.
  Tests run the same :class:`GdsCore` over it.
- :class:`GdsCore` has the C++ reader's interface (``next_batch``, ``count_all``, ``stats``,
  ``notes``, ``corruptions``), so :class:`dlstore.RecordReader` runs it as it runs the C++ core.
- :class:`GdsPlanReader` has the C++ plan reader's (``next_batch``, ``position``, ``stats``,
  ``notes``, ``corruptions``), so :class:`dlstore.Dataset` runs it as it runs ``_C.PlanReader``:
  an epoch's read plan, read in read order in large reads, handed out in emission order in batches
  of exactly ``batch_size``, gathered on the device (``dlstore_gather``, one launch per batch).
  Its batches (:class:`DeviceBatch`) hold the buffer (``buffer``: a CuPy array, which frameworks
  take without a copy through ``__cuda_array_interface__`` or DLPack), and the record ``offsets``
  and ``lengths`` into it as host numpy arrays.

Whether cuFile ran true GDS or a compat mode is :func:`dlstore.io.cuda.gds_verdict`'s, and goes into
``engine_reason`` and ``stats()["gds_mode"]``. NOT YET RUN ON A GPU: see docs/gpu.md.

One module a job: ``plan`` (pure numpy), ``kernels`` (the CUDA source and frame status codes),
``batch``, ``backends``, ``core`` and ``plan_reader``; the names above are re-exported here.

May import what :mod:`dlstore.io` may (``errors``, the C++ core's CRC-32C, :func:`dlstore.sources.indexing.find_index`
for the indexes); kvikio and CuPy only inside :class:`KvikioBackend`, at run time.
"""

from dlstore.io.gds.backends import HostBackend, KvikioBackend, default_backend
from dlstore.io.gds.batch import DeviceBatch
from dlstore.io.gds.core import GdsCore
from dlstore.io.gds.kernels import FRAME_DATA_CRC, FRAME_LENGTH, FRAME_LENGTH_CRC, FRAME_OK
from dlstore.io.gds.plan import (ALIGN, ReadPlan, byte_indices, file_plan, frame_positions, frame_problem,
                                 packed_offsets, plan_reads)
from dlstore.io.gds.plan_reader import GdsPlanReader

__all__ = ["ALIGN", "FRAME_OK", "FRAME_LENGTH", "FRAME_LENGTH_CRC", "FRAME_DATA_CRC",
           "ReadPlan", "plan_reads", "frame_positions", "packed_offsets", "byte_indices", "frame_problem",
           "DeviceBatch", "HostBackend", "KvikioBackend", "GdsCore", "GdsPlanReader", "file_plan", "default_backend"]
