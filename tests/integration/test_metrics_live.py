"""dlstore.metrics: /metrics scraped from a running training loop agrees with the loader's stats():
records, bytes, the wait histogram, failovers and skipped records; a Dataset read directly is exported
from its stats()["life"], and one a Loader reads is counted once (the Loader's); DLSTORE_METRICS_PORT
alone turns it on, from the first Loader or Dataset made."""
import gc
import os
import re
import socket
import time
import urllib.request
import weakref

import pytest

import dlstore
from dlstore import metrics
from dlstore.pipeline import Bert, Loader
from dlstore.placement.world import World
from dlstore.sources.source import SourceWrapper
from dlstore.synthetic import generate_bert
from tests.helpers import flip_data_byte, replicate, run_python

pytest.importorskip("prometheus_client", reason="dlstore.metrics serves through prometheus_client")

_SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")


def scrape(port):
    """``{(name, frozenset(labels)): value}`` of one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return parse(r.read().decode())


def parse(text):
    """``{(name, frozenset(labels)): value}`` of an exposition."""
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(series, name, **labels):
    hits = [v for (n, ls), v in series.items() if n == name and set(labels.items()) <= set(ls)]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} series; served: {sorted({n for n, _ in series})}"
    return hits[0]


@pytest.fixture
def served():
    port = metrics.serve(0, "127.0.0.1")
    yield port
    metrics.stop()


def _two_mounts_a_fault_and_a_gap(tmp_path, **kw):
    """A block-shuffled Dataset over 3 BERT shards on 2 mounts: a record corrupt on every copy (skipped) and
    a shard gone from the rank's mount (a failover to the replica). Returns ``(ds, mounts)``."""
    src = tmp_path / "src"
    src.mkdir()
    generate_bert(str(src), shards=3, records_per_shard=40, progress=False)
    shards = sorted(p for p in os.listdir(src) if not p.startswith("."))
    offsets = dlstore.sources.indexing.scan_offsets(str(src / shards[0]))[1]
    flip_data_byte(src / shards[0], 7, offsets)
    mounts = replicate(src, tmp_path, 2)
    ds = dlstore.Dataset("part-*", mounts=mounts, world=World(rank=0, size=1), shuffle="block", seed=1,
                         remainder="uneven", on_error="skip", **kw)
    os.unlink(os.path.join(mounts[0], shards[2]))
    return ds, mounts


@pytest.mark.filterwarnings("ignore:bad copy on mount:RuntimeWarning")  # the record is bad on every copy, on purpose
def test_a_training_loop_scraped_agrees_with_stats(tmp_path, served):
    ds, mounts = _two_mounts_a_fault_and_a_gap(tmp_path)
    loader = Loader(ds, Bert(), 8, last_batch="PARTIAL", epochs=2, prefetch=1)
    checked = 0
    for step, _ in enumerate(loader):
        time.sleep(0.002)  # the training step
        if step in (5, 20):  # in epoch 0, and in epoch 1 after epoch 0's failover was counted
            time.sleep(0.5)  # the loader fills its buffers and waits: nothing moves while both are read
            series, stats = scrape(served), loader.stats()
            labels = dict(rank="0", mount=mounts[0], engine=stats["engine"])
            assert value(series, "dlstore_records_total", **labels) == stats["records"] > 0
            assert value(series, "dlstore_read_bytes_total", **labels) == stats["bytes"] > 0
            assert value(series, "dlstore_batches_total", **labels) == stats["batches"] == step + 1
            assert value(series, "dlstore_batch_wait_seconds_count", **labels) == stats["stalls"]["steps"] == step + 1
            assert value(series, "dlstore_batch_wait_seconds_sum", **labels) == pytest.approx(stats["stalls"]["wait_s"])
            assert value(series, "dlstore_batch_wait_seconds_bucket", le="+Inf", **labels) == step + 1
            assert value(series, "dlstore_skipped_records_total", stage="source", **labels) == \
                stats["skipped_source"] == value(series, "dlstore_corrupt_records_total", **labels) >= 1
            assert value(series, "dlstore_failovers_total", **labels) == stats["failovers"]
            assert value(series, "dlstore_engine_info", reason=stats["engine_reason"], **labels) == 1
            checked += 1
    assert checked == 2
    stats = loader.stats()
    assert stats["failovers"] == 2 and stats["skipped_source"] == 2  # one each epoch
    assert stats["samples"] == 2 * (3 * 40 - 1)
    series = scrape(served)
    mine = dict(rank="0", mount=mounts[0])  # loaders of earlier tests this process still holds serve too
    assert value(series, "dlstore_failovers_total", **mine) == 2
    assert value(series, "dlstore_skipped_records_total", stage="source", **mine) == 2
    assert value(series, "dlstore_samples_total", **mine) == stats["samples"]


