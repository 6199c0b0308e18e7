"""DALI adapter: dlstore reads the records, DALI decodes (nvJPEG on a GPU, libjpeg-turbo on the CPU).

dlstore's C++ reader reads and checks the TFRecord or RecordIO shards (any engine, any mount, the
rank's share); :class:`EncodedSamples` has each record's ``image/encoded`` bytes located inside the
``tf.train.Example`` in C++ (:func:`dlstore.formats.example.bytes_feature_spans`), or the image after a
RecordIO record's ``IRHeader``, without copying them, and hands them with the labels (parsed in C++, or
the header's) to ``fn.external_source`` in batch mode.
:func:`dali_pipeline` builds the usual ResNet-50 graph behind it: ``decoders.image_random_crop``
(``mixed`` device when a GPU exists, else ``cpu``), ``resize``, ``crop_mirror_normalize``.

``import dlstore.adapters.dali`` does not import DALI; :func:`dali_pipeline` does.

Examples
--------
>>> from dlstore.adapters.dali import dali_pipeline                 # doctest: +SKIP
>>> pipe = dali_pipeline("/data/train-*", batch_size=256)           # doctest: +SKIP
>>> images, labels = pipe.run()                                     # doctest: +SKIP

With the PyTorch plugin, an epoch ends where the rank's records end::

    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    it = DALIGenericIterator(pipe, ["image", "label"], last_batch_policy=LastBatchPolicy.PARTIAL)
"""
from __future__ import annotations

import collections
import operator
from typing import Any, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from dlstore._args import whole
from dlstore.adapters.base import LastBatch, check_last_batch, current_world, import_framework
from dlstore.sources.dataset import dataset_for
from dlstore.errors import DlstoreError
from dlstore.formats.example import bytes_feature_spans, parse_batch
from dlstore.io.system import available_cores
from dlstore.pipeline.decode import IMAGENET_MEAN, IMAGENET_STD, check_eval_resize
from dlstore.pipeline.resnet50 import recordio_labels
from dlstore.sources.source import loaded_point, start_at, state_at

__all__ = ["dali_pipeline", "EncodedSamples"]

_RECENT_STATES = 256  # states EncodedSamples.state_after keeps: well beyond DALI's prefetch queue

_INSTALL = "pip install nvidia-dali-cuda130 (or the build for your CUDA), see https://docs.nvidia.com/deeplearning/dali"


def _record_error(error: DlstoreError, batch: Any) -> DlstoreError:
    """``error`` about record ``k`` of ``batch`` again, naming the file and the record's byte offset in it;
    ``error`` itself when it is not about one record of the batch."""
    if error.record is None or not 0 <= error.record < batch.num_records:
        return error
    k = error.record
    path, offset = batch.path(k), int(batch.file_offsets[k])
    return type(error)(f"{path}: record at byte {offset}: {error.reason}", path=path, offset=offset,
                       errno=error.errno, reason=error.reason)


# ---- the external_source feed ------------------------------------------------------------------------


