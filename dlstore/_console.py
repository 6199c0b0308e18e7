"""What every dlstore command line does alike: a mistake is one line on stderr and exit status 2,
never a traceback or a page of usage; a reader closing the pipe (``dlstore plan --json | head``)
ends the command quietly.

Used by ``dlstore`` (:mod:`dlstore.cli`), ``python -m dlstore.bench`` and ``python -m dlstore.bench.plot``.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import Callable

from dlstore.errors import DlstoreError

__all__ = ["Parser", "positive_int", "one_line", "run", "USAGE_ERRORS", "EXIT_USAGE", "EXIT_BROKEN_PIPE"]

EXIT_USAGE = 2
#: As a process killed by SIGPIPE reports itself to the shell (128 + 13), like ``yes | head``.
EXIT_BROKEN_PIPE = 141
#: What a command raises for bad input or settings: reported as one line, exit 2. ``OSError`` is a
#: path that cannot be created or read (``gen --out`` into a read-only place).
USAGE_ERRORS = (DlstoreError, ValueError, OSError)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (``PROG: error ... (see PROG --help)``),
    exit 2. Subcommand parsers made from it are of this class too."""

    def error(self, message: str):  # argparse's own prints the whole usage before the message
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer of 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {value}")
    return value


def one_line(e: BaseException) -> str:
    """An exception as one line: an ``OSError`` as ``path: reason``, any message's lines joined."""
    if isinstance(e, OSError) and e.strerror and not isinstance(e, DlstoreError):
        where = f"{e.filename}: " if e.filename is not None else ""
        text = f"{where}{e.strerror}"
    else:
        text = str(e) or type(e).__name__
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _quiet_stdout() -> None:
    # The reader has gone: point stdout at /dev/null so that the interpreter's last flush at exit
    # does not print "Exception ignored ... BrokenPipeError".
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured): nothing to quiet
        pass


def run(prog: str, command: Callable[[], int]) -> int:
    """Runs ``command``; returns its exit status, or reports what went wrong in one line.

    Bad input or settings (:data:`USAGE_ERRORS`): ``prog: message`` on stderr, status 2. A closed
    pipe: no output, status 141. Ctrl-C: ``prog: interrupted``, status 130. Anything else is a bug in
    dlstore and keeps its traceback.
    """
    def show(message, category, filename, lineno, file=None, line=None) -> None:
        print(f"{prog}: warning: {message}", file=sys.stderr)  # one line, not the source line that warned

    try:
        with warnings.catch_warnings():
            warnings.showwarning = show
            status = command()
        sys.stdout.flush()  # a closed pipe shows up here rather than at exit
        return status
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except USAGE_ERRORS as e:
        print(f"{prog}: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
