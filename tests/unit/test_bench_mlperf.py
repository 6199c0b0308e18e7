"""``bench mlperf``: the workload table, DLIO's record layout, MLPerf's AU rule, the search, a tiny run."""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
from collections import Counter

import numpy as np
import pytest

import dlstore
from dlstore.bench import mlperf
from dlstore.bench.__main__ import main as bench_main
from dlstore.bench.mlperf_au import aggregate, epoch_au, rank_epoch, search_accelerators
from dlstore.bench.mlperf_records import DlioExample, file_name, generate, layout_files, record_bytes, train_files
from dlstore.bench.mlperf_workloads import WORKLOADS, MlperfWorkload, workload
from dlstore.pipeline import Loader
from dlstore.placement.world import detect_world

# ---- the table --------------------------------------------------------------------------------------


def test_table_rows_hold_mlperf_v10_values_with_their_source():
    h100, a100 = workload("resnet50", "h100"), workload("resnet50", "a100")
    assert (h100.batch_size, h100.computation_time, h100.au_threshold_pct) == (400, 0.224, 90.0)
    assert a100.computation_time == 0.435 and a100.samples_per_s < h100.samples_per_s
    cosmo = workload("cosmoflow", "h100")
    assert (cosmo.batch_size, cosmo.computation_time, cosmo.au_threshold_pct) == (1, 0.0035, 70.0)
    assert cosmo.dimension_stdev > 0 and h100.dimension_stdev == 0
    assert h100.dimension == 338 and h100.image_bytes == 338 * 338  # int(sqrt(114660.07))
    for (name, acc), row in WORKLOADS.items():
        assert (row.workload, row.accelerator) == (name, acc)
        assert row.batch_size >= 1 and row.computation_time > 0 and row.files >= 1 and row.records_per_file >= 1
        source = row.source.format(name=row.name)
        assert f"configs/dlio/workload/{row.name}.yaml" in source and row.round in source
        assert f"{row.computation_time:g} s" in row.describe()


def test_table_refuses_an_unknown_pair_listing_the_known():
    with pytest.raises(ValueError, match="resnet50 on h100"):
        workload("unet3d", "v100")


def test_compute_preset_of_resnet50_agrees_with_the_table():
    from dlstore.bench.compute import resolve_compute

    for acc in ("a100", "h100"):
        row = workload("resnet50", acc)
        assert resolve_compute(acc, "resnet50", row.batch_size).seconds_per_batch == pytest.approx(row.computation_time)


# ---- the AU rule ------------------------------------------------------------------------------------


def test_au_leaves_the_first_step_out_and_counts_the_configured_compute():
    # 4 steps of 0.2 s compute: wall 2.0 s, first step 1.0 s (the pipeline's start)
    au = epoch_au([1.0, 0.25, 0.25, 0.5], 0.2)
    assert au["au_pct"] == pytest.approx(100 * 3 * 0.2 / 1.0)
    assert au["au_whole_pct"] == pytest.approx(100 * 4 * 0.2 / 2.0)
    assert epoch_au([0.3], 0.2)["au_pct"] is None  # one step leaves nothing to measure


def test_aggregate_means_au_over_ranks_and_sums_throughput():
    def rank(seconds, samples_per_step=10):
        steps = [{"step": i + 1, "seconds": s, "samples": samples_per_step, "bytes": 1 << 20,
                  "compute_seconds": 0.1} for i, s in enumerate(seconds)]
        return [rank_epoch({"steps": steps, "bytes": len(seconds) << 20}, 0.1)]

    fast, slow = rank([0.5, 0.1, 0.1]), rank([0.5, 0.1, 0.4])
    got = aggregate([fast, slow], threshold_pct=90.0)
    assert got["au_per_rank_pct"] == pytest.approx([100.0, 40.0])
    assert got["au_pct"] == pytest.approx(70.0) and not got["passed"]
    assert got["samples_per_s"] == pytest.approx(30 / 0.7 + 30 / 1.0)
    assert got["mib_per_s"] == pytest.approx(3 / 0.7 + 3 / 1.0)
    assert aggregate([fast], 90.0)["passed"]