class EncodedSamples:
    """Batches of ``(encoded images, labels)`` from dlstore, for ``fn.external_source(batch=True)``.

    Iterating it gives one epoch: lists of uint8 arrays (each a view of one record's image bytes
    in the reader's chunk, no copy) and an int64 label array of the same length. A new iteration
    is the next epoch (the source is set to it first, as the Loader does: a new order under a
    shuffle), which is what ``cycle="raise"`` asks of a source. The last ``keep`` batches handed out
    are referenced here, so DALI may use them without a copy (``no_copy=True``) until its prefetch
    queue has moved past them.

    :meth:`state_dict` says what it has handed out (``epoch``, ``sample_in_epoch``); DALI asks for batches
    ahead of what ``pipe.run()`` returned, so a checkpoint takes :meth:`state_after` of the runs made, the
    state after exactly the batches they returned. A source resumed on its own
    (``source.load_state_dict(state)``, before or after the feed was made) resumes the feed there, as
    :meth:`load_state_dict` of that point does (:func:`~dlstore.sources.source.loaded_point`).

    Parameters
    ----------
    source : Source
        This consumer's records: a :class:`~dlstore.Dataset` (batches of ``batch_size`` records) or
        :func:`~dlstore.open_records`.
    batch_size : int
    last_batch : {"PARTIAL", "DROP", "FILL"}
        ``FILL`` completes the last batch by repeating the epoch's last sample.
    image_key, label_key : str
        The bytes feature with the encoded image and the int64 feature with the label (TFRecord
        Examples; a RecordIO record is an ``IRHeader`` with the label, then the image).
    label_offset : int
        Added to each label (``-1`` turns ImageNet's 1..1000 into 0..999).
    keep : int
        Batches kept referenced after being handed out (at least DALI's prefetch depth + 1).
    """

    def __init__(self, source: Any, batch_size: int, *, last_batch: str = LastBatch.PARTIAL,
                 image_key: str = "image/encoded", label_key: str = "image/class/label", label_offset: int = 0,
                 keep: int = 4):
        self.source = source
        self.batch_size = whole("batch_size", batch_size, 1)
        self.last_batch = check_last_batch(last_batch)
        self.image_key, self.label_key = image_key, label_key
        self.label_spec = {label_key: (np.int64, 1)}
        self.label_offset = int(label_offset)
        self._epoch = 0
        self._position = 0  # the source's records of `_epoch` consumed: handed out, and skipped as corrupt
        self._delivered = 0       # samples handed out (padding not counted), on the scale of _chunk_ends
        self._chunk_ends: collections.deque = collections.deque()  # (delivered, source position) at chunk ends
        self._handed_out = collections.deque(maxlen=max(1, int(keep)))
        self._own_load = False  # load_state_dict ran since the last iteration started
        #: Batches handed to DALI since this feed was made.
        self.batches_handed = 0
        self._recent: collections.deque = collections.deque([(0, 0, 0)], maxlen=_RECENT_STATES)

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        self._take_resume_point()
        return self._epoch

    @property
    def sample_in_epoch(self) -> int:
        """The source's records of :attr:`epoch` consumed: handed out, and skipped as corrupt."""
        self._take_resume_point()
        return self._position

    def state_dict(self) -> dict:
        """``epoch``, ``sample_in_epoch`` and the source's state: where the next iteration starts."""
        self._take_resume_point()
        return {"epoch": self._epoch, "sample_in_epoch": self._position,
                "source": state_at(self.source, self._epoch, self._position)}

    def state_after(self, batches: int) -> dict:
        """The state after the first ``batches`` batches this feed handed out (:attr:`batches_handed`), to save
        with the training step that used them: pass how many batches ``pipe.run()`` has returned. DALI asks
        the feed ahead of its runs (its prefetch queue), so :meth:`state_dict` between runs is ahead of them.
        After an epoch's last batch, the next epoch's start.

        Raises
        ------
        ValueError
            For a count not among the last 256 handed out, or before the last :meth:`load_state_dict`.
        """
        for count, epoch, position in reversed(self._recent):
            if count == int(batches):
                length = len(self.source) if hasattr(self.source, "__len__") else None
                if length is not None and position >= length:
                    epoch, position = epoch + 1, 0
                return {"epoch": epoch, "sample_in_epoch": position, "source": state_at(self.source, epoch, position)}
        raise ValueError(f"no state after {batches} batches: this feed has handed out {self.batches_handed} and keeps "
                         f"the states of the last {self._recent.maxlen} (from {self._recent[0][0]}, where it was made "
                         f"or last loaded)")

    def load_state_dict(self, state: dict) -> None:
        """Resumes at a :meth:`state_dict`: the next iteration goes on from there.

        Raises
        ------
        ValueError
            ``state`` is not one :meth:`state_dict` gives (the feed's position is unchanged); what the source
            refuses (another dataset, order or seed) raises as the source does, also leaving it unchanged.
        """
        keys = ("epoch", "sample_in_epoch")
        if not isinstance(state, Mapping) or any(k not in state for k in keys):
            raise ValueError(f"not a DALI feed state: {state!r:.80} (feed.state_dict() gives one: epoch, "
                             f"sample_in_epoch, source)")
        try:
            epoch, position = (operator.index(state[k]) for k in keys)
        except TypeError:
            raise ValueError(f"not a DALI feed state: its epoch and sample_in_epoch must be integers, not "
                             f"{state['epoch']!r} and {state['sample_in_epoch']!r}") from None
        if epoch < 0 or position < 0:
            raise ValueError(f"not a DALI feed state: epoch {epoch} and sample_in_epoch {position} must be "
                             f"non-negative")
        self.source.load_state_dict(state.get("source") or state_at(self.source, epoch, position))
        self._epoch, self._position, self._own_load = epoch, position, True
        self._recent.clear()
        self._recent.append((self.batches_handed, epoch, position))

    def _take_resume_point(self) -> None:
        """Takes a point the source was resumed at on its own as the position (the next iteration starts there),
        as the Loader does (:func:`~dlstore.sources.source.loaded_point`). During an iteration the source keeps
        none: its pass has started, from the point this feed put it at."""
        point = loaded_point(self.source, (self._epoch, self._position),
                             loaded="DALI feed" if self._own_load else None)
        if point is not None:
            self._epoch, self._position, self._own_load = point[0], point[1], False
            self._recent.clear()
            self._recent.append((self.batches_handed, point[0], point[1]))

    def _samples(self, source) -> Iterator[Tuple[List[np.ndarray], np.ndarray]]:
        """Per chunk of records: image views and labels."""
        recordio = getattr(source, "format", "tfrecord") == "recordio"
        for batch in source.batches():
            try:  # the labels parsed, the image bytes located (not copied): TFRecord's in C++
                if recordio:  # IRHeader, then the image (image_key and label_key name Example features)
                    labels, offsets, lengths = recordio_labels(batch, batch.offsets, batch.lengths)
                    labels = labels + self.label_offset
                else:
                    labels = parse_batch(batch, self.label_spec)[self.label_key][:, 0] + self.label_offset
                    offsets, lengths = bytes_feature_spans(batch, self.image_key)
            except DlstoreError as e:
                located = _record_error(e, batch)
                if located is e:  # not about one record: it names what it can already
                    raise
                raise located from e
            chunk = np.frombuffer(batch, dtype=np.uint8)
            yield [chunk[o:o + n] for o, n in zip(offsets.tolist(), lengths.tolist())], labels

    def __iter__(self) -> Iterator[Tuple[List[np.ndarray], np.ndarray]]:
        source = self.source
        self._take_resume_point()
        self._own_load = False
        start_at(source, self._epoch, self._position)  # mid-epoch when resumed
        size = self.batch_size
        images: List[np.ndarray] = []
        labels: List[np.ndarray] = []
        self._delivered = self._position
        self._chunk_ends.clear()
        for chunk_images, chunk_labels in self._samples(source):
            # The source's position after this chunk, the corrupt records it skipped included (a Dataset's).
            after = getattr(source, "sample_in_epoch", None)
            if isinstance(after, int):
                self._chunk_ends.append((self._delivered + len(images) + len(chunk_images), after))
            images.extend(chunk_images)
            labels.append(chunk_labels)
            if len(images) < size:
                continue
            all_labels = np.concatenate(labels)
            while len(images) >= size:
                yield self._hand_out(images[:size], all_labels[:size], size)
                images, all_labels = images[size:], all_labels[size:]
            labels = [all_labels]
        if images and self.last_batch != LastBatch.DROP:
            tail, real = np.concatenate(labels), len(images)
            if self.last_batch == LastBatch.FILL:  # repeat the epoch's last sample, as dlstore's Loader does
                need = size - len(images)
                images = images + [images[-1]] * need
                tail = np.concatenate([tail, np.repeat(tail[-1:], need)])
            yield self._hand_out(images, tail, real)
        self._epoch, self._position = self._epoch + 1, 0

    def _hand_out(self, images: List[np.ndarray], labels: np.ndarray,
                  real: int) -> Tuple[List[np.ndarray], np.ndarray]:
        out = (list(images), np.ascontiguousarray(labels, dtype=np.int64))
        self._handed_out.append(out)
        self._position += real
        self._delivered += real
        # Past a chunk's end, the position is the source's there (its skipped records included) plus
        # the samples handed out since: a resume starts where the source stopped.
        while self._chunk_ends and self._chunk_ends[0][0] <= self._delivered:
            end, at = self._chunk_ends.popleft()
            self._position = max(self._position, at + self._delivered - end)
        self.batches_handed += 1
        self._recent.append((self.batches_handed, self._epoch, self._position))
        return out