def test_a_torch_dataset_is_one_series_over_its_epochs(tmp_path, served):
    # Each epoch's loader was its own series (bert-0, bert-1...), gone when its pass ended with what it
    # counted since the last scrape: after an epoch no dlstore_samples_total was served at all.
    torch = pytest.importorskip("torch")
    from dlstore.adapters.torch import DlstoreIterableDataset

    generate_bert(str(tmp_path), shards=1, records_per_shard=30, progress=False)
    ds = DlstoreIterableDataset(str(tmp_path), Bert(), batch_size=4)
    for epoch in range(3):
        ds.set_epoch(epoch)
        sum(1 for _ in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0))
        series = scrape(served)
        name = metrics.series_name(ds)  # other tests' loaders may still be alive in this process
        samples = [(labels, v) for (n, labels), v in series.items() if n == "dlstore_samples_total"
                   and ("loader", name) in labels]
        assert len(samples) == 1 and samples[0][1] == 30 * (epoch + 1) == ds.stats()["samples"]
        assert value(series, "dlstore_batch_wait_seconds_count", loader=name) == 8 * (epoch + 1)


def _served_alone(make: str, count: str, metric: str):
    """A fresh process with DLSTORE_METRICS_PORT=0 that runs ``make`` (which names ``source``), reads it
    through ``count``, and prints that count and the lines of ``metric`` its exporter serves."""
    script = ("import urllib.request, dlstore\n"
              "from dlstore.pipeline import bert_loader\n"
              f"source = {make}\n"
              f"n = {count}\n"
              "port = dlstore.metrics.serving()\n"
              "body = urllib.request.urlopen(f'http://127.0.0.1:{port}/metrics', timeout=10).read().decode()\n"
              f"print(n, [l for l in body.splitlines() if l.startswith({metric!r})])\n")
    return run_python(script, DLSTORE_METRICS_PORT="0")


def test_the_environment_variable_alone_serves_every_loader(tmp_path):
    generate_bert(str(tmp_path), shards=1, records_per_shard=16, progress=False)
    out = _served_alone(f"bert_loader({str(tmp_path)!r}, batch_size=4)", "sum(1 for _ in source)",
                        "dlstore_batches_total")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("4 ['dlstore_batches_total{") and out.stdout.rstrip().endswith("4.0']")


def test_a_port_taken_warns_once_and_the_loaders_still_run(tmp_path):
    # With the variable set and its port held by another job, every Loader() raised OSError: the optional
    # exporter stopped training.
    generate_bert(str(tmp_path), shards=1, records_per_shard=16, progress=False)
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        script = ("import dlstore\n"
                  "from dlstore.pipeline import bert_loader\n"
                  f"print([sum(1 for _ in bert_loader({str(tmp_path)!r}, batch_size=4)) for _ in range(2)], "
                  "dlstore.metrics.serving())\n")
        out = run_python(script, DLSTORE_METRICS_PORT=str(port))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[4,", "4]", "None"]
    said = "DLSTORE_METRICS_PORT is set, but no metrics are served"
    warned = [line for line in out.stderr.splitlines() if said in line]
    assert len(warned) == 1 and f":{port}" in warned[0], out.stderr


