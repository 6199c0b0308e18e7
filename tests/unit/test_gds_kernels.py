"""The CUDA kernels of io="gds" (dlstore/io/gds/kernels.cu), without a GPU.

- Their text compiled for the host (tests/stand_ins/host_kernels.py), launched as CuPy launches them:
  the block-sliced CRC-32C against the C++ core's at every length and alignment that matters, the slice
  combine checked (and shown to be checked: a source with a wrong combine fails), the frame check's
  statuses, and the gather against numpy.
- The whole text (device functions, kernels, ``__global__`` wrappers) compiled by NVRTC and linked to
  sm_80 and sm_90 SASS by nvJitLink, from the pip wheels, as CI runs it.
"""
from __future__ import annotations

import ctypes
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlstore import _C
from dlstore.io import cuda
from dlstore.bench.gpu_check import crc_bench_inputs
from dlstore.io.gds import kernels
from tests.stand_ins import host_kernels

SOURCE = kernels.cuda_source()
MASK = 0xFFFFFFFF


@pytest.fixture(scope="module")
def lib():
    try:
        library = host_kernels.host_library()
    except host_kernels.HostCompilerMissing as e:
        pytest.skip(str(e))
    library.dlstore_crc32c_host.restype = ctypes.c_uint32
    library.dlstore_crc32c_host.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int]
    library.dlstore_crc_shift_host.restype = ctypes.c_uint32
    library.dlstore_crc_shift_host.argtypes = [ctypes.c_uint32, ctypes.c_int]
    return library


def aligned_bytes(n: int, seed: int = 0) -> np.ndarray:
    """n random bytes starting on a 4096-byte boundary, so that offsets into it are the alignments tested."""
    raw = np.frombuffer(np.random.default_rng(seed).bytes(n + 4096), dtype=np.uint8).copy()
    start = (-raw.ctypes.data) % 4096
    return raw[start:start + n]


def device_crc(lib, buf: np.ndarray, offset: int, n: int, threads: int) -> int:
    return lib.dlstore_crc32c_host(buf.ctypes.data + offset, n, threads)


# --- the power table and the shift the combine uses -----------------------------------------------

def x8_pow2_from_the_normal_polynomial(k: int) -> int:
    """x^(8 * 2^k) mod P computed in the normal bit order (bit i is x^i), then reflected: an independent
    derivation of the table kernels.cu writes in reflected order."""
    poly = (1 << 32) | 0x1EDC6F41

    def mulmod(a, b):
        product = 0
        while b:
            if b & 1:
                product ^= a
            b >>= 1
            a <<= 1
            if a >> 32:
                a ^= poly
        return product

    result = 1 << 8  # x^8; then k squarings make it x^(8 * 2^k)
    for _ in range(k):
        result = mulmod(result, result)
    return int(f"{result:032b}"[::-1], 2)


def source_table(source: str) -> list:
    body = re.search(r"dlstore_x8_pow2\[64\] = \{([^}]*)\}", source).group(1)
    return [int(v.rstrip("u"), 16) for v in re.findall(r"0x[0-9A-Fa-f]+u", body)]


def test_the_power_table_is_x_to_the_8_times_2_to_the_k():
    table = source_table(SOURCE)
    assert len(table) == 64
    assert table == [x8_pow2_from_the_normal_polynomial(k) for k in range(64)]


def register_after_zeros(c: int, n: int) -> int:
    """The CRC register c followed by n zero bytes, through the C++ core (which works on finished CRCs)."""
    return ~_C.crc32c(bytes(n), ~c & MASK) & MASK


@pytest.mark.parametrize("k", range(0, 21))
def test_the_shift_is_feeding_2_to_the_k_zero_bytes(lib, k):
    for c in (0x80000000, 0xFFFFFFFF, 0x12345678, 1):
        assert lib.dlstore_crc_shift_host(c, k) == register_after_zeros(c, 1 << k)
    # ...and not 2^k - 1 or 2^k + 1 of them: an off-by-one in the length would be seen.
    assert lib.dlstore_crc_shift_host(0x12345678, k) != register_after_zeros(0x12345678, (1 << k) + 1)
    assert lib.dlstore_crc_shift_host(0x12345678, k) != register_after_zeros(0x12345678, (1 << k) - 1)


