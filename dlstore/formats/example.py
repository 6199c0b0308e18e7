"""``tf.train.Example``: parsed in C++ without TensorFlow or protobuf, encoded in pure Python.

The wire format (``tensorflow/core/example/{example,feature}.proto``)::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

:func:`parse_example` turns one record into a dict; :func:`parse_batch` parses every record of a
batch straight into fixed-shape arrays (the BERT path); :func:`encode_example` writes records for
the synthetic-data generators and the tests and needs neither the extension nor TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["bytes_feature_spans", "encode_example", "parse_batch", "parse_example"]

# Output dtypes the batch parser writes, by the name the extension knows them by.
_BATCH_DTYPES = {np.dtype(np.int64): "int64", np.dtype(np.int32): "int32", np.dtype(np.float32): "float32"}


# ---- encoding (pure Python) ----------------------------------------------------------------------


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 -> two's complement, ten bytes on the wire
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _feature_kind(value: Any) -> tuple[str, list]:
    """Classifies one feature value as ``("bytes" | "float" | "int64", list of values)``."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f":
            return "float", value.reshape(-1).astype(np.float32).tolist()
        if value.dtype.kind in "SO" and all(isinstance(v, (bytes, str)) for v in value.reshape(-1)):
            return "bytes", [v.encode() if isinstance(v, str) else bytes(v) for v in value.reshape(-1)]
        if value.dtype.kind not in "iub":
            raise TypeError(f"cannot encode an array of dtype {value.dtype} as a tf.train.Feature")
        values = value.reshape(-1).tolist()
    elif isinstance(value, (bytes, bytearray, memoryview, str, int, float, np.integer, np.floating)):
        values = [value]
    else:
        values = list(value)
    if values and all(isinstance(v, (bytes, bytearray, memoryview, str)) for v in values):
        return "bytes", [v.encode() if isinstance(v, str) else bytes(v) for v in values]
    if all(isinstance(v, (int, np.integer, np.bool_)) for v in values):
        ints = [int(v) for v in values]
        if ints and not (-(1 << 63) <= min(ints) and max(ints) < (1 << 63)):
            raise OverflowError("int64_list values must fit in int64")
        return "int64", ints
    if all(isinstance(v, (int, float, np.integer, np.floating)) for v in values):
        return "float", [float(v) for v in values]
    raise TypeError(
        f"cannot encode {type(value).__name__} of mixed or unsupported values as a tf.train.Feature"
    )


def encode_example(features: Mapping[str, Any], *, packed: bool = True) -> bytes:
    """Serializes a dict of features as a ``tf.train.Example``.

    Parameters
    ----------
    features : mapping of str to value
        Each value becomes one ``tf.train.Feature``:

        - ``bytes`` (or ``str``, encoded as UTF-8), or a list of them -> ``bytes_list``;
        - an int, a list of ints or an integer/bool numpy array -> ``int64_list``
          (negative values take ten bytes, as protobuf writes them);
        - a float, a list of numbers containing a float, or a floating numpy array ->
          ``float_list`` (stored as float32).

        An empty Python list becomes an empty ``int64_list``; for another kind pass an empty
        numpy array of that dtype (``object`` for ``bytes_list``).
    packed : bool, optional
        Write numeric lists packed (what TensorFlow writes, the default) or as one field per value
        (what some older writers do). Both parse the same.

    Returns
    -------
    bytes
        The serialized ``Example``: with ``packed`` true, byte-for-byte what protobuf (and so
        TensorFlow's ``SerializeToString``) writes when it emits the map in this dict's order.

    Examples
    --------
    >>> rec = encode_example({"label": 3, "weights": [0.5, 1.0], "image": b"\\xff\\xd8"})
    >>> parse_example(rec)["label"]
    array([3])
    """
    entries = bytearray()
    for name, value in features.items():
        kind, values = _feature_kind(value)
        if kind == "bytes":
            body = b"".join(_length_delimited(1, v) for v in values)
            feature = _length_delimited(1, body)
        elif kind == "float":
            if packed:
                body = _length_delimited(1, np.asarray(values, dtype="<f4").tobytes()) if values else b""
            else:
                body = b"".join(b"\x0d" + v.tobytes() for v in np.asarray(values, dtype="<f4"))
            feature = _length_delimited(2, body)
        else:
            if packed:
                body = _length_delimited(1, b"".join(_varint(v) for v in values)) if values else b""
            else:
                body = b"".join(b"\x08" + _varint(v) for v in values)
            feature = _length_delimited(3, body)
        entry = _length_delimited(1, name.encode()) + _length_delimited(2, feature)
        entries += _length_delimited(1, entry)
    return _length_delimited(1, bytes(entries))


# ---- parsing (C++) -------------------------------------------------------------------------------


def parse_example(record: Any) -> dict[str, Any]:
    """Parses one serialized ``tf.train.Example``.

    Parameters
    ----------
    record : bytes-like
        ``bytes``, ``memoryview``, a record from :func:`dlstore.open_records`, or anything else
        exposing a contiguous buffer.

    Returns
    -------
    dict
        Feature name -> ``numpy.int64`` array (``int64_list``), ``numpy.float32`` array
        (``float_list``) or list of ``bytes`` (``bytes_list``). A feature with no kind set parses
        as an empty list. When a name appears twice the last one wins, as in protobuf.

    Raises
    ------
    dlstore.CorruptRecordError
        The bytes are not a valid ``Example``: a truncated varint, a length past the end, a wire
        type that does not belong there. The message says what and at which byte of the record.
    """
    from dlstore import _C

    return _C.parse_example(_as_buffer(record))


