"""A read plan stays within the process's open-file limit: a global shuffle of small records over many
shards put thousands of files in one 8 MiB chunk, each held open while the chunk was read ("Too many open
files" at the common soft limit of 1024). Chunks now read at most max_chunk_files files, and the files
kept open between chunks follow the soft RLIMIT_NOFILE (dlstore.io.system.open_files_budget)."""
import pytest

from tests.helpers import run_python, write_tfrecord


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    from tests.helpers import direct_refused

    d = tmp_path_factory.mktemp("many")
    if direct_refused(d):
        pytest.skip(f"O_DIRECT engines need a filesystem that takes it: {direct_refused(d)}")
    for k in range(600):
        write_tfrecord(d / f"s{k:03d}.tfrecord", [b"%03d-%d" % (k, i) * 20 for i in range(2)])
    return d


@pytest.mark.parametrize("shuffle", ["global", "buffer"])
def test_a_global_shuffle_of_many_small_shards_under_a_low_file_limit(many_shards, engine, shuffle):
    # engine: conftest's fixture, every engine (io_uring skipped, saying why, where the kernel refuses it)
    code = f"""
import resource, dlstore
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
ds = dlstore.Dataset({str(many_shards)!r}, io={engine!r}, shuffle={shuffle!r}, batch_size=8, seed=3)
keys = sorted(bytes(b)[:5] for batch in ds.batches() for b in [memoryview(batch)[o:o + n]
              for o, n in zip(batch.offsets.tolist(), batch.lengths.tolist())])
print(len(keys), len(set(keys)), ds.stats()["engine"])
"""
    p = run_python(code, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["1200", "1200", engine]
