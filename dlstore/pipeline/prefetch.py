"""Reusable batch buffers and the background thread that fills them.

:class:`BatchRing` holds the output arrays: ``prefetch + 2`` slots (one being filled, up to
``prefetch`` finished and waiting, one held by the consumer), allocated once and reused, with
their pages touched at allocation. Batches are never allocated per step: on the VMs this runs on,
first-touch page faults cost more than the parsing that fills them.

:class:`Prefetcher` runs a producer function in a daemon thread. The producer takes free slots
with :meth:`~Prefetcher.acquire`, fills them (C++ work with the GIL released) and hands them over
with :meth:`~Prefetcher.publish`; the consumer draws them with :meth:`~Prefetcher.get` and gives
each back with :meth:`~Prefetcher.release`. An exception in the thread is re-raised in the
consumer, traceback included; :meth:`~Prefetcher.close` stops the thread and waits for it, so the
producer's ``finally`` blocks (closing the reader) have run when it returns.

A program that exits while a prefetcher's thread is still at work (a loop left without ``close()``)
has the thread stopped and waited for at exit (:data:`EXIT_WAIT_S` at most): left running, the
thread would come back from a C++ read into an interpreter being torn down, where CPython ends the
thread by unwinding its stack through C++ frames, and the process aborts ("terminate called without
an active exception").
"""
from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

__all__ = ["BatchRing", "Prefetcher", "Stopped", "touched_empty", "EXIT_WAIT_S"]

#: Seconds the interpreter's exit waits for each prefetcher's thread still running (a read under way
#: ends within the reader's ``read_timeout`` at worst; past this the exit goes on without it).
EXIT_WAIT_S = 30.0


def touched_empty(shape: Tuple[int, ...], dtype: Any) -> np.ndarray:
    """An array whose pages are all mapped now (written once), so that filling it later faults nothing."""
    a = np.empty(shape, dtype=dtype)
    a.fill(0)
    return a


class BatchRing:
    """``slots`` sets of output arrays of ``batch_size`` rows, allocated once.

    Parameters
    ----------
    fields : dict
        Name -> ``(per-sample shape, dtype)``.
    batch_size, slots : int
    allocator : callable, optional
        ``allocator(shape, dtype) -> numpy.ndarray`` (C-contiguous, writable). Default:
        :func:`touched_empty`. An adapter passes one returning page-locked memory
        (e.g. ``torch.empty(..., pin_memory=True).numpy()``) so that batches can be copied to a GPU
        asynchronously.

    Attributes
    ----------
    slots : list of dict
        ``slots[i][name]`` is an array of shape ``(batch_size, *shape)``.
    arrays_allocated : int
        Arrays allocated over the ring's life (fields x slots).
    """

    def __init__(self, fields: Dict[str, Tuple[Tuple[int, ...], Any]], batch_size: int, slots: int,
                 allocator: Optional[Callable[[Tuple[int, ...], Any], np.ndarray]] = None):
        allocate = allocator or touched_empty
        self.slots: List[Dict[str, np.ndarray]] = []
        self.arrays_allocated = 0
        for _ in range(slots):
            slot = {}
            for name, (shape, dtype) in fields.items():
                a = allocate((batch_size, *shape), dtype)
                if a.shape != (batch_size, *shape) or a.dtype != np.dtype(dtype) or not a.flags.c_contiguous \
                        or not a.flags.writeable:
                    raise ValueError(f"the allocator returned a {a.dtype} array of shape {a.shape} for "
                                     f"{name!r}; expected a writable C-contiguous {np.dtype(dtype)} array of "
                                     f"shape {(batch_size, *shape)}")
                slot[name] = a
                self.arrays_allocated += 1
            self.slots.append(slot)

    @property
    def nbytes(self) -> int:
        """Bytes held by all slots."""
        return sum(a.nbytes for slot in self.slots for a in slot.values())

    def __len__(self) -> int:
        return len(self.slots)


