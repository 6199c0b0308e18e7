"""The O_DIRECT engines read what the page cache already holds from it (the ``direct_cache`` setting,
on by default): the same bytes, counted in ``cache_bytes_read``; what the cache does not hold still
comes from the device. The other tests run with the setting off (tests/conftest.py), so their direct
reads reach the device."""
import os

import numpy as np
import pytest

import dlstore
from dlstore.io.pagecache import evict_files, make_warm, resident_fraction
from tests.helpers import as_nobody, batch_records, write_tfrecord

O_DIRECT_ENGINES = ["direct", "io_uring"]
SHUFFLES = ["none", "block", "global", "buffer"]


@pytest.fixture(autouse=True)
def direct_cache_on(monkeypatch):
    monkeypatch.delenv("DLSTORE_DIRECT_CACHE", raising=False)  # the default: on


@pytest.fixture
def shards(direct_dir):
    rng = np.random.default_rng(3)
    records = [[rng.bytes(int(n)) for n in rng.integers(1, 30_000, 150)] for _ in range(3)]
    paths = [write_tfrecord(direct_dir / f"part-{k}.tfrecord", recs) for k, recs in enumerate(records)]
    return paths, records


def _evicted(paths):
    evict_files(paths)
    left = resident_fraction(paths)
    if left is None or left > 0:
        pytest.skip(f"the files stay in the page cache after posix_fadvise(DONTNEED) here ({left})")


def _dataset_batches(paths, engine, shuffle, **kw):
    ds = dlstore.Dataset(paths, io=engine, shuffle=shuffle, batch_size=32, seed=5, **kw)
    out = [r for b in ds.batches() for r in batch_records(b)]
    return out, ds.stats()


@pytest.mark.parametrize("engine", O_DIRECT_ENGINES, indirect=True)  # conftest: io_uring skips where refused
def test_warm_files_are_read_from_the_cache(shards, engine):
    paths, records = shards
    make_warm(paths)
    assert resident_fraction(paths) == 1.0
    reader = dlstore.open_records(paths, io=engine, chunk_size=64 << 10)
    assert [bytes(r) for r in reader] == [r for recs in records for r in recs]
    stats = reader.stats()
    assert reader.engine == engine and stats["notes"] == []
    assert stats["cache_bytes_read"] == stats["file_bytes_read"] > 0


@pytest.mark.parametrize("engine", O_DIRECT_ENGINES, indirect=True)
@pytest.mark.parametrize("shuffle", SHUFFLES)
def test_dataset_batches_match_buffered_warm_and_cold(shards, engine, shuffle):
    paths, _ = shards
    expected, _ = _dataset_batches(paths, "buffered", shuffle)
    make_warm(paths)
    warm, stats = _dataset_batches(paths, engine, shuffle)
    assert warm == expected
    assert stats["engine"] == engine and stats["cache_bytes_read"] == stats["file_bytes_read"] > 0
    _evicted(paths)
    cold, stats = _dataset_batches(paths, engine, shuffle)
    assert cold == expected
    assert stats["cache_bytes_read"] == 0 < stats["file_bytes_read"]
    assert resident_fraction(paths) == 0  # O_DIRECT left the cache as it found it