def test_a_port_past_65535_with_the_local_rank_warns_and_the_loaders_still_run(tmp_path):
    """DLSTORE_METRICS_PORT=65535 on local rank 1 serves on 65536: bind raised OverflowError, which the
    exporter's guard did not catch, and the rank died making its Loader (mpirun then ended the job)."""
    generate_bert(str(tmp_path), shards=1, records_per_shard=16, progress=False)
    script = ("import dlstore\n"
              "from dlstore.pipeline import bert_loader\n"
              f"print(sum(1 for _ in bert_loader({str(tmp_path)!r}, batch_size=4)), dlstore.metrics.serving())\n")
    out = run_python(script, DLSTORE_METRICS_PORT="65535", OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2",
                     OMPI_COMM_WORLD_LOCAL_RANK="1", OMPI_COMM_WORLD_LOCAL_SIZE="2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "None"]  # rank 1 of 2: half of the 4 batches
    assert "no metrics are served" in out.stderr and "at most 65534" in out.stderr, out.stderr


def test_a_forked_worker_serves_its_own_port_and_loaders(tmp_path):
    # A forked child inherited the parent's server object (not its thread): serve() returned the parent's
    # port and the worker exported nothing, so the documented per-worker recipe did nothing under fork.
    # It exported its parent's loaders too, frozen copies under the same labels (counted twice in a sum).
    generate_bert(str(tmp_path), shards=1, records_per_shard=8, progress=False)
    script = ("import multiprocessing as mp, urllib.request, dlstore, dlstore.metrics\n"
              "from dlstore.pipeline import bert_loader\n"
              f"loader = bert_loader({str(tmp_path)!r}, batch_size=4)\n"
              "sum(1 for _ in loader)\n"
              "dlstore.metrics.serve(0)\n"
              "def child(q):\n"
              "    port = dlstore.metrics.serve(0)\n"
              "    body = urllib.request.urlopen(f'http://127.0.0.1:{port}/metrics', timeout=10).read()\n"
              "    q.put(port if b'dlstore_samples_total{' not in body else -1)\n"
              "q = mp.get_context('fork').Queue()\n"
              "p = mp.get_context('fork').Process(target=child, args=(q,))\n"
              "p.start(); got = q.get(timeout=60); p.join()\n"
              "print(got == -1, got == dlstore.metrics.serving(), p.exitcode)\n")
    out = run_python(script)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "0"]  # its own port, and none of the parent's loaders


def test_the_environment_variable_does_not_make_dataloader_workers_serve(tmp_path):
    """Processes started through multiprocessing (DataLoader workers) would all ask for the same port. The
    main process serves it (its Dataset, made first, starts the exporter); a worker asking for it too would
    find it taken and warn."""
    pytest.importorskip("torch")
    generate_bert(str(tmp_path), shards=2, records_per_shard=16, progress=False)
    script = ("import torch, dlstore\n"
              "from dlstore.adapters.torch import DlstoreIterableDataset\n"
              "from dlstore.pipeline import Bert\n"
              f"ds = DlstoreIterableDataset({str(tmp_path)!r}, Bert(), batch_size=4)\n"
              "loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)\n"
              "print(sum(len(b['input_ids']) for b in loader), dlstore.metrics.serving())\n")
    with socket.socket() as probe:  # a port free now: two workers serving would both bind it
        probe.bind(("0.0.0.0", 0))
        port = probe.getsockname()[1]
    out = run_python(script, DLSTORE_METRICS_PORT=str(port))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["32", str(port)]
    assert "no metrics are served" not in out.stderr, out.stderr


def of(series, name):
    """The samples of the series labelled ``loader=name``: ``{sample name: value}`` (labels beyond it dropped
    where one sample name has one series)."""
    return {n: v for (n, labels), v in series.items() if ("loader", name) in labels}


