"""What the tests share besides fixtures: a tiny pure-Python TFRecord/RecordIO oracle, independent of
the C++ core, writers of known payloads, and checks of which engine ran. Tests import these from
here; tests/conftest.py holds only fixtures."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from dlstore.io.select import ENGINES as _ENGINES, probe_io_uring

# Every host engine of the C++ registry (buffered, mmap, direct, io_uring): a new engine joins every sweep.
ENGINES = list(_ENGINES)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---- pure-Python oracle, independent of the C++ core --------------------------------------------

_POLY = 0x82F63B78
_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ _POLY if _c & 1 else _c >> 1
    _TABLE.append(_c)


def run_python(code: str, timeout: int = 120, **env: str) -> subprocess.CompletedProcess:
    """``python -c code`` in a fresh process that imports this checkout, with ``env`` added to the
    environment; its output captured as text."""
    full = dict(os.environ, PYTHONPATH=REPO, **env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=timeout)


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


def batch_records(batch) -> list:
    """The records of one RecordBatch (or anything with the buffer protocol, offsets and lengths) as bytes."""
    view = memoryview(batch).cast("B")
    return [bytes(view[o:o + n]) for o, n in zip(batch.offsets.tolist(), batch.lengths.tolist())]


def write_tfrecord(path, records) -> str:
    with open(path, "wb") as f:
        f.write(oracle_tfrecord_bytes(records))
    return os.fspath(path)


def flip_data_byte(path, record: int, offsets) -> int:
    """Damages the payload of ``record`` of a TFRecord file so that its data CRC no longer matches;
    ``offsets``: its frames, from an index made before the damage. Returns the record's frame offset."""
    at = int(offsets[record]) + 12 + 3  # past the 12-byte header, a few bytes into the data
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    return int(offsets[record])


def corrupt_unnoticed(path, records) -> None:
    """Damages the payloads of ``records`` of a TFRecord shard whose index or manifest was made before,
    keeping its size and mtime: the manifest still holds, and only reading the records finds them bad."""
    from dlstore.sources.indexing import ensure_index

    _, frames = ensure_index(os.fspath(path))
    before = os.stat(path)
    for record in records:
        flip_data_byte(path, record, frames)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def records_until_error(source, error, records_of=None):
    """``(records, exception)``: what ``source.batches()`` handed out before raising ``error`` (which it
    must), each batch split by ``records_of`` (default :func:`batch_records`)."""
    import pytest

    got = []
    with pytest.raises(error) as caught:
        for batch in source.batches():
            got += (records_of or batch_records)(batch)
    return got, caught.value


def replicate(src, root, copies: int) -> list:
    """``copies`` copies of directory ``src`` as ``root/mnt0``, ``root/mnt1``, ...: replicated mounts."""
    mounts = [os.path.join(root, f"mnt{m}") for m in range(copies)]
    for d in mounts:
        shutil.copytree(src, d)
    return mounts


# ---- where the direct engine really runs -----------------------------------------------------------

def direct_refused(directory):
    """None when files in ``directory`` can be opened with O_DIRECT (tmpfs and some FUSE mounts refuse),
    else why not."""
    from dlstore.io.select import probe_direct

    probe = os.path.join(os.fspath(directory), f".o_direct-probe-{os.getpid()}")
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
        return probe_direct(probe)
    except OSError as e:
        return f"cannot write a probe file in {directory}: {e.strerror}"
    finally:
        if os.path.exists(probe):
            os.unlink(probe)


