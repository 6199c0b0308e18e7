"""dlstore.io.deadline: a marked call that waits past the deadline ends the wait with an error naming it;
unmarked work, results and exceptions pass through."""
import errno
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dlstore.errors import DlstoreIOError
from dlstore.io import deadline


@pytest.fixture
def gate():
    """An event the stuck calls wait on, set at the end so that no thread is left waiting."""
    event = threading.Event()
    yield event
    event.set()


def test_results_and_exceptions_pass_through():
    assert deadline.within(5, "a task", lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(KeyError, match="missing"):
        deadline.within(5, "a task", lambda: {}["missing"])


def test_no_deadline_runs_in_the_caller():
    assert deadline.within(0, "a task", threading.get_ident) == threading.get_ident()
    assert deadline.within(None, "a task", threading.get_ident) == threading.get_ident()


def test_a_stuck_marked_call_raises_naming_the_path_and_the_call(gate):
    def stuck():
        with deadline.waiting_on("/mnt/3/train", "a listing"):
            gate.wait(30)

    t0 = time.monotonic()
    with pytest.raises(DlstoreIOError) as e:
        deadline.within(0.3, "opening the Dataset's shards", stuck)
    assert time.monotonic() - t0 < 5
    msg = str(e.value)
    assert msg.startswith("/mnt/3/train: no answer to a listing in ") and "opening the Dataset's shards" in msg
    assert "read_timeout" in msg and "\n" not in msg
    assert e.value.path == "/mnt/3/train" and e.value.errno == errno.ETIMEDOUT


def test_slow_unmarked_work_and_quick_marked_calls_do_not_time_out():
    def busy():
        for _ in range(6):  # 0.6 s in all, each marked call quick
            with deadline.waiting_on("/mnt/0", "a stat"):
                pass
            time.sleep(0.1)
        return "done"

    assert deadline.within(0.3, "a task", busy) == "done"


def test_a_pool_thread_carries_the_deadline(gate):
    def listing(mount):
        with deadline.waiting_on(mount, "a listing"):
            if mount == "/mnt/1":
                gate.wait(30)
        return mount

    def scan():
        with ThreadPoolExecutor(2) as pool:
            return list(pool.map(deadline.carried(listing), ["/mnt/0", "/mnt/1"]))

    with pytest.raises(DlstoreIOError, match="^/mnt/1: no answer to a listing"):
        deadline.within(0.3, "a task", scan)


def test_marks_outside_a_deadline_and_nested_deadlines_cost_nothing():
    with deadline.waiting_on("/mnt/0", "a stat"):  # no deadline: nothing kept
        pass
    assert deadline.carried(len) is len
    inner = deadline.within(5, "outer", lambda: deadline.within(5, "inner", threading.get_ident))
    assert inner != threading.get_ident()  # the inner one ran in the outer one's thread
