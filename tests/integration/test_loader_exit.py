"""A program that exits while its Loader's thread is still reading (a loop left without ``close()``)
exits cleanly: the thread is stopped and waited for at exit, rather than coming back from C++ into an
interpreter being torn down (which aborted the process: "terminate called without an active exception")."""
import os
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
