"""Deadlines for the file-system calls made outside a read pass: a Dataset's construction (listings,
manifests, ``stat`` calls, indexing) and ``dlstore verify``.

A read pass times its own reads in C++ (``read_timeout``). The calls around it are plain Python ones
(``os.stat``, ``os.scandir``, ``open``) that a stalled mount blocks for as long as it stalls, and no
signal can cut short. So :func:`within` runs such work in a thread of its own and waits for it; the
calls that may block on a mount are marked with :func:`waiting_on`, and one that has waited longer
than the deadline ends the wait with a :class:`~dlstore.errors.DlstoreIOError` naming the path and the
call. The stuck thread is left behind (a daemon), as a read pass leaves a stuck read.

Unmarked work (numpy, parsing, a long but moving index scan, which marks each of its steps) never
times out: the deadline bounds one call's wait, not the whole task.
"""
from __future__ import annotations

import contextvars
import errno
import itertools
import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, TypeVar

from dlstore.errors import DlstoreIOError

__all__ = ["within", "waiting_on", "carried", "stat"]

T = TypeVar("T")


class _Watch:
    """The marked calls under way for one :func:`within`, by token: ``(path, what, since)``."""

    def __init__(self) -> None:
        self.calls: Dict[int, Tuple[str, str, float]] = {}
        self.tokens = itertools.count()

    def overdue(self, timeout: float) -> Optional[Tuple[str, str, float]]:
        """The call waiting longest, when it has waited ``timeout`` seconds or more."""
        now = time.monotonic()
        oldest = min(list(self.calls.values()), key=lambda c: c[2], default=None)
        return oldest if oldest is not None and now - oldest[2] >= timeout else None


_watch: contextvars.ContextVar[Optional[_Watch]] = contextvars.ContextVar("dlstore_deadline", default=None)


@contextmanager
def waiting_on(path: str, what: str) -> Iterator[None]:
    """Marks a call that may block on a mount; ``what`` names it for the error ("a listing", "a stat").
    Outside :func:`within`, nothing."""
    watch = _watch.get()
    if watch is None:
        yield
        return
    token = next(watch.tokens)
    watch.calls[token] = (path, what, time.monotonic())
    try:
        yield
    finally:
        del watch.calls[token]


def stat(path: str) -> os.stat_result:
    """``os.stat(path)``, marked (:func:`waiting_on`)."""
    with waiting_on(path, "a stat"):
        return os.stat(path)


def carried(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` for another thread (a pool's), its marked calls counted in the caller's :func:`within`."""
    watch = _watch.get()
    if watch is None:
        return fn

    def run(*args: Any, **kwargs: Any) -> T:
        token = _watch.set(watch)
        try:
            return fn(*args, **kwargs)
        finally:
            _watch.reset(token)

    return run


def within(timeout: Optional[float], task: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, run in a thread of its own, its result or its exception.

    Parameters
    ----------
    timeout : float or None
        Seconds one call marked with :func:`waiting_on` may wait; 0 or None: ``fn`` runs here, with no
        deadline.
    task : str
        What ``fn`` does, for the error ("making the Dataset").

    Raises
    ------
    DlstoreIOError
        When a marked call has waited ``timeout`` seconds: it names the path, the call and the task.
    """
    if not timeout or _watch.get() is not None:  # no deadline, or one already runs this work
        return fn(*args, **kwargs)
    watch = _Watch()
    done = threading.Event()
    outcome: Dict[str, Any] = {}

    def body() -> None:
        _watch.set(watch)
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the caller as it is
            outcome["error"] = e
        finally:
            done.set()

    threading.Thread(target=body, name="dlstore-deadline", daemon=True).start()
    poll = min(1.0, max(0.01, timeout / 4))
    while not done.wait(poll):
        late = watch.overdue(timeout)
        if late is not None:
            path, what, since = late
            raise DlstoreIOError(f"{path}: no answer to {what} in {time.monotonic() - since:.0f} s, while {task}: "
                                 f"the mount looks stalled; leave it out until it answers, or raise read_timeout "
                                 f"({timeout:g} s, DLSTORE_READ_TIMEOUT)", path=path, errno=errno.ETIMEDOUT)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
