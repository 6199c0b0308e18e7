"""One testbed step: the error that names it, and running the command that does it.

Every step of a setup, a teardown or a fault is named (``"attach mount 1"``, ``"mkfs mount 0"``), and
a failure says which step, which command, its exit status and its stderr.
"""
from __future__ import annotations

import datetime
import shlex
import subprocess
from typing import Optional, Sequence

from dlstore.errors import DlstoreError

__all__ = ["TestbedError", "run_step", "now", "MiB"]

MiB = 1 << 20


class TestbedError(DlstoreError):
    """A testbed step failed. The message names the step and, for a command, the command line, its
    exit status and its stderr.

    Attributes
    ----------
    step : str or None
        What was being done (``"attach mount 1"``, ``"mkfs mount 0"``, ``"throttle mount 2"``).
    command : list of str or None
        The command that failed.
    stderr : str or None
        What it printed on stderr.
    """

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self, message: str, step: Optional[str] = None, command: Optional[Sequence[str]] = None,
                 stderr: Optional[str] = None, path: Optional[str] = None):
        super().__init__(message, path=path)
        self.step = step
        self.command = list(command) if command is not None else None
        self.stderr = stderr


def now() -> str:
    """The local time, to the second, as the state file's log records it."""
    return datetime.datetime.now().isoformat(timespec="seconds")


def run_step(step: str, cmd: Sequence[str], timeout: float = 300) -> str:
    """Runs one command; its stdout, or a :class:`TestbedError` naming the step, the command, its
    status and its stderr."""
    try:
        p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise TestbedError(f"{step} failed: `{cmd[0]}` is not installed (not on PATH)", step=step, command=cmd) from e
    except subprocess.TimeoutExpired as e:
        raise TestbedError(f"{step} failed: `{shlex.join(cmd)}` did not finish in {timeout:.0f} s",
                           step=step, command=cmd) from e
    if p.returncode != 0:
        err = (p.stderr or p.stdout or "").strip() or "(nothing on stderr)"
        raise TestbedError(f"{step} failed: `{shlex.join(cmd)}` exited with status {p.returncode}: {err}",
                           step=step, command=cmd, stderr=p.stderr)
    return p.stdout