# --- the block-sliced CRC-32C against the C++ core -------------------------------------------------

THREADS = (1, 2, 3, 32, 255, 256)


def test_every_length_to_300_at_every_alignment(lib):
    """Lengths 0..300 at offsets 0..15 and 4096..4111: every split of the data into an unaligned head,
    aligned 16-byte words and a tail under 16 bytes, with 0 to 5 slices."""
    buf = aligned_bytes(8192, seed=1)
    for offset in list(range(16)) + list(range(4096, 4112)):
        for n in range(301):
            want = _C.crc32c(buf[offset:offset + n])
            for threads in THREADS:
                assert device_crc(lib, buf, offset, n, threads) == want, (offset, n, threads)


@pytest.mark.parametrize("n", [4095, 4096, 4097, 65535, 65536, 65537, 110_000, 1 << 20, (3 << 20) + 5])
def test_large_lengths_at_unaligned_offsets(lib, n):
    buf = aligned_bytes(n + 4112, seed=n)
    for offset in (0, 1, 3, 8, 15, 4096, 4101):
        want = _C.crc32c(buf[offset:offset + n])
        for threads in THREADS:
            assert device_crc(lib, buf, offset, n, threads) == want, (offset, threads)


def test_every_slice_count_from_1_to_256(lib):
    """One length cut into every number of slices a block can use (1 thread to 256), so every level and
    every partner pattern of the combine tree runs, the partial first slice included."""
    n = 256 * 64 + 7
    buf = aligned_bytes(n + 16, seed=5)
    for offset in (0, 5):
        want = _C.crc32c(buf[offset:offset + n])
        for threads in range(1, 257):
            assert device_crc(lib, buf, offset, n, threads) == want, (offset, threads)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 300_000), offset=st.integers(0, 4200), threads=st.integers(1, 256),
       seed=st.integers(0, 2**32 - 1))
def test_random_lengths_offsets_and_block_sizes(lib, n, offset, threads, seed):
    buf = aligned_bytes(n + offset, seed=seed)
    assert device_crc(lib, buf, offset, n, threads) == _C.crc32c(buf[offset:offset + n])


def with_table(source: str, table: list) -> str:
    body = ",\n".join(", ".join(f"0x{v:08X}u" for v in table[i:i + 8]) for i in range(0, 64, 8))
    mutated, count = re.subn(r"(dlstore_x8_pow2\[64\] = \{)[^}]*(\})", lambda m: f"{m.group(1)}\n{body},\n{m.group(2)}",
                             source)
    assert count == 1
    return mutated


@pytest.mark.parametrize("wrong", ["twice the length", "one byte more"])
def test_a_wrong_combine_is_caught(lib, wrong):
    """kernels.cu with the combine's shift by the wrong length (2^(k+1) bytes, or 2^k + 1) computes
    wrong CRCs wherever a record has more than one slice, and right ones where it has one: the tests
    above would fail on such a combine."""
    table = source_table(SOURCE)
    if wrong == "twice the length":
        bad = table[1:] + table[:1]
    else:
        bad = [((~_C.crc32c(bytes(1), ~v & MASK)) & MASK) for v in table]  # x^8 more: one more zero byte
    try:
        mutant = host_kernels.build_host_library(with_table(SOURCE, bad))
    except host_kernels.HostCompilerMissing as e:
        pytest.skip(str(e))
    mutant.dlstore_crc32c_host.restype = ctypes.c_uint32
    mutant.dlstore_crc32c_host.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int]
    buf = aligned_bytes(200_000, seed=9)
    for n in (100, 1000, 110_000, 199_000):
        want = _C.crc32c(buf[3:3 + n])
        assert device_crc(mutant, buf, 3, n, 256) != want  # several slices: combined
        assert device_crc(mutant, buf, 3, n, 1) == want     # one slice: nothing combined
        assert device_crc(lib, buf, 3, n, 256) == want


# --- the frame check ------------------------------------------------------------------------------

def frame(data: bytes) -> bytes:
    length = len(data).to_bytes(8, "little")
    return (length + _C.masked_crc32c(length).to_bytes(4, "little") + data +
            _C.masked_crc32c(data).to_bytes(4, "little"))


