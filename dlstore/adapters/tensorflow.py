"""TensorFlow adapter: a dlstore loader as a ``tf.data.Dataset`` with a proper ``element_spec``.

``import dlstore.adapters.tensorflow`` does not import TensorFlow; :func:`as_tf_dataset` does.

Examples
--------
>>> from dlstore.adapters.tensorflow import as_tf_dataset          # doctest: +SKIP
>>> from dlstore.pipeline import resnet50_loader                   # doctest: +SKIP
>>> ds = as_tf_dataset(resnet50_loader("/data/train-*", batch_size=256))   # doctest: +SKIP
>>> ds.element_spec["image"]                                       # doctest: +SKIP
TensorSpec(shape=(256, 224, 224, 3), dtype=tf.uint8, name='image')
>>> model.fit(ds.map(lambda b: (b["image"], b["label"])), epochs=1)        # doctest: +SKIP
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np

from dlstore.adapters.base import BatchAdapter, import_framework
from dlstore.errors import DlstoreError

__all__ = ["as_tf_dataset", "TensorFlowAdapter", "trained_state"]

_INSTALL = "pip install tensorflow (or tensorflow-cpu)"


def _tf():
    return import_framework("tensorflow", _INSTALL)


class TensorFlowAdapter(BatchAdapter):
    """A :class:`dlstore.pipeline.Loader` seen by TensorFlow; :meth:`dataset` makes the ``tf.data.Dataset``.

    The loader's batches become the dataset's elements (a dict of tensors per batch) with no
    per-sample work. Each array is copied once, unless the loader yields owned arrays already
    (``Loader(..., copy=True)``): ``from_generator`` may keep a yielded array's memory as the
    tensor's instead of copying it (seen with the loader's buffers: held elements changed as the
    loader reused them), and elements are held downstream (``prefetch``, ``shuffle``) longer
    than the loader keeps a buffer. The tests hold every element of an epoch to check this.

    Parameters
    ----------
    loader : dlstore.pipeline.Loader
    copy : bool, optional
        Force (True) or skip (False) the copy; default: copy unless ``loader.copy`` is true.

    Raises
    ------
    DlstoreError
        For a loader that yields on a GPU (``Loader(..., device="cuda:N")``): not built for TensorFlow.
    """

    def __init__(self, loader, copy: Optional[bool] = None):
        device = getattr(loader, "device", None)
        if device is not None:
            raise DlstoreError(f"as_tf_dataset: the loader yields its batches on {device} (CuPy arrays); "
                               f"TensorFlow GPU batches are not built: make the Loader without device= (TensorFlow "
                               f"copies host batches to the GPU itself)")
        super().__init__(loader)
        self._tf = _tf()
        self.copy = (not getattr(loader, "copy", False)) if copy is None else bool(copy)

    def convert(self, name: str, array: np.ndarray) -> np.ndarray:
        return np.array(array, copy=True) if self.copy else array

    def convert_spec(self, name: str, shape: Tuple[Optional[int], ...], dtype: np.dtype):
        return self._tf.TensorSpec(shape=shape, dtype=self._tf.as_dtype(dtype), name=name)

    def cardinality(self) -> Optional[int]:
        """Elements one pass yields, when known: the loader's :meth:`~dlstore.pipeline.Loader.batches_per_epoch`
        times its ``epochs``, from the start of an epoch; else None."""
        per_epoch = self.loader.batches_per_epoch()
        epochs = getattr(self.loader, "epochs", None)
        if per_epoch is None or epochs is None or self.loader.state_dict()["sample_in_epoch"]:
            return None
        return per_epoch * epochs

    def dataset(self):
        """The ``tf.data.Dataset``: one element per loader batch; each iteration is a new pass of the loader.

        Its cardinality is :meth:`cardinality` when known (so that Keras knows an epoch's steps),
        else unknown.

        :meth:`state_dict` is exact for a loop that iterates this dataset, with what it adds that does
        not read ahead (a sequential ``map``, ``batch``...): tf.data's own injected prefetch is turned
        off. A ``prefetch``, a ``shuffle`` or a ``map(num_parallel_calls=...)`` added downstream holds
        elements the loop has not consumed yet, and a state saved then is ahead of the loop by them: leave
        them out of a pipeline that resumes mid-epoch (the loader reads ahead on its own threads already).
        Keras ``fit`` draws ahead too: save :func:`trained_state`'s state there.
        """
        known = self.cardinality()

        def generate() -> Iterator[Dict[str, Any]]:
            at = self.loader.state_dict()
            if known is not None and at["sample_in_epoch"]:
                # tf.data would fail the pass at its end, in a message about its own assertion.
                raise DlstoreError(
                    f"this tf.data.Dataset counts {known} batches from the start of an epoch, but its loader is at "
                    f"sample {at['sample_in_epoch']} of epoch {at['epoch']} (an earlier pass stopped early, e.g. a "
                    f"take() or a peek at a batch, which the loader counts as used): make the dataset again with "
                    f"as_tf_dataset(loader) for the rest of the epoch, or load the state saved before the peek")
            yield from self

        ds = self._tf.data.Dataset.from_generator(generate, output_signature=self.element_spec)
        # tf.data injects a prefetch at a pipeline's end: it would draw batches from the loader ahead of
        # the training loop, and a state_dict() saved in the loop would be ahead of what it consumed.
        # The loader prefetches already (its own threads), and counts only what the loop drew.
        options = self._tf.data.Options()
        if hasattr(options.experimental_optimization, "inject_prefetch"):
            options.experimental_optimization.inject_prefetch = False
        ds = ds.with_options(options)
        return ds if known is None else ds.apply(self._tf.data.experimental.assert_cardinality(known))


_TRAINED_STATE = None  # the callback class, made on first use (it subclasses Keras's Callback)


def trained_state(loader):
    """A Keras callback that knows the loader state of the batches ``fit`` has trained on.

    Keras ``fit`` draws batches ahead of its training step (its iterator prefetches one or two), so
    ``loader.state_dict()`` read in a callback is ahead of the steps run, and a run resumed from it
    never trains the batches in between. This callback counts the training steps ``fit`` ran (the
    optimizer's ``iterations``, which also counts the steps of a short last ``steps_per_execution``
    group; the ``batch`` numbers Keras passes to callbacks meant the group's first step in some Keras 3
    releases and its last in others) and its :meth:`state_dict` is
    ``loader.state_after(batches handed out before fit + steps run)``, leaving out what the same loader
    handed to a validation pass (``validation_data`` made from it: ``on_test_begin`` to ``on_test_end``).
    It is exact as long as each step takes the dataset's next batch: no ``shuffle``/``prefetch`` that
    holds or reorders batches added downstream, no ``steps_per_epoch`` that leaves a pass's prefetched
    batches behind, and no other reader of the loader while ``fit`` trains.

    Parameters
    ----------
    loader : dlstore.pipeline.Loader or TensorFlowAdapter
        What the dataset passed to ``fit`` was made from (:func:`as_tf_dataset`).

    Example
    -------
    ::

        progress = trained_state(loader)
        model.fit(as_tf_dataset(loader), epochs=2, callbacks=[progress, MyCheckpoint(progress)])
        # in MyCheckpoint.on_train_batch_end (after progress in the list): save progress.state_dict()
    """
    global _TRAINED_STATE
    if _TRAINED_STATE is None:
        class TrainedState(_tf().keras.callbacks.Callback):
            def __init__(self, loader):
                super().__init__()
                self.loader = getattr(loader, "loader", loader)  # an adapter's loader
                self.handed_before = self.loader.batches_handed
                self.iterations_before = 0
                self.steps = 0  # training steps run since fit began
                self.testing_from: Optional[int] = None

            def _iterations(self) -> int:
                return int(self.model.optimizer.iterations.numpy())

            def on_train_begin(self, logs=None):
                self.handed_before = self.loader.batches_handed  # fit has drawn nothing for this run yet
                self.iterations_before = self._iterations()
                self.steps = 0

            def on_train_batch_end(self, batch, logs=None):
                # Never more than the loader handed out (fit's last group may run short of data).
                handed = self.loader.batches_handed - self.handed_before
                self.steps = min(self._iterations() - self.iterations_before, handed)

            def on_test_begin(self, logs=None):
                self.testing_from = self.loader.batches_handed

            def on_test_end(self, logs=None):
                if self.testing_from is not None:  # batches of a validation pass over the same loader
                    self.handed_before += self.loader.batches_handed - self.testing_from
                self.testing_from = None

            def state_dict(self) -> Dict[str, Any]:
                """The loader's state after the batches the steps run so far trained on."""
                return self.loader.state_after(self.handed_before + self.steps)

        _TRAINED_STATE = TrainedState
    return _TRAINED_STATE(loader)


def as_tf_dataset(loader, *, copy: Optional[bool] = None):
    """A ``tf.data.Dataset`` over a dlstore loader's batches.

    Parameters
    ----------
    loader : dlstore.pipeline.Loader
        E.g. :func:`dlstore.pipeline.resnet50_loader` or :func:`dlstore.pipeline.bert_loader`.
    copy : bool, optional
        See :class:`TensorFlowAdapter`.

    Returns
    -------
    tf.data.Dataset
        Elements are dicts name -> tensor, one per batch; ``ds.cardinality()`` is the number of
        batches of the loader's epochs when it is known (a :class:`~dlstore.Dataset` source, no
        ``on_error`` skipping; else unknown); ``element_spec`` is a dict of ``tf.TensorSpec`` whose
        first dimension is the batch size, or ``None`` when the loader's last batch may be
        smaller (``last_batch="PARTIAL"``), with the loader's dtypes (``uint8`` or ``float32``
        images, ``int64`` labels and BERT ids, ``float32`` weights).
    """
    return TensorFlowAdapter(loader, copy=copy).dataset()
