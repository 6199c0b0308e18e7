"""Wrappers of a Source pass for one on every Python: Python 3.12's isinstance on a runtime protocol
looks members up statically (``inspect.getattr_static``), past ``__getattr__``."""
import inspect

import pytest

import dlstore
from dlstore import TFRecordWriter
from dlstore.bench.mlperf import _RepeatedEpoch
from dlstore.bench.steps import CountingSource
from dlstore.pipeline import Bert, Loader
from dlstore.sources.source import Source, SourceWrapper

PROTOCOL = ("format", "engine", "engine_reason", "num_batches", "batches", "set_epoch", "use_batch_size",
            "state_dict", "load_state_dict", "stats")


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "a.tfrecord"
    with TFRecordWriter(str(path)) as w:
        for i in range(10):
            w.write(b"r%d" % i)
    return dlstore.Dataset([str(path)], batch_size=4, shuffle="none", io="buffered")


@pytest.mark.parametrize("make", [SourceWrapper, CountingSource, lambda d: _RepeatedEpoch(d, 0)],
                         ids=["SourceWrapper", "CountingSource", "_RepeatedEpoch"])
def test_every_protocol_member_is_found_statically(make, dataset):
    wrapper = make(dataset)
    missing = [m for m in PROTOCOL if inspect.getattr_static(wrapper, m, None) is None]
    assert not missing, f"{type(wrapper).__name__} reaches {missing} only through __getattr__"
    assert isinstance(wrapper, Source)
    assert (wrapper.format, wrapper.engine, wrapper.num_batches) == (dataset.format, dataset.engine,
                                                                      dataset.num_batches)


def test_protocol_list_is_the_protocols():
    declared = {n for n in vars(Source) if not n.startswith("_")} | set(Source.__annotations__)
    assert declared == set(PROTOCOL)


def test_counting_source_counts_and_a_loader_takes_it(dataset):
    want = [(b.num_records, b.nbytes) for b in dataset.batches()]
    dataset.set_epoch(0)
    source = CountingSource(dataset)
    Loader(source, Bert(seq_len=128), batch_size=4).close()  # refused on Python 3.12 before SourceWrapper
    for _ in source.batches():
        pass
    assert (source.records, source.bytes) == tuple(map(sum, zip(*want)))
    assert source.records >= 10


def test_repeated_epoch_keeps_its_epoch(dataset):
    source = _RepeatedEpoch(dataset, 3)
    source.set_epoch(0)
    assert dataset.state_dict()["epoch"] == 3


def test_a_wrapper_reaching_the_protocol_through_getattr_alone_is_refused_and_told_what_to_use(dataset):
    class Forwarding:
        def __init__(self, source):
            self._source = source

        def __getattr__(self, name):
            return getattr(self._source, name)

    wrapper = Forwarding(dataset)
    if isinstance(wrapper, Source):  # Python < 3.12 finds members through __getattr__
        pytest.skip("this Python's isinstance reaches members through __getattr__")
    with pytest.raises(TypeError, match="SourceWrapper"):
        Loader(wrapper, Bert(seq_len=128), batch_size=4)


def test_a_wrapper_has_its_sources_length_and_a_loader_says_why_no_batch(dataset):
    """len() of a wrapper is its source's (len looks dunders up on the class, past __getattr__): a Loader
    over a wrapped Dataset too short for one batch failed with "object of type 'CountingSource' has no
    len()" instead of saying so."""
    assert len(CountingSource(dataset)) == len(dataset) == 12  # remainder pad: 10 records in batches of 4
    with pytest.raises(dlstore.DlstoreError, match="yields no batch"):
        list(Loader(CountingSource(dataset), Bert(8, 2), 16, last_batch="DROP"))
    with pytest.raises(TypeError):
        len(SourceWrapper(iter(())))  # a source without a length: still none
