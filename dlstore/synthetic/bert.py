"""BERT pretraining records: ``tf.train.Example`` records with the seven features of
``create_pretraining_data.py``, their layout and their value ranges.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from dlstore.formats.example import encode_example
from dlstore.synthetic.shards import check_counts, write_shards

SHARD_PREFIX = "part"  # shards are SHARD_PREFIX-00000-of-NNNNN

__all__ = ["generate_bert", "VOCAB_SIZE", "PAD_ID", "CLS_ID", "SEP_ID", "MASK_ID"]

# bert-base-uncased vocabulary: [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103, single
# characters from 999, whole words and pieces from 1996 ("the") to 30521.
VOCAB_SIZE = 30522
PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 101, 102, 103
_FIRST_WORD_ID = 1996
_PUNCTUATION_IDS = np.array([1010, 1012, 1005, 1011, 1025, 1029], dtype=np.int64)  # , . ' - ; ?
_MASKED_LM_PROB = 0.15
_SHORT_SEQ_PROB = 0.1
_BERT_TASK = 256


def _wordpieces(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` token ids with a Zipf-like word frequency and some punctuation."""
    ranks = rng.zipf(1.15, n) - 1
    ids = _FIRST_WORD_ID + ranks % (VOCAB_SIZE - _FIRST_WORD_ID)
    punct = rng.random(n) < 0.08
    ids[punct] = _PUNCTUATION_IDS[rng.integers(0, len(_PUNCTUATION_IDS), int(punct.sum()))]
    return ids.astype(np.int64)