def oracle_status(blob: bytes, rel: int, size: int, verify: bool) -> int:
    if size < 16:
        return kernels.FRAME_LENGTH
    length = int.from_bytes(blob[rel:rel + 8], "little")
    if length != size - 16:
        return kernels.FRAME_LENGTH
    if not verify:
        return kernels.FRAME_OK
    if _C.masked_crc32c(blob[rel:rel + 8]) != int.from_bytes(blob[rel + 8:rel + 12], "little"):
        return kernels.FRAME_LENGTH_CRC
    data_crc = int.from_bytes(blob[rel + 12 + length:rel + 16 + length], "little")
    if _C.masked_crc32c(blob[rel + 12:rel + 12 + length]) != data_crc:
        return kernels.FRAME_DATA_CRC
    return kernels.FRAME_OK


def damaged_frames(offset: int):
    """A read holding good and damaged frames, ``offset`` bytes in: (blob, rel, size, statuses with CRCs)."""
    rng = np.random.default_rng(offset)
    records = [b"", b"a", b"x" * 15, rng.bytes(4096), rng.bytes(110_000), rng.bytes(110_000), rng.bytes(110_000),
               rng.bytes(110_000), rng.bytes(70_001), rng.bytes(3000), rng.bytes(50), rng.bytes(33)]
    frames = [frame(r) for r in records]
    size = np.array([len(f) for f in frames], dtype=np.int64)
    rel = (offset + np.concatenate([[0], np.cumsum(size)[:-1]])).astype(np.int64)
    blob = bytearray(bytes(offset) + b"".join(frames))
    want = [kernels.FRAME_OK] * len(records)
    blob[rel[5] + 12] ^= 0x01                      # the first data byte
    blob[rel[6] + 12 + 110_000 - 1] ^= 0x80       # the last
    blob[rel[7] + 12 + 55_000] ^= 0x10            # one in the middle
    blob[rel[8] + 9] ^= 0x04                       # the length's CRC
    blob[rel[9] + 16 + 3000 - 1] ^= 0x01          # the stored data CRC
    size[10] += 1                                   # the index disagrees with the length
    want[5:11] = [kernels.FRAME_DATA_CRC] * 3 + [kernels.FRAME_LENGTH_CRC, kernels.FRAME_DATA_CRC,
                                                  kernels.FRAME_LENGTH]
    # Under 16 bytes at the very end of the read: the kernel must not read it (nothing past it exists).
    rel = np.append(rel, len(blob) - 5)
    size = np.append(size, 5)
    want.append(kernels.FRAME_LENGTH)
    return bytes(blob), rel, size, want


class HostHeld:
    """A fake CuPy device array: the numpy array under ``_host`` is its memory."""

    def __init__(self, array):
        self._host = array


@pytest.mark.parametrize("offset", [0, 1, 7, 12, 15, 4096])
def test_frame_statuses_match_the_oracle(lib, offset):
    blob, rel, size, want = damaged_frames(offset)
    frames = host_kernels.host_kernel(kernels.FRAMES_KERNEL_NAME)
    buf = aligned_bytes(len(blob))
    buf[:] = np.frombuffer(blob, dtype=np.uint8)
    n = len(rel)
    for verify in (True, False):
        expected = [oracle_status(blob, r, s, verify) for r, s in zip(rel.tolist(), size.tolist())]
        assert expected == (want if verify else [0 if w != kernels.FRAME_LENGTH else w for w in want])
        for grid, block, _ in [kernels.frames_launch(n), ((1,), (1,), 0), ((3,), (32,), 0), ((n + 5,), (256,), 0)]:
            status = np.full(n, 0xEE, dtype=np.uint8)
            frames(grid, block, (HostHeld(buf), rel, size, np.int32(n), np.int32(int(verify)), HostHeld(status)),
                   shared_mem=0)
            assert status.tolist() == expected, (grid, block, verify)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 20_000), min_size=1, max_size=12), offset=st.integers(0, 31),
       damage=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 2**31)), max_size=4),
       threads=st.sampled_from([1, 7, 32, 100, 256]), grid=st.integers(1, 13), seed=st.integers(0, 2**32 - 1))