def test_a_run_whose_first_step_holds_the_reading_is_decided_on_the_whole_epoch():
    # A user trial: each rank's share fit in the shuffle buffer, so every read fell in step 1, which MLPerf's
    # rule leaves out: AU 97% (MLPerf) beside 5% (whole epoch) passed, at under 5% of the samples/s needed.
    def rank(seconds, first_read):
        steps = [{"step": i + 1, "seconds": s, "samples": 10, "bytes": 1 << 20, "compute_seconds": 0.1}
                 for i, s in enumerate(seconds)]
        return [dict(rank_epoch({"steps": steps, "bytes": len(seconds) << 20}, 0.1), first_step_read_pct=first_read)]

    filled = [20.0] + [0.1] * 11  # step 1 read everything; the rest is the accelerator's sleep
    got = aggregate([rank(filled, 100.0), rank(filled, 96.0)], 90.0)
    assert got["au_pct"] == pytest.approx(100.0) and got["au_whole_pct"] < 10
    assert got["first_step_read_pct"] == 100.0 and got["decided_on"] == "au_whole_pct" and not got["passed"]
    warm_up = aggregate([rank([0.3] + [0.1] * 11, 5.0)], 90.0)  # step 1 is the pipeline's start: MLPerf's rule
    assert warm_up["decided_on"] == "au_pct" and warm_up["passed"]
    median = mlperf._median_run([dict(got, others_cores=None)], 90.0)
    assert median["decided_on"] == "au_whole_pct" and not median["passed"]
    verdict = mlperf._verdict("cold", {"best": 0, "tried": [1], "runs": {1: median}},
                              {"accelerator": "h100", "workload": "resnet50", "au_threshold_pct": 90.0})
    assert "decided on the whole-epoch AU" in verdict and "read 100% of a rank's epoch" in verdict


# ---- the search -------------------------------------------------------------------------------------


@pytest.mark.parametrize("feeds, cap, best, tried", [
    (5, 64, 5, [1, 2, 4, 8, 6, 5]),
    (4, 64, 4, [1, 2, 4, 8, 6, 5]),
    (1, 64, 1, [1, 2]),
    (0, 64, 0, [1]),
    (100, 12, 12, [1, 2, 4, 8, 12]),
    (10, 12, 10, [1, 2, 4, 8, 12, 10, 11]),
])
def test_search_finds_the_most_accelerators_that_pass(feeds, cap, best, tried):
    got = search_accelerators(lambda n: {"passed": n <= feeds}, cap)
    assert got["best"] == best and got["tried"] == tried
    assert got["capped"] == (best == cap)


# ---- DLIO's layout ----------------------------------------------------------------------------------


def test_generated_files_have_dlio_names_features_and_sizes(tmp_path):
    cosmo = workload("cosmoflow", "h100")
    files = generate(str(tmp_path), cosmo, 3, records_per_file=2)
    assert [os.path.basename(f) for f in files] == [file_name(i, 3) for i in range(3)] == \
        ["img_0_of_3.tfrecord", "img_1_of_3.tfrecord", "img_2_of_3.tfrecord"]
    assert layout_files(str(tmp_path)) == files
    sizes = set()
    for path in files:
        records = [dlstore.parse_example(r) for r in dlstore.open_records(path)]
        assert len(records) == 2 and set(records[0]) == {"image", "size"}
        assert int(records[0]["size"][0]) == cosmo.dimension
        sizes.add(len(records[0]["image"][0]))
        assert len(records[1]["image"][0]) == len(records[0]["image"][0])  # one shape per file, as DLIO's
    assert len(sizes) > 1  # the sides are drawn per file