@pytest.mark.filterwarnings("ignore:bad copy on mount:RuntimeWarning")  # the record is bad on every copy, on purpose
def test_a_dataset_read_directly_scraped_agrees_with_its_stats(tmp_path, served):
    # Read through ds.batches() (no Loader) a Dataset was not exported at all: nothing to scrape.
    ds, mounts = _two_mounts_a_fault_and_a_gap(tmp_path, batch_size=8)
    name = metrics.series_name(ds)
    assert name is not None and name.startswith("dataset-")
    labels = dict(loader=name, rank="0", mount=mounts[0], engine=ds.engine)
    records = nbytes = 0
    for epoch in range(2):
        for step, batch in enumerate(ds.batches()):
            records += batch.num_records
            nbytes += int(batch.nbytes)
            if step == 3:  # mid-pass: what was handed out so far; the failovers of the passes that ended
                series, life = scrape(served), ds.stats()["life"]
                assert value(series, "dlstore_records_total", **labels) == life["records"] == records
                assert value(series, "dlstore_read_bytes_total", **labels) == life["bytes"] == nbytes
                assert value(series, "dlstore_failovers_total", **labels) == life["failovers"] == epoch
        series, stats = scrape(served), ds.stats()
        life = stats["life"]
        assert life["passes"] == epoch + 1 and life["records"] == records == (epoch + 1) * (3 * 40 - 1)
        assert stats["records"] == 3 * 40 - 1 and stats["payload_bytes"] * (epoch + 1) == life["bytes"] == nbytes
        assert value(series, "dlstore_records_total", **labels) == records
        assert value(series, "dlstore_read_bytes_total", **labels) == nbytes
        assert value(series, "dlstore_skipped_records_total", stage="source", **labels) == \
            value(series, "dlstore_corrupt_records_total", **labels) == life["skipped"] == epoch + 1
        assert value(series, "dlstore_failovers_total", **labels) == life["failovers"] == epoch + 1
        assert value(series, "dlstore_retries_total", **labels) == life["retries"]
        assert value(series, "dlstore_engine_info", reason=stats["engine_reason"], **labels) == 1
    # A Dataset hands batches to no training loop: none of the loop's series, no pipeline stage.
    assert set(of(series, name)) == {"dlstore_records_total", "dlstore_read_bytes_total", "dlstore_engine_info",
                                      "dlstore_skipped_records_total", "dlstore_corrupt_records_total",
                                      "dlstore_failovers_total", "dlstore_retries_total"}
    assert [dict(ls)["stage"] for (n, ls) in series if n == "dlstore_skipped_records_total"
            and ("loader", name) in ls] == ["source"]


def test_a_dataset_a_loader_reads_is_counted_once(tmp_path):
    """A Dataset and the Loader over it both exported would count each record twice in a sum by rank: the
    Dataset is left out while a Loader reads it (directly or through a SourceWrapper), and is back, with its
    whole life, once none does."""
    generate_bert(str(tmp_path), shards=2, records_per_shard=16, progress=False)
    ds = dlstore.Dataset(str(tmp_path), batch_size=4)
    name = metrics.series_name(ds)
    assert of(parse(metrics.exposition()), name)["dlstore_records_total"] == 0  # made, not read yet: exported
    loader = Loader(ds, Bert(), 4)
    assert sum(1 for _ in loader) == 8
    wrapped = Loader(SourceWrapper(ds), Bert(), 4, epochs=1)
    assert sum(1 for _ in wrapped) == 8
    series = parse(metrics.exposition())
    assert of(series, name) == {}  # not even its engine: every figure of it is in the loaders'
    assert of(series, metrics.series_name(loader))["dlstore_records_total"] == 32
    assert of(series, metrics.series_name(wrapped))["dlstore_records_total"] == 32
    assert ds.stats()["life"]["records"] == 64
    del loader, wrapped
    gc.collect()
    assert of(parse(metrics.exposition()), name)["dlstore_records_total"] == 64