def test_random_frames_with_random_damage(lib, lengths, offset, damage, threads, grid, seed):
    rng = np.random.default_rng(seed)
    frames_bytes = [frame(rng.bytes(n)) for n in lengths]
    size = np.array([len(f) for f in frames_bytes], dtype=np.int64)
    rel = (offset + np.concatenate([[0], np.cumsum(size)[:-1]])).astype(np.int64)
    blob = bytearray(bytes(offset) + b"".join(frames_bytes))
    for record, where in damage:  # a flipped bit anywhere in a frame: length, its CRC, data or data CRC
        if record < len(lengths):
            blob[rel[record] + where % size[record]] ^= 1 << (where % 8)
    blob = bytes(blob)
    buf = np.frombuffer(blob, dtype=np.uint8).copy()
    status = np.full(len(rel), 0xEE, dtype=np.uint8)
    host_kernels.host_kernel(kernels.FRAMES_KERNEL_NAME)(
        grid, threads, (buf, rel, size, np.int32(len(rel)), np.int32(1), status))
    assert status.tolist() == [oracle_status(blob, r, n, True) for r, n in zip(rel.tolist(), size.tolist())]


def test_the_bench_input_checks_ok_and_fills_the_read(lib):
    buf, rel, size = crc_bench_inputs(1 << 20, 110_000)
    assert len(buf) == 1 << 20 and rel.dtype == size.dtype == np.int64
    assert size.tolist() == [110_000] * 9 + [(1 << 20) - 990_000] and rel[-1] + size[-1] == 1 << 20
    status = np.full(len(rel), 0xEE, dtype=np.uint8)
    grid, block, shared = kernels.frames_launch(len(rel))
    host_kernels.host_kernel(kernels.FRAMES_KERNEL_NAME)(grid, block, (buf, rel, size, np.int32(len(rel)),
                                                                       np.int32(1), status), shared_mem=shared)
    assert status.tolist() == [kernels.FRAME_OK] * len(rel)
    _, rel, size = crc_bench_inputs(8 << 20, 110_000)
    assert len(rel) == 77 and size[:-1].tolist() == [110_000] * 76
    with pytest.raises(ValueError, match="at least 16"):
        crc_bench_inputs(1 << 20, 15)


def test_launch_configurations():
    assert kernels.frames_launch(76) == ((76,), (256,), 0)
    assert kernels.frames_launch(0) == ((1,), (256,), 0)
    assert kernels.frames_launch(10**6)[0][0] <= 4096
    assert kernels.gather_launch(5) == ((5,), (256,), 0)
    assert kernels.gather_launch(10**7)[0][0] <= 65535
    assert re.search(r"#define DLSTORE_FRAME_THREADS (\d+)", SOURCE).group(1) == str(kernels.FRAME_THREADS)
    for code in ("OK", "LENGTH", "LENGTH_CRC", "DATA_CRC"):
        value = re.search(rf"#define DLSTORE_FRAME_{code} (\d+)", SOURCE).group(1)
        assert int(value) == getattr(kernels, f"FRAME_{code}")


def test_the_kernels_and_their_host_twins_take_the_documented_arguments():
    params = host_kernels.kernel_parameters(SOURCE)
    assert params == {
        "dlstore_tfrecord_frames": [("dlstore_u8*", "buf"), ("dlstore_i64*", "rel"), ("dlstore_i64*", "size"),
                                    ("int", "n"), ("int", "verify"), ("dlstore_u8*", "status")],
        "dlstore_gather": [("dlstore_u64*", "sources"), ("dlstore_i64*", "src_buf"), ("dlstore_i64*", "src_at"),
                           ("dlstore_i64*", "len"), ("dlstore_i64*", "dst_at"), ("dlstore_i64", "n"),
                           ("dlstore_u8*", "dst")]}
    for name, kernel in params.items():
        twin = re.search(rf'extern "C" void {name}_host\(int grid, int block, ([^)]*)\)', SOURCE).group(1)
        assert [p.split()[-1] for p in twin.split(",")] == [p for _, p in kernel]