@pytest.mark.parametrize("engine", O_DIRECT_ENGINES, indirect=True)
def test_partly_cached_file_mixes_cache_and_device(direct_dir, engine):
    # One file of 8 reads; the cache holds its first half: those reads come from it, the rest from the device.
    records = [os.urandom(4000 + k) for k in range(400)]
    path = write_tfrecord(direct_dir / "half.tfrecord", records)
    _evicted([path])
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead past the half read
        os.pread(fd, size // 2, 0)
    finally:
        os.close(fd)
    assert 0.3 < resident_fraction([path]) < 0.7
    reader = dlstore.open_records(path, io=engine, chunk_size=(size // 8 + 4095) // 4096 * 4096)
    assert [bytes(r) for r in reader] == records
    stats = reader.stats()
    assert 0 < stats["cache_bytes_read"] < stats["file_bytes_read"]


@pytest.mark.parametrize("engine", O_DIRECT_ENGINES, indirect=True)
def test_setting_off_reads_the_device(shards, engine, monkeypatch):
    paths, records = shards
    monkeypatch.setenv("DLSTORE_DIRECT_CACHE", "off")
    make_warm(paths)
    reader = dlstore.open_records(paths, io=engine)
    assert [bytes(r) for r in reader] == [r for recs in records for r in recs]
    assert reader.stats()["cache_bytes_read"] == 0
    _, stats = _dataset_batches(paths, engine, "global")
    assert stats["cache_bytes_read"] == 0 < stats["file_bytes_read"]


def test_buffered_fallback_counts_no_cache_bytes(tmp_path, payloads):
    # Where O_DIRECT is refused (tmpfs), direct reads buffered: through the cache, but not "from the cache
    # instead of the device", so cache_bytes_read stays 0 and the note says why.
    import shutil
    import tempfile

    from tests.helpers import direct_refused

    where = None
    if direct_refused(tmp_path):
        where = str(tmp_path)
    elif os.path.isdir("/dev/shm") and direct_refused("/dev/shm"):
        where = tempfile.mkdtemp(prefix="dlstore-", dir="/dev/shm")
    if where is None:
        pytest.skip(f"neither {tmp_path} nor /dev/shm refuses O_DIRECT: the fallback needs a filesystem that does")
    try:
        path = write_tfrecord(os.path.join(where, "t.tfrecord"), payloads)
        reader = dlstore.open_records(path, io="direct")
        assert [bytes(r) for r in reader] == payloads
        assert reader.stats()["cache_bytes_read"] == 0 and "refuses O_DIRECT" in reader.stats()["notes"][0]
    finally:
        if where != str(tmp_path):
            shutil.rmtree(where, ignore_errors=True)


@pytest.mark.parametrize("engine", O_DIRECT_ENGINES, indirect=True)
def test_file_cut_after_indexing_names_file_and_offset(shards, engine):
    paths, _ = shards
    ds = dlstore.Dataset(paths, io=engine, shuffle="none", batch_size=32)
    make_warm(paths)
    size = os.path.getsize(paths[1])
    os.truncate(paths[1], size // 2)
    with pytest.raises(dlstore.DlstoreError) as e:
        for _ in ds.batches():
            pass
    assert paths[1] in str(e.value)


@pytest.mark.parametrize("how", ["cachestat", "mincore", "auto"])
def test_page_cache_check_agrees_with_residency(direct_dir, how):
    from dlstore import _C

    path = str(direct_dir / "r.bin")
    with open(path, "wb") as f:
        f.write(os.urandom(64 << 10) + b"x" * 1000)  # 17 pages, the last partly used
    if how == "cachestat" and not _C.page_cache_holds(path, 0, 1, how):
        make_warm([path])
        if not _C.page_cache_holds(path, 0, 1, how):
            pytest.skip("this kernel has no cachestat(2) (Linux 6.5+): mincore is used")
    make_warm([path])
    size = os.path.getsize(path)
    assert _C.page_cache_holds(path, 0, size, how)
    assert _C.page_cache_holds(path, 4097, 10_000, how)
    assert not _C.page_cache_holds(path, 0, 0, how)  # nothing to read: never "held"
    assert not _C.page_cache_holds(path, 0, size + (8 << 10), how)  # pages past the end are not
    _evicted([path])
    assert not _C.page_cache_holds(path, 0, size, how)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        os.pread(fd, 4096, 8192)  # the third page alone
    finally:
        os.close(fd)
    assert _C.page_cache_holds(path, 8192, 4096, how) and _C.page_cache_holds(path, 8200, 100, how)
    assert not _C.page_cache_holds(path, 4096, 8192, how) and not _C.page_cache_holds(path, 8192, 4097, how)
    with pytest.raises(ValueError, match="how must be"):
        _C.page_cache_holds(path, 0, 1, "fadvise")


def test_setting_is_parsed_and_documented():
    from dlstore import settings

    assert settings.get("direct_cache") is True
    assert settings.get("direct_cache", "no") is False
    with open(os.path.join(os.path.dirname(dlstore.__file__), "..", "docs", "settings.md")) as f:
        doc = f.read()
    assert "DLSTORE_DIRECT_CACHE" in doc


@pytest.mark.parametrize("engine", O_DIRECT_ENGINES, indirect=True)
def test_file_renamed_over_is_not_read_from_the_cache(direct_dir, engine):
    # The buffered descriptor is opened by path at the first cached read. A file renamed over that path
    # since the reader opened it is another file: its bytes must not stand in for the open one's.
    old = [os.urandom(3000 + k) for k in range(600)]
    path = write_tfrecord(direct_dir / "r.tfrecord", old)
    _evicted([path])
    reader = dlstore.open_records(path, io=engine, chunk_size=64 << 10)
    batches = reader.batches()
    got = batch_records(next(batches))  # the file is open, read O_DIRECT so far (nothing cached)
    keep = os.open(path, os.O_RDONLY)
    try:
        write_tfrecord(direct_dir / "new.tfrecord", [os.urandom(3000 + k) for k in range(600)])
        os.rename(direct_dir / "new.tfrecord", path)
        os.pread(keep, os.fstat(keep).st_size, 0)  # the open file's bytes now sit in the cache
        for batch in batches:
            got += batch_records(batch)
    finally:
        os.close(keep)
    assert got == old
    assert reader.stats()["cache_bytes_read"] == 0


def _probe_as_nobody(path, how):
    """page_cache_holds(path, whole file, how) as the user nobody."""
    from dlstore import _C

    size = os.path.getsize(path)
    answer = as_nobody(path, lambda p: _C.page_cache_holds(p, 0, size, how))
    assert answer in ("False", "True"), f"the child could not probe: {answer}"
    return answer == "True"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root, to become another user")
@pytest.mark.parametrize("how", ["mincore", "auto"])
def test_page_cache_check_of_a_file_the_kernel_does_not_describe(direct_dir, how):
    # For a file a process neither owns nor may write, mincore reports every page resident (cachestat
    # refuses): such a file is "not held" (its reads go to the device), never held because mincore says so.
    path = str(direct_dir / "theirs.bin")
    with open(path, "wb") as f:
        f.write(os.urandom(256 << 10))
    os.chmod(path, 0o644)
    _evicted([path])
    assert not _probe_as_nobody(path, how)  # cold: mincore said held
    make_warm([path])
    assert not _probe_as_nobody(path, how)  # the kernel does not say
    os.chmod(path, 0o666)  # a file it may write: the kernel tells it the truth
    assert _probe_as_nobody(path, how)
    os.chmod(path, 0o644)
    os.chown(path, 65534, 65534)  # its own file: the same
    assert _probe_as_nobody(path, how)
    _evicted([path])
    assert not _probe_as_nobody(path, how)


@pytest.mark.parametrize("engine", O_DIRECT_ENGINES, indirect=True)
@pytest.mark.parametrize("direct_cache", ["1", "0"])
def test_cached_reads_take_no_descriptor_of_their_own(direct_dir, engine, direct_cache):
    # A chunk of a global shuffle holds every file its records lie in open at once: here all 300, as one
    # descriptor each (300 + the interpreter's ~30 within a soft limit of 450). A buffered descriptor kept
    # per file for the cached reads made that 600 ("Too many open files"); one opened per read does not.
    from tests.helpers import run_python

    for k in range(300):
        write_tfrecord(direct_dir / f"s{k:03d}.tfrecord", [bytes([k % 256]) * 200] * 4)
    code = f"""
import resource, dlstore
resource.setrlimit(resource.RLIMIT_NOFILE, (450, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
ds = dlstore.Dataset({str(direct_dir)!r}, io={engine!r}, shuffle="global", batch_size=25, seed=3)
n = sum(b.num_records for b in ds.batches())
s = ds.stats()
print(n, s["cache_bytes_read"] == s["file_bytes_read"] > 0)
"""
    p = run_python(code, timeout=300, DLSTORE_DIRECT_CACHE=direct_cache)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["1200", "True" if direct_cache == "1" else "False"]


def test_open_files_budget_follows_the_soft_limit(monkeypatch):
    import resource

    from dlstore.io.system import open_files_budget

    for soft, files in [(1024, 448), (256, 64), (100, 16), (1 << 20, 1024)]:
        monkeypatch.setattr(resource, "getrlimit", lambda _which, s=soft: (s, 1 << 20))
        assert open_files_budget() == files, soft
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert open_files_budget() == 1024