# ---- the pipeline ------------------------------------------------------------------------------------


def _gpu_count(dali) -> int:
    try:
        return int(dali.backend.GetCUDADeviceCount())
    except Exception:  # no driver at all: DALI's CPU-only path
        return 0


def dali_pipeline(source, batch_size: int, *, device: str = "auto", train: bool = True, size: int = 224,
                  layout: str = "NCHW", dtype: str = "float32", mean: Sequence[float] = IMAGENET_MEAN,
                  std: Sequence[float] = IMAGENET_STD, eval_resize: Optional[int] = None,
                  num_threads: Optional[int] = None, device_id: Optional[int] = None, seed: int = 0,
                  prefetch_queue_depth: int = 2,
                  last_batch: str = LastBatch.PARTIAL, world: Any = None, shuffle: Optional[str] = None,
                  remainder: str = "uneven", image_key: str = "image/encoded", label_key: str = "image/class/label",
                  label_offset: int = 0, **dataset_kwargs: Any):
    """A built DALI pipeline: dlstore's reader feeding encoded JPEGs and labels to a ResNet-50 graph.

    Outputs ``(images, labels)``: images ``size x size`` in ``layout`` (``NCHW``/``NHWC`` per
    batch), float32 normalised as ``(value / 255 - mean) / std`` or uint8 as decoded; labels
    int64 scalars per sample (``label_offset`` added). ``pipe.run()`` raises ``StopIteration`` at
    the end of the rank's epoch; ``pipe.reset()`` starts the next.

    Parameters
    ----------
    source : str, path-like, list of them, or a Source
        Record files (globs, directories), read through a :class:`dlstore.Dataset` of this rank's
        share (:func:`~dlstore.sources.dataset.dataset_for`), or a ready source of this rank's records
        (a ``dlstore.Dataset``, ``dlstore.open_records(...)``).
    batch_size : int
    device : {"auto", "cpu", "gpu"}
        ``gpu`` decodes with nvJPEG (``mixed``) and resizes on the GPU; ``cpu`` runs everything on
        the CPU with ``device_id=None`` (no CUDA needed); ``auto`` takes ``gpu`` when DALI sees one.
    train : bool
        Train: random crop (area 0.08..1, aspect 3/4..4/3) decoded in place, resize to ``size``,
        random horizontal flip. Eval: resize the shorter side to ``eval_resize``, centre crop.
        As :class:`dlstore.pipeline.ResNet50` (DALI's own resampling and crop choice).
    layout : {"NCHW", "NHWC"}
    dtype : {"float32", "uint8"}
        ``uint8`` skips normalisation. Any layout goes with either dtype.
    mean, std : sequence of 3 floats
        In 0..1 units, as :class:`dlstore.pipeline.ResNet50` takes them (ImageNet's by default).
    eval_resize : int, optional
        Default ``round(size * 256 / 224)`` (256 for 224).
    num_threads : int, optional
        DALI's CPU threads; default the cores this process may use.
    device_id : int, optional
        GPU; default the local rank modulo the GPUs visible. Ignored (None) on the CPU.
    seed : int
        DALI's seed (crops, flips); combined with the rank so ranks differ.
    prefetch_queue_depth : int
    last_batch : {"PARTIAL", "DROP", "FILL"}
    world, shuffle, remainder
        The Dataset's (only when ``source`` names files): who this rank is, its record shuffle drawn
        from ``(seed, epoch)`` (by default ``block`` to train, ``none`` to evaluate), and its remainder
        policy (``uneven``: every record once).
    image_key, label_key, label_offset
        See :class:`EncodedSamples`.
    **dataset_kwargs
        For the :class:`dlstore.Dataset` made from files: ``mounts``, ``buffer_size``, reader options
        (``io``, ``verify``, ``on_error``...).

    Returns
    -------
    nvidia.dali.Pipeline
        Built; its feed is ``pipe.dlstore_samples`` (an :class:`EncodedSamples`).
    """
    dali = import_framework("nvidia.dali", _INSTALL)
    fn, types = dali.fn, dali.types
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
    if dtype not in ("float32", "uint8"):
        raise ValueError(f"dtype must be 'float32' or 'uint8', got {dtype!r}")
    if device not in ("auto", "cpu", "gpu"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'gpu', got {device!r}")
    if eval_resize is not None:
        check_eval_resize(train, size, eval_resize)
    gpus = _gpu_count(dali)
    if device == "auto":
        device = "gpu" if gpus else "cpu"
    if device == "gpu" and not gpus:
        raise RuntimeError("device='gpu' but DALI sees no CUDA device; use device='cpu' or 'auto'")

    world = current_world(world)
    if shuffle is None:
        shuffle = "block" if train else "none"
    source = dataset_for(source, dataset_kwargs, world=world, shuffle=shuffle, seed=seed, remainder=remainder,
                         batch_size=int(batch_size))
    samples = EncodedSamples(source, batch_size, last_batch=last_batch, image_key=image_key,
                             label_key=label_key, label_offset=label_offset, keep=prefetch_queue_depth + 2)
    if device == "gpu":
        device_id = world.local_rank % gpus if device_id is None else int(device_id)
    else:
        device_id = None
    if num_threads is None:
        num_threads = available_cores()
    pipe = dali.Pipeline(batch_size=int(batch_size), num_threads=int(num_threads), device_id=device_id,
                         seed=int(np.random.SeedSequence([seed, world.rank]).generate_state(1)[0] & 0x7FFFFFFF),
                         prefetch_queue_depth=int(prefetch_queue_depth))
    decoder = "mixed" if device == "gpu" else "cpu"
    with pipe:
        # Batch mode from an iterable: one chunk of views per call, no copy (the feed keeps them alive).
        # Not parallel=True: the reading already runs in dlstore's C++ threads, and an iterator's state
        # would tie it to one Python worker anyway.
        jpegs, labels = fn.external_source(source=samples, num_outputs=2, batch=True, cycle="raise", no_copy=True,
                                           dtype=[types.UINT8, types.INT64], ndim=[1, 0])
        if train:
            images = fn.decoders.image_random_crop(jpegs, device=decoder, output_type=types.RGB,
                                                   random_area=[0.08, 1.0], random_aspect_ratio=[0.75, 4.0 / 3.0],
                                                   num_attempts=100)
            images = fn.resize(images, resize_x=size, resize_y=size)
            extra = {"mirror": fn.random.coin_flip(probability=0.5)}
        else:
            images = fn.decoders.image(jpegs, device=decoder, output_type=types.RGB)
            images = fn.resize(images, resize_shorter=eval_resize or round(size * 256 / 224))
            extra = {"crop": (size, size)}
        normalise = dtype == "float32"
        if normalise:
            extra.update(mean=[255.0 * m for m in mean], std=[255.0 * d for d in std])
        images = fn.crop_mirror_normalize(images, output_layout=layout[1:],
                                          dtype=types.FLOAT if normalise else types.UINT8, **extra)
        pipe.set_outputs(images, labels)
    pipe.build()
    pipe.dlstore_samples = samples
    return pipe