def test_the_torch_adapter_counts_its_dataset_once(tmp_path):
    pytest.importorskip("torch")
    from dlstore.adapters.torch import DlstoreIterableDataset

    generate_bert(str(tmp_path), shards=1, records_per_shard=30, progress=False)
    batches = DlstoreIterableDataset(str(tmp_path), Bert(), batch_size=4)
    assert sum(1 for _ in batches) == 8
    series = parse(metrics.exposition())
    assert of(series, metrics.series_name(batches))["dlstore_records_total"] == 30
    assert of(series, metrics.series_name(batches.dataset)) == {}  # its passes' figures are the adapter's
    # Without a pipeline the user decodes the records: nothing but the Dataset counts them.
    records = DlstoreIterableDataset(str(tmp_path))
    assert sum(1 for _ in records) == 30
    assert metrics.series_name(records) is None
    series = parse(metrics.exposition())
    assert of(series, metrics.series_name(records.dataset))["dlstore_records_total"] == 30


def test_a_collected_dataset_leaves_the_scrape(tmp_path):
    generate_bert(str(tmp_path), shards=1, records_per_shard=16, progress=False)
    ds = dlstore.Dataset(str(tmp_path), batch_size=4)
    assert sum(b.num_records for b in ds.batches()) == 16
    name = metrics.series_name(ds)
    assert of(parse(metrics.exposition()), name)["dlstore_records_total"] == 16
    gone = weakref.ref(ds)
    del ds
    gc.collect()
    assert gone() is None  # tracking holds it weakly: it never keeps a Dataset alive
    assert of(parse(metrics.exposition()), name) == {}


def test_a_worker_copy_is_exported_when_it_reads_with_its_own_counts(tmp_path):
    """A DataLoader worker's Dataset is a copy (for_worker): exported once it reads, counting from zero, not
    the rank's Dataset's counts it was copied with; copies made only to plan (never read) are not exported."""
    generate_bert(str(tmp_path), shards=2, records_per_shard=16, progress=False)
    ds = dlstore.Dataset(str(tmp_path), batch_size=4)
    assert sum(b.num_records for b in ds.batches()) == 32
    copy = ds.for_worker(1, 2)
    assert metrics.series_name(copy) is None
    assert sum(b.num_records for b in copy.batches()) == 16
    series = parse(metrics.exposition())
    assert of(series, metrics.series_name(copy))["dlstore_records_total"] == 16 == copy.stats()["life"]["records"]
    assert of(series, metrics.series_name(ds))["dlstore_records_total"] == 32


def test_the_environment_variable_alone_serves_a_dataset(tmp_path):
    """DLSTORE_METRICS_PORT started the exporter from the first Loader only: a job reading Datasets
    directly served nothing."""
    generate_bert(str(tmp_path), shards=1, records_per_shard=16, progress=False)
    out = _served_alone(f"dlstore.Dataset({str(tmp_path)!r}, batch_size=4)",
                        "sum(b.num_records for b in source.batches())", "dlstore_records_total")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("16 ['dlstore_records_total{") and 'loader="dataset-0"' in out.stdout
    assert out.stdout.rstrip().endswith("16.0']"), out.stdout


def test_a_scrape_ends_whatever_a_source_wraps(tmp_path):
    # The scrape follows each loader's source through SourceWrapper.wrapped to the Dataset it reads: a
    # wrapper whose `wrapped` leads round a cycle must not keep it going for ever.
    generate_bert(str(tmp_path), shards=1, records_per_shard=8, progress=False)

    class Looping(SourceWrapper):
        @property
        def wrapped(self):
            return self

    loader = Loader(Looping(dlstore.Dataset(str(tmp_path), batch_size=4)), Bert(), 4, epochs=1)
    assert sum(1 for _ in loader) == 2
    assert of(parse(metrics.exposition()), metrics.series_name(loader))["dlstore_records_total"] == 8
