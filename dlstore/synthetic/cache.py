"""Generated sets kept in a cache: named presets, made once, found again by the hash of their
parameters, guarded by a marker written last and by a lock, so that ranks of one job (or two jobs)
generate a set only once and a half-made set is never used.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from typing import Any, Dict, List, Optional

from dlstore import settings
from dlstore.synthetic.bert import generate_bert
from dlstore.synthetic.imagenet import generate_imagenet

try:
    import fcntl
except ImportError:  # not on Windows: see _exclusive
    fcntl = None

__all__ = ["PRESETS", "GENERATOR_VERSION", "cached_paths", "cached_dataset"]

# Bump when what a given seed produces changes, so that cached sets are made again.
GENERATOR_VERSION = 1

#: Named sizes for :func:`cached_dataset`: generator arguments per kind and size.
PRESETS: Dict[str, Dict[str, Dict[str, Any]]] = {
    "imagenet": {
        "tiny": {"shards": 2, "records_per_shard": 16},           # ~3.7 MB, for tests
        "small": {"shards": 8, "records_per_shard": 330},         # ~300 MB
        "default": {"shards": 16, "records_per_shard": 550},      # ~1 GB
        "3gb": {"shards": 24, "records_per_shard": 1088},         # ~3 GB, 26,112 records
    },
    "bert": {  # 0.83 KB a record at seq_len 128
        "tiny": {"shards": 2, "records_per_shard": 32},
        "small": {"shards": 8, "records_per_shard": 2048},        # 16k records, ~14 MB
        "default": {"shards": 16, "records_per_shard": 4096},     # 65k records, ~55 MB
        # python -m dlstore.bench bert's baseline: the default set's 65k records in 16 copies, 1M records,
        # ~870 MB, so that a tier lasts long enough to time while only 65k records are encoded.
        "bench": {"shards": 16, "records_per_shard": 4096, "copies": 16},
        "large": {"shards": 64, "records_per_shard": 16384},      # 1M records, ~870 MB
    },
}
_GENERATORS = {"imagenet": generate_imagenet, "bert": generate_bert}
_MARKER = "COMPLETE.json"


def _read_marker(directory: str, identity: Dict[str, Any]) -> Optional[List[str]]:
    """The shard paths if ``directory`` holds a finished set of this identity (kind, version, params)."""
    try:
        with open(os.path.join(directory, _MARKER)) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    if {key: marker.get(key) for key in identity} != identity:
        return None
    paths = []
    for name, size in marker.get("shards", {}).items():
        path = os.path.join(directory, name)
        try:
            if os.path.getsize(path) != size:
                return None
        except OSError:
            return None
        paths.append(path)
    return sorted(paths) or None


@contextlib.contextmanager
def _exclusive(lock_path: str):
    """Holds an exclusive lock on ``lock_path``: ranks of one job, or two jobs, generate a set only once."""
    if fcntl is None:  # no flock (Windows): the marker still keeps a half-made set from being used
        yield
        return
    with open(lock_path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _cache_entry(kind: str, size: str, cache_dir, overrides: Dict[str, Any]):
    """``(cache root, the set's directory, its identity, generator parameters)``; nothing is read."""
    if kind not in PRESETS:
        raise ValueError(f"kind must be one of {sorted(PRESETS)}, got {kind!r}")
    if size not in PRESETS[kind]:
        raise ValueError(f"size must be one of {list(PRESETS[kind])} for {kind}, got {size!r}")
    params = dict(PRESETS[kind][size], **overrides)
    for ignored in ("progress", "workers"):  # how it is made, not what is made
        params.pop(ignored, None)
    identity = {"kind": kind, "version": GENERATOR_VERSION, "params": params}
    # Normalise through JSON so the marker compares equal after a round trip (tuples become lists).
    identity = json.loads(json.dumps(identity, sort_keys=True))
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    if cache_dir is None:
        cache_dir = os.path.join(settings.get("cache_dir"), "synthetic")
    root = os.path.expanduser(os.fspath(cache_dir))
    return root, os.path.join(root, f"{kind}-{size}-{digest}"), identity, params


def cached_paths(kind: str, size: str = "default", cache_dir=None, **overrides: Any) -> Optional[List[str]]:
    """The shard paths of a finished synthetic set of this preset (and these overrides) in the cache,
    or None; unlike :func:`cached_dataset` it never generates."""
    _, directory, identity, _ = _cache_entry(kind, size, cache_dir, overrides)
    return _read_marker(directory, identity)


def cached_dataset(kind: str, size: str = "default", cache_dir=None, *, progress: bool = True,
                   **overrides: Any) -> List[str]:
    """The shard paths of a synthetic set, generating it the first time it is asked for.

    Sets live in ``<cache_dir>/<kind>-<size>-<hash of the parameters>``. A marker file, written
    last, records the parameters and each shard's size: a set whose marker is missing (an
    interrupted generation), stale or contradicted by the files is removed and made again. An
    exclusive lock beside the set makes concurrent callers (ranks of one job) wait for one
    generation instead of racing.

    Parameters
    ----------
    kind : {"imagenet", "bert"}
    size : str, optional
        A preset of :data:`PRESETS`: imagenet ``tiny`` (2 x 16 records, for tests), ``small``
        (~300 MB), ``default`` (~1 GB), ``3gb`` (24 shards, ~3 GB); bert ``tiny``, ``small``,
        ``default``, ``large``.
    cache_dir : str or path-like, optional
        Where sets are kept; default ``<cache_dir setting>/synthetic``, i.e.
        ``$DLSTORE_CACHE/synthetic`` or ``~/.cache/dlstore/synthetic``.
    progress : bool, optional
        Show a progress bar while generating.
    **overrides
        Generator arguments replacing the preset's (``seed``, ``seq_len``, ``image_size``, ...);
        they are part of the hash, so each combination is its own set.

    Returns
    -------
    list of str
        Shard paths, sorted.

    Examples
    --------
    >>> paths = cached_dataset("bert", "small", seq_len=384)   # doctest: +SKIP
    """
    root, directory, identity, params = _cache_entry(kind, size, cache_dir, overrides)
    found = _read_marker(directory, identity)
    if found is not None:
        return found
    os.makedirs(root, exist_ok=True)
    with _exclusive(directory + ".lock"):
        found = _read_marker(directory, identity)  # made by whoever held the lock before us
        if found is not None:
            return found
        if os.path.exists(directory):  # left over from an interrupted run
            shutil.rmtree(directory)
        paths = _GENERATORS[kind](directory, progress=progress, **params)
        marker = {**identity, "shards": {os.path.basename(p): os.path.getsize(p) for p in paths}}
        tmp = os.path.join(directory, _MARKER + ".tmp")
        with open(tmp, "w") as f:
            json.dump(marker, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(directory, _MARKER))
    return sorted(paths)
