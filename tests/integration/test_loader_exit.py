"""A program that exits while its Loader's thread is still reading (a loop left without ``close()``)
exits cleanly: the thread is stopped and waited for at exit, rather than coming back from C++ into an
interpreter being torn down (which aborted the process: "terminate called without an active exception")."""
import os
import re
import subprocess
import sys

import pytest

from dlstore.synthetic import generate_bert

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The loader's thread hands out one batch, then waits in the C++ reader (GIL released) for a file that
# never opens (a FIFO with no writer, as on a hung mount) until the read times out: by then the main
# thread has left the script.
SCRIPT = r"""
import os, sys
import dlstore
from dlstore import _C
from dlstore.pipeline import Bert
from dlstore.pipeline.loader import Loader
from dlstore.sources.source import ReadOptions

good, hung = sys.argv[1], sys.argv[2]


class HungSource:
    format, engine, engine_reason, num_batches = "tfrecord", "buffered", "a test", None

    def set_epoch(self, epoch):
        pass

    def use_batch_size(self, batch_size):
        pass

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass

    def stats(self):
        return {}

    def batches(self):
        core = _C.Reader([good, hung], "tfrecord", ["none"] * 2, ReadOptions(read_timeout=1.0).core("buffered"), [])
        while (batch := core.next_batch()) is not None:
            yield batch


it = iter(Loader(HungSource(), Bert(seq_len=128), batch_size=4, epochs=None))
next(it)
print("left the loop", flush=True)
"""


@pytest.fixture
def shards(tmp_path):
    generate_bert(tmp_path / "bert", shards=1, records_per_shard=4, seq_len=128)
    good = next(os.path.join(tmp_path / "bert", n) for n in sorted(os.listdir(tmp_path / "bert"))
                if not n.startswith(".") and not n.endswith((".idx", ".json", ".lock")))
    hung = os.fspath(tmp_path / "hung.tfrecord")
    os.mkfifo(hung)
    yield good, hung
    try:  # let an open still waiting on the FIFO return
        os.close(os.open(hung, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


@pytest.mark.parametrize("attempt", range(3))  # the abort depended on timing: each attempt could catch it
def test_exit_with_a_loader_thread_inside_a_read_is_clean(shards, attempt):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *shards], capture_output=True, text=True, timeout=120,
                          env=env, cwd=REPO)
    assert "left the loop" in proc.stdout, proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "terminate called" not in proc.stderr


# A daemon thread reading with the raw reader (no Loader to wait for it) when the program ends: the
# thread comes back from C++ while the interpreter is torn down. CPython ended it with pthread_exit
# inside pybind11's noexcept GIL guard: std::terminate, SIGABRT, in most runs.
DAEMON = r"""
import sys, threading, time
import dlstore

path = sys.argv[1]


def busy():
    while True:
        for batch in dlstore.open_records(path, io="buffered", chunk_size=64 << 10).batches():
            pass


threading.Thread(target=busy, daemon=True).start()
time.sleep(0.3)
print("main returns", flush=True)
"""


@pytest.mark.parametrize("attempt", range(5))  # it aborted in 4 runs of 5 before
def test_exit_with_a_daemon_thread_inside_the_reader_is_clean(tmp_path, attempt):
    path = os.fspath(tmp_path / "a.tfrecord")
    import dlstore

    with dlstore.TFRecordWriter(path) as w:
        for i in range(4000):
            w.write(bytes([i % 251]) * 300)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", DAEMON, path], capture_output=True, text=True, timeout=120,
                          env=env, cwd=REPO)
    assert "main returns" in proc.stdout, proc.stderr[-2000:]
    assert proc.returncode == 0 and "terminate called" not in proc.stderr, proc.stderr[-2000:]


# A reader dropped with a read in flight that hangs (a window read ahead when its mount stalls, then
# dropped by the failover): its destructor waited for the read with the GIL held and no deadline, so
# the whole program stopped with the mount.
DROP = r"""
import sys, threading, time
import numpy as np
from dlstore import _C
from dlstore.sources.source import ReadOptions

good, hung = sys.argv[1], sys.argv[2]
size = 4 * (12 + 100 + 4)
reader = _C.PlanReader([good, hung], np.array([0, 0, 0, 0, 1], np.uint32),
                       np.array([0, 116, 232, 348, 0], np.uint64), np.array([116] * 5, np.uint64), None, "tfrecord",
                       4, ReadOptions(read_timeout=600.0, chunk_size=64 << 10).core("buffered", in_order=False))
reader.start()  # the hung file's read is in flight: its open waits on the FIFO
time.sleep(0.3)
ticks = []
stop = threading.Event()


def tick():
    last = time.monotonic()
    while not stop.is_set():
        time.sleep(0.01)
        now = time.monotonic()
        ticks.append(now - last)
        last = now


ticker = threading.Thread(target=tick)
ticker.start()
time.sleep(0.2)
t0 = time.monotonic()
del reader
took = time.monotonic() - t0
time.sleep(0.2)
stop.set()
ticker.join()
print(f"dropped in {took:.2f} s; longest stall {max(ticks):.2f} s", flush=True)
"""


def test_a_reader_dropped_with_a_hung_read_in_flight_does_not_wait_for_it(shards, tmp_path):
    good = os.fspath(tmp_path / "good.tfrecord")
    import dlstore

    with dlstore.TFRecordWriter(good) as w:
        for _ in range(4):
            w.write(b"r" * 100)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        proc = subprocess.run([sys.executable, "-c", DROP, good, shards[1]], capture_output=True, text=True,
                              timeout=60, env=env, cwd=REPO)
    except subprocess.TimeoutExpired:
        pytest.fail("dropping the reader waited for the hung read")
    assert proc.returncode == 0, proc.stderr[-2000:]
    took, stall = map(float, re.match(r"dropped in ([0-9.]+) s; longest stall ([0-9.]+) s", proc.stdout).groups())
    assert took < 1 and stall < 1, proc.stdout