class Stopped(Exception):
    """Raised in the producer thread by :meth:`Prefetcher.acquire` once the consumer has closed."""


class _Done:
    """End of the producer's stream."""


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


class Prefetcher:
    """A producer thread handing filled ring slots to one consumer.

    Parameters
    ----------
    slots : int
        Ring slots; all start free.
    produce : callable
        ``produce(prefetcher)``, run in the thread. It calls :meth:`acquire` / :meth:`publish`
        and returns at the end of its stream; :class:`Stopped` from :meth:`acquire` ends it early.
    name : str
        The thread's name.

    Attributes
    ----------
    producer_wait_s : float
        Seconds the producer waited for a free slot (the consumer was the slower side).
    consumer_wait_s : float
        Seconds the consumer waited in :meth:`get` (the producer was the slower side).
    last_wait_s : float
        Seconds the last :meth:`get` waited.
    """

    def __init__(self, slots: int, produce: Callable[["Prefetcher"], None], name: str = "dlstore-loader"):
        self._free: "queue.SimpleQueue[Optional[int]]" = queue.SimpleQueue()
        for i in range(slots):
            self._free.put(i)
        self._ready: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._stop = threading.Event()
        self._produce = produce
        self.producer_wait_s = 0.0
        self.consumer_wait_s = 0.0
        self.last_wait_s = 0.0
        self._finished = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        _running.add(self)

    # ---- producer side ----

    @property
    def stopping(self) -> bool:
        """True once the consumer has closed: the producer should return."""
        return self._stop.is_set()

    def acquire(self) -> int:
        """A free slot index, waiting for the consumer to give one back if needed.

        Raises
        ------
        Stopped
            When the consumer has closed.
        """
        t0 = time.perf_counter()
        slot = self._free.get()
        self.producer_wait_s += time.perf_counter() - t0
        if slot is None or self._stop.is_set():
            raise Stopped()
        return slot

    def publish(self, item: Any) -> None:
        """Hands ``item`` (usually naming a filled slot) to the consumer."""
        self._ready.put(item)

    def _main(self) -> None:
        try:
            self._produce(self)
        except Stopped:
            pass
        except BaseException as e:  # noqa: B036 - everything must reach the consumer, KeyboardInterrupt too
            self._ready.put(_Failure(e))
            return
        self._ready.put(_Done)

    # ---- consumer side ----

    def get(self) -> Any:
        """The next published item, or None at the end of the stream.

        Raises
        ------
        BaseException
            The exception that ended the producer, as raised there (its traceback shows where).
        """
        if self._finished:
            return None
        t0 = time.perf_counter()
        item = self._ready.get()
        self.last_wait_s = time.perf_counter() - t0
        self.consumer_wait_s += self.last_wait_s
        if item is _Done or self._stop.is_set():
            self._finished = True
            return None
        if isinstance(item, _Failure):
            self._finished = True
            raise item.error
        return item

    def release(self, slot: int) -> None:
        """Gives slot ``slot`` back to the producer (also usable by the producer for a slot it drops)."""
        self._free.put(slot)

    def close(self, timeout: Optional[float] = None) -> None:
        """Stops the producer and waits for its thread to end (its ``finally`` blocks have run), or for
        ``timeout`` seconds at most."""
        self._stop.set()
        self._free.put(None)  # wakes a producer waiting in acquire()
        self._ready.put(_Done)  # and a consumer waiting in get(), when closed from another thread
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if not self._thread.is_alive():
            _running.discard(self)


#: Prefetchers whose threads were started and not seen to end (weakly held: a thread's target keeps its own).
_running: "weakref.WeakSet[Prefetcher]" = weakref.WeakSet()


@atexit.register
def _stop_at_exit() -> None:
    # Runs before the interpreter starts tearing down, while a returning thread can still take the GIL.
    for prefetcher in list(_running):
        prefetcher.close(timeout=EXIT_WAIT_S)