def test_a_resnet50_record_is_the_size_dlio_writes(tmp_path):
    h100 = workload("resnet50", "h100")
    [path] = generate(str(tmp_path), h100, 1, records_per_file=3)
    assert os.path.getsize(path) == 3 * record_bytes(h100) == 3 * 114303  # DLIO's files hold 114,303-byte records


def test_layout_files_refuses_a_folder_without_dlio_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no \\*.tfrecord"):
        layout_files(str(tmp_path))
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "shard-0.tfrecord").write_bytes(b"")
    with pytest.raises(ValueError, match="shard-0.tfrecord: not a name of DLIO's layout"):
        layout_files(str(tmp_path))


def test_an_interrupted_generate_is_refused_then_finished_by_generate(tmp_path):
    small = dataclasses.replace(workload("resnet50", "h100"), record_length=64.0)  # 8x8 images
    paths = generate(str(tmp_path), small, 3, records_per_file=2)
    os.remove(paths[1])
    with pytest.raises(ValueError, match="2 of the 3 files their names promise \\(img_1_of_3.tfrecord is missing\\)"):
        layout_files(str(tmp_path))
    parser = argparse.ArgumentParser()
    mlperf.add_arguments(parser)
    args = parser.parse_args(["--data", str(tmp_path), "--generate", "--records-per-file", "2", "--quiet"])
    note = mlperf._generate(args, small, lambda line: None)
    assert "1 of them missing, the rest kept" in note
    assert layout_files(str(tmp_path)) == paths


def test_names_of_two_data_sets_in_one_folder_are_refused(tmp_path):
    small = dataclasses.replace(workload("resnet50", "h100"), record_length=64.0)
    generate(str(tmp_path), small, 2, records_per_file=1)
    generate(str(tmp_path), small, 3, records_per_file=1)
    with pytest.raises(ValueError, match="img_0_of_3.tfrecord: one of 3 files, where img_0_of_2.tfrecord is one of 2"):
        layout_files(str(tmp_path))


