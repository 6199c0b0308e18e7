"""Type stub of the C++ extension. The documented API is in dlstore/*.py; this is its backend."""
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

class RecordBatch:
    """Records of one contiguous region (buffer protocol, read-only)."""

    offsets: np.ndarray
    lengths: np.ndarray
    file_offsets: np.ndarray
    file_indices: np.ndarray  # per record: index into the reader's files
    file_index: int
    nbytes: int
    num_records: int
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...
    def path(self, i: int) -> Optional[str]: ...
    def slice(self, start: int, stop: int) -> "RecordBatch": ...

class _EngineFields:
    """What both readers' options share (C++ EngineOptions), under dlstore.ReadOptions' names."""

    engine: str  # a name of engine_names()
    chunk_size: int
    depth: int
    io_threads: int
    read_timeout: float
    queue_depth: int  # io_uring: reads in flight per I/O thread; 0: the device's nr_requests, at most 64
    verify: bool
    on_error: str  # "raise" | "skip"

class ReaderOptions(_EngineFields):
    """Options of the in-order Reader, as dlstore.ReadOptions.core(engine) builds them."""

    headroom: int
    verify_threads: int
    max_records: int
    def __init__(self) -> None: ...

class PlanOptions(_EngineFields):
    """Options of the PlanReader, as dlstore.ReadOptions.core(engine, in_order=False) builds them."""

    max_open_files: int
    def __init__(self) -> None: ...

def engine_names() -> List[str]: ...  # the engine registry, in order
def io_uring_refusal() -> str: ...  # why io_uring cannot run here; "" when it can
def io_uring_queue_depth(path: str, setting: int = 0) -> Tuple[int, str]: ...  # (depth, why)
def page_cache_holds(path: str, offset: int, n: int, how: str = "auto") -> bool: ...  # direct_cache's check
def cached_pages(path: str) -> Optional[Tuple[int, int]]: ...  # (cached, pages) of a file, None: not told
def _simulate_io_uring_refusal(why: str) -> None: ...  # tests: io_uring refused with `why` ("" undoes)

class Reader:
    def __init__(self, paths: List[str], format: str, compression: List[str], options: ReaderOptions,
                 ranges: List[Tuple[int, int]] = ...) -> None: ...
    def next_batch(self) -> Optional[RecordBatch]: ...
    def count_all(self) -> None: ...
    def close(self) -> None: ...  # ends the reads in flight (waited for up to the read timeout, GIL released)
    def stats(self) -> Dict[str, int]: ...
    def notes(self) -> List[str]: ...
    def corruptions(self) -> List[Tuple[str, int, str]]: ...

class PlanReader:
    # Per read position: file (index into paths), frame offset, frame size; emit: read positions in
    # emission order, or None for read order.
    def __init__(self, paths: List[str], file: np.ndarray, offset: np.ndarray, size: np.ndarray,
                 emit: Optional[np.ndarray], format: str, batch_size: int, options: PlanOptions,
                 hold_bytes: int = ..., sequential: bool = ..., first_batch: int = ...,
                 device: Optional[np.ndarray] = ...) -> None: ...  # device per file: threads of its own
    def next_batch(self) -> Optional[RecordBatch]: ...
    def start(self) -> None: ...  # the first reads, without waiting for any (a reader made ahead of its turn)
    def close(self) -> None: ...  # ends the reads in flight (waited for up to the read timeout, GIL released)
    @property
    def position(self) -> int: ...
    def __len__(self) -> int: ...
    def stats(self) -> Dict[str, int]: ...
    def notes(self) -> List[str]: ...
    def corruptions(self) -> List[Tuple[str, int, str]]: ...

class ReadSchedule:
    # The plan reader's logic for an executor written in Python (dlstore/io/gds/reader.py). next() returns
    # ("read", chunk, file, start, end, first, last) (the chunk's pieces), ("wait", chunk), ("spill", chunk,
    # positions), ("release", chunk), ("batch", positions, chunks) or None at the end; it raises the error a
    # record met once the good records before it went out. arrived() answers a "wait".
    def __init__(self, paths: List[str], file: np.ndarray, offset: np.ndarray, size: np.ndarray,
                 emit: Optional[np.ndarray], device: Optional[np.ndarray] = ..., *, chunk_size: int, depth: int,
                 batch_size: int, first_batch: int = ..., hold_bytes: int = ..., on_error: str = ...,
                 max_chunk_files: int = ...) -> None: ...
    def next(self) -> Optional[Tuple[Any, ...]]: ...
    def arrived(self, chunk: int, bytes_read: int, held_bytes: int, bad: np.ndarray, bad_at: np.ndarray,
                bad_what: List[str], failed_from: int = ..., failure: str = ..., failure_path: str = ...,
                failure_offset: int = ...) -> None: ...
    @property
    def position(self) -> int: ...
    @property
    def num_chunks(self) -> int: ...
    def chunk_device(self, chunk: int) -> int: ...
    def __len__(self) -> int: ...
    def stats(self) -> Dict[str, int]: ...
    def corruptions(self) -> List[Tuple[str, int, str]]: ...

def frame_problem(frame: Any, format: str = ..., verify: bool = ...,
                  file_tail: bool = ...) -> Optional[Tuple[str, int]]: ...  # file_tail: the frame ends its file
def crc32c(data: Any, value: int = 0) -> int: ...
def masked_crc32c(data: Any) -> int: ...
def crc32c_is_hardware() -> bool: ...
def parse_example(data: Any) -> Dict[str, Any]: ...
def parse_example_batch(buffer: Any, offsets: np.ndarray, lengths: np.ndarray,
                        spec: List[Tuple[Any, ...]], out: Optional[Dict[str, np.ndarray]] = None, row: int = 0,
                        threads: int = 1) -> Optional[Dict[str, np.ndarray]]: ...
# spec entries: (name, dtype, length[, default bytes]). With `out` (name -> C-contiguous writable array of
# rows of `length` values), record i goes to row `row + i` and None is returned.

# Image decoding (csrc/bindings/image_bindings.cpp); documented in dlstore/pipeline/decode.py.
def jpeg_available() -> Tuple[bool, str]: ...
def image_crop_windows(heights: np.ndarray, widths: np.ndarray, seeds: np.ndarray, train: bool, out_h: int,
                       out_w: int, scale: Tuple[float, float], ratio: Tuple[float, float], flip_probability: float,
                       eval_resize: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]: ...
def example_bytes_spans(buffer: Any, offsets: np.ndarray, lengths: np.ndarray,
                        name: str) -> Tuple[np.ndarray, np.ndarray]: ...

class JpegDecoder:
    threads: int
    def __init__(self, threads: int, dct_method: str, fancy_upsampling: bool, window_decode: bool,
                 dct_scales: int = 0x8B) -> None: ...  # dct_scales: bit M - 1 allows scale M/8
    def decode(self, buffer: Any, offsets: np.ndarray, lengths: np.ndarray, seeds: np.ndarray, out: np.ndarray,
               train: bool, mean: List[float], std: List[float], scale: Tuple[float, float],
               ratio: Tuple[float, float], flip_probability: float,
               eval_resize: int) -> Tuple[np.ndarray, List[Tuple[int, str]]]: ...