def test_arguments_are_checked_as_the_gpu_would_read_them(lib):
    frames = host_kernels.host_kernel(kernels.FRAMES_KERNEL_NAME)
    blob = frame(b"hello")
    buf = np.frombuffer(blob, dtype=np.uint8).copy()
    rel, size = np.zeros(1, dtype=np.int64), np.array([len(blob)], dtype=np.int64)

    class Interface:  # only __array_interface__, as a foreign host buffer
        def __init__(self, a):
            self.__array_interface__ = a.__array_interface__

    class Host:
        def __init__(self, a):
            self.host = a

    status = np.full(1, 0xEE, dtype=np.uint8)
    frames((1,), (256,), (Interface(buf), Host(rel), size, 1, np.int64(1), status))  # ints as CuPy passes them
    assert status.tolist() == [kernels.FRAME_OK]
    with pytest.raises(TypeError, match="n is int .*np.int32"):
        frames(1, 256, (buf, rel, size, np.int16(1), np.int32(1), status))
    with pytest.raises(TypeError, match="not a device array"):
        frames(1, 256, (blob, rel, size, np.int32(1), np.int32(1), status))
    with pytest.raises(OverflowError, match="cannot hold"):
        frames(1, 256, (buf, rel, size, 1 << 40, np.int32(1), status))
    with pytest.raises(ValueError, match="__launch_bounds__"):
        frames(1, 512, (buf, rel, size, np.int32(1), np.int32(1), status))
    with pytest.raises(TypeError, match="takes 6 arguments"):
        frames(1, 256, (buf, rel, size, np.int32(1), status))
    with pytest.raises(AttributeError, match="no kernel 'dlstore_nothing'"):
        host_kernels.host_kernel("dlstore_nothing")


# --- the gather ----------------------------------------------------------------------------------

@pytest.mark.parametrize("launch", ["gather_launch", "one block", "odd"])
def test_gather_matches_numpy_at_every_relative_alignment(lib, launch):
    rng = np.random.default_rng(8)
    parents = [aligned_bytes(n, seed=i) for i, n in enumerate((300_000, 4096 * 3 + 5, 7, 70_000))]
    sources = [parents[0], parents[1][3:], parents[2], parents[3][4096 + 9:]]  # buffers at odd addresses too
    n = 200
    src_buf = rng.integers(0, len(sources), n).astype(np.int64)
    length = np.array([rng.integers(0, min(5000, len(sources[b])) + 1) for b in src_buf], dtype=np.int64)
    src_buf[:4], length[:4] = [0, 3, 2, 1], [120_000, 60_000, 7, 4096 * 3]  # large, whole, across pages
    length[10] = 0
    src_at = np.array([rng.integers(0, len(sources[b]) - k + 1) for b, k in zip(src_buf, length)], dtype=np.int64)
    src_at[20:36] = np.arange(16)  # every source alignment against the packed destination's
    src_buf[20:36], length[20:36] = 0, 1000 + np.arange(16)
    dst_at = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64) + 5
    want = b"".join(sources[b][a:a + k].tobytes() for b, a, k in zip(src_buf.tolist(), src_at.tolist(),
                                                                     length.tolist()))
    dst = aligned_bytes(len(want) + 16, seed=77)
    before = dst.copy()
    pointers = np.array([s.ctypes.data for s in sources], dtype=np.uint64)
    grid, block, shared = {"gather_launch": kernels.gather_launch(n), "one block": ((1,), (1,), 0),
                           "odd": ((7,), (33,), 0)}[launch]
    host_kernels.host_kernel(kernels.GATHER_KERNEL_NAME)(
        grid, block, (HostHeld(pointers), src_buf, src_at, length, dst_at, np.int64(n), HostHeld(dst)),
        shared_mem=shared)
    assert dst[5:5 + len(want)].tobytes() == want
    # Nothing written outside the records.
    end = 5 + len(want)
    assert dst[:5].tobytes() == before[:5].tobytes() and dst[end:].tobytes() == before[end:].tobytes()