@pytest.mark.slow  # importing TensorFlow takes seconds
def test_dlio_example_parses_records_tensorflow_wrote_as_dlio_does(tmp_path):
    tf = pytest.importorskip("tensorflow")
    train = tmp_path / "train"
    train.mkdir()
    path = str(train / file_name(0, 1))
    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(path) as writer:  # DLIO's tf_generator, record by record
        for _ in range(6):
            image = rng.integers(0, 255, size=(12, 9), dtype=np.uint8).tobytes()
            feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
                       "size": tf.train.Feature(int64_list=tf.train.Int64List(value=[10]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    loader = Loader(dlstore.Dataset([path], shuffle="none", batch_size=3), DlioExample(), 3)
    batches = list(loader)
    assert len(batches) == 2
    for b in batches:
        assert b["size"][:, 0].tolist() == [10, 10, 10] and b["image_bytes"][:, 0].tolist() == [108, 108, 108]


# ---- runs -------------------------------------------------------------------------------------------


def _tiny(tmp_path, files=4, per_file=12, batch=4, seconds_per_batch=0.004) -> mlperf.RunSpec:
    row = workload("resnet50", "h100")
    small = MlperfWorkload(**{**row.__dict__, "batch_size": batch, "computation_time": seconds_per_batch})
    paths = generate(str(tmp_path), small, files, records_per_file=per_file)
    return mlperf.RunSpec(tuple(paths), small, io="buffered", shuffle="block")


def test_ranks_read_dlios_steps_and_every_record_once(tmp_path):
    spec = _tiny(tmp_path)  # 48 records, 2 ranks, batch 4: DLIO's floor(48 / 4 / 2) = 6 steps each
    got = mlperf.measure_threads(spec, 2, "warm")
    assert "read once" in got["cache_method"]
    for ranks in got["ranks"]:
        [epoch] = ranks
        assert [s["samples"] for s in epoch["steps"]] == [4] * mlperf.dlio_steps(48, 4, 2) == [4] * 6
    # The Datasets the ranks read: together, each of the 48 records once.
    seen = []
    for r in range(2):
        ds = spec.dataset(detect_world(rank=r, size=2, local_rank=r, local_size=2))
        for batch in ds.batches():
            buf = memoryview(batch).cast("B")
            seen += [hashlib.sha1(buf[o:o + n]).hexdigest() for o, n in zip(batch.offsets, batch.lengths)]
    everything = [hashlib.sha1(bytes(r)).hexdigest() for r in dlstore.open_records(list(spec.files))]
    assert sorted(seen) == sorted(everything) and len(set(everything)) == 48


# ---- which records each rank reads, against DLIO's rule ------------------------------------------------

def dlio_epoch_records(counts, ranks, batch, read_threads):
    """The ``(file, record)`` pairs each rank of DLIO 2.0.0 takes in one epoch, in its order.

    DLIO's rule, from its source (in our words):

    - ``dlio_benchmark/reader/tf_reader.py``, ``TFReader.next``: the sorted file list, when it holds at
      least as many files as ranks, is cut by ``tf.data``'s ``shard``: rank r keeps files r, r + ranks,
      r + 2 ranks, .... A ``TFRecordDataset`` with ``num_parallel_reads=read_threads`` reads them: it
      opens ``read_threads`` files at a time and takes one record from each in turn until they end,
      then the next ones (for files of one length, as DLIO writes them: groups of ``read_threads``
      consecutive files, interleaved record by record). With fewer files than ranks, the stream of
      all the files is sharded instead: record i of it to rank i % ranks. The stream is batched with
      the short last batch dropped, and the batched stream is repeated without end.
    - ``dlio_benchmark/main.py``, ``DLIOBenchmark._train``: every epoch iterates that dataset from its
      start (a new iterator) and stops after ``floor(records / batch / ranks)`` steps.
    """
    assert len(set(counts)) == 1, "files of one length, as DLIO generates them"

    def stream(files):
        out = []
        for g in range(0, len(files), read_threads):
            group = files[g:g + read_threads]
            out += [(f, k) for k in range(counts[0]) for f in group]
        return out

    steps = sum(counts) // batch // ranks
    taken = []
    for r in range(ranks):
        mine = stream(list(range(r, len(counts), ranks))) if len(counts) >= ranks else stream(
            list(range(len(counts))))[r::ranks]
        one_pass = mine[:len(mine) // batch * batch]
        taken.append([one_pass[i % len(one_pass)] for i in range(steps * batch)])
    return taken


def _records_read(spec, epoch):
    """A rank's epoch figures' ``records`` as ``(file index, record)`` pairs."""
    return [(spec.files.index(path), k) for path, k in epoch["records"]]


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("threads", [1, 2, 8])
def test_ranks_read_the_records_dlio_reads_with_its_read_threads(tmp_path, ranks, threads):
    # 5 files of 12 records, batch 4: they do not divide evenly among the ranks. DLIO's steps take 28 (2
    # ranks) or 20 (3 ranks) records per rank: rank 0's files hold more (its stream is cut), the last
    # rank's fewer (it reads its files again from the start). DLIO's read threads interleave a rank's
    # files record by record; so does the Dataset (interleave).
    spec = _tiny(tmp_path, files=5, per_file=12)
    spec = dataclasses.replace(spec, workload=dataclasses.replace(spec.workload, read_threads=threads),
                               shuffle="none", epochs=2, keep_records=True)
    got = mlperf.measure_threads(spec, ranks, "warm")
    dlio = dlio_epoch_records([12] * 5, ranks, 4, read_threads=threads)
    assert len(dlio[0]) != 12 * len(range(0, 5, ranks))  # the uneven case: rank 0's stream is cut
    for r in range(ranks):
        for epoch in got["ranks"][r]:
            assert _records_read(spec, epoch) == dlio[r]


def test_shuffled_only_the_cut_and_the_records_read_twice_differ(tmp_path):
    spec = dataclasses.replace(_tiny(tmp_path, files=5, per_file=12), keep_records=True)  # the block shuffle
    got = mlperf.measure_threads(spec, 2, "warm")
    dlio = dlio_epoch_records([12] * 5, 2, 4, read_threads=8)
    for r, [epoch] in enumerate(got["ranks"]):
        mine, theirs = Counter(_records_read(spec, epoch)), Counter(dlio[r])
        assert sum(mine.values()) == sum(theirs.values()) == 28
        assert {f for f, _ in mine} == {f for f, _ in theirs} == set(range(r, 5, 2))  # DLIO's files for rank r
        held = 12 * len(range(r, 5, 2))
        one_pass = held // 4 * 4
        cut, twice = held - min(one_pass, 28), max(0, 28 - one_pass)  # rank 0: 8 left out; rank 1: 4 read twice
        assert sum((theirs - mine).values()) <= cut + twice


def test_with_fewer_files_than_ranks_the_ranks_share_one_epoch(tmp_path):
    # 2 files of 16 records over 3 ranks, batch 4: DLIO's floor(32 / 4 / 3) = 2 steps each. DLIO deals the
    # records round-robin then; dlstore gives each rank a contiguous share of the epoch, none read twice.
    spec = dataclasses.replace(_tiny(tmp_path, files=2, per_file=16), shuffle="none", keep_records=True)
    got = mlperf.measure_threads(spec, 3, "warm")
    taken = [_records_read(spec, epoch) for [epoch] in got["ranks"]]
    assert [len(t) for t in taken] == [8, 8, 8]
    assert len({pair for t in taken for pair in t}) == 24
    assert taken[0] == [(f, k) for k in range(4) for f in (0, 1)]  # the interleaved stream's first 8 (none)


@pytest.mark.slow  # importing TensorFlow takes seconds
@pytest.mark.parametrize("files", [5, 2])
def test_dlios_rule_is_what_tensorflows_pipeline_does(tmp_path, files):
    # TFReader.next's pipeline, built as it builds it, over files whose records carry their identity.
    tf = pytest.importorskip("tensorflow")
    paths = [str(tmp_path / file_name(i, files)) for i in range(files)]
    for i, path in enumerate(paths):
        with tf.io.TFRecordWriter(path) as writer:
            for k in range(12):
                ids = tf.train.Int64List(value=[i, k])
                writer.write(tf.train.Example(features=tf.train.Features(
                    feature={"id": tf.train.Feature(int64_list=ids)})).SerializeToString())
    for ranks in (2, 3):
        for threads in (1, 2, 8):
            expected = dlio_epoch_records([12] * files, ranks, 4, threads)
            steps = 12 * files // 4 // ranks
            for r in range(ranks):
                names = tf.data.Dataset.list_files(paths, shuffle=False)
                if files >= ranks:
                    names = names.shard(num_shards=ranks, index=r)
                ds = tf.data.TFRecordDataset(filenames=names, num_parallel_reads=threads)
                if files < ranks:
                    ds = ds.shard(num_shards=ranks, index=r)
                ds = ds.batch(4, drop_remainder=True).repeat()
                for _ in range(2):  # two epochs, each from the start
                    seen = []
                    for step, batch in enumerate(ds):
                        ids = tf.io.parse_example(batch, {"id": tf.io.FixedLenFeature([2], tf.int64)})["id"]
                        seen += [tuple(pair) for pair in ids.numpy().tolist()]
                        if step + 1 == steps:
                            break
                    assert seen == expected[r], (ranks, threads, r)


def test_a_rank_whose_share_fits_in_the_shuffle_buffer_reads_it_all_in_step_1(tmp_path):
    spec = _tiny(tmp_path)  # 24 records per rank, far below the 64 MiB shuffle buffer, which spreads them all
    got = mlperf.measure_threads(spec, 2, "warm")
    # Each rank's first batch of 4 takes a record from as far as the 19th of the 24 it reads (seed 0).
    assert [e["first_step_read_pct"] for [e] in got["ranks"]] == pytest.approx([100 * 19 / 24] * 2)
    assert aggregate(got["ranks"], 90.0)["decided_on"] == "au_whole_pct"
    unshuffled = mlperf.measure_threads(dataclasses.replace(spec, shuffle="none"), 2, "warm")
    assert [e["first_step_read_pct"] for [e] in unshuffled["ranks"]] == pytest.approx([100 * 4 / 24] * 2)  # a batch
    assert aggregate(unshuffled["ranks"], 90.0)["decided_on"] == "au_pct"


def test_reported_au_matches_a_hand_computation_from_the_step_log(tmp_path):
    spec = _tiny(tmp_path, seconds_per_batch=0.01)
    got = mlperf.measure_threads(spec, 2, "warm")
    figures = aggregate(got["ranks"], 90.0)
    by_hand = []
    for [epoch] in got["ranks"]:
        seconds = [s["seconds"] for s in epoch["steps"]]
        by_hand.append(100 * 0.01 * (len(seconds) - 1) / (sum(seconds) - seconds[0]))
        assert epoch["au_pct"] == pytest.approx(by_hand[-1])
        assert all(s["slept"] >= 0.01 for s in epoch["steps"])  # the sleep happened, at least as long
    assert figures["au_pct"] == pytest.approx(sum(by_hand) / 2)


def test_default_tiers_leave_warm_out_where_a_warm_run_could_not_be_warm():
    assert mlperf.choose_tiers(None, 10, 20, "buffered") == (["cold", "warm"], "cold, warm")
    tiers, note = mlperf.choose_tiers(None, 30, 20, "buffered")
    assert tiers == ["cold"] and "outgrows the page cache" in note
    tiers, note = mlperf.choose_tiers(None, 10, 20, "direct")
    assert tiers == ["cold"] and "direct reads around the page cache" in note
    assert mlperf.choose_tiers("warm,cold", 30, 20, "direct")[0] == ["cold", "warm"]  # asked for: run as asked
    with pytest.raises(ValueError, match="unknown hot"):
        mlperf.choose_tiers("hot", 10, 20, "buffered")


def test_too_little_data_for_two_steps_is_refused_in_one_line(tmp_path):
    spec = _tiny(tmp_path, files=1, per_file=4)
    with pytest.raises(ValueError, match="MLPerf's AU needs at least 2"):
        mlperf.measure_threads(spec, 1, "warm")


def test_cli_generates_searches_and_reports(tmp_path, capsys):
    out = tmp_path / "r.json"
    data = tmp_path / "data"
    status = bench_main(["mlperf", "--data", str(data), "--generate", "--files", "2", "--records-per-file", "16",
                         "--batch-size", "4", "--launch", "threads", "--max-accelerators", "2", "--tiers", "warm",
                         "--quiet", "--json", str(out), "--markdown", str(tmp_path / "r.md")])
    assert status == 0
    assert len(train_files(str(data))) == 2
    text = capsys.readouterr().out
    for words in ("resnet50_h100: batch 4", "scaled from 0.224 s per 400", "one thread per emulated accelerator",
                  "as DLIO 2.0.0's TensorFlow reader deals them",
                  "MLPerf's rule", "load average", "AU % (MLPerf)", "warm: "):
        assert words in text
    doc = json.loads(out.read_text())
    found = doc["tiers"]["warm"]
    assert found["tried"][:1] == [1] and set(found["runs"]) <= {"1", "2"}
    first = found["runs"]["1"]
    assert first["samples_per_s"] > 0 and first["mib_per_s"] > 0 and first["au_pct"] is not None
    assert doc["config"]["records"] == 32 and doc["workload"]["batch_size"] == 4
    assert "| accelerators |" in (tmp_path / "r.md").read_text()
