"""Shared fixtures: a tiny pure-Python TFRecord/RecordIO oracle and writers of known payloads."""
from __future__ import annotations

import os
import struct

import numpy as np
import pytest

ENGINES = ["buffered", "mmap", "direct"]

# ---- pure-Python oracle, independent of the C++ core --------------------------------------------

_POLY = 0x82F63B78
_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ _POLY if _c & 1 else _c >> 1
    _TABLE.append(_c)


def oracle_crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def oracle_masked(data: bytes) -> int:
    c = oracle_crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def oracle_tfrecord_bytes(records) -> bytes:
    out = bytearray()
    for r in records:
        n = struct.pack("<Q", len(r))
        out += n + struct.pack("<I", oracle_masked(n)) + r + struct.pack("<I", oracle_masked(r))
    return bytes(out)


def oracle_read_tfrecord(blob: bytes) -> list:
    out, pos = [], 0
    while pos < len(blob):
        (n,) = struct.unpack_from("<Q", blob, pos)
        out.append(blob[pos + 12:pos + 12 + n])
        pos += 16 + n
    return out


def oracle_read_recordio(blob: bytes) -> list:
    """MXNet's reader: parts joined with the magic word between them."""
    out, pos, cur = [], 0, None
    while pos < len(blob):
        magic, lrec = struct.unpack_from("<II", blob, pos)
        assert magic == 0xCED7230A
        cflag, n = lrec >> 29, lrec & ((1 << 29) - 1)
        data = blob[pos + 8:pos + 8 + n]
        pos += 8 + n + (-n) % 4
        if cflag == 0:
            out.append(data)
        elif cflag == 1:
            cur = data + struct.pack("<I", 0xCED7230A)
        elif cflag == 2:
            cur += data + struct.pack("<I", 0xCED7230A)
        else:
            out.append(cur + data)
    return out


@pytest.fixture
def payloads():
    """Records of awkward sizes: empty, 1 byte, around 4096, larger than a 64 KiB chunk."""
    rng = np.random.default_rng(7)
    sizes = [0, 1, 3, 4095, 4096, 4097, 12, 16, 200_000, 0, 65_536, 70_001, 5, 1_000_000, 333]
    sizes += rng.integers(0, 20_000, 60).tolist()
    return [rng.bytes(int(n)) for n in sizes]


def write_tfrecord(path, records) -> str:
    with open(path, "wb") as f:
        f.write(oracle_tfrecord_bytes(records))
    return os.fspath(path)