def test_gather_of_short_records_at_every_pair_of_alignments(lib):
    """Records of 0 to 40 bytes (and 100) from every source alignment to every destination alignment:
    the byte-by-byte edges, words or none, and the assembled words meet exactly."""
    gather = host_kernels.host_kernel(kernels.GATHER_KERNEL_NAME)
    src = aligned_bytes(256, seed=3)
    pointers = np.array([src.ctypes.data], dtype=np.uint64)
    one = np.zeros(1, dtype=np.int64)
    for n in list(range(41)) + [100]:
        for src_at in range(16):
            for dst_at in range(16):
                for threads in (1, 33):
                    dst = np.zeros(160, dtype=np.uint8)
                    gather(1, threads, (pointers, one, np.array([src_at]), np.array([n]), np.array([dst_at]),
                                        np.int64(1), dst))
                    want = np.zeros(160, dtype=np.uint8)
                    want[dst_at:dst_at + n] = src[src_at:src_at + n]
                    assert dst.tobytes() == want.tobytes(), (n, src_at, dst_at, threads)


def reads_and_writes_stay_inside_the_records():
    """Run by the test below in a child process with AddressSanitizer preloaded: both kernels, built with
    it, over buffers allocated at their exact size; a byte read or written outside one stops the child."""
    gather = host_kernels.host_kernel(kernels.GATHER_KERNEL_NAME, SOURCE, sanitize=True)
    frames = host_kernels.host_kernel(kernels.FRAMES_KERNEL_NAME, SOURCE, sanitize=True)
    rng = np.random.default_rng(0)
    one = np.zeros(1, dtype=np.int64)
    for n in list(range(0, 70)) + [100, 1000, 4097]:
        for src_at in range(16):
            src = np.empty(src_at + n, dtype=np.uint8)  # the record ends its allocation
            src[:] = np.frombuffer(rng.bytes(len(src)), dtype=np.uint8)
            pointers = np.array([src.ctypes.data], dtype=np.uint64)
            for dst_at in range(0, 16, 5):
                dst = np.empty(dst_at + n, dtype=np.uint8)
                gather(1, 33, (pointers, one, np.array([src_at]), np.array([n]), np.array([dst_at]), np.int64(1), dst))
                assert dst[dst_at:].tobytes() == src[src_at:].tobytes()
    for n in list(range(0, 40)) + [100, 1000, 110_000]:
        for at in range(0, 16, 3):
            record = frame(rng.bytes(n))
            blob = np.empty(at + len(record) + 5, dtype=np.uint8)  # the frame, then 5 bytes too short to read
            blob[at:at + len(record)] = np.frombuffer(record, dtype=np.uint8)
            rel, size = np.array([at, at + len(record)]), np.array([len(record), 5])
            status = np.empty(2, dtype=np.uint8)
            frames(1, 256, (blob[at:], rel - at, size, np.int32(2), np.int32(1), status))
            assert status.tolist() == [kernels.FRAME_OK, kernels.FRAME_LENGTH]
    print("inside")


def test_no_kernel_reads_or_writes_outside_its_records():
    """What compute-sanitizer's memcheck checks on a GPU, on the host: the kernels under AddressSanitizer."""
    runtime = host_kernels.asan_runtime()
    if runtime is None:
        pytest.skip("no AddressSanitizer runtime (libasan) for g++")
    env = dict(os.environ, LD_PRELOAD=runtime, ASAN_OPTIONS="detect_leaks=0")
    child = subprocess.run([sys.executable, "-c", "from tests.unit.test_gds_kernels import "
                            "reads_and_writes_stay_inside_the_records as check; check()"],
                           cwd=str(pathlib.Path(__file__).resolve().parents[2]), env=env, capture_output=True,
                           text=True)
    assert child.returncode == 0 and child.stdout.strip() == "inside", (child.returncode, child.stderr[-3000:])


# --- the whole source through NVRTC and nvJitLink ------------------------------------------------