def parse_batch(batch: Any, spec: Mapping[str, Sequence[Any]]) -> dict[str, np.ndarray]:
    """Parses every record of a batch into fixed-shape arrays, in C++ without the GIL.

    Parameters
    ----------
    batch : RecordBatch or similar
        Records in one contiguous region: ``batch.buffer`` (or the batch itself) exposes the
        buffer protocol, and ``batch.offsets`` / ``batch.lengths`` (numpy ``uint64``) say where
        record ``i`` lies in it.
    spec : mapping of str to tuple
        Feature name -> ``(dtype, length)`` or ``(dtype, length, default)``. ``dtype`` is
        ``numpy.int64``, ``numpy.int32`` (read from an ``int64_list``, each value checked to
        fit) or ``numpy.float32`` (from a ``float_list``). Every record must hold the feature with
        exactly ``length`` values, unless ``default`` (a scalar or ``length`` values) is given,
        in which case a record without the feature (or whose entry holds no list, as
        TensorFlow treats it) gets the default. Features not named in ``spec`` are skipped
        after a framing check.

    Returns
    -------
    dict of str to numpy.ndarray
        One C-contiguous array of shape ``(num_records, length)`` per feature.

    Raises
    ------
    dlstore.CorruptRecordError
        A record is not a valid ``Example``. The message names the record's index in the batch,
        the byte within it, and what was wrong.
    dlstore.DlstoreError
        A record lacks a feature, holds another kind or another number of values, or an int32
        feature holds a value out of range. The message names the record and the feature.
    ValueError, TypeError
        ``spec`` asks for something the batch path cannot produce (bytes, other dtypes, negative
        lengths, a default of the wrong size).

    Examples
    --------
    >>> spec = {"input_ids": (np.int32, 128), "next_sentence_labels": (np.int64, 1)}
    >>> arrays = parse_batch(batch, spec)            # doctest: +SKIP
    >>> arrays["input_ids"].shape                    # doctest: +SKIP
    (256, 128)
    """
    from dlstore import _C

    native_spec = []
    for name, entry in spec.items():
        if not isinstance(name, str):
            raise TypeError(f"feature names must be str, got {name!r}")
        if len(entry) not in (2, 3):
            raise ValueError(
                f"spec[{name!r}] must be (dtype, length) or (dtype, length, default), got {entry!r}"
            )
        dtype = np.dtype(entry[0])
        if dtype not in _BATCH_DTYPES:
            raise ValueError(
                f"spec[{name!r}]: dtype {dtype} is not supported in a batch; use int64, int32 or float32 "
                "(bytes features: parse_example per record)"
            )
        length = int(entry[1])
        if length < 0:
            raise ValueError(f"spec[{name!r}]: length must be >= 0, got {length}")
        default = None
        if len(entry) == 3 and entry[2] is not None:
            values = np.asarray(entry[2])
            if values.size not in (1, length):
                raise ValueError(
                    f"spec[{name!r}]: default must be a scalar or {length} values, got {values.size}"
                )
            default = np.ascontiguousarray(
                np.broadcast_to(values.reshape(-1).astype(dtype), (length,))
            ).tobytes()
        native_spec.append((name, _BATCH_DTYPES[dtype], length, default))

    buffer, offsets, lengths = _batch_arrays(batch)
    return _C.parse_example_batch(buffer, offsets, lengths, native_spec)


def bytes_feature_spans(batch: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Where a one-value bytes feature lies in each record of a batch, without copying it.

    For ``name="image/encoded"`` these are the JPEGs, ready for
    :func:`dlstore.pipeline.decode.decode_batch` on the same buffer.

    Parameters
    ----------
    batch : RecordBatch or similar
        As for :func:`parse_batch`.
    name : str
        The feature; every record must hold it as a ``bytes_list`` of exactly one value.

    Returns
    -------
    offsets, lengths : numpy.ndarray
        uint64 ``[num_records]``: value ``i`` is ``buffer[offsets[i]:offsets[i] + lengths[i]]``,
        offsets counted from the start of the batch's buffer.

    Raises
    ------
    dlstore.CorruptRecordError
        A record is not a valid ``Example`` (the message names the record and the byte).
    dlstore.DlstoreError
        A record lacks the feature, holds another kind, or holds other than one value.
    """
    from dlstore import _C

    if not isinstance(name, str):
        raise TypeError(f"name must be str, got {name!r}")
    buffer, offsets, lengths = _batch_arrays(batch)
    return _C.example_bytes_spans(buffer, offsets, lengths, name)

def _batch_arrays(batch: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    """``(buffer, offsets, lengths)`` of a RecordBatch-like object, checked, as the C++ calls take them."""
    offsets = np.ascontiguousarray(batch.offsets, dtype=np.uint64)
    lengths = np.ascontiguousarray(batch.lengths, dtype=np.uint64)
    if offsets.shape != lengths.shape or offsets.ndim != 1:
        raise ValueError(
            f"offsets and lengths must be 1-D and of the same size, got {offsets.shape} and {lengths.shape}"
        )
    return _as_buffer(batch.buffer if hasattr(batch, "buffer") else batch), offsets, lengths


def _as_buffer(obj: Any) -> Any:
    """Returns ``obj`` if it exposes a contiguous byte buffer, else raises a TypeError that says so."""
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(
            f"expected bytes or an object with the buffer protocol, got {type(obj).__name__}"
        ) from None
    if not view.c_contiguous:
        raise ValueError("the buffer must be C-contiguous")
    return obj
