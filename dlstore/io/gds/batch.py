"""A batch of records in device memory (:class:`DeviceBatch`): the buffer and the records' host offsets."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np

__all__ = ["DeviceBatch"]


class DeviceBatch:
    """Records of one read, in one buffer: on the GPU (a CuPy array) or, with the host stand-in, numpy.

    Record ``i`` is ``buffer[offsets[i]:offsets[i] + lengths[i]]``. The buffer goes to any framework
    without a copy: ``torch.from_dlpack(batch)`` or ``cupy.asarray(batch)``.
    """

    def __init__(self, buffer: Any, offsets: np.ndarray, lengths: np.ndarray, file_offsets: np.ndarray,
                 file_index: int, paths: Sequence[str], file_indices: Optional[np.ndarray] = None):
        self.buffer = buffer
        self.offsets, self.lengths, self.file_offsets = offsets, lengths, file_offsets
        # A batch of one read has one file; one gathered from several reads has a file per record.
        self.file_indices = (np.full(len(offsets), int(file_index), dtype=np.int64) if file_indices is None
                             else np.asarray(file_indices, dtype=np.int64))
        self.file_index = int(self.file_indices[0]) if len(self.file_indices) else int(file_index)
        self._paths = paths

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
        return hasattr(self.buffer, "__cuda_array_interface__")

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        if not self.on_gpu:
            raise AttributeError("__cuda_array_interface__: this batch's buffer is in host memory")
        return self.buffer.__cuda_array_interface__

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self.buffer.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self.buffer.__dlpack_device__()

    def path(self, i: int) -> Optional[str]:
        return self._paths[int(self.file_indices[i])] if 0 <= i < self.num_records else None

    def slice(self, start: int, stop: int) -> "DeviceBatch":
        return DeviceBatch(self.buffer, self.offsets[start:stop], self.lengths[start:stop],
                           self.file_offsets[start:stop], self.file_index, self._paths, self.file_indices[start:stop])

    def take(self, keep: np.ndarray) -> "DeviceBatch":
        return DeviceBatch(self.buffer, self.offsets[keep], self.lengths[keep], self.file_offsets[keep],
                           self.file_index, self._paths, self.file_indices[keep])