def as_nobody(path, call):
    """``repr(call(p))`` where ``p`` names ``path`` (``/proc/self/fd/N`` of a descriptor opened here: test
    directories are private to root), run as the user nobody in a forked child of this root process."""
    fd = os.open(path, os.O_RDONLY)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(w, repr(call(f"/proc/self/fd/{fd}")).encode())
        except BaseException as e:
            os.write(w, b"raised " + repr(e).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.close(fd)
    answer = os.read(r, 4096).decode()
    os.close(r)
    os.waitpid(pid, 0)
    return answer


def check_engine(reader, engine: str) -> None:
    """The engine asked for is the one that ran, with no per-file fallback (call after a pass)."""
    if engine == "io_uring" and probe_io_uring():
        pytest.skip(f"io_uring cannot run here ({probe_io_uring()}): its fallback is tested apart")
    assert reader.engine == engine, reader.engine_reason
    stats = reader.stats()
    assert stats["notes"] == []
    if engine in ("direct", "io_uring"):
        assert stats["cache_bytes_read"] == 0, "an O_DIRECT engine read from the page cache with DLSTORE_DIRECT_CACHE=0"


class SpanBatch:
    """Records laid end to end in one buffer, with the ``buffer``, ``offsets`` and ``lengths`` a
    ``RecordBatch`` has: what the parsers and locators of :mod:`dlstore.formats.example` take."""

    def __init__(self, records):
        self.buffer = b"".join(records)
        self.lengths = np.array([len(r) for r in records], np.uint64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.uint64)


# ---- tf.train.Example: a tiny, strict, pure-Python protobuf decoder -----------------------------

class Bad(Exception):
    pass


def _o_varint(b, pos):
    v = 0
    for i in range(10):
        if pos >= len(b):
            raise Bad("truncated varint")
        c = b[pos]
        pos += 1
        v |= (c & 0x7F) << (7 * i)
        if c < 0x80:
            return v & ((1 << 64) - 1), pos
    raise Bad("varint too long")


def _o_fields(b):
    """(field, wire, value) of one message: value is an int for varints, bytes otherwise."""
    out, pos = [], 0
    while pos < len(b):
        tag, pos = _o_varint(b, pos)
        field, wire = tag >> 3, tag & 7
        if field == 0 or field >= 1 << 29:
            raise Bad("field number")
        if wire == 0:
            v, pos = _o_varint(b, pos)
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            if pos + n > len(b):
                raise Bad("truncated fixed")
            v, pos = b[pos : pos + n], pos + n
        elif wire == 2:
            n, pos = _o_varint(b, pos)
            if n > len(b) - pos:
                raise Bad("length past end")
            v, pos = b[pos : pos + n], pos + n
        else:
            raise Bad("wire type")
        out.append((field, wire, v))
    return out


def _o_expect(wire, *allowed):
    if wire not in allowed:
        raise Bad("wrong wire type")


def _o_list(kind, b):
    vals = []
    for field, wire, v in _o_fields(b):
        if field != 1:
            continue
        if kind == "bytes":
            _o_expect(wire, 2)
            vals.append(bytes(v))
        elif kind == "float":
            _o_expect(wire, 2, 5)
            if len(v) % 4:
                raise Bad("packed float")
            vals.append(bytes(v))
        else:
            _o_expect(wire, 0, 2)
            if wire == 0:
                vals.append(v)
            else:
                pos = 0
                while pos < len(v):
                    x, pos = _o_varint(v, pos)
                    vals.append(x)
    return vals


def oracle_decode(record: bytes) -> dict:
    """name -> (kind or None, values), with protobuf's merge rules; raises Bad."""
    out = {}
    for field, wire, features in _o_fields(record):
        if field != 1:
            continue
        _o_expect(wire, 2)
        for f2, w2, ent in _o_fields(features):
            if f2 != 1:
                continue
            _o_expect(w2, 2)
            key, feats = b"", []
            for f3, w3, v in _o_fields(ent):
                if f3 in (1, 2):
                    _o_expect(w3, 2)
                    if f3 == 1:
                        key = bytes(v)
                    else:
                        feats.append(v)
            kind, vals = None, []
            for feat in feats:
                for f4, w4, lst in _o_fields(feat):
                    if f4 not in (1, 2, 3):
                        continue
                    _o_expect(w4, 2)
                    k = {1: "bytes", 2: "float", 3: "int64"}[f4]
                    if k != kind:
                        kind, vals = k, []
                    vals += _o_list(k, lst)
            try:
                name = key.decode()
            except UnicodeDecodeError:
                raise Bad("utf-8") from None
            out[name] = (kind, vals)
    return out


def oracle_example(record: bytes) -> dict:
    """:func:`oracle_decode` with the values as Python reads them: name -> ('bytes', [bytes]) |
    ('int64', [signed int]) | ('float', [float])."""
    out = {}
    for name, (kind, vals) in oracle_decode(record).items():
        if kind == "float":
            packed = b"".join(vals)
            vals = list(struct.unpack(f"<{len(packed) // 4}f", packed))
        elif kind == "int64":
            vals = [v - (1 << 64) if v >> 63 else v for v in vals]
        out[name] = (kind, vals)
    return out
