"""A batch of records in GPU memory (:class:`DeviceBatch`), and when its memory may be read into again."""
from __future__ import annotations

from collections import deque
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["DeviceBatch", "Quarantine"]


class Quarantine:
    """Device buffers that consumers may still read on their own streams, kept until those streams pass
    the point where the buffer was let go.

    CuPy's pool hands a freed buffer out again at once, in the order of the stream that allocated it; a
    ``CuFile.pread`` into it is not ordered on any stream. A consumer that read a batch on its own
    stream (the ``stream`` it gave ``__dlpack__``, e.g. torch's) may have kernels queued on it when it
    drops the batch. So a dropped batch's buffer comes here with an event recorded on each such stream,
    and goes back to CuPy only once the events have completed.
    """

    def __init__(self, cupy: Any):
        self._cp = cupy
        self._held: Deque[Tuple[Any, List[Any]]] = deque()

    def hold(self, buffer: Any, streams: Sequence[int]) -> None:
        events = []
        for s in streams:
            stream = self._cp.cuda.Stream.null if s in (None, 1) else self._cp.cuda.ExternalStream(int(s))
            events.append(stream.record())
        self._held.append((buffer, events))

    def purge(self) -> None:
        """Lets go the buffers whose consumers are done with them (call before reading into new memory)."""
        left: Deque[Tuple[Any, List[Any]]] = deque()
        for buffer, events in self._held:
            if not all(e.done for e in events):
                left.append((buffer, events))
        self._held = left

    def __len__(self) -> int:
        return len(self._held)


class DeviceBatch:
    """Records in one device buffer (a CuPy uint8 array): record ``i`` is
    ``buffer[offsets[i]:offsets[i] + lengths[i]]``; ``offsets``, ``lengths``, ``file_offsets`` and
    ``file_indices`` are host numpy arrays.

    Frameworks take it without a copy: ``torch.from_dlpack(batch)`` or ``cupy.asarray(batch)``. The
    exported array keeps this batch alive, and the consumer's stream named to ``__dlpack__`` is waited
    for before the memory is read into again (:class:`Quarantine`).
    """

    def __init__(self, buffer: Any, offsets: np.ndarray, lengths: np.ndarray, file_offsets: np.ndarray,
                 file_indices: np.ndarray, paths: Sequence[str], quarantine: Optional[Quarantine] = None):
        self.buffer = buffer
        self.offsets, self.lengths, self.file_offsets = offsets, lengths, file_offsets
        self.file_indices = np.asarray(file_indices, dtype=np.int64)
        self.file_index = int(self.file_indices[0]) if len(self.file_indices) else 0
        self._paths = paths
        self._quarantine = quarantine
        self._streams: List[int] = []

    @property
    def num_records(self) -> int:
        return len(self.offsets)

    def __len__(self) -> int:
        return self.num_records

    @property
    def nbytes(self) -> int:
        return int(self.lengths.sum())

    @property
    def on_gpu(self) -> bool:
        return True

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        return self.buffer.__cuda_array_interface__

    def __dlpack__(self, *, stream: Optional[int] = None, **kwargs: Any) -> Any:
        import cupy

        if stream not in self._streams:
            self._streams.append(stream)
        # A view whose memory names this batch as its owner: the consumer's tensor keeps the batch (and so
        # the buffer) alive, and its end is when the buffer is quarantined.
        memory = cupy.cuda.UnownedMemory(self.buffer.data.ptr, self.buffer.nbytes, self,
                                         device_id=self.buffer.device.id)
        view = cupy.ndarray(self.buffer.shape, self.buffer.dtype, cupy.cuda.MemoryPointer(memory, 0))
        return view.__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self.buffer.__dlpack_device__()

    def __del__(self):
        if self._quarantine is not None and self._streams:
            self._quarantine.hold(self.buffer, self._streams)

    def path(self, i: int) -> Optional[str]:
        return self._paths[int(self.file_indices[i])] if 0 <= i < self.num_records else None

    def slice(self, start: int, stop: int) -> "DeviceBatch":
        return self.take(slice(start, stop))

    def take(self, keep: Any) -> "DeviceBatch":
        """The records ``keep`` selects (a slice, a boolean mask or indices), sharing the buffer."""
        return DeviceBatch(self.buffer, self.offsets[keep], self.lengths[keep], self.file_offsets[keep],
                           self.file_indices[keep], self._paths, self._quarantine)
