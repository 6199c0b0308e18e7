"""``io="gds"``: TFRecord records read straight into GPU memory through kvikio's ``CuFile``.

gds is a destination of the one read plan, not a second reader: the C++ ``ReadSchedule`` that the host
engines run decides what is read together, in which order records go out, what is held, spilled or
let go, and what an error does; :class:`GdsPlanReader` carries out its steps on the GPU (reads with
``CuFile.pread`` into CuPy buffers, frames and CRCs checked by a kernel, batches gathered by a kernel,
see :mod:`dlstore.io.gds.kernels`). Its batches (:class:`DeviceBatch`) go to any framework by DLPack
without a copy. Whether cuFile ran true GDS or a compat mode is :func:`dlstore.io.cuda.gds_verdict`'s
(``engine_reason``, ``stats()["gds_mode"]``). docs/gpu.md says what has run on a GPU.

May import what :mod:`dlstore.io` may; kvikio and CuPy only inside :class:`GdsPlanReader`, at run time.
"""
from typing import Sequence

from dlstore.errors import DlstoreError
from dlstore.io.gds.batch import DeviceBatch, Quarantine
from dlstore.io.gds.reader import ALIGN, GdsPlanReader

__all__ = ["ALIGN", "DeviceBatch", "GdsPlanReader", "Quarantine", "check_source"]


def check_source(fmt: str, paths: Sequence[str], compressions: Sequence[str] = ()) -> None:
    """Refuses what gds cannot read: a format whose frames the GPU does not parse (only TFRecord's), or a
    compressed file.

    Raises
    ------
    DlstoreError
        Naming the first file that is not, and what it is.
    """
    from dlstore.formats.registry import format_named

    refused = [(p, c) for p, c in zip(paths, compressions) if c != "none"]
    device_reads = format_named(fmt).device_reads
    if device_reads and not refused:
        return
    path, what = (paths[0], fmt) if not device_reads else (refused[0][0], f"{refused[0][1]}-compressed")
    raise DlstoreError(f"io='gds' reads uncompressed TFRecord files; {path} is {what}: use a host engine", path=path)
