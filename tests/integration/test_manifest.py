"""Dataset manifests on real files: built once (one process under a lock), used by every later Dataset,
checked against the shards, rebuilt naming the shard that changed; `dlstore index` and read-only data."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import dlstore
from dlstore.sources import indexing
from dlstore.sources.dataset import Dataset
from dlstore.placement.world import World
from tests.helpers import batch_records, write_tfrecord


def _write(root, shards=5, records=12, tag=""):
    os.makedirs(root, exist_ok=True)
    data = {}
    for s in range(shards):
        recs = [f"{tag}s{s}r{i}|".encode() * (1 + (i * 7 + s) % 50) for i in range(records)]
        with dlstore.TFRecordWriter(os.path.join(root, f"train-{s:03d}")) as w:
            for r in recs:
                w.write(r)
        data[f"train-{s:03d}"] = recs
    return data


def _read_all(ds):
    out = []
    for batch in ds.batches():
        out += batch_records(batch)
    return out


def test_one_manifest_no_per_file_indexes_and_the_data_read_back(tmp_path):
    data = _write(tmp_path / "d")
    ds = Dataset(str(tmp_path / "d" / "train-*"), shuffle="global", batch_size=4, remainder="uneven")
    assert set(os.listdir(tmp_path / "d")) == set(data) | {".dlstore-manifest", ".dlstore-manifest.lock"}
    assert ds.index.manifests == [str(tmp_path / "d" / ".dlstore-manifest")] and "indexed 5 shards" in ds.index.notes[0]
    assert sorted(_read_all(ds)) == sorted(r for recs in data.values() for r in recs)
    again = Dataset(str(tmp_path / "d" / "train-*"), shuffle="global", batch_size=4, remainder="uneven")
    assert again.index.notes == [] and again.counts.tolist() == [12] * 5


def test_a_subset_then_the_rest_of_a_directory(tmp_path):
    _write(tmp_path / "d", shards=4)
    Dataset(str(tmp_path / "d" / "train-00[01]"))
    ds = Dataset(str(tmp_path / "d"))  # two more shards: added to the manifest, the first two kept
    assert "train-002 is not in it (added)" in ds.index.notes[0]
    _, m, _ = indexing.read_manifest(str(tmp_path / "d"))
    assert m.names == [f"train-{s:03d}" for s in range(4)]


def test_one_file_named_is_read_by_its_format_whatever_the_manifest_of_its_directory_holds(tmp_path):
    # A manifest holds one format. One written when the directory held RecordIO only, then a TFRecord file
    # beside it named alone: that file is read (it was refused as the directory's shards mixing formats),
    # and the RecordIO one again after it; the mixed refusal is for shards named together that mix.
    d = tmp_path / "d"
    d.mkdir()
    rec = os.fspath(d / "b.rec")
    with dlstore.RecordIOWriter(rec) as w:
        for i in range(5):
            w.write(b"rec%d" % i)
    Dataset(os.fspath(d))
    assert indexing.read_manifest(os.fspath(d))[1].format == "recordio"
    tf = write_tfrecord(os.fspath(d / "a.tfrecord"), [b"tf%d" % i for i in range(4)])
    assert sorted(_read_all(Dataset(tf, batch_size=2, remainder="uneven"))) == [b"tf%d" % i for i in range(4)]
    assert sorted(_read_all(Dataset(rec, batch_size=2, remainder="uneven"))) == [b"rec%d" % i for i in range(5)]
    said = f"recordio in 1 file ({rec}) and tfrecord in 1 file ({tf})"
    for both in ([rec, tf], os.fspath(d)):
        with pytest.raises(dlstore.DlstoreError) as e:
            Dataset(both)
        assert str(e.value) == f"the shards mix formats, {said}; read each format apart" and e.value.path == rec


@pytest.mark.parametrize("change", ["rewritten", "added", "removed"])
def test_a_manifest_that_no_longer_matches_is_rebuilt_naming_the_shard(tmp_path, change):
    _write(tmp_path / "d")
    Dataset(str(tmp_path / "d" / "train-*"))
    if change == "rewritten":  # same name, other records (and another size)
        time.sleep(0.01)
        new = _write(tmp_path / "new", shards=3, records=3, tag="X")["train-002"]
        os.replace(tmp_path / "new" / "train-002", tmp_path / "d" / "train-002")
        name = "train-002"
    elif change == "added":
        new = _write(tmp_path / "new", shards=6, records=2, tag="Y")["train-005"]
        os.replace(tmp_path / "new" / "train-005", tmp_path / "d" / "train-005")
        name = "train-005"
    else:
        os.remove(tmp_path / "d" / "train-001")
        name, new = "train-001", []
    if change == "added":  # a shard new to the manifest is added to it, with a note but no warning
        ds = Dataset(str(tmp_path / "d" / "train-*"), batch_size=3, remainder="uneven")
        assert f"shard {name} is not in it (added)" in ds.index.notes[0]
    else:
        with pytest.warns(UserWarning, match=f"no longer matches its shards: shard {name} was {change}"):
            ds = Dataset(str(tmp_path / "d" / "train-*"), batch_size=3, remainder="uneven")
    got = _read_all(ds)
    assert all(r in got for r in new) and len(got) == int(ds.counts.sum())
    _, m, _ = indexing.read_manifest(str(tmp_path / "d"))
    assert (name in m.names) == (change != "removed")
    assert Dataset(str(tmp_path / "d" / "train-*")).index.notes == []  # up to date now


def test_a_damaged_manifest_is_rebuilt(tmp_path):
    _write(tmp_path / "d")
    Dataset(str(tmp_path / "d"))
    with open(tmp_path / "d" / ".dlstore-manifest", "r+b") as f:
        f.truncate(100)
    ds = Dataset(str(tmp_path / "d"))
    assert "was refused" in ds.index.notes[0] and int(ds.counts.sum()) == 60


def test_read_only_data_gets_its_manifest_in_the_cache(tmp_path, monkeypatch):
    # As root every directory is writable to os.access: the decision is simulated here, and made for
    # real on a read-only mount in test_index_on_a_read_only_mount.
    _write(tmp_path / "d")
    monkeypatch.setenv("DLSTORE_CACHE", str(tmp_path / "cache"))
    real = os.access
    monkeypatch.setattr(indexing.os, "access", lambda p, m: False if str(p).endswith("/d") else real(p, m))
    ds = Dataset(str(tmp_path / "d"))
    assert ds.index.manifests[0].startswith(str(tmp_path / "cache" / "manifests"))
    assert not any(n.startswith(".dlstore") for n in os.listdir(tmp_path / "d"))


@pytest.mark.slow
def test_ranks_starting_together_build_it_once(tmp_path):
    _write(tmp_path / "d", shards=30, records=40)
    script = ("import sys, dlstore\nfrom dlstore.placement.world import World\n"
              "ds = dlstore.Dataset(sys.argv[1], world=World(rank=int(sys.argv[2]), size=4), shuffle='global')\n"
              "print(len(ds.index.notes), sum(len(b) for b in ds.batches()))\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "d"), str(r)], stdout=subprocess.PIPE,
                              text=True) for r in range(4)]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(int(o[0]) for o in outs) == 1  # one built it, three waited and read it
    assert sum(int(o[1]) for o in outs) == 1200


def test_dlstore_index_writes_the_manifest(tmp_path):
    _write(tmp_path / "d", shards=3)
    out = subprocess.run([sys.executable, "-m", "dlstore", "index", str(tmp_path / "d")], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert f"manifest: {tmp_path / 'd' / '.dlstore-manifest'}" in out.stdout
    ds = Dataset(str(tmp_path / "d"), world=World(rank=1, size=2))
    assert ds.index.notes == [] and int(ds.counts.sum()) == 36


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only tmpfs needs root")
def test_index_on_a_read_only_mount(tmp_path):
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("mount -t tmpfs failed here (no mount privilege in this container)")
    try:
        _write(mnt, shards=2)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        env = dict(os.environ, DLSTORE_CACHE=str(tmp_path / "cache"))
        out = subprocess.run([sys.executable, "-m", "dlstore", "index", str(mnt)], capture_output=True, text=True,
                             env=env)
        assert out.returncode == 0, out.stderr
        assert "read-only: written to the cache directory" in out.stdout
        assert str(tmp_path / "cache" / "manifests") in out.stdout
    finally:
        subprocess.run(["umount", str(mnt)])


def test_expand_gives_the_copies_a_manifest_without_reading_them(tmp_path):
    from dlstore.tools.expand import expand_shards

    data = _write(tmp_path / "src", shards=2)
    result = expand_shards(str(tmp_path / "src"), str(tmp_path / "big"), 3, progress=False)
    assert result.manifest == str(tmp_path / "big" / ".dlstore-manifest")
    ds = Dataset(str(tmp_path / "big"), shuffle="global", batch_size=5, remainder="uneven")
    assert ds.index.notes == [] and len(ds.shards) == 6
    assert sorted(_read_all(ds)) == sorted(r for recs in data.values() for r in recs for _ in range(3))


@pytest.mark.slow
def test_simulated_plan_json(tmp_path):
    out = subprocess.run([sys.executable, "-m", "dlstore", "plan", "--simulate", "1000:50", "--mounts-count", "4",
                          "--world-size", "16", "--rank", "3", "--shuffle", "global", "--json",
                          str(tmp_path / "p.json")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    got = json.loads((tmp_path / "p.json").read_text())
    assert got["records"] == 3125 and got["mounts"] == [3] and got["seconds"] > 0
    assert "rank 3: mounts [3]; 3,125 records" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "dlstore", "plan", "--simulate", "1000", "--world-size", "2"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "SHARDS:RECORDS_PER_SHARD" in bad.stderr and "Traceback" not in bad.stderr
    assert np.isfinite(got["max_rss_mb"])


def test_plan_counts_records_from_the_manifest(tmp_path):
    _write(tmp_path / "m0", shards=3)
    Dataset(str(tmp_path / "m0"))  # the manifest only: no per-file .idx
    out = subprocess.run([sys.executable, "-m", "dlstore", "plan", "--mounts", str(tmp_path / "m0"),
                          "--world-size", "2"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert ".dlstore-manifest: 36 records" in out.stdout and "indexed" not in out.stdout  # read, not rebuilt


def test_an_unchanged_directory_is_not_listed_again(tmp_path, monkeypatch):
    from dlstore.sources import reader

    _write(tmp_path / "d", shards=6)
    Dataset(str(tmp_path / "d" / "train-*"))
    listed = []
    real = reader.os.scandir
    monkeypatch.setattr(reader.os, "scandir", lambda p=".": listed.append(p) or real(p))
    ds = Dataset(str(tmp_path / "d" / "train-00[0-3]"), batch_size=2)
    assert listed == [] and len(ds.shards) == 4 and ds.index.notes == []  # the manifest's listing answered
    (tmp_path / "d" / "notes.txt").write_text("not a shard")  # the directory changed: listed once, restamped
    assert len(Dataset(str(tmp_path / "d")).shards) == 6 and len(listed) == 1
    assert len(Dataset(str(tmp_path / "d")).shards) == 6 and len(listed) == 1


def test_a_rank_checks_its_own_shards_only(tmp_path, monkeypatch):
    _write(tmp_path / "d", shards=24, records=10)
    Dataset(str(tmp_path / "d"))
    stat_calls = []
    real = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: stat_calls.append(os.fspath(p)) or real(p, *a, **k))
    ds = Dataset(str(tmp_path / "d"), world=World(rank=1, size=4), shuffle="block", batch_size=5)
    sum(len(b) for b in ds.batches())
    shards = {p for p in stat_calls if os.path.basename(p).startswith("train-")}
    mine = {ds.shards[s] for s in np.unique(ds.read_plan(0).shards)}
    assert shards == mine and len(mine) < 24


def test_a_shard_rewritten_in_place_is_found_by_the_rank_that_reads_it(tmp_path):
    _write(tmp_path / "d", shards=4, records=8)
    Dataset(str(tmp_path / "d"))
    path = tmp_path / "d" / "train-002"
    new = _write(tmp_path / "new", shards=3, records=3, tag="Z")["train-002"]
    time.sleep(0.01)
    path.write_bytes((tmp_path / "new" / "train-002").read_bytes())  # in place: the directory is unchanged
    readers = []
    for rank in range(4):
        try:
            ds = Dataset(str(tmp_path / "d"), world=World(rank=rank, size=4), shuffle="none", shuffle_shards=False)
        except indexing.ShardChanged as e:
            assert "train-002" in str(e) and "dlstore index" in str(e)
            readers.append(rank)
            continue
        assert 2 not in set(ds.plan(0).piece_arrays(rank)[0].tolist())
    assert readers == [2]
    with pytest.warns(UserWarning, match="shard train-002 was rewritten"):
        alone = Dataset(str(tmp_path / "d"), batch_size=4)  # one rank alone brings the manifest up to date
    assert all(r in _read_all(alone) for r in new)


def test_a_large_manifest_is_read_entry_by_entry(tmp_path, monkeypatch):
    _write(tmp_path / "d", shards=7, records=30)
    mapped = Dataset(str(tmp_path / "d"), shuffle="global", batch_size=8, remainder="uneven")
    expected = _read_all(mapped)
    monkeypatch.setattr(indexing, "_MAP_MANIFESTS_OVER", 0)  # every manifest is "large" now
    ds = Dataset(str(tmp_path / "d"), shuffle="global", batch_size=8, remainder="uneven")
    assert all(t is not None for t in ds.index._takes)
    plan = ds.read_plan(0)
    assert np.array_equal(plan.offset, mapped.read_plan(0).offset)
    assert _read_all(ds) == expected


def test_entries_are_gathered_from_the_file_by_several_threads(tmp_path):
    n = 200_000
    offsets = np.arange(n, dtype=np.uint64) * 16
    dest = indexing.write_manifest(str(tmp_path / ".dlstore-manifest"), "tfrecord", ["s"], [16 * n], [0], [n], offsets)
    _, m, _ = indexing.read_manifest(str(tmp_path))
    at = np.random.default_rng(3).integers(0, n, 5000)
    got = indexing._gather_offsets(dest, m, at)  # about 4,000 runs: read by the thread pool
    assert np.array_equal(got, offsets[at])
    with open(dest, "r+b") as f:
        f.truncate(m.offsets_at + 8 * 1000)  # cut short: the error names the file and the byte
    with pytest.raises(dlstore.DlstoreError, match=r"\.dlstore-manifest: at byte \d+: read 0 of"):
        indexing._gather_offsets(dest, m, np.array([n - 1]))