def _bert_features(seed: int, index: int, seq_len: int, max_predictions: int) -> Dict[str, np.ndarray]:
    """Record ``index``: ``[CLS] A [SEP] B [SEP]`` then zero padding, with 15% of the tokens masked.

    As ``create_pretraining_data.py`` makes them: most sequences are nearly full (sentences end
    before the limit), one in ten is short; masked positions avoid [CLS]/[SEP], are sorted, and are
    replaced by [MASK] 80% of the time, a random token 10%, left as they were 10%.
    """
    rng = np.random.default_rng([seed, index])
    if rng.random() < _SHORT_SEQ_PROB:
        length = int(rng.integers(5, seq_len + 1))
    else:
        length = seq_len - int(rng.integers(0, seq_len // 8 + 1))
    length = max(length, 5)
    pieces = length - 3
    len_a = int(rng.integers(1, pieces))
    words = _wordpieces(rng, pieces)
    words[len_a - 1] = words[-1] = 1012  # each segment ends a sentence

    input_ids = np.zeros(seq_len, np.int64)
    input_ids[0] = CLS_ID
    input_ids[1:1 + len_a] = words[:len_a]
    input_ids[1 + len_a] = SEP_ID
    input_ids[2 + len_a:length - 1] = words[len_a:]
    input_ids[length - 1] = SEP_ID
    input_mask = np.zeros(seq_len, np.int64)
    input_mask[:length] = 1
    segment_ids = np.zeros(seq_len, np.int64)
    segment_ids[2 + len_a:length] = 1

    predictions = min(max_predictions, max(1, int(round(pieces * _MASKED_LM_PROB))))
    candidates = np.concatenate([np.arange(1, 1 + len_a), np.arange(2 + len_a, length - 1)])
    positions = np.sort(rng.choice(candidates, predictions, replace=False))
    originals = input_ids[positions].copy()
    fate = rng.random(predictions)
    random_tokens = rng.integers(999, VOCAB_SIZE, predictions)
    input_ids[positions] = np.where(fate < 0.8, MASK_ID, np.where(fate < 0.9, random_tokens, originals))

    masked_lm_positions = np.zeros(max_predictions, np.int64)
    masked_lm_positions[:predictions] = positions
    masked_lm_ids = np.zeros(max_predictions, np.int64)
    masked_lm_ids[:predictions] = originals
    masked_lm_weights = np.zeros(max_predictions, np.float32)
    masked_lm_weights[:predictions] = 1.0
    return {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "masked_lm_positions": masked_lm_positions,
        "masked_lm_ids": masked_lm_ids,
        "masked_lm_weights": masked_lm_weights,
        "next_sentence_labels": np.array([rng.integers(0, 2)], np.int64),
    }


def _bert_payloads(task: Tuple[int, int, int, int, int]) -> List[bytes]:
    """Serialized records ``start..stop-1`` (runs in a worker process)."""
    seed, start, stop, seq_len, max_predictions = task
    return [encode_example(_bert_features(seed, i, seq_len, max_predictions)) for i in range(start, stop)]


def generate_bert(out_dir, *, shards: int, records_per_shard: int, seed: int = 0, seq_len: int = 128,
                  max_predictions: Optional[int] = None, copies: int = 1, progress: bool = True,
                  workers: Optional[int] = None) -> List[str]:
    """Writes BERT pretraining records (``tf.train.Example``) in TFRecord shards.

    Each record has the seven features of ``create_pretraining_data.py``: ``input_ids``,
    ``input_mask``, ``segment_ids`` (``seq_len`` int64 each; ``[CLS] A [SEP] B [SEP]`` then zero
    padding, vocabulary of 30,522 as bert-base-uncased), ``masked_lm_positions``,
    ``masked_lm_ids`` (``max_predictions`` int64, zero padded), ``masked_lm_weights``
    (``max_predictions`` float, 1.0 for real predictions) and ``next_sentence_labels`` (one int64).

    Parameters
    ----------
    out_dir : str or path-like
        Created if missing. Shards are named ``part-00000-of-00500`` as in MLPerf's BERT set.
    shards, records_per_shard : int
        The set holds ``shards * records_per_shard`` records.
    seed : int, optional
        Non-negative; record ``i`` depends only on ``(seed, i)``.
    seq_len : int, optional
        Sequence length; 128 and 384 are the usual presets. At least 8.
    max_predictions : int, optional
        Masked-LM slots per record; default: the preset of ``seq_len``
        (:data:`dlstore.pipeline.bert.BERT_PRESETS`: 20 at 128, 60 at 384), which the BERT pipeline
        expects of that length. A length without preset needs it.
    copies : int, optional
        Write the ``shards`` shards this many times, as ``shards * copies`` files (copy ``c`` of
        shard ``s`` is file ``c * shards + s``): a set large enough to time, at the cost of encoding
        ``shards * records_per_shard`` records only (encoding a record costs far more than parsing
        it). Reading costs the same whatever the content, and the Dell EMC Isilon reference
        architecture expanded ImageNet by copies too.
    progress : bool, optional
        Show a progress bar on stderr (only when it is a terminal).
    workers : int, optional
        Encoding processes, as for :func:`generate_imagenet`.

    Returns
    -------
    list of str
        The shard paths, in order.
    """
    check_counts(shards, records_per_shard, seed)
    if int(seq_len) < 8:
        raise ValueError(f"seq_len must be at least 8, got {seq_len}")
    if max_predictions is None:
        from dlstore.pipeline.bert import BERT_PRESETS  # what the pipeline expects at this length

        if int(seq_len) not in BERT_PRESETS:
            raise ValueError(f"no max_predictions preset for seq_len {seq_len} (presets: {BERT_PRESETS}); "
                             f"pass max_predictions")
        max_predictions = BERT_PRESETS[int(seq_len)]
    if int(max_predictions) < 1:
        raise ValueError(f"max_predictions must be at least 1, got {max_predictions}")

    def task(start: int, stop: int):
        return (seed, start, stop, int(seq_len), int(max_predictions))

    return write_shards(out_dir, SHARD_PREFIX, shards, records_per_shard, "tfrecord", _bert_payloads, task,
                         _BERT_TASK, workers, progress, "bert", copies=copies)
