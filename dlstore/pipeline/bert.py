"""The BERT pretraining pipeline: seven ``tf.train.Example`` features parsed in C++ into fixed-shape batches.

The features are those of ``create_pretraining_data.py`` (and :func:`dlstore.synthetic.generate_bert`):
``input_ids``, ``input_mask``, ``segment_ids`` (``seq_len`` values each), ``masked_lm_positions``,
``masked_lm_ids`` (``max_predictions`` each), ``masked_lm_weights`` (``max_predictions`` floats) and
``next_sentence_labels`` (one value). Each run of records is one call of the C++ Example parser
(:func:`dlstore.formats.example.parse_batch`'s backend), which writes straight into the rows of the
loader's reused arrays with the GIL released: no per-record Python, no intermediate arrays.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import numpy as np

from dlstore.pipeline.loader import Loader
from dlstore.sources.dataset import dataset_for
from dlstore.pipeline.stages import Field, Pipeline, PipelineRun, naming_missing_features

__all__ = ["Bert", "bert_loader", "BERT_PRESETS"]

#: ``seq_len -> max_predictions`` of the usual presets (MLPerf-style 128/20 and 384/60).
BERT_PRESETS = {128: 20, 384: 60}

_INT_DTYPES = {"int64": np.int64, "int32": np.int32}


class Bert(Pipeline):
    """BERT pretraining features as fixed-shape batch arrays.

    Parameters
    ----------
    seq_len : int, optional
        Sequence length: 128 and 384 are the presets; any length of at least 1 works.
    max_predictions : int, optional
        Masked-LM slots per sample; default from :data:`BERT_PRESETS` (20 for 128, 60 for 384),
        required for other lengths.
    dtype : {"int64", "int32"}, optional
        Integer features' dtype (``masked_lm_weights`` is always float32). int32 halves the
        bytes a batch holds and moves to the accelerator; each value is checked to fit.
    features : mapping, optional
        Output name -> the ``tf.train.Example`` feature it is read from, for records whose features
        are named otherwise (e.g. ``{"next_sentence_labels": "nsp_label"}``); outputs not named keep
        their own name, as ``create_pretraining_data.py`` writes them. A record lacking features is
        reported with every feature it lacks.

    Raises
    ------
    ValueError
        For a length or count below 1, a ``seq_len`` without preset and no ``max_predictions``,
        or another dtype.

    Notes
    -----
    Every record must hold each feature with exactly the stated number of values, as TensorFlow's
    ``FixedLenFeature`` requires; a record that does not is reported with its file, offset and
    feature (or skipped, by the loader's ``on_error``).
    """

    name = "bert"
    formats = ("tfrecord",)

    def __init__(self, seq_len: int = 128, max_predictions: Optional[int] = None, dtype: str = "int64",
                 features: Optional[Mapping[str, str]] = None):
        seq_len = int(seq_len)
        if seq_len < 1:
            raise ValueError(f"seq_len must be at least 1, got {seq_len}")
        if max_predictions is None:
            if seq_len not in BERT_PRESETS:
                raise ValueError(f"no max_predictions preset for seq_len {seq_len} "
                                 f"(presets: {BERT_PRESETS}); pass max_predictions")
            max_predictions = BERT_PRESETS[seq_len]
        if int(max_predictions) < 1:
            raise ValueError(f"max_predictions must be at least 1, got {max_predictions}")
        if dtype not in _INT_DTYPES:
            raise ValueError(f"dtype must be 'int64' or 'int32', got {dtype!r}")
        self.seq_len = seq_len
        self.max_predictions = int(max_predictions)
        self.dtype = dtype
        unknown = sorted(set(features or {}) - set(self.fields()))
        if unknown:
            raise ValueError(f"features: {unknown} are not outputs of the BERT pipeline ({sorted(self.fields())})")
        #: Output name -> the feature it is read from.
        self.features = {name: str((features or {}).get(name, name)) for name in self.fields()}

    def fields(self) -> Dict[str, Field]:
        ints = np.dtype(_INT_DTYPES[self.dtype])
        seq, pred = (self.seq_len,), (self.max_predictions,)
        return {
            "input_ids": (seq, ints),
            "input_mask": (seq, ints),
            "segment_ids": (seq, ints),
            "masked_lm_positions": (pred, ints),
            "masked_lm_ids": (pred, ints),
            "masked_lm_weights": (pred, np.dtype(np.float32)),
            "next_sentence_labels": ((1,), ints),
        }

    def default_threads(self) -> int:
        # Parsing a batch into reused arrays is fast enough that splitting a batch of 64 over a
        # pool costs more in hand-offs than it saves; the loader's own thread already overlaps
        # parsing with the consumer.
        return 1

    def bind(self, *, format: str, seed: int, threads: int) -> PipelineRun:
        from dlstore import _C

        self.check_format(format)
        names = self.features
        spec = [(names[name], np.dtype(dtype).name, int(np.prod(shape)), None)
                for name, (shape, dtype) in self.fields().items()]
        parse = _C.parse_example_batch
        renamed = any(feature != name for name, feature in names.items())

        def run(buffer: Any, offsets: np.ndarray, lengths: np.ndarray, out: Dict[str, np.ndarray], row: int,
                epoch: int, position: int) -> None:
            arrays = {feature: out[k] for k, feature in names.items()} if renamed else out
            parse(buffer, offsets, lengths, spec, arrays, row, threads)

        return naming_missing_features(run, names, "Bert(features={output: feature name}) or "
                                                   "bert_loader(..., features=...)")

    def describe(self) -> Dict[str, Any]:
        return {"pipeline": self.name, "seq_len": self.seq_len, "max_predictions": self.max_predictions,
                "parser": "C++ tf.train.Example parser into reused arrays"}

    def __repr__(self) -> str:
        return f"Bert(seq_len={self.seq_len}, max_predictions={self.max_predictions}, dtype={self.dtype!r})"


def bert_loader(source: Any, batch_size: int = 64, seq_len: int = 128, io: Optional[str] = None,
                prefetch: int = 2, *, max_predictions: Optional[int] = None, dtype: str = "int64",
                features: Optional[Mapping[str, str]] = None, **kw: Any):
    """A :class:`~dlstore.pipeline.Loader` of BERT pretraining batches from TFRecord files.

    Parameters
    ----------
    source : Source, or str, path-like or sequence of them
        A :class:`~dlstore.Dataset` or :func:`~dlstore.open_records` reader; or files, globs or
        directories, read through a :class:`~dlstore.Dataset` of this rank's share (rank and size
        from the launcher), shuffled (``shuffle="block"`` unless given).
    batch_size, prefetch : int, optional
    seq_len, max_predictions, dtype, features : optional
        See :class:`Bert`.
    io : str, optional
        I/O engine (``auto`` by default, resolved and reported in ``loader.stats()``).
    **kw
        For the Dataset made from paths: ``shuffle``, ``remainder``, ``buffer_size``, ``world``,
        ``mounts``..., and :class:`~dlstore.ReadOptions` (``verify``, ``chunk_size``...);
        :class:`Loader` arguments (``last_batch``, ``threads``, ``seed``, ``epochs``, ``copy``,
        ``allocator``, ``device``: batches are parsed on the host, then copied to that GPU); ``seed`` and
        ``on_error`` go to both.

    Returns
    -------
    Loader

    Examples
    --------
    >>> loader = bert_loader("/data/bert/part-*", batch_size=64, seq_len=128)   # doctest: +SKIP
    >>> next(iter(loader))["input_ids"].shape                                    # doctest: +SKIP
    (64, 128)
    """

    if io is not None:
        kw["io"] = io
    device = kw.pop("device", None)  # the loader's: records are parsed on the host, each batch then copied there
    source = dataset_for(source, kw, shared=("seed", "on_error"), rest=True, shuffle="block")
    return Loader(source, Bert(seq_len, max_predictions, dtype, features), batch_size, prefetch=prefetch,
                  device=device, **kw)