class Nvrtc:
    """NVRTC and nvJitLink from the pip wheels (nvidia-cuda-nvrtc, nvidia-nvjitlink), through ctypes."""

    def __init__(self):
        paths = cuda.find_library_file("nvrtc"), cuda.find_library_file("nvJitLink")
        if None in paths:
            pytest.skip("the nvidia-cuda-nvrtc and nvidia-nvjitlink wheels are not installed "
                        "(pip install -e '.[test]')")
        self.nvrtc, self.link = ctypes.CDLL(paths[0]), ctypes.CDLL(paths[1])
        major = re.search(r"\.so\.(\d+)", paths[1]).group(1)
        self.suffix = f"_{major}_0"  # nvJitLink's entry points carry the version they appeared in

    def _jit(self, name):
        return getattr(self.link, f"__nvJitLink{name}{self.suffix}")

    def ptx(self, source: str, arch: str):
        prog = ctypes.c_void_p()
        assert self.nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernels.cu", 0, None, None) == 0
        try:
            options = [f"-arch={arch}".encode(), b"-std=c++17"]
            result = self.nvrtc.nvrtcCompileProgram(prog, len(options), (ctypes.c_char_p * len(options))(*options))
            size = ctypes.c_size_t()
            self.nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            self.nvrtc.nvrtcGetProgramLog(prog, log)
            assert result == 0, f"NVRTC ({arch}) failed:\n{log.value.decode()}"
            self.nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
            ptx = ctypes.create_string_buffer(size.value)
            assert self.nvrtc.nvrtcGetPTX(prog, ptx) == 0
            return ptx.raw, log.value.decode().strip()
        finally:
            self.nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))

    def cubin(self, ptx: bytes, arch: str):
        handle = ctypes.c_void_p()
        options = [f"-arch={arch}".encode(), b"-Xptxas=-v"]
        assert self._jit("Create")(ctypes.byref(handle), len(options), (ctypes.c_char_p * len(options))(*options)) == 0
        try:
            assert self._jit("AddData")(handle, 2, ptx, len(ptx), b"kernels.ptx") == 0  # 2: NVJITLINK_INPUT_PTX
            result = self._jit("Complete")(handle)
            logs = {}
            for kind in ("Error", "Info"):
                size = ctypes.c_size_t()
                self._jit(f"Get{kind}LogSize")(handle, ctypes.byref(size))
                text = ctypes.create_string_buffer(size.value + 1)
                self._jit(f"Get{kind}Log")(handle, text)
                logs[kind] = text.value.decode()
            assert result == 0, f"nvJitLink ({arch}) failed:\n{logs['Error']}"
            size = ctypes.c_size_t()
            assert self._jit("GetLinkedCubinSize")(handle, ctypes.byref(size)) == 0
            cubin = ctypes.create_string_buffer(size.value)
            assert self._jit("GetLinkedCubin")(handle, cubin) == 0
            return cubin.raw, logs["Info"]
        finally:
            self._jit("Destroy")(ctypes.byref(handle))


def kernel_resources(info: str) -> dict:
    """ptxas -v's lines per kernel: registers, shared memory bytes, stack and spill bytes."""
    out = {}
    for name, body in re.findall(r"Function properties for (\w+)\n(.*?)(?=Compiling entry|\Z)", info, re.S):
        smem = re.search(r"(\d+) bytes smem", body)
        out[name] = {"registers": int(re.search(r"Used (\d+) registers", body).group(1)),
                     "shared_bytes": int(smem.group(1)) if smem else 0,
                     "stack_bytes": int(re.search(r"(\d+) bytes stack frame", body).group(1)),
                     "spill_bytes": sum(map(int, re.findall(r"(\d+) bytes spill", body)))}
    return out


@pytest.mark.parametrize("sm", [80, 90])
def test_nvrtc_and_nvjitlink_build_the_whole_source_for(sm):
    """NVRTC compiles kernels.cu for compute_XX (PTX) and nvJitLink links it to sm_XX SASS, as CuPy's
    RawModule does on a GPU; neither says a word of warning, nothing spills, and the frame check keeps
    its 9 KB of static shared memory and under 64 registers (4 blocks of 256 threads fit an SM's
    register file)."""
    tools = Nvrtc()
    ptx, log = tools.ptx(SOURCE, f"compute_{sm}")
    assert log == ""
    assert b".entry dlstore_tfrecord_frames" in ptx and b".entry dlstore_gather" in ptx
    cubin, info = tools.cubin(ptx, f"sm_{sm}")
    assert cubin[:4] == b"\x7fELF"
    resources = kernel_resources(info)
    print(f"sm_{sm}: {resources}")
    assert set(resources) == {"dlstore_tfrecord_frames", "dlstore_gather"}
    assert all(r["spill_bytes"] == 0 and r["stack_bytes"] == 0 for r in resources.values()), resources
    frames = resources["dlstore_tfrecord_frames"]
    assert frames["shared_bytes"] == (8 * 256 + kernels.FRAME_THREADS) * 4 and frames["registers"] <= 64
